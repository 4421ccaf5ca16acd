"""Bulk actions (issue 9, item 3): ``services.bulk_submit`` acts on each run with the
single action's own service, each run in its own transaction; a refusal is that run's
result and never stops or rolls back the others; the same client token runs once; each
run's audit event carries the bulk id; another tenant's run is "not found", untouched.
"""

from __future__ import annotations

import uuid

import pytest

from checkpoints import selectors, services
from checkpoints.exceptions import Forbidden, InvalidPayload, ReasonRequired
from checkpoints.models import (
    BULK_JOB_MAX_RUNS,
    AuditEvent,
    BulkAction,
    BulkActionItem,
    Conflict,
    Effect,
    ReconcileRequest,
    RetryRequest,
    Run,
)
from checkpoints.vocab import AuditAction, BulkOutcome, BulkState, EffectState, RecoveryState
from tests.faults.conftest import in_doubt_run
from tests.helpers import age_world, ambiguous_run, envelope, put_checkpoint

pytestmark = pytest.mark.django_db


def submit(actor, tenant, action, runs=None, *, token=None, reason="incident 42", filters=None):
    return services.bulk_submit(
        actor=actor, tenant=tenant, action=action, reason=reason,
        client_token=token or uuid.uuid4(),
        run_ids=None if runs is None else [str(r) for r in runs], filters=filters)


def results(bulk) -> dict:
    """run id -> (outcome, error, detail)."""
    return {i.run_uuid: (i.outcome, i.error, i.detail)
            for i in BulkActionItem.objects.filter(bulk=bulk).order_by("position")}


def bulk_events(bulk) -> list[AuditEvent]:
    """Every audit event of a run action carrying this bulk's id."""
    return [e for e in AuditEvent.objects.order_by("seq")
            if isinstance(e.after, dict) and e.after.get("bulk_id") == str(bulk.uuid)]


def state(run_id) -> str:
    return Run.objects.get(uuid=run_id).recovery_state


def healthy_run(writer, tenant) -> uuid.UUID:
    body = envelope(payload={"phase": "ready", "order_id": "A-7"})
    put_checkpoint(writer, tenant, body)
    return uuid.UUID(body["run_id"])


# --------------------------------------------------------------------------------------
# Each action in bulk, with mixed outcomes
# --------------------------------------------------------------------------------------

def test_bulk_reconcile_acts_on_each_in_doubt_run_and_refuses_the_others(
        acme, globex, wendy, rita, wes):
    one = in_doubt_run(wendy, acme, ("charge:A-1",))
    two = in_doubt_run(wendy, acme, ("charge:A-2", "ship:A-2"))
    age_world(3600)  # the owners went quiet: reconciling is allowed
    live = in_doubt_run(wendy, acme, ("charge:A-3",), lease_ttl=600)
    calm = healthy_run(wendy, acme)
    theirs = in_doubt_run(wes, globex, ("charge:G-1",))
    age_world(3600)
    ghost = uuid.uuid4()
    # the lease above was aged too: take it again so that owner is live
    services.lease_acquire(actor=wendy, tenant=acme, run_id=live.run_id, owner="worker-1",
                           ttl_s=600)

    bulk, created = submit(rita, acme, "reconcile",
                           [one.run_id, live.run_id, calm, two.run_id, theirs.run_id, ghost])

    assert created and bulk.state == BulkState.FINISHED
    got = results(bulk)
    assert list(got) == [one.run_id, live.run_id, calm, two.run_id, theirs.run_id, ghost]
    assert got[one.run_id][0] == BulkOutcome.DONE
    assert got[two.run_id][:2] == (BulkOutcome.DONE, "")
    assert "2 effects" in got[two.run_id][2]
    assert got[live.run_id][:2] == (BulkOutcome.REFUSED, "owner_live")
    assert "worker-1 is live until" in got[live.run_id][2]
    assert got[calm][:2] == (BulkOutcome.REFUSED, "invalid_transition")
    assert got[calm][2] == "no effect is submitted or unresolved"
    assert got[theirs.run_id] == (BulkOutcome.REFUSED, "not_found", "not found in this tenant")
    assert got[ghost][:2] == (BulkOutcome.REFUSED, "not_found")
    assert (bulk.total, bulk.done, bulk.refused, bulk.failed) == (6, 2, 4, 0)
    # what was refused wrote nothing; the other tenant's run is untouched
    assert not ReconcileRequest.objects.filter(run__uuid__in=[live.run_id, calm]).exists()
    assert not ReconcileRequest.objects.filter(run__uuid=theirs.run_id).exists()
    assert ReconcileRequest.objects.filter(run__uuid=two.run_id).count() == 2
    # each done run: its own usual audit event, carrying the bulk id
    events = bulk_events(bulk)
    assert [(e.action, e.run_uuid) for e in events] == [
        (AuditAction.RUN_RECONCILE, one.run_id), (AuditAction.RUN_RECONCILE, two.run_id)]
    assert all(e.actor_name == "rita" and e.reason == "incident 42" for e in events)
    # the request and its end are audited too
    assert AuditEvent.objects.filter(action=AuditAction.BULK_SUBMIT,
                                     target_ref=str(bulk.uuid)).count() == 1
    finish = AuditEvent.objects.get(action=AuditAction.BULK_FINISH, target_ref=str(bulk.uuid))
    assert finish.after == {"state": "finished", "done": 2, "refused": 4, "failed": 0}
    assert services.audit_verify(tenant=acme)[0]
    assert services.audit_verify(tenant=globex)[0]
    assert not [e for e in AuditEvent.objects.filter(tenant=globex)
                if isinstance(e.after, dict) and "bulk_id" in e.after]


