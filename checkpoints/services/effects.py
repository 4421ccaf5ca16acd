"""Effects: the write-ahead side-effect record (CONTRACT.md 3 "Effects"): validation,
compare-and-swap writes and the effect state machine.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from .. import crypto, intranges, policy, roles
from ..audit import (
    audit_record,
)
from ..exceptions import (
    Fenced,
    IdempotencyKeyReuse,
    InvalidPayload,
    InvalidTransition,
    NotFound,
    OperationExists,
    StaleRevision,
)
from ..jsonparse import content_sha256, dumps
from ..models import (
    Effect,
    EffectRevision,
    Tenant,
    encrypt_receipt,
)
from ..permissions import require
from ..vocab import (
    AuditAction,
    EffectClass,
    EffectSource,
    EffectState,
    TargetType,
)
from . import screening
from .common import HEX64_RE, _actor_name, _str_field, _uuid_field, cas_revisions_check
from .runs import (
    _check_fence,
    _drop_if_empty,
    _lock_run,
    _record_conflict,
    _record_fenced,
    refuse_tombstoned,
    run_save,
)

# --------------------------------------------------------------------------------------
# Effects: write-ahead side-effect records
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EffectBody:
    effect_id: uuid.UUID
    run_id: uuid.UUID
    revision: int
    operation_key: str
    service: str
    effect_class: str
    request_fingerprint: str
    state: str
    receipt: Any
    request_json: str = ""  # canonical JSON of the optional ``request`` (fingerprint checked)
    request: Any = None  # the optional ``request`` itself (screened, never stored in clear)


def parse_effect(body: dict, *, url_id: uuid.UUID) -> EffectBody:
    """Validate an effect body (CONTRACT.md 3 "Effects"); raises ``InvalidPayload``."""
    eid = _uuid_field(body, "id")
    if eid != url_id:
        raise InvalidPayload("id: differs from the id in the URL")
    run_id = _uuid_field(body, "run_id")
    revision = intranges.REVISION.check(body.get("revision"), "revision")
    operation_key = _str_field(body, "operation_key", 512)
    service = _str_field(body, "service", 200)
    effect_class = body.get("effect_class")
    if effect_class not in EffectClass.values:
        raise InvalidPayload("effect_class: must be read_only, idempotent or non_idempotent")
    fp = body.get("request_fingerprint")
    if not isinstance(fp, str) or not HEX64_RE.match(fp):
        raise InvalidPayload("request_fingerprint: must be 64 hex digits (SHA-256)")
    state = body.get("state")
    if state not in EffectState.values:
        raise InvalidPayload(f"state: must be one of {', '.join(EffectState.values)}")
    receipt = body.get("receipt")
    if receipt is not None and not isinstance(receipt, dict):
        raise InvalidPayload("receipt: must be an object or null")
    request_json = ""
    if body.get("request") is not None:
        # Optional: the canonical request itself, so that the replay reconciler can send it
        # again with the same key. It must be the request the fingerprint names.
        if not isinstance(body["request"], dict):
            raise InvalidPayload("request: must be an object or null")
        request_json = dumps(body["request"])
        if hashlib.sha256(request_json.encode("utf-8")).hexdigest() != fp.lower():
            raise InvalidPayload("request: its SHA-256 (canonical JSON: sorted keys, no "
                                 "spaces, UTF-8) is not request_fingerprint")
    unknown = set(body) - {"id", "run_id", "revision", "operation_key", "service",
                           "effect_class", "request_fingerprint", "state", "receipt", "request"}
    if unknown:
        raise InvalidPayload(f"{sorted(unknown)[0]}: unknown field")
    return EffectBody(eid, run_id, revision, operation_key, service, effect_class, fp.lower(),
                      state, receipt, request_json, body.get("request"))


def _effect_history(effect: Effect, *, actor, source: str) -> None:
    EffectRevision.objects.create(
        tenant_id=effect.tenant_id, effect=effect, revision=effect.revision, state=effect.state,
        receipt_ciphertext=effect.receipt_ciphertext, attempt=effect.attempt,
        actor_name=_actor_name(actor), source=source,
    )


def effect_put(
    *,
    actor,
    tenant: Tenant,
    body: EffectBody,
    expected_revision: int | None,
    fencing_token: int | None = None,
) -> tuple[Effect, bool]:
    """Compare-and-swap one effect record, walking the effect state machine.

    Create (``expected_revision=None``): revision 0, state ``planned``; a used
    (service, operation_key) answers ``OperationExists`` (409, same fingerprint) or
    ``IdempotencyKeyReuse`` (422). Update: revision N+1, identity fields unchanged, a move
    the runtime may make (``policy.EFFECT_TRANSITIONS``), ``confirmed`` with a receipt;
    ``unknown``/``not_executed`` -> ``planned`` only after an approved retry was consumed
    (attempt + 1). The receipt and the request are screened first (``services.screening``):
    what is found is kept on the effect (``secret_paths``) and named in the audit event.
    Raises ``InvalidPayload``, ``InvalidTransition`` (422), ``NotFound``, ``Fenced``,
    ``StaleRevision`` (412, conflict kept), ``SecretDetected`` (422 under a ``refuse``
    data policy; nothing written).
    """
    require(actor, tenant, roles.WRITE)
    cas_revisions_check(expected_revision, body.revision)
    if body.state == EffectState.CONFIRMED and body.receipt is None:
        raise InvalidPayload("receipt: required when state is confirmed")
    found = screening.screen_effect(tenant, receipt=body.receipt, request=body.request)
    refused = dumps({"id": str(body.effect_id), "revision": body.revision, "state": body.state,
                     "operation_key": body.operation_key, "service": body.service})
    try:
        effect = _effect_cas(actor, tenant, body, expected_revision, fencing_token, refused,
                             found)
    except Fenced as exc:
        _record_fenced(exc, tenant=tenant, actor=actor, target_type=TargetType.EFFECT,
                       target_id=body.effect_id, expected=expected_revision,
                       attempted=body.revision, token=fencing_token, refused=refused)
        raise
    if isinstance(effect, StaleRevision):
        raise effect
    return effect, expected_revision is None


def _effect_cas(actor, tenant, body, expected_revision, fencing_token, refused, found):
    """The transaction of ``effect_put``; returns the effect, or the ``StaleRevision`` to
    raise once the conflict record has committed. ``found``: the screening's findings
    (``/request/...`` and ``/receipt/...`` paths)."""
    # Long on purpose: the effect's compare-and-swap, fence, transition, history,
    # conflict and audit event in one transaction, step by step like _checkpoint_cas.
    conflict_at: int | None = None
    with transaction.atomic():
        existing = Effect.objects.for_tenant(tenant).filter(uuid=body.effect_id).select_related(
            "run").first()
        if expected_revision is not None and existing is None:
            # Retention's phase 2 deleted the run's effects with its row: its tombstone
            # says so (409 run_deleted, as before phase 2), not 404.
            refuse_tombstoned(tenant, body.run_id)
            raise NotFound("no such effect")
        if existing is None:
            if body.state != EffectState.PLANNED:
                raise InvalidTransition("state: a new effect starts as planned")
            _check_operation_key(tenant, body)
            run = _lock_run(tenant, body.run_id, create=True)
            now = run.db_now
            _check_fence(run, fencing_token, now)
            try:
                with transaction.atomic():
                    effect = Effect.objects.create(
                        tenant=tenant, run=run, uuid=body.effect_id, revision=0,
                        operation_key=body.operation_key, service=body.service,
                        effect_class=body.effect_class,
                        request_fingerprint=body.request_fingerprint, state=EffectState.PLANNED,
                        receipt=body.receipt, state_changed_at=now,
                        request_ciphertext=(crypto.encrypt_text(body.request_json, tenant=tenant)
                                            if body.request_json else ""),
                        secret_paths=found,
                    )
            except IntegrityError:
                # Lost a race: either the effect id or the operation key is now taken.
                other = (Effect.objects.for_tenant(tenant).filter(uuid=body.effect_id)
                         .select_related("run").first())
                if other is None:
                    _check_operation_key(tenant, body)
                    raise
                conflict_at = other.revision
                if other.run_id != run.pk:
                    # As for checkpoints: the conflict belongs to the winner's run (the run
                    # that owns the id), and the run this call just made for itself is
                    # dropped if nothing else uses it; the winner's run fences the writer.
                    _drop_if_empty(run)
                    run = _lock_run(tenant, other.run.uuid, create=False)
                    _check_fence(run, fencing_token, run.db_now)
        elif expected_revision is None:
            # A create that finds the id taken is a conflict of the run that owns the id.
            run = _lock_run(tenant, existing.run.uuid, create=False)
            _check_fence(run, fencing_token, run.db_now)
            conflict_at = existing.revision
        else:
            for key in ("operation_key", "service", "effect_class", "request_fingerprint"):
                if getattr(existing, key) != getattr(body, key):
                    raise InvalidPayload(f"{key}: never changes across revisions")
            if existing.run.uuid != body.run_id:
                raise InvalidPayload("run_id: never changes across revisions")
            run = _lock_run(tenant, body.run_id, create=False)
            now = run.db_now
            _check_fence(run, fencing_token, now)
            existing.refresh_from_db()
            if existing.revision != expected_revision:
                conflict_at = existing.revision
            else:
                effect = _effect_transition(
                    existing, expected_revision=expected_revision, to_state=body.state,
                    receipt=body.receipt, by=EffectSource.RUNTIME, actor=actor, now=now,
                    receipt_paths=[f for f in found if f["path"].startswith("/receipt")])
                if effect is None:
                    conflict_at = Effect.objects.for_tenant(tenant).get(pk=existing.pk).revision
        if conflict_at is not None:
            _record_conflict(tenant=tenant, run=run, actor=actor, target_type=TargetType.EFFECT,
                             target_id=body.effect_id, expected=expected_revision,
                             actual=conflict_at, attempted=body.revision, refused=refused)
        else:
            if expected_revision is None:
                _effect_history(effect, actor=actor, source=EffectSource.RUNTIME)
            reopened = run_save(run, now, reopen=True, last_write_at=now)
            after = {"revision": effect.revision, "state": effect.state,
                     "operation_key": effect.operation_key, "service": effect.service}
            if body.receipt is not None:  # by its hash, never a value (issue 20, item 3)
                after["receipt_sha256"] = content_sha256(dumps(body.receipt))
            if reopened:
                after["reopened"] = True
            if effect.secret_paths:
                after["flagged_paths"] = effect.secret_paths
            audit_record(
                tenant=tenant, actor=actor, action=AuditAction.EFFECT_WRITE, target_type=TargetType.EFFECT,
                target_id=body.effect_id, run_id=run.uuid,
                before=None if expected_revision is None else {"revision": expected_revision},
                after=after, created_at=now,  # the lock's database time, as the write's
            )
    if conflict_at is not None:
        return StaleRevision(conflict_at)
    return effect


def _check_operation_key(tenant: Tenant, body: EffectBody) -> None:
    other = Effect.objects.for_tenant(tenant).filter(service=body.service,
                                  operation_key=body.operation_key).first()
    if other is None or other.uuid == body.effect_id:
        return
    if other.request_fingerprint == body.request_fingerprint:
        raise OperationExists(str(other.uuid))
    raise IdempotencyKeyReuse(
        "operation_key: already used in this service with another request_fingerprint")


#: ``receipt=KEEP_RECEIPT``: a transition keeps the stored receipt as it is (its
#: ciphertext, never decrypted: a crypto-shredded tenant's effects still move).
KEEP_RECEIPT = object()


def _effect_transition(effect: Effect, *, expected_revision: int, to_state: str, receipt: Any,
                       by: str, actor, now: datetime,
                       receipt_paths: list[dict] | None = None) -> Effect | None:
    """Move ``effect`` one state by compare-and-swap; ``None`` if its revision moved on.
    ``receipt``: the new receipt (a dict or ``None``), or ``KEEP_RECEIPT``.
    ``receipt_paths``: the screening's findings in the new receipt (``/receipt/...``),
    stored with the request's findings kept; ``None`` leaves ``secret_paths`` as it is.

    Raises ``InvalidTransition`` for a move ``by`` may not make, ``InvalidPayload`` for
    ``confirmed`` without a receipt.
    """
    from_state = effect.state
    attempt = effect.attempt
    retry_clear = False
    if from_state in EffectState.NEEDS_RETRY and to_state == EffectState.PLANNED:
        if effect.retry_authorized_by_id is None:
            raise InvalidTransition(
                f"state: {from_state} -> planned needs an approved, consumed retry")
        by, attempt, retry_clear = EffectSource.RETRY, attempt + 1, True
    if not policy.transition_allowed(from_state, to_state, by):
        raise InvalidTransition(f"state: {from_state} -> {to_state} is not allowed ({by})")
    keep = receipt is KEEP_RECEIPT
    if to_state == EffectState.CONFIRMED and (not effect.has_receipt if keep else receipt is None):
        raise InvalidPayload("receipt: required when state is confirmed")
    ciphertext = (effect.receipt_ciphertext if keep
                  else encrypt_receipt(receipt, tenant=effect.tenant_id))
    fields = dict(revision=expected_revision + 1, state=to_state,
                  receipt_ciphertext=ciphertext, attempt=attempt,
                  state_changed_at=now, updated_at=now)
    if to_state == EffectState.SUBMITTED:
        fields["submitted_at"] = now
    if retry_clear:
        fields["retry_authorized_by"] = None
    if receipt_paths is not None:
        fields["secret_paths"] = [f for f in effect.secret_paths or []
                                  if f["path"].startswith("/request")] + receipt_paths
    updated = (Effect.objects.for_tenant(effect.tenant_id)
               .filter(pk=effect.pk, revision=expected_revision).update(**fields))
    if updated != 1:
        return None
    for key, value in fields.items():
        setattr(effect, key, value)
    # The consumed retry re-plans on the runtime's resume: its history says runtime.
    source = EffectSource.RUNTIME if by == EffectSource.RETRY else by
    _effect_history(effect, actor=actor, source=source)
    return effect


