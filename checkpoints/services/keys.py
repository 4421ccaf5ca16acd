"""Encryption keys: re-encrypting every ciphertext column under the newest key.
"""

from __future__ import annotations

from django.db import transaction

from .. import crypto, locks
from ..audit import (
    audit_record,
)
from ..models import (
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    GraphCheckpoint,
    GraphWrite,
    ReconcileAttempt,
    Tenant,
)
from ..vocab import (
    AuditAction,
    TargetType,
)

# --------------------------------------------------------------------------------------
# Encryption keys
# --------------------------------------------------------------------------------------

# Every encrypted column. One left out here would become unreadable once the old key is
# dropped.
_CIPHER_COLUMNS = (
    (Checkpoint, "payload_ciphertext"),
    (CheckpointRevision, "payload_ciphertext"),
    (Conflict, "refused_ciphertext"),
    (Effect, "receipt_ciphertext"),
    (Effect, "request_ciphertext"),
    (EffectRevision, "receipt_ciphertext"),
    (ReconcileAttempt, "evidence_ciphertext"),
    (GraphCheckpoint, "checkpoint_ciphertext"),  # LangGraph (issue 10)
    (GraphCheckpoint, "metadata_ciphertext"),
    (GraphWrite, "value_ciphertext"),
)


_ROTATION = "key rotation re-encrypts every tenant's ciphertext columns"


def payloads_rotate_keys(*, batch_size: int = 500) -> dict[str, int]:
    """Re-encrypt every stored payload, receipt, stored request and reconcile evidence
    (``_cipher_columns``) under the newest key of
    ``RECOVERY_ENCRYPTION_KEYS``, so older keys can then be removed (DESIGN.md 5).

    Works in batches of ``batch_size`` rows, each batch one transaction; a row is rewritten
    only if its ciphertext is unchanged since it was read (compare-and-swap), so running
    beside live writers is safe and running twice is harmless. Writes one audit event per
    tenant with the counts (actor: system). Returns ``{"rows": n, "tenants": m}``.
    Raises ``cryptography.fernet.InvalidToken`` if a row fits none of the keys.
    """
    per_tenant: dict[int, int] = {}
    for model, column in _CIPHER_COLUMNS:
        last_pk = 0
        while True:
            rows = list(model.objects.for_all_tenants(reason=_ROTATION)
                        .filter(pk__gt=last_pk).exclude(**{column: ""})
                        .order_by("pk").values_list("pk", "tenant_id", column)[:batch_size])
            if not rows:
                break
            with transaction.atomic():  # one batch of rows at a time
                for pk, tenant_id, token in rows:
                    if crypto.is_current(token):
                        continue
                    rotated = crypto.rotate_token(token)
                    if model.objects.for_tenant(tenant_id).filter(
                            pk=pk, **{column: token}).update(**{column: rotated}):
                        per_tenant[tenant_id] = per_tenant.get(tenant_id, 0) + 1
            last_pk = rows[-1][0]
    with transaction.atomic():
        for tenant in locks.lock_audit_heads(Tenant.objects.filter(pk__in=per_tenant)):
            audit_record(tenant=tenant, actor=None, action=AuditAction.PAYLOAD_ROTATE_KEYS,
                         target_type=TargetType.TENANT, target_id=tenant.slug,
                         after={"rows": per_tenant[tenant.pk]})
    return {"rows": sum(per_tenant.values()), "tenants": len(per_tenant)}