def test_bulk_mark_unknown_marks_every_in_doubt_effect_of_each_run(acme, wendy, rita):
    two = in_doubt_run(wendy, acme, ("charge:A-1", "ship:A-1"))
    age_world(3600)
    live = in_doubt_run(wendy, acme, ("charge:A-2",), lease_ttl=600)

    bulk, _ = submit(rita, acme, "mark_unknown", [two.run_id, live.run_id])

    got = results(bulk)
    assert got[two.run_id] == (BulkOutcome.DONE, "", "2 effects marked outcome unknown")
    assert got[live.run_id][:2] == (BulkOutcome.REFUSED, "owner_live")
    assert set(Effect.objects.filter(run__uuid=two.run_id).values_list("state", flat=True)) \
        == {EffectState.UNKNOWN}
    assert Effect.objects.get(run__uuid=live.run_id).state == EffectState.SUBMITTED
    events = bulk_events(bulk)
    assert sorted(e.target_ref for e in events) == sorted(str(e) for e in two.effects.values())
    assert {e.action for e in events} == {AuditAction.EFFECT_MARK_UNKNOWN}


def test_bulk_retry_request_asks_for_in_doubt_runs_and_says_why_not_for_healthy_ones(
        acme, wendy, rita):
    stuck = ambiguous_run(wendy, acme)
    calm = healthy_run(wendy, acme)

    bulk, _ = submit(rita, acme, "request_retry", [stuck, calm])

    got = results(bulk)
    assert got[stuck][0] == BulkOutcome.DONE
    # Written just now, its owner counts as live: refused owner_live before its state
    # (CONTRACT.md 3; stop 39), which says when the owner is gone.
    assert got[calm][:2] == (BulkOutcome.REFUSED, "owner_live")
    assert "live until" in got[calm][2]
    assert RetryRequest.objects.get().run.uuid == stuck
    assert [e.action for e in bulk_events(bulk)] == [AuditAction.RETRY_REQUEST]


def test_bulk_close_closes_each_run_once(acme, wendy, rita):
    a, b = healthy_run(wendy, acme), ambiguous_run(wendy, acme)
    services.run_close(actor=rita, tenant=acme, run_id=b, reason="done by hand")

    bulk, _ = submit(rita, acme, "close", [a, b])

    got = results(bulk)
    assert got[a][0] == BulkOutcome.DONE and state(a) == RecoveryState.CLOSED
    outcome, error, detail = got[b]
    assert (outcome, error) == (BulkOutcome.REFUSED, "invalid_transition")
    assert detail.startswith("already closed by rita at ")  # who and when (AlreadyDone)
    assert Run.objects.get(uuid=b).closed_reason == "done by hand"  # not overwritten
    assert [(e.action, e.run_uuid) for e in bulk_events(bulk)] == [(AuditAction.RUN_CLOSE, a)]


