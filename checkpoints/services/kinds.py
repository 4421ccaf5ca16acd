"""Declarative kinds (issue 19, item 1; docs/kinds.md): a tenant's admin declares a kind
version as a JSON Schema and a phase map (``kinds.declarative``), and the tenant's
checkpoints of that kind are classified by it (``checkpoints.declared``)."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from .. import kinds, locks, roles
from ..audit import audit_record
from ..exceptions import InvalidPayload, KindVersionInUse
from ..kinds import declarative
from ..models import Checkpoint, CheckpointRevision, DeclaredKindVersion, Tenant
from ..permissions import require
from ..vocab import AuditAction, TargetType

#: What ``kind_declare`` did: a new version, a replaced unused one, or nothing (same body).
CREATED, REPLACED, UNCHANGED = "created", "replaced", "unchanged"


def _checked_kind(kind) -> str:
    if not kinds.is_kind_name(kind):
        raise InvalidPayload("kind: must match ^[a-z][a-z0-9_]*(\\.[a-z0-9_-]+)+$ and be at "
                             "most 200 characters (CONTRACT.md 1)")
    if kinds.in_code(kind):
        raise InvalidPayload(f"kind: {kind} is a kind in code (built in or from "
                             "RECOVERY_KIND_MODULES); declare one of your own name")
    return kind


def kind_declare(*, actor, tenant: Tenant, kind: str, version: int,
                 body: dict) -> tuple[DeclaredKindVersion, str]:
    """Declare ``tenant``'s ``kind`` at schema ``version`` from ``body`` (the
    declaration: ``kinds.declarative``'s docstring). Returns ``(row, what)``, ``what``
    one of ``CREATED``, ``REPLACED`` (the version existed and no checkpoint used it) or
    ``UNCHANGED`` (the same declaration again: nothing written, nothing audited).

    ``actor``: the tenant's admin (``roles.MANAGE``), or ``None`` for the operator's
    ``manage.py register_kind``. Raises ``Forbidden``/``NotFound`` (rights);
    ``InvalidPayload`` naming the field (a bad kind name or one a kind in code took, a
    version outside 0..2^32-1, a declaration ``parse_declaration`` refuses, a migration
    whose version before is not declared); ``KindVersionInUse`` (409) to change a version
    a checkpoint or a revision of the tenant already uses. Audited (``kind.declare``:
    the kind and version, the digests before and after) in the same transaction as the
    write.
    """
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    kind = _checked_kind(kind)
    if type(version) is not int or not 0 <= version <= kinds.U32_MAX:
        raise InvalidPayload(f"version: must be an integer in 0..{kinds.U32_MAX}")
    try:
        declaration = declarative.parse_declaration(kind, version, body)
    except declarative.DeclarationError as exc:
        raise InvalidPayload(str(exc)[:500]) from None
    declared = DeclaredKindVersion.objects.for_tenant(tenant)
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        if declaration.ops is not None and not declared.filter(
                kind=kind, version=version - 1).exists():
            raise InvalidPayload(f"migration: {kind} v{version - 1} is not declared; declare "
                                 "it first (a migration goes from the version before)")
        row = declared.filter(kind=kind, version=version).first()
        if row is not None and row.digest == declaration.digest:
            return row, UNCHANGED
        before = None
        if row is not None:
            if (Checkpoint.objects.for_tenant(tenant).filter(kind=kind, schema_version=version)
                    .exists() or CheckpointRevision.objects.for_tenant(tenant)
                    .filter(kind=kind, schema_version=version).exists()):
                raise KindVersionInUse(f"version: {kind} v{version} is used by checkpoints of "
                                       f"this tenant and cannot change; declare v"
                                       f"{version + 1} (with a migration) instead")
            before = {"kind": kind, "version": version, "digest": row.digest}
            declared.filter(pk=row.pk).update(
                body=body, digest=declaration.digest, description=declaration.description,
                declared_by=actor, updated_at=Now())
            what = REPLACED
        else:
            row = DeclaredKindVersion.objects.create(
                tenant=tenant, kind=kind, version=version, body=body, digest=declaration.digest,
                description=declaration.description, declared_by=actor)
            what = CREATED
        # ``target_ref`` holds 64 characters, a kind 200: the event names it whole in
        # ``before``/``after`` (the target is cut, for the audit log's filter only).
        audit_record(tenant=tenant, actor=actor, action=AuditAction.KIND_DECLARE,
                     target_type=TargetType.KIND, target_id=f"{kind} v{version}"[:64],
                     before=before, after={"kind": kind, "version": version,
                                           "digest": declaration.digest,
                                           "reversible_from_previous": _reversible(declaration)})
    row.refresh_from_db()
    return row, what


def _reversible(declaration: declarative.Declaration) -> bool | None:
    """Whether the declared step from the version before can be undone; ``None``: no step."""
    if declaration.ops is None:
        return None
    return declarative.compile_ops(declaration.ops)[1] is not None
