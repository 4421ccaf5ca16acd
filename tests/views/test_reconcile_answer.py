"""What a reconcile answers says where its requests went (the newcomer's finding: in the
embedded default the API answered ``"queued": true`` beside ``"detail": "reconciled in
this process"``, which reads as both "waiting" and "done").

``queued`` keeps its meaning, "handed over" (false only when the task queue was
unavailable); ``dispatch`` says where: ``in_process`` (ran before the answer: each
request's own ``state`` tells how it ended), ``worker`` (published for a Celery worker)
or ``waiting`` (stored until the worker is back). The run page's notice after the same
action is chosen by the same field (``dashboard.actions.reconcile_notice``).

Real commits (``transaction=True``): the requests are handed over when the service's
transaction commits, before the answer, as in production.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.urls import reverse

from checkpoints.models import ReconcileRequest
from checkpoints.services import stored_send
from tests.api.apihelpers import post
from tests.faults.stubs import broker_at

REASON = {"reason": "the worker died mid-charge"}
CLOSED_PORT = "redis://127.0.0.1:1/0"
FIELDS = {"task_id", "queued", "dispatch", "detail", "requests"}


@pytest.fixture
def published(settings, monkeypatch):
    """A broker that takes every message (nothing consumes them): the tasks' names and
    arguments as published."""
    sent = []
    settings.CELERY_TASK_ALWAYS_EAGER = False
    monkeypatch.setattr(stored_send, "current_app", SimpleNamespace(
        send_task=lambda name, args, countdown=None: sent.append((name, args))))
    return sent


@pytest.mark.django_db(transaction=True)
def test_the_embedded_default_answers_that_it_ran_in_this_process(api_as, rita, stuck):
    r = post(api_as(rita), "acme", f"runs/{stuck.run_id}/reconcile", REASON)
    assert r.status_code == 202, r.content
    body = r.json()
    assert set(body) == FIELDS
    assert (body["queued"], body["dispatch"]) == (True, "in_process")
    assert "ran in this process" in body["detail"]
    # It ran before the answer: the request's own state says how it ended (no reconciler
    # for "payments" here: unknown, done).
    assert [(q["state"], q["outcome"]) for q in body["requests"]] == [("done", "unknown")]
    assert ReconcileRequest.objects.get().state == "done"


@pytest.mark.django_db(transaction=True)
def test_with_a_broker_the_answer_says_a_worker_has_them(api_as, rita, stuck, published):
    r = post(api_as(rita), "acme", f"runs/{stuck.run_id}/reconcile", REASON)
    assert r.status_code == 202, r.content
    body = r.json()
    assert (body["queued"], body["dispatch"]) == (True, "worker")
    assert body["detail"] == "queued for a worker"
    assert [q["state"] for q in body["requests"]] == ["queued"]  # not run yet
    assert [args for _, args in published] == [[body["requests"][0]["id"]]]


@pytest.mark.django_db(transaction=True)
def test_a_broker_outage_answers_waiting(api_as, rita, stuck):
    with broker_at(CLOSED_PORT):
        r = post(api_as(rita), "acme", f"runs/{stuck.run_id}/reconcile", REASON)
    assert r.status_code == 202, r.content
    body = r.json()
    assert (body["queued"], body["dispatch"]) == (False, "waiting")
    assert "worker is back" in body["detail"]
    assert [q["state"] for q in body["requests"]] == ["queued"]


@pytest.mark.django_db(transaction=True)
def test_the_run_page_says_the_same_as_the_api(login, rita, stuck, published):
    """The dashboard's notice for the same action follows the same ``dispatch``: with a
    worker, "a worker is asking"; in this process, "run in this process"; waiting, the
    service's words."""
    url = reverse("run_reconcile", args=["acme", stuck.run_id])
    body = login(rita).post(url, REASON, HTTP_HX_REQUEST="true").content.decode()
    assert "Reconciliation of 1 effect requested" in body
    assert "a worker is asking the services" in body and "run in this process" not in body


@pytest.mark.django_db(transaction=True)
def test_the_run_page_says_it_ran_in_this_process(login, rita, stuck):
    url = reverse("run_reconcile", args=["acme", stuck.run_id])
    body = login(rita).post(url, REASON, HTTP_HX_REQUEST="true").content.decode()
    assert "Reconciliation of 1 effect requested (task " in body
    assert "and run in this process; the section below shows what the services answered" \
        in body


@pytest.mark.django_db(transaction=True)
def test_the_run_page_says_when_they_wait(login, rita, stuck):
    url = reverse("run_reconcile", args=["acme", stuck.run_id])
    with broker_at(CLOSED_PORT):
        body = login(rita).post(url, REASON, HTTP_HX_REQUEST="true").content.decode()
    assert "the task queue is unavailable, so it will run when the worker is back" in body
    assert "run in this process" not in body and "a worker is asking" not in body
