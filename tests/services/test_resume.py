"""Resume decisions through ``services.resume_claim`` (and ``resume_preview``), with state
built by real writes: every action and reason of CONTRACT.md 3, the consumption of an
approved retry by the claim, and a preview that changes nothing."""

from __future__ import annotations

import uuid

import pytest

from checkpoints import kinds, services
from checkpoints.exceptions import Fenced, Forbidden, NotFound
from checkpoints.models import AuditEvent, RetryRequest, Run
from tests.api.apihelpers import snapshot
from tests.helpers import (
    age_world,
    effect_body,
    envelope,
    put_checkpoint,
    put_effect,
    sweep_later,
    walk_effect,
)

AGENT = {"execution_id": "x", "agent": "refund-assistant",
         "model": {"provider": "openai", "name": "gpt-4.1-mini"}, "transcript": [],
         "turns": 0, "tool_calls": 0, "delegations": 0, "usage": {},
         "phase": {"state": "ready_for_turn"}}


def resume(acme, wendy, body, **asked):
    return services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                 asked=asked)


def _checkpoint(acme, wendy, phase="ready", **kw):
    body = envelope(payload={"phase": phase}, **kw)
    cp = put_checkpoint(wendy, acme, body)
    return body, cp


def test_it_continues_from_a_stable_checkpoint(acme, wendy):
    body, cp = _checkpoint(acme, wendy, "charged")
    assert resume(acme, wendy, body) == {"action": "continue", "reason": "stable",
                                         "checkpoint_id": str(cp.uuid), "revision": 0,
                                         "fencing_token": 0}


def test_it_replays_a_completed_run(acme, wendy):
    body, _ = _checkpoint(acme, wendy, "completed")
    assert resume(acme, wendy, body)["action"] == "replay"


def test_it_rejects_an_in_flight_checkpoint(acme, wendy):
    body, _ = _checkpoint(acme, wendy, "charging")
    assert (resume(acme, wendy, body)["action"], resume(acme, wendy, body)["reason"]) == (
        "reject", "in_flight")


def test_it_rejects_an_unsupported_schema(acme, wendy):
    body = envelope(kind="runifold.workflow", schema_version=2, payload={})
    put_checkpoint(wendy, acme, body)
    assert resume(acme, wendy, body)["reason"] == "unsupported_schema"


@pytest.fixture
def acme_offline():
    """``acme.order`` migrates offline for the test (issue 19, item 2), lazy again after."""
    kinds.set_migration_mode("acme.order", "offline")
    yield
    kinds.set_migration_mode("acme.order", "lazy")


def _order(acme, wendy, version: int, phase: str = "charged"):
    amount = {"amount_cents": 2599} if version == 1 else {
        "amount": {"cents": 2599, "currency": "USD"}}
    body = envelope(schema_version=version, payload={"phase": phase, **amount})
    put_checkpoint(wendy, acme, body)
    return body


@pytest.mark.parametrize("version", [1, 2])
def test_a_lazy_kind_resumes_its_older_versions(acme, wendy, version):
    assert kinds.registered()["acme.order"] == [1, 2]
    body = _order(acme, wendy, version)
    assert (resume(acme, wendy, body)["action"], resume(acme, wendy, body)["reason"]) == (
        "continue", "stable")


@pytest.mark.parametrize("phase", ["charged", "completed", "charging"])
def test_an_offline_kind_refuses_to_resume_an_older_version(acme, wendy, acme_offline, phase):
    body = _order(acme, wendy, 1, phase)
    run_id = uuid.UUID(body["run_id"])
    preview = services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
    claim = resume(acme, wendy, body)
    for answer in (preview, claim):
        assert (answer["action"], answer["reason"]) == ("reject", "migration_required")
    newest = _order(acme, wendy, 2, phase)
    assert resume(acme, wendy, newest)["reason"] != "migration_required"


@pytest.mark.parametrize(("asked", "action"), [
    ({"agent": "refund-assistant", "model": "openai/gpt-4.1-mini"}, "continue"),
    ({"agent": "other"}, "reject"),
    ({"model": "openai/gpt-4o"}, "reject"),
    ({"workflow": "refund-approval"}, "reject"),
    ({"definition_version": "1"}, "reject"),
])
def test_it_checks_each_identity_parameter_given(acme, wendy, asked, action):
    body = envelope(kind="runifold.agent", payload=AGENT)
    put_checkpoint(wendy, acme, body)
    decision = resume(acme, wendy, body, **asked)
    assert decision["action"] == action
    if action == "reject":
        assert decision["reason"] == "identity_mismatch"


def test_it_asks_for_reconciliation_while_an_effect_is_in_doubt(acme, wendy):
    body, _ = _checkpoint(acme, wendy, "charging")
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted")
    assert (resume(acme, wendy, body)["action"], resume(acme, wendy, body)["reason"]) == (
        "reconcile", "effects_in_doubt")


def test_it_rejects_an_unknown_outcome_until_a_human_decides(acme, wendy, rita, april):
    body, _ = _checkpoint(acme, wendy, "charging")
    effect = walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted")
    age_world(3600)  # the owner is gone: a reviewer may declare it
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid,
                                 reason="the processor has no lookup")
    assert resume(acme, wendy, body)["reason"] == "outcome_unknown"
    retry = services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                   reason="charge at most once more")
    assert resume(acme, wendy, body)["reason"] == "awaiting_approval"
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    assert Run.objects.get().recovery_state == "retry_approved"


def test_it_consumes_an_approved_retry_once_and_fences_the_old_owner(acme, wendy, rita, april):
    body, _ = _checkpoint(acme, wendy, "charging")
    run_id = uuid.UUID(body["run_id"])
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w1", ttl_s=1)
    sweep_later()  # w1 went quiet: its lease expired, the run is ambiguous
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    decision = resume(acme, wendy, body)
    assert (decision["action"], decision["reason"], decision["fencing_token"]) == (
        "retry", "retry_approved", 2)
    retry.refresh_from_db()
    assert (retry.state, retry.consumed_fencing_token) == ("consumed", 2)
    run = Run.objects.get()
    assert (run.lease_owner, run.fencing_token) == ("", 2)
    assert AuditEvent.objects.filter(action="retry.consume").count() == 1
    # The old owner's token is refused; the second call is no longer a retry.
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0, token=1)
    with pytest.raises(Fenced):  # leaving the header out does not get past the fence
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    assert put_checkpoint(wendy, acme, dict(body, revision=1), expected=0, token=2).revision == 1
    assert resume(acme, wendy, body)["action"] == "reject"
    assert RetryRequest.objects.get().state == "consumed"


def test_it_rejects_a_run_without_a_checkpoint(acme, wendy):
    body = effect_body()
    put_effect(wendy, acme, body)
    assert resume(acme, wendy, body)["reason"] == "no_checkpoint"


def test_it_answers_not_found_for_an_unknown_run_and_refuses_readers(acme, wendy, vic):
    with pytest.raises(NotFound):
        resume(acme, wendy, envelope())
    assert not Run.objects.exists()
    body, _ = _checkpoint(acme, wendy)
    before = snapshot()
    with pytest.raises(Forbidden):
        resume(acme, vic, body)
    assert snapshot() == before
