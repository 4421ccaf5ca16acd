"""Issue 5, fault 6: stale state without a sweeper.

On the default deployment (no broker, no cron, no beat) the web process itself runs the
sweep (``checkpoints.jobs.inprocess``, started by its middleware on the first request), so a
run whose owner died is listed ``ambiguous`` without anyone calling the sweep; and a
retry request judges the run as it is *now*, not as the last sweep left it.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.test import Client

from checkpoints.jobs import inprocess
from checkpoints.models import Run
from tests.api.apihelpers import get, post
from tests.helpers import age_world, envelope, put_checkpoint

WAIT_S = 15  # the bound: listed within about 15 s


@pytest.fixture
def inprocess_worker(settings, monkeypatch):
    """Turn the in-process worker on (as without a broker outside the tests) with a 1 s
    round, and stop its thread at the end so it cannot touch another test's database."""
    settings.RECOVERY_INPROCESS_WORKER = True
    settings.RECOVERY_SWEEP_INTERVAL_S = 1
    stop = threading.Event()
    monkeypatch.setattr(inprocess, "_started", threading.Event())
    real_start = inprocess.start
    monkeypatch.setattr(inprocess, "start", lambda stop_event=None: real_start(stop))
    yield
    stop.set()
    for thread in threading.enumerate():
        if thread.name == "recovery-inprocess-worker":
            thread.join(timeout=10)
            assert not thread.is_alive(), "the in-process worker did not stop"


@pytest.mark.django_db(transaction=True)
def test_the_web_process_lists_a_dead_owners_run_as_ambiguous_by_itself(
        acme, wendy, vic, api_as, inprocess_worker):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    age_world(301)  # the owner stopped writing 301 s ago (threshold 300 s); nobody swept
    assert Run.objects.get(uuid=run_id).recovery_state == "healthy"

    browser = Client()
    browser.force_login(vic)
    assert browser.get("/").status_code in (200, 302)  # any request starts the worker

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if Run.objects.get(uuid=run_id).recovery_state == "ambiguous":
            break
        time.sleep(0.2)
    listed = get(api_as(vic), "acme", "runs", recovery_state="ambiguous").json()["results"]
    assert [r["run_id"] for r in listed] == [str(run_id)]


def test_a_retry_request_on_a_run_whose_owner_went_quiet_needs_no_sweep(
        acme, wendy, rita, api_as):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    age_world(301)  # owner gone by the rule; no sweep ran, the stored state says healthy
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "healthy"

    r = post(api_as(rita), "acme", f"runs/{body['run_id']}/retry-requests",
             {"reason": "worker died"})

    assert r.status_code == 201, r.content
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "awaiting_approval"


def test_a_retry_request_on_a_live_run_is_still_refused(acme, wendy, rita, api_as):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    age_world(290)  # short of the 300 s threshold: the owner counts as live
    r = post(api_as(rita), "acme", f"runs/{body['run_id']}/retry-requests", {"reason": "x"})
    # 409 owner_live, judged before the run's state (CONTRACT.md 3; stop 39: it was 422)
    assert (r.status_code, r.json()["error"]) == (409, "owner_live"), r.content
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "healthy"
