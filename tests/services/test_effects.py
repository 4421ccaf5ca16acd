"""Effect records through ``services.effect_put`` and friends: CONTRACT.md 3's state table
(read from docs/CONTRACT.md, for every actor through its real write path),
operation-key uniqueness, receipts, and the retry path back to ``planned``."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from checkpoints import reconcile, services
from checkpoints.exceptions import (
    IdempotencyKeyReuse,
    InvalidPayload,
    InvalidTransition,
    NotFound,
    OperationExists,
    StaleRevision,
)
from checkpoints.models import AuditEvent, Conflict, Effect, EffectRevision, Run
from checkpoints.vocab import ReconcileAnswer
from tests import contract_tables
from tests.api.apihelpers import snapshot
from tests.contract_tables import NEW
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

# CONTRACT.md 3's effect table, read from docs/CONTRACT.md, plus the code's named
# exceptions (tests/contract_tables.py: CODE_BEYOND_CONTRACT).
MOVES = contract_tables.effect_transitions()
STATES = list(contract_tables.effect_states())
allowed = contract_tables.allowed_by_code
# How a runtime (plus a reviewer, for unknown) brings an effect into each state. (The
# runtime's own unresolved -> not_executed is one of the code's named exceptions.)
PATHS = {
    "planned": (),
    "submitted": ("submitted",),
    "confirmed": ("submitted", "confirmed"),
    "failed": ("submitted", "failed"),
    "unresolved": ("submitted", "unresolved"),
    "not_executed": ("submitted", "unresolved", "not_executed"),
    "unknown": ("submitted",),
}


def _destinations(actor: str) -> set[str]:
    return {dst for (src, dst) in MOVES if allowed(src, dst, actor)} | {
        dst for (src, dst, who) in contract_tables.CODE_BEYOND_CONTRACT if who == actor}


def _bring_to(state, wendy, rita, acme, body) -> Effect:
    effect = walk_effect(wendy, acme, body, *PATHS[state])
    if state == "unknown":
        age_world(3600)  # the owner is gone: a reviewer may declare it
        effect = services.effect_mark_unknown(actor=rita, tenant=acme,
                                              effect_id=effect.uuid, reason="no lookup")
    return effect


def _attempt(body: dict, effect: Effect, dst: str) -> dict:
    receipt = {"charge_id": "ch_9"} if dst == "confirmed" else None
    return dict(body, revision=effect.revision + 1, state=dst, receipt=receipt)


def _assert_history_follows_the_table(effect: Effect) -> None:
    """Every recorded step of ``effect`` is a move its recorded source may make (a retry's
    write is recorded as the runtime's)."""
    history = list(EffectRevision.objects.filter(effect=effect).order_by("revision")
                   .values_list("state", "source"))
    previous = NEW
    for state, source in history:
        who = {source} | ({"retry"} if source == "runtime" else set())
        assert any(allowed(previous, state, w) for w in who), (previous, state, source, history)
        previous = state


@pytest.mark.parametrize("state", STATES)
def test_it_creates_an_effect_only_in_the_state_the_table_starts_one_in(acme, wendy, state):
    receipt = {"charge_id": "ch_1"} if state == "confirmed" else None
    attempt = effect_body(state=state, receipt=receipt)
    if allowed(NEW, state, "runtime"):
        assert put_effect(wendy, acme, attempt).state == state
    else:
        before = snapshot()
        with pytest.raises(InvalidTransition):
            put_effect(wendy, acme, attempt)
        assert snapshot() == before
        assert not Effect.objects.exists()


@pytest.mark.parametrize("src", STATES)
@pytest.mark.parametrize("dst", STATES)
def test_it_lets_a_runtime_make_exactly_the_allowed_moves(acme, wendy, rita, src, dst):
    body = effect_body()
    effect = _bring_to(src, wendy, rita, acme, body)
    n = effect.revision
    if allowed(src, dst, "runtime"):
        moved = put_effect(wendy, acme, _attempt(body, effect, dst), expected=n)
        assert (moved.state, moved.revision) == (dst, n + 1)
        assert EffectRevision.objects.filter(effect=moved).count() == n + 2
        _assert_history_follows_the_table(moved)
    else:
        before = snapshot()
        with pytest.raises(InvalidTransition) as exc:
            put_effect(wendy, acme, _attempt(body, effect, dst), expected=n)
        assert exc.value.status == 422
        assert exc.value.body()["error"] == "invalid_transition"
        assert snapshot() == before


RETRY_SOURCES = sorted({src for (src, dst), who in MOVES.items() if "retry" in who})


@pytest.mark.parametrize("src", RETRY_SOURCES)
@pytest.mark.parametrize("dst", STATES)
def test_it_lets_a_consumed_retry_make_exactly_the_allowed_moves(acme, wendy, rita, april,
                                                                 src, dst):
    body = effect_body()
    put_checkpoint(wendy, acme, envelope(run_id=body["run_id"], payload={"phase": "charging"}))
    effect = _bring_to(src, wendy, rita, acme, body)
    _retry_cycle(acme, rita, april, wendy, uuid.UUID(body["run_id"]))
    token = services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                  asked={})["fencing_token"]
    effect.refresh_from_db()
    assert effect.retry_authorized_by is not None
    n = effect.revision
    if allowed(src, dst, "retry") or allowed(src, dst, "runtime"):
        moved = put_effect(wendy, acme, _attempt(body, effect, dst), expected=n, token=token)
        assert (moved.state, moved.revision) == (dst, n + 1)
        _assert_history_follows_the_table(moved)
    else:
        before = snapshot()
        with pytest.raises(InvalidTransition):
            put_effect(wendy, acme, _attempt(body, effect, dst), expected=n, token=token)
        assert snapshot() == before


