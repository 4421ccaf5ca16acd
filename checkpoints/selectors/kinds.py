"""The Kinds page and ``GET …/kinds``: for one tenant, each kind and schema version its
checkpoints use, beside what the kind registry supports (docs/kinds.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count

from .. import declared, kinds, roles
from ..exceptions import NotFound
from ..models import Checkpoint, DeclaredKindVersion, RecoveryState, Run, Tenant
from ..permissions import require


@dataclass(frozen=True)
class KindVersion:
    """One schema version of a kind: ``supported`` by the registry or not; the tenant's
    ``checkpoints`` of it, the ``runs`` those belong to, and the runs in
    ``schema_mismatch`` whose latest checkpoint is of it. A supported version no
    checkpoint uses yet is listed with zeros."""

    schema_version: int
    supported: bool
    checkpoints: int = 0
    runs: int = 0
    schema_mismatch_runs: int = 0
    #: A chain of registered (or declared) steps leads from this version up to the kind's
    #: newest: ``manage.py migrate_checkpoints`` / "Migrate to vN" can move it there.
    #: False for the newest itself and for unsupported versions.
    migrates_to_newest: bool = False


@dataclass(frozen=True)
class KindUsage:
    """A kind the tenant's checkpoints use, or one the registry knows (then perhaps with
    zero counts): ``registered``, the versions the registry supports, and its versions
    (the supported ones and the ones in use, oldest first)."""

    kind: str
    registered: bool
    description: str
    supported_versions: tuple[int, ...]
    versions: tuple[KindVersion, ...]
    #: The tenant's admin declared it (``PUT …/kinds/{kind}/versions/{v}``): not in code.
    declared: bool = False

    @property
    def newest_supported_version(self) -> int | None:
        return self.supported_versions[-1] if self.supported_versions else None


def kind_usage(*, user, tenant: Tenant) -> list[KindUsage]:
    """Every kind of the registry and every kind the tenant's checkpoints use, by name,
    with per-version counts (``KindUsage``). Two grouped queries, tenant first: the
    tenant's checkpoints per (kind, version) with their distinct runs, and its
    ``schema_mismatch`` runs per (kind, version) of their latest checkpoint. The first
    reads every checkpoint row of the tenant (one row per checkpoint id, not per
    revision): a few per run."""
    require(user, tenant, roles.VIEW)
    counts: dict[tuple[str, int], dict[str, int]] = {}
    used = (Checkpoint.objects.for_tenant(tenant).order_by().values("kind", "schema_version")
            .annotate(checkpoints=Count("id"), runs=Count("run", distinct=True)))
    for row in used:
        counts[(row["kind"], row["schema_version"])] = {"checkpoints": row["checkpoints"],
                                                       "runs": row["runs"]}
    mismatched = (Run.objects.for_tenant(tenant)
                  .filter(recovery_state=RecoveryState.SCHEMA_MISMATCH)
                  .exclude(schema_version=None).order_by()
                  .values("kind", "schema_version").annotate(n=Count("id")))
    for row in mismatched:
        counts.setdefault((row["kind"], row["schema_version"]), {})["schema_mismatch_runs"] \
            = row["n"]
    own = declared.declared_kinds(tenant)
    registry = kinds.registered(declared=own)
    for kind, versions in registry.items():
        for version in versions:
            counts.setdefault((kind, version), {})
    by_kind: dict[str, list[int]] = {}
    for kind, version in sorted(counts):
        by_kind.setdefault(kind, []).append(version)
    out = []
    for kind, versions in by_kind.items():
        supported = tuple(registry.get(kind, ()))
        out.append(KindUsage(
            kind=kind, registered=kind in registry, declared=kind in own,
            description=own[kind].description if kind in own else kinds.description(kind),
            supported_versions=supported,
            versions=tuple(KindVersion(v, v in supported, **counts[(kind, v)],
                                       migrates_to_newest=_leads_up(kind, v, supported, own))
                           for v in versions)))
    return out


def _leads_up(kind: str, version: int, supported: tuple[int, ...], own: dict) -> bool:
    """Whether registered (or ``own`` declared) steps lead from ``version`` to the newest."""
    if version not in supported or version >= supported[-1]:
        return False
    try:
        kinds.migration_path(kind, version, supported[-1], lookup=own.get)
    except kinds.MigrationError:
        return False
    return True


def declared_kind_get(*, user, tenant: Tenant, kind: str, version: int):
    """``tenant``'s declared ``kind`` at ``version`` (a ``DeclaredKindVersion``), for any
    role of the tenant. Raises ``NotFound`` when it has no such declaration (a kind in
    code is not a declaration: docs/kinds.md)."""
    require(user, tenant, roles.VIEW)
    if not kinds.is_kind_name(kind):  # never declared; never sent to the database
        raise NotFound("no such kind version")
    row = (DeclaredKindVersion.objects.for_tenant(tenant).select_related("declared_by")
           .filter(kind=kind, version=version).first())
    if row is None:
        raise NotFound(f"{str(kind)[:200]} v{version} is not declared by this tenant")
    return row


def kind_known(*, user, tenant: Tenant, kind: str) -> bool:
    """Whether ``kind`` is a kind ``tenant`` can name in a URL: one in code, or one it
    declared (for any role of the tenant; a path naming another is answered 404)."""
    require(user, tenant, roles.VIEW)
    if not kinds.is_kind_name(kind):
        return False
    return kinds.in_code(kind) or DeclaredKindVersion.objects.for_tenant(tenant).filter(
        kind=kind).exists()  # one query, no schema compiled
