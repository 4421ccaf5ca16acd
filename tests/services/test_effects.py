"""Effect records through ``services.effect_put`` and friends: CONTRACT.md 3's state table,
operation-key uniqueness, receipts, and the retry path back to ``planned``."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from checkpoints import services
from checkpoints.exceptions import (
    IdempotencyKeyReuse,
    InvalidPayload,
    InvalidTransition,
    NotFound,
    OperationExists,
    StaleRevision,
)
from checkpoints.models import AuditEvent, Conflict, Effect, EffectRevision, Run
from tests.helpers import (
    FP,
    age_world,
    effect_body,
    envelope,
    put_checkpoint,
    put_effect,
    sweep_later,
    walk_effect,
)

STATES = ["planned", "submitted", "confirmed", "failed", "unresolved", "not_executed", "unknown"]
# How a runtime (plus a reviewer, for unknown) brings an effect into each state.
PATHS = {
    "planned": (),
    "submitted": ("submitted",),
    "confirmed": ("submitted", "confirmed"),
    "failed": ("submitted", "failed"),
    "unresolved": ("submitted", "unresolved"),
    "not_executed": ("submitted", "unresolved", "not_executed"),
    "unknown": ("submitted",),
}
# The moves a runtime may make with a PUT (CONTRACT.md 3; policy.py also lets a runtime that
# reconciles by itself settle an unresolved effect).
RUNTIME_MOVES = {
    ("planned", "submitted"), ("submitted", "confirmed"), ("submitted", "failed"),
    ("submitted", "unresolved"), ("unresolved", "confirmed"), ("unresolved", "failed"),
    ("unresolved", "not_executed"),
}


def _bring_to(state, wendy, rita, acme, body) -> Effect:
    effect = walk_effect(wendy, acme, body, *PATHS[state])
    if state == "unknown":
        age_world(3600)  # the owner is gone: a reviewer may declare it
        effect = services.effect_mark_unknown(actor=rita, tenant=acme,
                                              effect_id=effect.uuid, reason="no lookup")
    return effect


@pytest.mark.parametrize("src", STATES)
@pytest.mark.parametrize("dst", STATES)
def test_it_lets_a_runtime_make_exactly_the_allowed_moves(acme, wendy, rita, src, dst):
    body = effect_body()
    effect = _bring_to(src, wendy, rita, acme, body)
    n = effect.revision
    receipt = {"charge_id": "ch_9"} if dst == "confirmed" else None
    attempt = dict(body, revision=n + 1, state=dst, receipt=receipt)
    if (src, dst) in RUNTIME_MOVES:
        moved = put_effect(wendy, acme, attempt, expected=n)
        assert (moved.state, moved.revision) == (dst, n + 1)
        assert EffectRevision.objects.filter(effect=moved).count() == n + 2
    else:
        with pytest.raises(InvalidTransition) as exc:
            put_effect(wendy, acme, attempt, expected=n)
        assert exc.value.status == 422
        assert exc.value.body()["error"] == "invalid_transition"
        effect.refresh_from_db()
        assert (effect.state, effect.revision) == (src, n)


def test_it_creates_effects_only_as_planned(acme, wendy):
    for state in STATES[1:]:
        receipt = {"charge_id": "ch_1"} if state == "confirmed" else None
        with pytest.raises(InvalidTransition):
            put_effect(wendy, acme, effect_body(state=state, receipt=receipt))
    assert not Effect.objects.exists()


@pytest.mark.parametrize("src", STATES)
def test_it_lets_a_reviewer_mark_unknown_only_when_in_doubt(acme, wendy, rita, src):
    effect = _bring_to(src, wendy, rita, acme, effect_body())
    if src in {"submitted", "unresolved"}:
        age_world(3600)  # the owner is gone: a reviewer may declare it
        moved = services.effect_mark_unknown(actor=rita, tenant=acme,
                                             effect_id=effect.uuid, reason="cannot tell")
        assert moved.state == "unknown"
        assert Run.objects.get().recovery_state == "unknown_outcome"
        event = AuditEvent.objects.get(action="effect.mark_unknown")
        assert (event.actor, event.reason, event.before["state"]) == (rita, "cannot tell", src)
    else:
        with pytest.raises(InvalidTransition):
            age_world(3600)  # the owner is gone: a reviewer may declare it
            services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid,
                                         reason="cannot tell")
        effect.refresh_from_db()
        assert effect.state == src


def test_it_requires_a_receipt_to_confirm(acme, wendy):
    body = effect_body()
    walk_effect(wendy, acme, body, "submitted")
    with pytest.raises(InvalidPayload) as exc:
        put_effect(wendy, acme, dict(body, revision=2, state="confirmed", receipt=None),
                   expected=1)
    assert exc.value.detail.startswith("receipt")
    assert Effect.objects.get().state == "submitted"


def test_it_answers_operation_exists_for_the_same_request(acme, wendy):
    first = put_effect(wendy, acme, effect_body())
    with pytest.raises(OperationExists) as exc:
        put_effect(wendy, acme, effect_body(fingerprint=FP.upper()))
    assert exc.value.status == 409
    assert exc.value.body() == {"error": "operation_exists", "effect_id": str(first.uuid)}
    assert Effect.objects.count() == 1


def test_it_answers_idempotency_key_reuse_for_another_request(acme, wendy):
    put_effect(wendy, acme, effect_body())
    other = hashlib.sha256(b"charge A-1042 9999").hexdigest()
    with pytest.raises(IdempotencyKeyReuse) as exc:
        put_effect(wendy, acme, effect_body(fingerprint=other))
    assert exc.value.status == 422
    assert Effect.objects.count() == 1


def test_it_scopes_operation_keys_by_service_and_tenant(acme, globex, wendy, wes):
    put_effect(wendy, acme, effect_body(service="payments"))
    put_effect(wendy, acme, effect_body(service="crm"))
    put_effect(wes, globex, effect_body(service="payments"))
    assert Effect.objects.count() == 3


def test_it_stores_fingerprints_in_lower_case(acme, wendy):
    effect = put_effect(wendy, acme, effect_body(fingerprint=FP.upper()))
    assert effect.request_fingerprint == FP


@pytest.mark.parametrize(("field", "value"), [
    ("operation_key", "charge:other"), ("service", "crm"), ("effect_class", "idempotent"),
    ("request_fingerprint", "0" * 64), ("run_id", str(uuid.uuid4())),
])
def test_it_never_changes_an_effects_identity(acme, wendy, field, value):
    body = effect_body()
    put_effect(wendy, acme, body)
    with pytest.raises(InvalidPayload) as exc:
        put_effect(wendy, acme, dict(body, revision=1, state="submitted", **{field: value}),
                   expected=0)
    assert exc.value.detail.startswith(field)


def test_it_refuses_a_stale_effect_write_and_keeps_the_conflict(acme, wendy):
    body = effect_body()
    walk_effect(wendy, acme, body, "submitted")
    with pytest.raises(StaleRevision) as exc:
        put_effect(wendy, acme, dict(body, revision=1, state="submitted"), expected=0)
    assert exc.value.current_revision == 1
    conflict = Conflict.objects.get()
    assert (conflict.target_type, conflict.expected_revision, conflict.actual_revision) == (
        "effect", 0, 1)
    assert Run.objects.get().recovery_state == "conflicted"


def test_it_answers_not_found_for_an_update_of_a_missing_effect(acme, wendy):
    with pytest.raises(NotFound):
        put_effect(wendy, acme, effect_body(revision=1, state="submitted"), expected=0)


def _retry_cycle(acme, rita, april, wendy, run_id):
    sweep_later()  # the run's owner is long gone: ambiguous, so a retry may be requested
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="safe to redo")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="checked")
    return retry


@pytest.mark.parametrize("stuck", ["unknown", "not_executed"])
def test_it_sends_an_effect_back_to_planned_only_after_an_approved_retry_is_consumed(
        acme, wendy, rita, april, stuck):
    body = effect_body()
    put_checkpoint(wendy, acme, envelope(run_id=body["run_id"], payload={"phase": "charging"}))
    effect = _bring_to(stuck, wendy, rita, acme, body)
    n = effect.revision
    again = dict(body, revision=n + 1, state="planned")
    with pytest.raises(InvalidTransition):
        put_effect(wendy, acme, again, expected=n)
    run_id = uuid.UUID(body["run_id"])
    retry = _retry_cycle(acme, rita, april, wendy, run_id)
    # Approved but not yet consumed: still refused.
    with pytest.raises(InvalidTransition):
        put_effect(wendy, acme, again, expected=n)
    decision = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    assert decision["action"] == "retry"
    retry.refresh_from_db()
    assert retry.state == "consumed"
    token = decision["fencing_token"]
    moved = put_effect(wendy, acme, again, expected=n, token=token)
    assert (moved.state, moved.attempt, moved.revision) == ("planned", 2, n + 1)
    assert moved.retry_authorized_by is None
    assert EffectRevision.objects.get(effect=moved, revision=n + 1).attempt == 2
    # The authorisation is spent: the next round needs a new approval.
    walk_to = dict(body, revision=n + 2, state="submitted")
    moved = put_effect(wendy, acme, walk_to, expected=n + 1, token=token)
    assert moved.attempt == 2
