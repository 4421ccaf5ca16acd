"""Encryption keys (docs/security/encryption.md): rotating the master keys (re-wrapping
the tenants' data keys, moving legacy ciphertexts to them) and crypto-shredding a tenant
(destroying its data keys).
"""

from __future__ import annotations

import hmac

from django.db import transaction

from .. import crypto, intranges, locks
from ..audit import (
    audit_record,
)
from ..dbclock import NOW
from ..exceptions import DomainError, Forbidden, InvalidPayload
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
    TenantDataKey,
)
from ..vocab import (
    AuditAction,
    TargetType,
)
from .lifecycle import active_holds

# --------------------------------------------------------------------------------------
# Encryption keys
# --------------------------------------------------------------------------------------

# Every encrypted column. One left out here would keep legacy ciphertexts that become
# unreadable once the old master key is dropped, and that a tenant's shredding misses.
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


_ROTATION = "key rotation re-wraps every tenant's data keys and moves legacy ciphertexts"


class TenantHeld(DomainError, status=409, error="legal_hold"):
    """A tenant with an active legal hold cannot be crypto-shredded: 409."""


#: How many holds ``TenantHeld``'s message names (then "and N more").
HELD_NAMED = 5


def _refuse_if_held(tenant: Tenant) -> None:
    """Raise ``TenantHeld`` naming the tenant's active holds (id, scope, who placed it,
    the reason's first 80 characters; the oldest ``HELD_NAMED``), else nothing. The
    operator's walk, item 6: "the tenant has an active legal hold" named none."""
    holds = list(active_holds(tenant).order_by("placed_at", "pk")[:HELD_NAMED + 1])
    if not holds:
        return
    named = "; ".join(
        f"{h.uuid} (scope {h.scope}, placed by {h.placed_by_name}: "
        f"{h.reason[:80]!r})" for h in holds[:HELD_NAMED])
    more = active_holds(tenant).count() - HELD_NAMED if len(holds) > HELD_NAMED else 0
    what = ("an active legal hold: release it first" if len(holds) == 1
            else "active legal holds: release them first")
    raise TenantHeld(f"the tenant has {what}: {named}" + (f"; and {more} more" if more else ""))


def _legacy_rows(model, column: str, tenant_id: int | None):
    rows = (model.objects.for_all_tenants(reason=_ROTATION) if tenant_id is None
            else model.objects.for_tenant(tenant_id))
    return (rows.exclude(**{column: ""}).exclude(**{f"{column}__startswith": crypto.PREFIX})
            .order_by("pk"))


def _move_legacy(tenant_id: int | None, batch_size: int, counts: dict[int, int]) -> None:
    """Re-encrypt every legacy (master-key) ciphertext, of one tenant or of all, under its
    tenant's data key, in batches of ``batch_size`` rows, each batch one transaction;
    compare-and-swap per row (a row changed meanwhile is left for the next run). Adds the
    rows moved per tenant id to ``counts``."""
    for model, column in _CIPHER_COLUMNS:
        last_pk = 0
        while True:
            rows = list(_legacy_rows(model, column, tenant_id).filter(pk__gt=last_pk)
                        .values_list("pk", "tenant_id", column)[:batch_size])
            if not rows:
                break
            with transaction.atomic():  # one batch of rows at a time
                for pk, row_tenant, token in rows:
                    moved = crypto.encrypt_text(crypto.decrypt_text(token, tenant=row_tenant),
                                                tenant=row_tenant)
                    if model.objects.for_tenant(row_tenant).filter(
                            pk=pk, **{column: token}).update(**{column: moved}):
                        counts[row_tenant] = counts.get(row_tenant, 0) + 1
            last_pk = rows[-1][0]


def payloads_rotate_keys(*, batch_size: int = 500) -> dict[str, int]:
    """After a new master key was prepended to ``RECOVERY_ENCRYPTION_KEYS``: re-wrap every
    live data key under it (a few rows: payloads are not re-encrypted), and move every
    legacy ciphertext (written under a master key before issue 20: ``_CIPHER_COLUMNS``)
    to its tenant's data key, so the older master keys can then be removed (DESIGN.md 5;
    docs/security/encryption.md).

    Works in batches of ``batch_size`` rows, each batch one transaction; a row is rewritten
    only if it is unchanged since it was read (compare-and-swap), so running beside live
    writers is safe and running twice is harmless. Writes one audit event per tenant with
    the counts (actor: system). Returns ``{"rows": legacy ciphertexts moved, "keys": data
    keys re-wrapped, "tenants": tenants touched}``. Raises
    ``cryptography.fernet.InvalidToken`` if a legacy row or a data key fits none of the
    master keys, ``InvalidPayload`` for a ``batch_size`` outside ``intranges.ROTATE_BATCH``.
    """
    intranges.ROTATE_BATCH.check(batch_size, "batch_size")
    keys: dict[int, int] = {}
    last_pk = 0
    while True:
        rows = list(TenantDataKey.objects.for_all_tenants(reason=_ROTATION)
                    .filter(pk__gt=last_pk, destroyed_at__isnull=True).exclude(wrapped="")
                    .order_by("pk").values_list("pk", "tenant_id", "wrapped")[:batch_size])
        if not rows:
            break
        with transaction.atomic():
            for pk, tenant_id, wrapped in rows:
                if crypto.is_current(wrapped):
                    continue
                if TenantDataKey.objects.for_tenant(tenant_id).filter(
                        pk=pk, wrapped=wrapped, destroyed_at__isnull=True).update(
                        wrapped=crypto.rotate_token(wrapped)):
                    keys[tenant_id] = keys.get(tenant_id, 0) + 1
        last_pk = rows[-1][0]
    moved: dict[int, int] = {}
    _move_legacy(None, batch_size, moved)
    touched = set(keys) | set(moved)
    with transaction.atomic():
        for tenant in locks.lock_audit_heads(Tenant.objects.filter(pk__in=touched)):
            audit_record(tenant=tenant, actor=None, action=AuditAction.PAYLOAD_ROTATE_KEYS,
                         target_type=TargetType.TENANT, target_id=tenant.slug,
                         after={"rows": moved.get(tenant.pk, 0),
                                "keys": keys.get(tenant.pk, 0)})
    return {"rows": sum(moved.values()), "keys": sum(keys.values()), "tenants": len(touched)}


