"""A tenant's declared kinds, as the registry reads them (issue 19, item 1;
``kinds.declarative``): ``lookup(tenant)`` is what ``kinds.classify``, ``migration_path``
and ``migrate`` take as ``lookup`` so a tenant's checkpoints are classified by its own
declarations, and no other tenant's (a kind in code always wins).

Reading: one query per kind looked up (version and digest of each declared version), and a
second for the bodies of those not yet compiled in this process; a compiled version is
kept by its digest (the declaration's content), so a replaced declaration is recompiled
and an unchanged one never is. Kinds in code (``kinds._REGISTRY``) cost nothing here.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from . import kinds
from .kinds import declarative
from .models import DeclaredKindVersion, Tenant

logger = logging.getLogger(__name__)

_COMPILED: OrderedDict[tuple, tuple] = OrderedDict()
_COMPILED_MAX = 512


def _compiled(kind: str, version: int, digest: str, body: dict) -> tuple:
    """``(VersionSpec, Migration | None, description)`` of one declaration, by content."""
    key = (kind, version, digest)
    found = _COMPILED.get(key)
    if found is None:
        declaration = declarative.parse_declaration(kind, version, body)
        found = (declaration.spec(), declaration.migration(kind), declaration.description)
        _COMPILED[key] = found
        while len(_COMPILED) > _COMPILED_MAX:
            _COMPILED.popitem(last=False)
    else:
        _COMPILED.move_to_end(key)
    return found


def _spec_of(tenant_id: int, kind: str, rows: list[tuple[int, str]]) -> kinds.KindSpec | None:
    if not rows:
        return None
    missing = [v for v, digest in rows if (kind, v, digest) not in _COMPILED]
    bodies = dict(DeclaredKindVersion.objects.for_tenant(tenant_id)
                  .filter(kind=kind, version__in=missing).values_list("version", "body")
                  ) if missing else {}
    spec = kinds.KindSpec(kind=kind)
    for version, digest in sorted(rows):
        body = bodies.get(version)
        try:
            compiled = (_COMPILED.get((kind, version, digest)) if body is None
                        else _compiled(kind, version, digest, body))
        except declarative.DeclarationError:  # stored under older bounds: unsupported now
            logger.exception("tenant %s: declared %s v%s no longer compiles", tenant_id,
                             kind, version)
            compiled = None
        if compiled is None:  # replaced between the two queries: read on the next look-up
            continue
        spec.versions[version], migration, description = compiled
        if migration is not None:
            spec.migrations[version - 1] = migration
        spec.description = description or spec.description
    # A step needs both its versions (``kinds.register_migration``'s rule).
    spec.migrations = {v: m for v, m in spec.migrations.items()
                       if v in spec.versions and v + 1 in spec.versions}
    return spec


def lookup(tenant: Tenant | int) -> kinds.Lookup:
    """``kind -> KindSpec | None`` over ``tenant``'s declared kinds, each read once per
    lookup object (make one per request or per migration, not one per process)."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    seen: dict[str, kinds.KindSpec | None] = {}
    digests: dict[tuple[str, int], str] = {}

    def find(kind: str) -> kinds.KindSpec | None:
        if not kinds.is_kind_name(kind):  # never declared: no query (a U+0000 is a PG error)
            return None
        if kind not in seen:
            rows = list(DeclaredKindVersion.objects.for_tenant(tenant_id).filter(kind=kind)
                        .values_list("version", "digest"))
            digests.update(((kind, version), digest) for version, digest in rows)
            seen[kind] = _spec_of(tenant_id, kind, rows)
        return seen[kind]

    def digest(kind: str, version: int) -> str | None:
        """The digest of the declaration ``find`` read for (kind, version), ``None`` when
        the tenant had none (call after ``find(kind)``)."""
        return digests.get((kind, version))

    find.digest = digest
    return find


def current_digest(tenant: Tenant | int, kind: str, version: int) -> str | None:
    """The digest of ``tenant``'s declaration of (kind, version) now, ``None`` if none:
    the write path compares it under the audit head with the one it classified by."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    if not kinds.is_kind_name(kind):
        return None
    return (DeclaredKindVersion.objects.for_tenant(tenant_id)
            .filter(kind=kind, version=version).values_list("digest", flat=True).first())


def declared_kinds(tenant: Tenant | int) -> dict[str, kinds.KindSpec]:
    """Every kind ``tenant`` declared (``{kind: KindSpec}``), for ``kinds.registered``
    and the Kinds page; a name a kind in code took is left out (that one wins)."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    rows: dict[str, list[tuple[int, str]]] = {}
    for kind, version, digest in (DeclaredKindVersion.objects.for_tenant(tenant_id)
                                  .order_by("kind", "version")
                                  .values_list("kind", "version", "digest")):
        rows.setdefault(kind, []).append((version, digest))
    out = {}
    for kind, found in rows.items():
        if not kinds.in_code(kind):
            out[kind] = _spec_of(tenant_id, kind, found)
    return out


def declared_kind_names(tenant: Tenant | int) -> set[str]:
    """The names of the kinds ``tenant`` declared (one query, nothing compiled), for lists
    that only name kinds (the inbox's kind filter)."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return {kind for kind in DeclaredKindVersion.objects.for_tenant(tenant_id).order_by()
            .values_list("kind", flat=True).distinct() if not kinds.in_code(kind)}
