"""Bulk actions raced on real PostgreSQL (issue 9, item 3): the same bulk request (same
client token) submitted by several threads at once acts once. The unique constraint
``bulk_one_per_client_token`` decides: the losers' INSERT waits for the winner's commit,
then finds its row and answers it (``created`` false); no run is acted on twice, and the
audit chain holds one ``bulk.submit`` and one ``run.close`` per run.

SQLite has one writer at a time and no row locks: these skip there (``postgres`` mark).
"""

from __future__ import annotations

import time
import uuid

import pytest

from checkpoints import services
from checkpoints.jobs import bulk as bulk_job
from checkpoints.models import AuditEvent, BulkAction, BulkActionItem, Run
from checkpoints.vocab import AuditAction, BulkOutcome, BulkState
from tests.helpers import ambiguous_run
from tests.services.test_bulk_jobs import many_runs
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SUBMITTERS = 6


def test_one_client_token_submitted_at_once_by_many_acts_once(acme, wendy, rita):
    runs = [ambiguous_run(wendy, acme) for _ in range(5)]
    token = uuid.uuid4()

    def submit(_i):
        return services.bulk_submit(actor=rita, tenant=acme, action="close",
                                    reason="incident 42", run_ids=runs, client_token=token)

    results = race(SUBMITTERS, submit)

    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    assert sorted(created for _bulk, created in results) == [False] * (SUBMITTERS - 1) + [True]
    assert len({bulk.pk for bulk, _created in results}) == 1
    assert BulkAction.objects.count() == 1
    items = BulkActionItem.objects.all()
    assert len(items) == len(runs)
    assert {i.outcome for i in items} == {BulkOutcome.DONE}  # none "already closed"
    assert AuditEvent.objects.filter(action=AuditAction.BULK_SUBMIT).count() == 1
    assert AuditEvent.objects.filter(action=AuditAction.RUN_CLOSE).count() == len(runs)
    assert services.audit_verify(tenant=acme)[0]


def test_two_bulks_over_the_same_runs_at_once_act_on_each_run_once(acme, wendy, rita):
    # Different tokens (two reviewers' forms): the run lock decides each run; every run
    # is closed by exactly one of them and refused ("already closed") by the other.
    runs = [ambiguous_run(wendy, acme) for _ in range(5)]

    def submit(_i):
        return services.bulk_submit(actor=rita, tenant=acme, action="close",
                                    reason="incident 42", run_ids=runs,
                                    client_token=uuid.uuid4())

    results = race(2, submit)

    assert not [r for r in results if isinstance(r, Exception)], results
    done = BulkActionItem.objects.filter(outcome=BulkOutcome.DONE)
    assert sorted(str(i.run_uuid) for i in done) == sorted(str(r) for r in runs)
    assert BulkActionItem.objects.filter(outcome=BulkOutcome.REFUSED).count() == len(runs)
    assert AuditEvent.objects.filter(action=AuditAction.RUN_CLOSE).count() == len(runs)
    assert services.audit_verify(tenant=acme)[0]


# --------------------------------------------------------------------------------------
# Bulk jobs (issue 22, item 6): a worker and an abort, two workers, at once
# --------------------------------------------------------------------------------------

def _job(rita, acme, monkeypatch, n):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    runs = many_runs(acme, n)
    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="close", reason="r",
                                   run_ids=[str(r) for r in runs], client_token=uuid.uuid4())
    return bulk, runs


def test_an_abort_while_the_worker_runs_stops_it_with_counts_equal_to_the_results(
        acme, rita, monkeypatch):
    # The worker's run transactions (audit head, run, then the job's row) and the abort
    # (audit head, then the job's row) in one order: no deadlock; whatever run was in
    # progress either committed before the abort or was rolled back.
    bulk, runs = _job(rita, acme, monkeypatch, 60)

    def act(i):
        if i == 0:
            return bulk_job.execute(bulk.pk)
        while not BulkActionItem.objects.filter(bulk=bulk).exists():
            time.sleep(0.01)
        return services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason="stop")

    results = race(2, act)

    assert not [r for r in results if isinstance(r, Exception)], results
    assert results[0]["result"] == "lost" and results[1].state == BulkState.ABORTED
    bulk.refresh_from_db()
    items = BulkActionItem.objects.filter(bulk=bulk).count()
    closed = Run.objects.filter(uuid__in=runs, closed_at__isnull=False).count()
    assert bulk.state == BulkState.ABORTED and 0 < closed < len(runs)
    assert bulk.done == items == closed
    assert AuditEvent.objects.filter(action=AuditAction.RUN_CLOSE).count() == closed
    assert services.audit_verify(tenant=acme)[0]


def test_two_workers_handed_the_same_job_act_on_each_run_once(acme, rita, monkeypatch):
    bulk, runs = _job(rita, acme, monkeypatch, 20)

    results = race(2, lambda _i: bulk_job.execute(bulk.pk))

    assert sorted(r["result"] for r in results) == ["finished", "skipped"], results
    bulk.refresh_from_db()
    assert (bulk.state, bulk.done) == (BulkState.FINISHED, 20)
    assert AuditEvent.objects.filter(action=AuditAction.RUN_CLOSE).count() == 20