def test_bulk_acknowledge_conflicts(acme, wendy, rita):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(Exception):  # noqa: B017 - a stale write: kept as a conflict
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    run_id = uuid.UUID(body["run_id"])
    assert state(run_id) == RecoveryState.CONFLICTED

    bulk, _ = submit(rita, acme, "acknowledge_conflicts", [run_id])

    assert results(bulk)[run_id] == (BulkOutcome.DONE, "", "1 conflict acknowledged")
    assert not Conflict.objects.filter(acknowledged_at__isnull=True).exists()
    assert state(run_id) != RecoveryState.CONFLICTED


def test_all_runs_matching_filters(acme, wendy, rita):
    stuck = [ambiguous_run(wendy, acme) for _ in range(3)]
    calm = healthy_run(wendy, acme)
    filters = selectors.RunFilters(recovery_state=RecoveryState.AMBIGUOUS)

    bulk, _ = submit(rita, acme, "close", filters=filters, token=(token := uuid.uuid4()))

    assert set(results(bulk)) == set(stuck)
    assert bulk.selection == {"filters": {"recovery_state": "ambiguous", "kind": None,
                                          "subject": None, "age_s_min": None, "q": None}}
    assert state(calm) == RecoveryState.HEALTHY
    # Resubmitted: the filters now match nothing, yet it is the same request: its results.
    again, created = submit(rita, acme, "close", filters=filters, token=token)
    assert (again.pk, created) == (bulk.pk, False)


# --------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------

def test_the_same_token_runs_once_and_answers_the_first_results(acme, wendy, rita):
    a, b = healthy_run(wendy, acme), healthy_run(wendy, acme)
    token = uuid.uuid4()
    first, created = submit(rita, acme, "close", [a, b], token=token)
    events = AuditEvent.objects.count()

    again, created_again = submit(rita, acme, "close", [a, b], token=token)

    assert created and not created_again
    assert again.pk == first.pk and again.state == BulkState.FINISHED
    assert (again.done, again.refused) == (2, 0)  # not "already closed" twice
    assert AuditEvent.objects.count() == events
    assert BulkAction.objects.count() == 1 and BulkActionItem.objects.count() == 2


def test_a_token_reused_for_another_request_is_refused_naming_it(acme, wendy, rita, april):
    a, b = healthy_run(wendy, acme), healthy_run(wendy, acme)
    token = uuid.uuid4()
    submit(rita, acme, "close", [a], token=token)
    before = (BulkAction.objects.count(), AuditEvent.objects.count())
    for action, runs, reason in (("close", [b], "incident 42"),
                                 ("close", [a], "another reason"),
                                 ("acknowledge_conflicts", [a], "incident 42")):
        with pytest.raises(InvalidPayload, match="^client_token: already used"):
            submit(rita, acme, action, runs, token=token, reason=reason)
    assert (BulkAction.objects.count(), AuditEvent.objects.count()) == before


def test_a_token_is_per_requester(acme, wendy, rita, adam):
    # Another reviewer's form cannot pick up rita's results by sending her token.
    a = healthy_run(wendy, acme)
    token = uuid.uuid4()
    mine, _ = submit(rita, acme, "acknowledge_conflicts", [a], token=token)
    theirs, created = submit(adam, acme, "acknowledge_conflicts", [a], token=token)
    assert created and theirs.pk != mine.pk