def tenant_shred(*, actor, tenant: Tenant, confirm_slug: str,
                 batch_size: int = 500) -> dict:
    """Crypto-shred ``tenant``: every payload, receipt, request, refused write, evidence
    and LangGraph blob it ever stored becomes unreadable, here and in every later copy of
    the database (issue 20, item 3; docs/security/encryption.md says what holds for
    backups taken before).

    First moves the tenant's legacy (master-key) ciphertexts to its data key (batches, as
    ``payloads_rotate_keys``), then, in one transaction under the tenant's audit head:
    destroys every live data key of the tenant (``wrapped`` emptied, ``destroyed_at`` the
    database time, ``destroyed_by`` the actor), creates the key later writes use, and
    writes one ``tenant.key_destroy`` event naming the key ids (never key material).
    Rows and metadata stay (lists, states, the audit); reading a payload answers 410
    ``erased`` (``crypto.DataKeyGone``). This process forgets the keys at once; other
    processes within ``RECOVERY_DATA_KEY_CACHE_S`` seconds.

    ``actor``: ``None`` (the operator's ``manage.py shred_tenant``) or a superuser, else
    ``Forbidden``; ``confirm_slug`` must repeat the tenant's slug (``InvalidPayload``).
    Raises ``TenantHeld`` (409) while any legal hold of the tenant is active. Returns
    ``{"tenant": slug, "key_ids": [...destroyed], "legacy_rows": n, "new_key_id": id}``.
    """
    if actor is not None and not getattr(actor, "is_superuser", False):
        raise Forbidden("only an operator may crypto-shred a tenant")
    if confirm_slug != tenant.slug:
        raise InvalidPayload("confirm_slug: must repeat the tenant's slug")
    _refuse_if_held(tenant)
    moved: dict[int, int] = {}
    _move_legacy(tenant.pk, batch_size, moved)
    crypto.forget(tenant.pk)
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        _refuse_if_held(tenant)
        _move_legacy(tenant.pk, batch_size, moved)  # written meanwhile by an old process
        live = TenantDataKey.objects.for_tenant(tenant).filter(destroyed_at__isnull=True)
        key_ids = sorted(live.values_list("key_id", flat=True))
        live.update(wrapped="", destroyed_at=NOW, destroyed_by=actor)
        new = crypto.data_key_create(tenant)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.TENANT_KEY_DESTROY,
                     target_type=TargetType.TENANT, target_id=tenant.slug,
                     after={"key_ids": key_ids, "legacy_rows": moved.get(tenant.pk, 0),
                            "new_key_id": new.key_id})
        transaction.on_commit(lambda: crypto.forget(tenant.pk))
    crypto.forget(tenant.pk)
    return {"tenant": tenant.slug, "key_ids": key_ids, "legacy_rows": moved.get(tenant.pk, 0),
            "new_key_id": new.key_id}


# --------------------------------------------------------------------------------------
# The keyring: the data keys as the live database holds them, kept beside the backups
# --------------------------------------------------------------------------------------

_KEYRING = "the keyring export lists every tenant's data keys (wrapped, or destroyed)"
#: The fields of one keyring record (one JSON line).
KEYRING_FIELDS = ("tenant", "key_id", "generation", "wrapped", "destroyed")


def keyring_export() -> list[dict]:
    """Every tenant's data keys as this database holds them now, for ``manage.py
    export_keyring``: ``[{"tenant": slug, "key_id", "generation", "wrapped": the
    master-key token or "", "destroyed": bool}]``, by tenant and generation. It holds no
    key in clear (a wrapped key needs a configured master key); reading writes nothing.

    Kept beside the backups and refreshed after every master-key rotation and every
    shredding, it lets a restored older backup be read with today's master keys while
    the keys destroyed since stay destroyed (``keyring_restore``)."""
    rows = (TenantDataKey.objects.for_all_tenants(reason=_KEYRING)
            .order_by("tenant__slug", "generation")
            .values_list("tenant__slug", "key_id", "generation", "wrapped", "destroyed_at"))
    return [{"tenant": slug, "key_id": key_id, "generation": generation, "wrapped": wrapped,
             "destroyed": destroyed_at is not None}
            for slug, key_id, generation, wrapped, destroyed_at in rows]


