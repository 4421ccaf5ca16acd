"""Issue 5, fault 3: the broker is down when a reviewer reconciles.

With a broker configured (eager off) but nothing answering on its port, the reconcile
API answers 202 with ``queued: false`` and a clear detail (never a 500), the requests are
stored ``queued`` with the error, and the audit trail records the stored requests. Nothing
is lost: once something can run them (here the embedded in-process worker; with a real
broker and worker see ``tests/celery``), the sweep's re-drive runs them.
"""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent, Effect, ReconcileRequest
from checkpoints.services import sweep_stale_runs
from tests.api.apihelpers import get, post
from tests.faults.conftest import in_doubt_run
from tests.faults.stubs import broker_at
from tests.helpers import age_world

CLOSED_PORT = "redis://127.0.0.1:1/0"
RECEIPT = b'{"status": "succeeded", "charge_id": "ch_3"}'


@pytest.mark.django_db(transaction=True)
def test_a_broker_outage_answers_202_queued_false_and_loses_nothing(
        acme, wendy, rita, api_as, stub):
    run = in_doubt_run(wendy, acme, keys=("charge:A-1", "charge:A-2"))
    stub.answer("charge:A-1", RECEIPT)
    age_world(3600)

    with broker_at(CLOSED_PORT):
        r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "died"})
        assert r.status_code == 202, r.content
        body = r.json()
        assert (body["queued"], body["dispatch"]) == (False, "waiting")
        assert "queued" in body["detail"] and "worker is back" in body["detail"]
        assert {q["state"] for q in body["requests"]} == {"queued"}
        stored = list(ReconcileRequest.objects.order_by("pk"))
        assert [q.state for q in stored] == ["queued", "queued"]
        assert all("broker unavailable" in q.last_error for q in stored)
        assert all(q.dispatched_at is None and q.attempts == 0 for q in stored)
        event = AuditEvent.objects.get(action="run.reconcile")
        assert sorted(event.after["requests"]) == [q.pk for q in stored]
        assert stub.seen == []
        # Still down at the next sweep: still stored, nothing lost, no crash.
        age_world(60)
        sweep_stale_runs()
        assert ReconcileRequest.objects.filter(state="queued").count() == 2
        shown = get(api_as(rita), "acme", f"runs/{run.run_id}").json()["reconcile_requests"]
        assert all("broker unavailable" in q["last_error"] for q in shown)

    # Something can run them again: the next sweep's re-drive does.
    sweep_stale_runs()
    states = dict(Effect.objects.values_list("operation_key", "state"))
    assert states == {"charge:A-1": "confirmed", "charge:A-2": "not_executed"}
    assert set(ReconcileRequest.objects.values_list("state", "attempts")) == {("done", 1)}
    assert AuditEvent.objects.filter(action="effect.reconcile").count() == 2