# --------------------------------------------------------------------------------------
# Bad input and rights: nothing written
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "field"), [
    ({"action": "delete"}, InvalidPayload, "action"),
    ({"runs": []}, InvalidPayload, "run_ids"),
    ({"runs": ["not-a-uuid"]}, InvalidPayload, "run_ids"),
    ({"runs": [str(uuid.uuid4()) for _ in range(BULK_JOB_MAX_RUNS + 1)]}, InvalidPayload,
     "run_ids"),
    ({"reason": "  "}, ReasonRequired, "reason"),
    ({"reason": "x" * 4001}, InvalidPayload, "reason"),
    ({"token": "not-a-token"}, InvalidPayload, "client_token"),
    ({"runs": None}, InvalidPayload, "run_ids"),
    ({"filters": selectors.RunFilters(recovery_state=RecoveryState.CONFLICTED)},
     InvalidPayload, "run_ids"),  # both
])
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(acme, wendy, rita, kwargs,
                                                                   error, field):
    a = healthy_run(wendy, acme)
    args = {"action": "close", "runs": [a]} | kwargs
    before = (AuditEvent.objects.count(), Run.objects.get(uuid=a).closed_at)
    with pytest.raises(error, match=f"^{field}: "):
        submit(rita, acme, args.pop("action"), args.pop("runs"), **args)
    assert not BulkAction.objects.exists()
    assert (AuditEvent.objects.count(), Run.objects.get(uuid=a).closed_at) == before


def test_filters_matching_nothing_or_too_many_are_refused(acme, wendy, rita, monkeypatch):
    ambiguous_run(wendy, acme)
    ambiguous_run(wendy, acme)
    with pytest.raises(InvalidPayload, match="^filters: no run matches"):
        submit(rita, acme, "close",
               filters=selectors.RunFilters(recovery_state=RecoveryState.CONFLICTED))
    monkeypatch.setattr("checkpoints.services.bulk.BULK_JOB_MAX_RUNS", 1)
    with pytest.raises(InvalidPayload, match="^filters: more than 1 runs match"):
        submit(rita, acme, "close",
               filters=selectors.RunFilters(recovery_state=RecoveryState.AMBIGUOUS))
    assert not BulkAction.objects.exists()
    assert not Run.objects.filter(closed_at__isnull=False).exists()


def test_rights_are_the_single_actions(acme, globex, wendy, vic, omar):
    a = healthy_run(wendy, acme)
    with pytest.raises(Forbidden):
        submit(vic, acme, "close", [a])
    with pytest.raises(Exception) as raised:  # noqa: B017 - no role in acme: not found
        submit(omar, acme, "close", [a])
    assert raised.value.status == 404
    assert not BulkAction.objects.exists()


def test_an_unexpected_error_in_one_run_does_not_stop_the_others(acme, wendy, rita,
                                                                  monkeypatch):
    a, b = healthy_run(wendy, acme), healthy_run(wendy, acme)
    from checkpoints.services import bulk as bulk_module

    real = bulk_module.ACTIONS["close"]

    def flaky(*, run_id, **kwargs):
        if run_id == a:
            raise RuntimeError("disk on fire")
        return real(run_id=run_id, **kwargs)

    monkeypatch.setitem(bulk_module.ACTIONS, "close", flaky)
    bulk, _ = submit(rita, acme, "close", [a, b])
    got = results(bulk)
    assert got[a][:2] == (BulkOutcome.FAILED, "RuntimeError")
    assert got[b][0] == BulkOutcome.DONE
    assert (bulk.done, bulk.failed) == (1, 1) and bulk.state == BulkState.FINISHED


def test_a_failed_audit_in_one_run_rolls_back_that_run_only(acme, wendy, rita, monkeypatch):
    from checkpoints import audit

    a, b = healthy_run(wendy, acme), healthy_run(wendy, acme)
    real = audit.new_event

    def down_for_a(**kwargs):
        if kwargs["action"] == AuditAction.RUN_CLOSE and kwargs["run_id"] == a:
            raise RuntimeError("audit store down")
        return real(**kwargs)

    monkeypatch.setattr(audit, "new_event", down_for_a)
    bulk, _ = submit(rita, acme, "close", [a, b])
    got = results(bulk)
    assert got[a][0] == BulkOutcome.FAILED and got[b][0] == BulkOutcome.DONE
    assert Run.objects.get(uuid=a).closed_at is None  # nothing of a's close was kept
    assert Run.objects.get(uuid=b).closed_at is not None
    assert services.audit_verify(tenant=acme)[0]