def test_the_table_gives_the_reviewer_and_the_sweep_only_the_moves_they_have_a_door_for():
    # The reviewer's one effect write is mark-unknown, the sweep's is submitted ->
    # unresolved: a row giving either another destination would be untestable here.
    assert _destinations("reviewer") == {"unknown"}
    assert _destinations("sweep") == {"unresolved"}


@pytest.mark.parametrize("src", STATES)
def test_it_lets_a_reviewer_mark_unknown_only_where_the_table_allows(acme, wendy, rita, src):
    effect = _bring_to(src, wendy, rita, acme, effect_body())
    age_world(3600)  # the owner is gone: a reviewer may declare it
    if allowed(src, "unknown", "reviewer"):
        moved = services.effect_mark_unknown(actor=rita, tenant=acme,
                                             effect_id=effect.uuid, reason="cannot tell")
        assert moved.state == "unknown"
        assert Run.objects.get().recovery_state == "unknown_outcome"
        event = AuditEvent.objects.get(action="effect.mark_unknown")
        assert (event.actor, event.reason, event.before["state"]) == (rita, "cannot tell", src)
        _assert_history_follows_the_table(moved)
    else:
        before = snapshot()
        with pytest.raises(InvalidTransition):
            services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid,
                                         reason="cannot tell")
        assert snapshot() == before


@pytest.mark.parametrize("src", STATES)
def test_it_lets_the_sweep_move_only_what_the_table_allows(acme, wendy, rita, src):
    effect = _bring_to(src, wendy, rita, acme, effect_body())
    sweep_later()
    effect.refresh_from_db()
    if allowed(src, "unresolved", "sweep"):
        assert (effect.state, EffectRevision.objects.filter(effect=effect).last().source) == (
            "unresolved", "sweep")
        _assert_history_follows_the_table(effect)
    else:
        assert effect.state == src
        assert not EffectRevision.objects.filter(effect=effect, source="sweep").exists()


class FixedAnswer:
    """A reconciler plugin (dotted path) that gives the answer the test put in ``KIND``."""

    name = "fixed"
    KIND = reconcile.FOUND

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    def lookup(self, effect):
        return {
            reconcile.FOUND: reconcile.Answer.found({"charge_id": "ch_r"}),
            reconcile.REFUSED: reconcile.Answer.refused({"declined": True}),
            reconcile.NOT_EXECUTED: reconcile.Answer.not_executed("never saw the key"),
            reconcile.NO_LOOKUP: reconcile.Answer.no_lookup(),
        }[FixedAnswer.KIND]


@pytest.mark.parametrize("answer", sorted(ReconcileAnswer.SETTLES))
@pytest.mark.parametrize("src", STATES)
def test_it_lets_reconciliation_make_exactly_the_allowed_moves(
        acme, wendy, rita, src, answer, monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr(FixedAnswer, "KIND", answer)
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin=f"{__name__}.FixedAnswer")
    body = effect_body()
    effect = _bring_to(src, wendy, rita, acme, body)
    age_world(3600)  # the owner is gone and the settle delay has passed
    target = ReconcileAnswer.SETTLES[answer]
    # The table's move, or (the named exception) via unresolved in two recorded steps.
    direct = allowed(src, target, "reconciliation")
    two_steps = (src != "unresolved" and allowed(src, "unresolved", "reconciliation")
                 and allowed("unresolved", target, "reconciliation"))
    if direct or two_steps:
        with django_capture_on_commit_callbacks(execute=True):
            services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                   reason="look it up")
        effect.refresh_from_db()
        assert effect.state == target
        _assert_history_follows_the_table(effect)
        sources = EffectRevision.objects.filter(effect=effect, revision__gt=len(PATHS[src])
                                                ).values_list("source", flat=True)
        assert set(sources) == {"reconciliation"}
    else:
        # Reconciliation only ever starts on an effect in doubt; the table gives it no
        # move from anywhere else.
        assert not any(allowed(src, dst, "reconciliation") for dst in STATES)
        before = snapshot()
        with django_capture_on_commit_callbacks(execute=True), \
                pytest.raises(InvalidTransition):
            services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                   reason="look it up")
        assert snapshot() == before


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
    before = snapshot()
    with pytest.raises(InvalidPayload) as exc:
        put_effect(wendy, acme, dict(body, revision=1, state="submitted", **{field: value}),
                   expected=0)
    assert exc.value.detail.startswith(field)
    assert snapshot() == before


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
    before = snapshot()
    with pytest.raises(NotFound):
        put_effect(wendy, acme, effect_body(revision=1, state="submitted"), expected=0)
    assert snapshot() == before  # no effect, and no run for its run_id either


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
