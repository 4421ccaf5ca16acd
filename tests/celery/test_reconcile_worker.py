"""Reconciliation through a real Redis broker and real ``celery -A recovery worker``
processes, against a stub status service on 127.0.0.1 (issue 5).

Runs in the PostgreSQL pass of ``make test`` (``CELERY_BROKER_URL`` set); skipped, with a
message, only when no broker is configured (the embedded SQLite pass). The tests wait
(bounded) for the workers' commits and make time pass for the rules with ``age_world``
(stored times move into the past), never by sleeping.

- a worker reconciles a run's in-doubt effects (found -> confirmed, 404 -> not_executed);
- a worker's pool child SIGKILLed during a slow look-up, and separately a worker's main
  process SIGKILLed: the request is not lost; once its claim has expired the sweep
  re-drives it and the effect is reconciled exactly once;
- the same task delivered twice at once to two workers: one look-up, one transition, one
  audit event;
- the broker down when the reviewer reconciles: 202 ``queued: false``; once it is back
  the sweep's re-drive sends the request and a worker runs it.
"""

from __future__ import annotations

import os
import signal

import pytest
from django.conf import settings

from checkpoints import audit, services
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Effect, EffectRevision, ReconcileRequest, Run
from tests.api.apihelpers import post
from tests.celery.conftest import children, wait_for
from tests.faults.conftest import in_doubt_run, request_for
from tests.faults.stubs import broker_at
from tests.helpers import age_world

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL"),
                       reason="CELERY_BROKER_URL is not set: no broker, so no real worker "
                              "(make test runs this in its PostgreSQL pass)"),
]

RECEIPT = b'{"status": "succeeded", "charge_id": "ch_42", "amount_cents": 2599}'
KEY = "charge:A-1042"
# Longer than any claim (the look-up's timeout + the margin).
CLAIM_EXPIRED_S = settings.RECOVERY_RECONCILE_TIMEOUT_S + reconciliation.CLAIM_MARGIN_S + 1


def _settled(effect_id):
    return lambda: Effect.objects.get(uuid=effect_id).state not in ("submitted",
                                                                           "unresolved")


def _reconciled_once(effect_id, *, state: str = "confirmed") -> Effect:
    effect = Effect.objects.get(uuid=effect_id)
    assert effect.state == state
    assert EffectRevision.objects.filter(effect=effect, state=state).count() == 1
    assert EffectRevision.objects.get(effect=effect, state=state).source == "reconciliation"
    events = AuditEvent.objects.filter(action="effect.reconcile", target_ref=str(effect_id))
    assert [(e.actor_name, e.after["state"]) for e in events] == [("system", state)]
    return effect


def _redrive_after_the_claim_expired() -> None:
    """What beat's next sweep does once the dead worker's claim has run out: the request
    goes back to ``queued`` and is sent to a worker again, in the same sweep."""
    age_world(CLAIM_EXPIRED_S)
    assert services.sweep_stale_runs()["reconcile_redriven"] == 1


def test_it_reconciles_in_doubt_effects_in_a_real_worker(acme, wendy, rita, stub, start_worker):
    worker = start_worker()
    assert not settings.CELERY_TASK_ALWAYS_EAGER
    stub.answer(KEY, RECEIPT)
    run = in_doubt_run(wendy, acme, keys=(KEY, "charge:never-sent"))
    age_world(3600)  # the owner is gone and the settle delay has passed

    queued = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                    reason="worker died after the charge")
    assert queued.dispatched and len(queued.requests) == 2

    for effect_id in run.effects.values():
        wait_for(_settled(effect_id), worker, what="the effects to settle")
    confirmed = _reconciled_once(run.effects[KEY])
    assert confirmed.receipt["charge_id"] == "ch_42"
    _reconciled_once(run.effects["charge:never-sent"], state="not_executed")
    assert sorted(stub.seen) == sorted([KEY, "charge:never-sent"])
    assert Run.objects.get(uuid=run.run_id).recovery_reason == \
        "checkpoint in flight, owner gone"  # nothing left in doubt
    assert services.audit_verify(tenant=acme)[0]


def test_a_workers_answer_carries_the_requests_incident(acme, wendy, rita, stub, start_worker):
    # The newcomer's finding: the answer a worker records (by ``system``) carried no
    # incident; the request stores it (``ReconcileRequest.incident_ref``) for the worker.
    worker = start_worker()
    stub.answer(KEY, RECEIPT)
    run = in_doubt_run(wendy, acme, keys=(KEY,))
    age_world(3600)
    with audit.working_on("INC-2041"):
        queued = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                        reason="worker died after the charge")
    assert queued.dispatched
    wait_for(_settled(run.effects[KEY]), worker, what="the effect to settle")
    event = _reconciled_once(run.effects[KEY]) and AuditEvent.objects.get(
        action="effect.reconcile", target_ref=str(run.effects[KEY]))
    assert (event.actor_name, event.incident_ref) == ("system", "INC-2041")


