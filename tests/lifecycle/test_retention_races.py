"""Purgers at once (issue 20, "Tests": "two purgers at once delete each run once"), on
PostgreSQL, with threads released together: the cleanup lease lets one purger through
per tenant, and whatever it lets through (a lease taken over mid-way) the fencing check
and the rule judged again under each run's lock leave one tombstone and one audit event
per run. A purge racing a write to one of its runs: the write commits first and the
purge leaves the run (no longer ended), or the purge commits first and the write gets
409 run_deleted; never both. A run created anew racing phase 2's delete of the old run
row under the same id: refused by the tombstone once the row is gone, never created."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection, transaction

from checkpoints import locks, services
from checkpoints.exceptions import RunDeleted
from checkpoints.models import AuditEvent, Checkpoint, DataPolicy, Run, Tombstone
from checkpoints.services import retention
from tests.helpers import age_world, envelope, put_checkpoint
from tests.services.test_state_counts import assert_counts
from tests.transactional.test_lock_order import _in_thread, _wait_until_blocked

from .retention_world import DAY, completed_run, set_policy

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 12
PURGERS = 4


def race(n: int, call) -> list:
    barrier = threading.Barrier(n, timeout=30)
    results: list = [None] * n

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = call(i)
        except Exception as exc:  # collected and asserted on by the caller
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a purger is stuck"
    return results


def deleted_once(tenant, runs) -> None:
    stones = Counter(Tombstone.objects.filter(tenant=tenant).values_list("run_uuid", flat=True))
    assert stones == Counter({r.uuid: 1 for r in runs})
    events = Counter(AuditEvent.objects.filter(tenant=tenant, action="run.purge")
                     .values_list("target_ref", flat=True))
    assert events == Counter({str(r.uuid): 1 for r in runs})
    ok, *problem = services.audit_verify(tenant=tenant)
    assert ok, problem


def test_purgers_at_once_delete_each_run_once(acme, globex, wendy, wes):
    runs = [completed_run(wendy, acme, order_id=f"R-{i}", effect=i % 2 == 0)
            for i in range(RUNS)]
    other = [completed_run(wes, globex, order_id=f"G-{i}") for i in range(3)]
    set_policy(acme, payload_retention_days=1)
    set_policy(globex, payload_retention_days=1)
    age_world(2 * DAY)
    results = race(PURGERS, lambda i: services.retention_purge_all(batch_size=5))
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(r["purged"] for r in results) == RUNS + len(other)
    deleted_once(acme, runs)
    deleted_once(globex, other)
    assert_counts(acme, globex)


def test_a_purger_whose_lease_was_taken_over_stops_and_the_new_one_finishes(acme, wendy):
    runs = [completed_run(wendy, acme, order_id=f"T-{i}", effect=False) for i in range(RUNS)]
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    stalled = retention._lease_take(acme, "stalled")
    age_world(retention.LEASE_TTL_S + 1)  # the stalled purger's lease expires
    results = race(PURGERS, lambda i: services.retention_purge(tenant=acme, batch_size=3))
    assert Counter(r["lease"] for r in results) == {"taken": 1, "held": PURGERS - 1}
    assert retention._purge_one(acme, runs[0].pk, stalled, services.policy_for(acme)) == \
        "fenced"
    deleted_once(acme, runs)


def test_a_write_racing_the_purge_of_its_run_either_wins_or_is_refused(acme, wendy):
    bodies, runs = [], []
    for i in range(RUNS):
        run = completed_run(wendy, acme, order_id=f"W-{i}", effect=False)
        runs.append(run)
        cp = Checkpoint.objects.get(run=run)
        bodies.append({"id": str(cp.uuid), "run_id": str(run.uuid), "revision": 2,
                       "kind": "acme.order", "schema_version": 1, "updated_at_ms": 1,
                       "payload": {"phase": "ready", "order_id": f"W-{i}"}})
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)

    def act(i):
        if i == 0:
            return services.retention_purge(tenant=acme)
        return [_write(wendy, acme, b) for b in bodies]

    results = race(2, act)
    writes = results[1]
    assert not isinstance(writes, Exception), writes
    for run, outcome in zip(runs, writes, strict=True):
        run.refresh_from_db()
        stones = Tombstone.objects.filter(run_uuid=run.uuid).count()
        if isinstance(outcome, RunDeleted):  # the purge won: deleted once, no checkpoint
            assert stones == 1 and run.payloads_deleted_at is not None
            assert not Checkpoint.objects.filter(run=run).exists()
        else:  # the write won: the run is open again and kept whole
            assert stones == 0 and run.payloads_deleted_at is None
            assert Checkpoint.objects.get(run=run).revision == 2
    assert Run.objects.filter(tenant=acme).count() == RUNS


def _write(writer, tenant, body):
    try:
        return put_checkpoint(writer, tenant, body, expected=1)
    except RunDeleted as exc:
        return exc


def test_a_run_created_while_phase_2_deletes_its_row_is_refused_by_the_tombstone(acme,
                                                                                 wendy):
    """Phase 2 holds the run's lock and deletes the row; a checkpoint create of the same
    run id queues on that lock, then finds no row. The tombstone (committed by phase 1,
    long before) refuses it: no new run under the deleted id (``runs.refuse_tombstoned``)."""
    run = completed_run(wendy, acme, order_id="E-1", effect=False)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    assert services.retention_purge(tenant=acme)["purged"] == 1
    set_policy(acme, effect_retention_days=1)
    token = retention._lease_take(acme, "phase-2")
    policy = DataPolicy.objects.get(tenant=acme)
    with transaction.atomic():
        assert locks.lock_run(acme, run.uuid) is not None  # phase 2 has the run
        thread, box = _in_thread(
            lambda: put_checkpoint(wendy, acme, envelope(run_id=run.uuid)))
        _wait_until_blocked(box)  # the create queues on the run's lock
        assert retention._expire_one(acme, run.pk, token, policy) == "expired"
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), RunDeleted), box
    assert box["error"].detail.startswith(f"run_id: the payloads of run {run.uuid} were")
    assert not Run.objects.filter(tenant=acme, uuid=run.uuid).exists()
    assert Tombstone.objects.filter(tenant=acme, run_uuid=run.uuid).count() == 1
    assert_counts(acme)
