"""Reconcile jobs under concurrency on real PostgreSQL (issue 5): the same task delivered
twice at once, and many reviewers reconciling one run at once. Threads on a barrier, each
on its own connection. Whatever the interleaving: one look-up, one transition, one
``effect.reconcile`` audit event per effect, at most one open request per effect."""

from __future__ import annotations

from collections import Counter

import pytest

from checkpoints import services
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Effect, EffectRevision, ReconcileRequest
from checkpoints.services import reconcile_requests
from tests.faults import stubs
from tests.faults.conftest import in_doubt_run
from tests.helpers import age_world
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 4


@pytest.fixture
def counting(acme, monkeypatch):
    monkeypatch.setattr(stubs.CountingPlugin, "lookups", {})
    stubs.use_plugin(acme, "payments", "tests.faults.stubs.CountingPlugin")
    return stubs.CountingPlugin


def _queued(acme, wendy, rita, key: str) -> tuple:
    run = in_doubt_run(wendy, acme, keys=(key,))
    age_world(3600)
    with pytest.MonkeyPatch.context() as mp:  # store the request; run nothing yet
        mp.setattr(reconcile_requests, "dispatch", lambda pks, **kw: reconcile_requests.Sent(True, ""))
        (req,) = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                        reason="died").requests
    return run, req


def test_the_same_request_executed_twice_at_once_settles_once(acme, wendy, rita, counting):
    for i in range(ROUNDS):
        key = f"charge:dup-{i}"
        run, req = _queued(acme, wendy, rita, key)

        results = race(2, lambda _i, pk=req.pk: reconciliation.execute(pk))

        assert sorted(r["result"] for r in results) == ["confirmed", "skipped"], results
        assert counting.lookups[key] == 1
        effect = Effect.objects.get(uuid=run.effects[key])
        assert effect.state == "confirmed"
        assert EffectRevision.objects.filter(effect=effect, source="reconciliation").count() == 1
        assert AuditEvent.objects.filter(action="effect.reconcile",
                                         target_ref=str(effect.uuid)).count() == 1
        req.refresh_from_db()
        assert (req.state, req.attempts) == ("done", 1)
        assert req.attempt_log.count() == 1
    assert services.audit_verify(tenant=acme)[0]


def test_a_delivery_racing_the_sweeps_redrive_settles_once(acme, wendy, rita, counting):
    for i in range(ROUNDS):
        key = f"charge:redrive-{i}"
        run, req = _queued(acme, wendy, rita, key)
        age_world(3600)  # overdue: the sweep's re-drive takes it too

        def one(i, pk=req.pk):
            return reconciliation.execute(pk) if i == 0 else services.sweep_stale_runs()

        race(2, one)

        assert counting.lookups[key] == 1
        effect = Effect.objects.get(uuid=run.effects[key])
        assert effect.state == "confirmed"
        assert AuditEvent.objects.filter(action="effect.reconcile",
                                         target_ref=str(effect.uuid)).count() == 1


def test_many_reviewers_reconciling_one_run_at_once_store_one_request_per_effect(
        acme, wendy, rita, counting):
    run = in_doubt_run(wendy, acme, keys=("charge:m-1", "charge:m-2"))
    age_world(3600)
    results = race(8, lambda _i: services.run_reconcile(actor=rita, tenant=acme,
                                                        run_id=run.run_id, reason="died"))
    kinds = Counter(type(r).__name__ for r in results)
    # Each reviewer either queued (the first ones) or found nothing left in doubt.
    assert set(kinds) <= {"ReconcileQueued", "InvalidTransition"}, results
    assert kinds["ReconcileQueued"] >= 1
    assert ReconcileRequest.objects.count() == 2
    assert set(ReconcileRequest.objects.values_list("state", flat=True)) == {"done"}
    assert counting.lookups == {"charge:m-1": 1, "charge:m-2": 1}
    assert AuditEvent.objects.filter(action="effect.reconcile").count() == 2
    assert AuditEvent.objects.filter(action="run.reconcile").count() == kinds["ReconcileQueued"]
    assert services.audit_verify(tenant=acme)[0]