def _slow_lookup_started(acme, wendy, rita, stub, worker) -> tuple:
    """A run with one in-doubt charge the provider knows, reconciled; the worker's
    look-up is held by the stub until the test releases it."""
    stub.answer(KEY, RECEIPT)
    stub.hold(KEY)
    run = in_doubt_run(wendy, acme, keys=(KEY,))
    age_world(3600)
    services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="died")
    wait_for(stub.entered(KEY).is_set, worker, what="the look-up to start")
    return run, request_for(run.effects[KEY])


def test_a_pool_child_killed_mid_look_up_is_reconciled_later_exactly_once(
        acme, wendy, rita, stub, start_worker):
    worker = start_worker(pool="prefork", concurrency=1)
    run, req = _slow_lookup_started(acme, wendy, rita, stub, worker)
    (child,) = children(worker.pid)

    os.kill(child, signal.SIGKILL)
    stub.release(KEY)

    # The message comes back (acks late, reject on worker loss) and finds the request
    # still claimed by the dead child: it does nothing rather than run it twice at once.
    wait_for(lambda: "skipped" in worker.results(), worker, what="the redelivery")
    req.refresh_from_db()
    assert (req.state, req.attempts) == ("running", 1)
    assert Effect.objects.get(uuid=run.effects[KEY]).state == "submitted"

    _redrive_after_the_claim_expired()

    wait_for(_settled(run.effects[KEY]), worker, what="the re-driven request")
    assert worker.proc.poll() is None  # the worker itself lived on
    _reconciled_once(run.effects[KEY])
    req.refresh_from_db()
    assert (req.state, req.outcome, req.attempts) == ("done", "confirmed", 2)
    assert stub.looked_up(KEY) == 2  # the killed look-up, then the one that settled it
    assert services.audit_verify(tenant=acme)[0]


def test_a_worker_main_process_killed_mid_look_up_is_reconciled_later_exactly_once(
        acme, wendy, rita, stub, start_worker):
    first = start_worker(pool="solo")
    run, req = _slow_lookup_started(acme, wendy, rita, stub, first)

    first.kill()  # the whole worker: its message stays unacknowledged at the broker
    stub.release(KEY)
    second = start_worker(pool="solo")
    req.refresh_from_db()
    assert (req.state, req.attempts) == ("running", 1)

    _redrive_after_the_claim_expired()

    wait_for(_settled(run.effects[KEY]), second, what="the re-driven request")
    _reconciled_once(run.effects[KEY])
    req.refresh_from_db()
    assert (req.state, req.outcome, req.attempts) == ("done", "confirmed", 2)
    assert stub.looked_up(KEY) == 2


def test_the_same_task_delivered_twice_at_once_settles_once(
        acme, wendy, rita, stub, start_worker):
    from recovery.celery import app

    one, two = start_worker(pool="solo"), start_worker(pool="solo")
    run, req = _slow_lookup_started(acme, wendy, rita, stub, one)
    # A second delivery of the same message while the first is still looking up.
    app.send_task("checkpoints.tasks.reconcile_effect", args=[req.pk])
    wait_for(lambda: "skipped" in one.results() + two.results(), one, two,
             what="the duplicate delivery")
    stub.release(KEY)

    wait_for(_settled(run.effects[KEY]), one, two, what="the first delivery")
    _reconciled_once(run.effects[KEY])
    assert sorted(one.results() + two.results()) == ["confirmed", "skipped"]
    assert stub.looked_up(KEY) == 1
    req.refresh_from_db()
    assert (req.state, req.attempts) == ("done", 1)


def test_a_broker_outage_queues_and_the_sweep_sends_it_once_the_broker_is_back(
        acme, wendy, rita, api_as, stub, start_worker):
    worker = start_worker(pool="solo")
    stub.answer(KEY, RECEIPT)
    run = in_doubt_run(wendy, acme, keys=(KEY,))
    age_world(3600)

    with broker_at("redis://127.0.0.1:1/0"):
        r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "died"})
    assert r.status_code == 202, r.content
    assert r.json()["queued"] is False and "worker is back" in r.json()["detail"]
    req = request_for(run.effects[KEY])
    assert req.state == "queued" and "broker unavailable" in req.last_error
    assert stub.seen == []

    # The broker is back (this process publishes to the real one again).
    age_world(settings.RECOVERY_RECONCILE_REDRIVE_GRACE_S + 1)
    stats = services.sweep_stale_runs()
    assert stats["reconcile_redriven"] == 1

    wait_for(_settled(run.effects[KEY]), worker, what="the re-driven request")
    _reconciled_once(run.effects[KEY])
    req.refresh_from_db()
    assert (req.state, req.attempts, req.last_error) == ("done", 1, "")
    assert ReconcileRequest.objects.count() == 1
