"""The request id reaches the Celery task a request sent (issue 9, item 7): a reviewer's
API reconcile with ``X-Request-ID`` queues a task through the real broker, and the real
worker's JSON log line for that task carries the same ``request_id`` (django-guid's
Celery integration; recovery/celery.py formats the worker's lines)."""

from __future__ import annotations

import json
import os

import pytest

from tests.celery.conftest import wait_for
from tests.faults.conftest import in_doubt_run
from tests.helpers import age_world

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL"),
                       reason="CELERY_BROKER_URL is not set: no broker, so no real worker "
                              "(make test runs this in its PostgreSQL pass)"),
]


def test_a_task_logs_with_the_request_id_of_the_request_that_sent_it(
        acme, wendy, rita, stub, start_worker, monkeypatch, api_as):
    monkeypatch.setenv("RECOVERY_LOG_FORMAT", "json")
    worker = start_worker()
    run = in_doubt_run(wendy, acme, keys=("charge:A-77",))
    age_world(3600)
    request_id = "reconcile-from-test-0001"
    response = api_as(rita).post(f"/api/v1/tenants/acme/runs/{run.run_id}/reconcile",
                                 {"reason": "request id"}, format="json",
                                 HTTP_X_REQUEST_ID=request_id)
    assert response.status_code == 202, response.content
    assert response["X-Request-ID"] == request_id

    def logged():
        return [json.loads(line) for line in worker.log().splitlines()
                if line.startswith("{") and request_id in line]

    wait_for(lambda: any(line["logger"] == "checkpoints.jobs.tasks" for line in logged()), worker,
             what="the task's log line")
    line = next(line for line in logged() if line["logger"] == "checkpoints.jobs.tasks")
    assert line["request_id"] == request_id
    assert line["result"] in ("confirmed", "not_executed", "failed", "unknown", "retry",
                              "gave_up", "moved_on", "skipped", "waiting")
    # Lines of other tasks (none here) or of the worker itself carry other ids, never this.
    assert all(json.loads(text)["request_id"] != request_id
               for text in worker.log().splitlines()
               if text.startswith("{") and "ready." in text)
