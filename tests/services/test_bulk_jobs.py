"""Bulk actions as stored jobs (issue 22, item 6): a selection above ``BULK_MAX_RUNS`` is
stored ``queued`` and run by a worker (``jobs.bulk.execute``; the sweep's
``bulk_jobs_redrive`` without a broker), each run in its own transaction with its result
row and the job's counts; a reviewer may abort it (the runs done stay done, no run is
acted on after); a worker that vanished leaves a ``running`` job whose claim passes, and
the re-drive resumes it without acting on any run twice.

Runs are inserted as rows (``many_runs``): the test is about the job, not the writes.
Most tests lower ``BULK_MAX_RUNS`` to 3 so a handful of runs make a job; one runs 610.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from checkpoints import selectors, services
from checkpoints.dbclock import NOW
from checkpoints.exceptions import AlreadyDone, Forbidden, InvalidTransition, NotFound
from checkpoints.jobs import bulk as bulk_job
from checkpoints.models import (
    BULK_MAX_RUNS,
    AuditEvent,
    BulkAction,
    BulkActionItem,
    Run,
)
from checkpoints.vocab import AuditAction, BulkOutcome, BulkState, PhaseClass, RecoveryState

pytestmark = pytest.mark.django_db


def many_runs(tenant, n: int) -> list[uuid.UUID]:
    """``n`` healthy runs of ``tenant``, inserted as rows (oldest first)."""
    rows = [Run(tenant=tenant, uuid=uuid.uuid4(), kind="acme.order", workflow="acme.order",
                phase_class=PhaseClass.STABLE, phase_label=f"ready {i}",
                recovery_state=RecoveryState.HEALTHY) for i in range(n)]
    Run.objects.for_tenant(tenant).bulk_create(rows, batch_size=1000)
    return [r.uuid for r in rows]


def submit(actor, tenant, runs, *, action="close", token=None):
    return services.bulk_submit(actor=actor, tenant=tenant, action=action,
                                reason="incident 42", client_token=token or uuid.uuid4(),
                                run_ids=[str(r) for r in runs])


def closed(runs) -> int:
    return Run.objects.filter(uuid__in=runs, closed_at__isnull=False).count()


def events(bulk, action) -> list[AuditEvent]:
    return [e for e in AuditEvent.objects.filter(action=action).order_by("seq")
            if e.target_ref == str(bulk.uuid)
            or (isinstance(e.after, dict) and e.after.get("bulk_id") == str(bulk.uuid))]


@pytest.fixture
def small_jobs(monkeypatch):
    """More than 3 runs make a job; batches of 2."""
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    monkeypatch.setattr(bulk_job, "BATCH", 2)


def test_more_than_the_inline_maximum_is_a_job_the_worker_finishes(acme, wendy, rita):
    runs = many_runs(acme, BULK_MAX_RUNS + 110)

    bulk, created = submit(rita, acme, runs)

    # Answered at once, nothing acted on in the request: a stored job.
    assert created and bulk.background and bulk.state == BulkState.QUEUED
    assert closed(runs) == 0 and not BulkActionItem.objects.exists()
    [submitted] = AuditEvent.objects.filter(action=AuditAction.BULK_SUBMIT)
    assert submitted.after == {"action": "close", "runs": 610, "job": True,
                               "fingerprint": bulk.fingerprint}

    result = bulk_job.execute(bulk.pk)

    assert result["result"] == "finished"
    bulk.refresh_from_db()
    assert (bulk.state, bulk.done, bulk.refused, bulk.failed) == (BulkState.FINISHED, 610, 0, 0)
    assert bulk.finished_at is not None and bulk.claimed_until is None
    assert closed(runs) == 610
    items = list(BulkActionItem.objects.filter(bulk=bulk).order_by("position"))
    assert [i.run_uuid for i in items] == runs  # each run once, in the selection's order
    assert len(events(bulk, AuditAction.RUN_CLOSE)) == 610
    [finish] = events(bulk, AuditAction.BULK_FINISH)
    assert finish.after == {"state": "finished", "done": 610, "refused": 0, "failed": 0}
    # The result page's reading: counts from the row, nothing pending.
    got = selectors.bulk_get(user=rita, tenant=acme, bulk_id=bulk.uuid)
    assert (got.done, got.pending) == (610, 0)


def test_every_run_matching_filters_beyond_the_inline_maximum(acme, rita, small_jobs):
    runs = many_runs(acme, 5)
    filters = selectors.RunFilters(recovery_state=RecoveryState.HEALTHY)

    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="close", reason="x",
                                   client_token=uuid.uuid4(), filters=filters)

    assert bulk.background and sorted(bulk.targets) == sorted(str(r) for r in runs)
    assert services.bulk_jobs_redrive() == 1  # the in-process worker's sweep runs it
    bulk.refresh_from_db()
    assert (bulk.state, bulk.done) == (BulkState.FINISHED, 5) and closed(runs) == 5


def test_refusals_are_counted_and_the_job_goes_on(acme, globex, rita, small_jobs):
    runs = many_runs(acme, 4)
    services.run_close(actor=rita, tenant=acme, run_id=runs[1], reason="by hand")
    elsewhere = many_runs(globex, 1)

    bulk, _ = submit(rita, acme, [*runs, *elsewhere])
    bulk_job.execute(bulk.pk)

    bulk.refresh_from_db()
    assert (bulk.state, bulk.done, bulk.refused) == (BulkState.FINISHED, 3, 2)
    items = {i.run_uuid: i for i in BulkActionItem.objects.filter(bulk=bulk)}
    assert items[runs[1]].error == "invalid_transition"
    assert items[elsewhere[0]].error == "not_found"
    assert Run.objects.get(uuid=elsewhere[0]).closed_at is None


def test_abort_between_batches_stops_it_and_leaves_the_done_runs_done(acme, rita, small_jobs):
    runs = many_runs(acme, 7)
    bulk, _ = submit(rita, acme, runs)

    # The in-process worker's slice: one batch (2 runs), then back to queued.
    assert bulk_job.execute(bulk.pk, budget_s=0)["result"] == "paused"
    bulk.refresh_from_db()
    assert (bulk.state, bulk.done) == (BulkState.QUEUED, 2)

    aborted = services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid,
                                  reason="wrong filter")

    assert aborted.state == BulkState.ABORTED and aborted.finished_at is not None
    assert (aborted.aborted_by_name, aborted.abort_reason) == ("rita", "wrong filter")
    [event] = events(bulk, AuditAction.BULK_ABORT)
    assert (event.reason, event.before, event.after) == (
        "wrong filter", {"state": "queued"}, {"state": "aborted"})
    # The worker finds nothing to do; the sweep does not pick it up again.
    assert bulk_job.execute(bulk.pk)["result"] == "skipped"
    assert services.bulk_jobs_redrive() == 0
    assert closed(runs) == 2 and BulkActionItem.objects.filter(bulk=bulk).count() == 2
    got = selectors.bulk_get(user=rita, tenant=acme, bulk_id=bulk.uuid)
    assert (got.done, got.pending) == (2, 5)
    # Twice: who and when.
    with pytest.raises(AlreadyDone, match="^bulk: already aborted by rita at "):
        services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason="again")
    assert len(events(bulk, AuditAction.BULK_ABORT)) == 1


def test_abort_while_a_worker_holds_it_stops_it_before_its_next_run(acme, rita, small_jobs):
    runs = many_runs(acme, 5)
    bulk, _ = submit(rita, acme, runs)
    job = bulk_job._claim(bulk.pk)
    assert services.bulk_job_act(job, 0, runs[0], actor=rita, claim_s=60) == BulkOutcome.DONE

    services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason="stop")

    with pytest.raises(services.BulkJobLost):
        services.bulk_job_act(job, 1, runs[1], actor=rita, claim_s=60)
    with pytest.raises(services.BulkJobLost):
        services.bulk_job_finish(job)
    assert closed(runs) == 1  # the run after the abort was rolled back with its result
    bulk.refresh_from_db()
    assert (bulk.state, bulk.done) == (BulkState.ABORTED, 1)
    assert BulkActionItem.objects.filter(bulk=bulk).count() == 1


def test_a_vanished_worker_is_resumed_without_acting_on_a_run_twice(acme, rita, small_jobs):
    runs = many_runs(acme, 6)
    bulk, _ = submit(rita, acme, runs)
    # A worker claims it, does three runs, and dies (its claim still live).
    job = bulk_job._claim(bulk.pk)
    for position in range(3):
        services.bulk_job_act(job, position, runs[position], actor=rita, claim_s=60)
    assert services.bulk_jobs_redrive() == 0  # a live claim: not taken over
    assert bulk_job.execute(bulk.pk)["result"] == "skipped"

    BulkAction.objects.filter(pk=bulk.pk).update(claimed_until=NOW - timedelta(seconds=1))
    assert services.bulk_jobs_redrive() == 1

    bulk.refresh_from_db()
    assert (bulk.state, bulk.done, bulk.attempts) == (BulkState.FINISHED, 6, 2)
    assert "vanished" in bulk.last_error or bulk.last_error == ""
    assert closed(runs) == 6
    assert BulkActionItem.objects.filter(bulk=bulk).count() == 6
    assert len(events(bulk, AuditAction.RUN_CLOSE)) == 6  # none closed twice
    # The dead worker's attempt cannot write any more.
    with pytest.raises(services.BulkJobLost):
        services.bulk_job_act(job, 3, runs[3], actor=rita, claim_s=60)


def test_an_outage_is_retried_then_gives_up_visibly(acme, rita, small_jobs, monkeypatch):
    runs = many_runs(acme, 4)
    bulk, _ = submit(rita, acme, runs)

    def down(*args, **kwargs):
        raise ConnectionError("database went away")

    monkeypatch.setattr(services, "bulk_job_act", down)
    for attempt in range(1, bulk_job.MAX_FAILURES + 1):
        BulkAction.objects.filter(pk=bulk.pk).update(next_attempt_at=NOW)
        result = bulk_job.execute(bulk.pk)["result"]
        assert result == ("failed" if attempt == bulk_job.MAX_FAILURES else "retry")
    bulk.refresh_from_db()
    assert bulk.state == BulkState.FAILED and "database went away" in bulk.last_error


def test_a_requester_who_lost_the_right_fails_the_job(acme, rita, small_jobs):
    runs = many_runs(acme, 4)
    bulk, _ = submit(rita, acme, runs)
    services.role_revoke(actor=None, tenant=acme, user=rita, role="reviewer")

    assert bulk_job.execute(bulk.pk)["result"] == "failed"

    bulk.refresh_from_db()
    assert bulk.state == BulkState.FAILED and "no longer holds" in bulk.last_error
    assert closed(runs) == 0


def once_acted_on(monkeypatch, position: int, then) -> None:
    """Have the worker call ``then()`` right after its run at ``position`` committed (in
    the middle of a batch), as another request would, through its own user object."""
    act = services.bulk_job_act

    def acting(job, at, run_id, **kwargs):
        outcome = act(job, at, run_id, **kwargs)
        if at == position:
            then()
        return outcome

    monkeypatch.setattr(services, "bulk_job_act", acting)


def stopped_at_the_next_batch(bulk, runs, words: str) -> None:
    """The job (7 runs, batches of 2, the right lost during the run at position 2) ran
    its second batch to the end as read before it, then stopped: failed, saying why,
    nothing acted on after, every count equal to its result rows."""
    bulk.refresh_from_db()
    assert bulk.state == BulkState.FAILED and bulk.finished_at is not None
    assert words in bulk.last_error and "stopped after 4 of 7 runs" in bulk.last_error
    assert (bulk.done, bulk.refused, bulk.failed) == (4, 0, 0)
    assert set(Run.objects.filter(uuid__in=runs, closed_at__isnull=False)
               .values_list("uuid", flat=True)) == set(runs[:4])
    assert BulkActionItem.objects.filter(bulk=bulk).count() == 4
    assert len(events(bulk, AuditAction.RUN_CLOSE)) == 4
    assert not events(bulk, AuditAction.BULK_FINISH)


@pytest.mark.parametrize("left", [None, "viewer"])
def test_a_role_revoked_mid_job_stops_it_at_the_next_batch(acme, rita, small_jobs,
                                                            monkeypatch, left):
    # stop 34's attack: the rights read at the claim were kept on the job's user object, so every later
    # check (before each batch, and each run's service) answered "reviewer" still.
    runs = many_runs(acme, 7)
    bulk, _ = submit(rita, acme, runs)
    if left:
        services.role_grant(actor=None, tenant=acme, user=rita, role=left)
    once_acted_on(monkeypatch, 2, lambda: services.role_revoke(
        actor=None, tenant=acme, user=rita, role="reviewer"))

    assert bulk_job.execute(bulk.pk)["result"] == "failed"

    stopped_at_the_next_batch(bulk, runs, "rita no longer holds the review right in "
                              f"this tenant ({'forbidden' if left else 'not_found'})")


def test_an_account_deactivated_mid_job_stops_it_at_the_next_batch(acme, rita, small_jobs,
                                                                   monkeypatch):
    # stop 34's attack: the job's user object, read at the claim, kept is_active=True.
    runs = many_runs(acme, 7)
    bulk, _ = submit(rita, acme, runs)
    once_acted_on(monkeypatch, 2, lambda: services.account_deactivate(user=rita))

    assert bulk_job.execute(bulk.pk)["result"] == "failed"

    stopped_at_the_next_batch(bulk, runs, "rita's account was deactivated")


def test_abort_rights_and_refusals(acme, globex, rita, vic, omar, small_jobs):
    runs = many_runs(acme, 4)
    bulk, _ = submit(rita, acme, runs)
    inline, _ = submit(rita, acme, runs[:1])

    with pytest.raises(Forbidden):
        services.bulk_abort(actor=vic, tenant=acme, bulk_id=bulk.uuid, reason="x")
    with pytest.raises(NotFound):  # no role in acme
        services.bulk_abort(actor=omar, tenant=acme, bulk_id=bulk.uuid, reason="x")
    with pytest.raises(NotFound):  # acme's bulk seen from globex
        services.bulk_abort(actor=omar, tenant=globex, bulk_id=bulk.uuid, reason="x")
    with pytest.raises(InvalidTransition, match="^bulk: it ran in the request"):
        services.bulk_abort(actor=rita, tenant=acme, bulk_id=inline.uuid, reason="x")
    with pytest.raises(Exception) as raised:  # noqa: B017 - no reason
        services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason=" ")
    assert raised.value.error == "reason_required"
    bulk.refresh_from_db()
    assert bulk.state == BulkState.QUEUED
    assert not AuditEvent.objects.filter(action=AuditAction.BULK_ABORT).exists()


def test_a_finished_job_cannot_be_aborted(acme, rita, small_jobs):
    bulk, _ = submit(rita, acme, many_runs(acme, 4))
    bulk_job.execute(bulk.pk)
    with pytest.raises(AlreadyDone, match="^bulk: already finished at "):
        services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason="late")