def keyring_restore(*, records: list[dict]) -> dict[str, int]:
    """Bring a restored database's data keys up to a keyring exported later
    (``keyring_export``; the restore procedure of docs/operations/backup.md): a key the
    keyring says is destroyed is destroyed here too (audited ``tenant.key_destroy``), and
    a live key takes the keyring's wrapped copy (wrapped by a newer master key, audited
    ``payload.rotate_keys``) if a configured master key unwraps it. Keys the keyring does
    not name (created after it), or that belong to another tenant here, are left as they
    are. Operator-only (the command line); safe to run twice.

    Raises ``InvalidPayload`` naming the record and field for a malformed record, or one
    that would swap a different key in under a key's id (nothing imported). Returns
    ``{"destroyed": n, "rewrapped": m, "unwrappable": k}`` (``k``: live keys whose copy
    in the file no configured master key unwraps; left as they were).
    """
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict) or set(record) != set(KEYRING_FIELDS):
            raise InvalidPayload(f"record {number}: must have exactly the fields "
                                 f"{', '.join(KEYRING_FIELDS)}")
        if not isinstance(record["key_id"], str) or not isinstance(record["wrapped"], str) \
                or not isinstance(record["destroyed"], bool):
            raise InvalidPayload(f"record {number}: key_id, wrapped: strings; destroyed: a "
                                 f"boolean")
        generation = record["generation"]
        if isinstance(generation, bool) or not isinstance(generation, int) \
                or not 1 <= generation <= 2**31 - 1:
            raise InvalidPayload(f"record {number}: generation: an integer in 1..2^31-1")
    seen = [(str(r["tenant"]), r["key_id"]) for r in records]
    if len(set(seen)) != len(seen):
        raise InvalidPayload("keyring: a tenant's key id is given twice (nothing imported)")
    by_tenant: dict[str, list[dict]] = {}
    for record in records:
        by_tenant.setdefault(str(record["tenant"]), []).append(record)
    done = {"destroyed": 0, "rewrapped": 0, "unwrappable": 0}
    with transaction.atomic():  # all records or none (a refused one rolls back all)
        for tenant in Tenant.objects.filter(slug__in=by_tenant).order_by("pk"):
            wanted = {r["key_id"]: r for r in by_tenant[tenant.slug]}
            with transaction.atomic():
                locks.lock_audit_head(tenant)
                here = TenantDataKey.objects.for_tenant(tenant).filter(key_id__in=wanted,
                                                                       destroyed_at__isnull=True)
                gone = sorted(k for k in here.values_list("key_id", flat=True)
                              if wanted[k]["destroyed"])
                rewrapped = 0
                for key_id, wrapped in here.exclude(key_id__in=gone).values_list("key_id",
                                                                                  "wrapped"):
                    new = wanted[key_id]["wrapped"]
                    if new == wrapped or not new:
                        continue
                    try:
                        unwrapped = crypto.fernet().decrypt(new.encode("ascii"))
                    except (crypto.InvalidToken, UnicodeEncodeError):
                        done["unwrappable"] += 1  # no configured master key: keep ours
                        continue
                    try:
                        ours = crypto.fernet().decrypt(wrapped.encode("ascii"))
                    except crypto.InvalidToken:
                        ours = None  # ours fits no configured master key: the file's may
                    if ours is not None and not hmac.compare_digest(unwrapped, ours):
                        # A re-wrap carries the same key under another master key; a record
                        # that would swap in a different key (another tenant's, say) would
                        # make every ciphertext of this tenant unreadable: refused.
                        raise InvalidPayload(
                            f"keyring: {tenant.slug} key {key_id} in the file is not the key "
                            f"this database holds under that id (nothing imported)")
                    rewrapped += TenantDataKey.objects.for_tenant(tenant).filter(
                        key_id=key_id, wrapped=wrapped).update(wrapped=new)
                if gone:
                    here.filter(key_id__in=gone).update(wrapped="", destroyed_at=NOW)
                    audit_record(tenant=tenant, actor=None, action=AuditAction.TENANT_KEY_DESTROY,
                                 target_type=TargetType.TENANT, target_id=tenant.slug,
                                 after={"key_ids": gone, "legacy_rows": 0, "from": "keyring"})
                if rewrapped:
                    audit_record(tenant=tenant, actor=None, action=AuditAction.PAYLOAD_ROTATE_KEYS,
                                 target_type=TargetType.TENANT, target_id=tenant.slug,
                                 after={"rows": 0, "keys": rewrapped, "from": "keyring"})
                transaction.on_commit(lambda t=tenant.pk: crypto.forget(t))
            done["destroyed"] += len(gone)
            done["rewrapped"] += rewrapped
    return done
