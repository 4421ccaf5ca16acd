"""The state a reviewer reads does not depend on the broker (issue 17, item 6).

With a broker, beat sends the stale-run sweep; with the broker (or beat, or every worker)
down nothing swept, and a run whose owner died showed ``healthy`` with an expired lease
for as long as the outage lasted. Now:

- every sweep records its heartbeat on the database clock (``checkpoints.heartbeat``);
- each web process's background thread runs ``inprocess.catch_up`` every interval: when
  no sweep finished in two intervals it runs the sweep itself (never in a request: a GET
  writes nothing), so the inbox, the run page and the API show the run ``ambiguous``;
- dashboard pages carry a banner while the deployment's own worker is late;
- a reconcile job whose worker died says so on the run page and in the API while it
  waits for the next sweep.

Time passes by ageing the stored times (heartbeat rows included), never by sleeping.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db.models import F

from checkpoints import heartbeat, services
from checkpoints.jobs import inprocess
from checkpoints.models import Heartbeat, ReconcileRequest, Run
from tests.faults.stubs import broker_at
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, walk_effect

pytestmark = pytest.mark.django_db

BANNER = "Background work is not running"


def _age_heartbeats(seconds: float) -> None:
    Heartbeat.objects.update(at=F("at") - timedelta(seconds=seconds))


@pytest.fixture
def with_broker(settings, monkeypatch):
    """What ``CELERY_BROKER_URL`` set means for the web process (nothing is published;
    the tests call ``inprocess.catch_up`` themselves instead of starting its thread)."""
    monkeypatch.setattr(inprocess, "start", lambda **kw: False)
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERY_INPROCESS_WORKER = False
    settings.RECOVERY_SWEEP_WATCHDOG = True
    return settings


def _crashed_run(wendy, acme) -> uuid.UUID:
    """A run in flight whose owner held a 60 s lease, one effect submitted, then died:
    its lease expired an hour ago and no sweep has run since."""
    body = envelope(payload={"phase": "charging", "order_id": "A-7"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w1", ttl_s=60)
    walk_effect(wendy, acme, effect_body(run_id=run_id), "submitted", token=1)
    age_world(3600)
    return run_id


def _run_state_on_page(page: str) -> str:
    return re.search(r'id="run-state">([^<]+)<', page).group(1)


def test_a_sweep_records_its_heartbeat_on_the_database_clock(acme):
    services.sweep_stale_runs(by="celery")
    beats = heartbeat.read()
    assert set(beats) == {"sweep", "sweep.celery"}
    assert beats["sweep"].age_s < 5
    services.sweep_stale_runs()
    assert set(heartbeat.read()) == {"sweep", "sweep.celery"}
    with pytest.raises(ValueError):
        services.sweep_stale_runs(by="someone")


def test_a_late_sweep_is_run_by_the_web_process_and_every_view_shows_it(
        acme, wendy, rita, login, api_as, with_broker):
    services.sweep_stale_runs(by="celery")  # beat and a worker were fine ...
    run_id = _crashed_run(wendy, acme)
    # ... then the broker died: past the worker's bound (and the sweep's two intervals).
    _age_heartbeats(with_broker.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S + 1)
    web = login(rita)

    # Reading writes nothing: the run is still stored healthy, whatever the page shows.
    page = web.get(f"/t/acme/runs/{run_id}/").content.decode()
    assert BANNER in page and "sweeps stale runs itself" in page
    assert Run.objects.get(uuid=run_id).recovery_state == "healthy"

    stats = inprocess.catch_up()  # what the web process's background thread does
    assert stats is not None and stats["runs_ambiguous"] == 1
    assert set(heartbeat.read()) >= {"sweep", "sweep.web"}

    page = web.get(f"/t/acme/runs/{run_id}/").content.decode()
    assert _run_state_on_page(page) == "ambiguous"
    inbox = web.get("/t/acme/?state=ambiguous").content.decode()
    assert str(run_id)[:8] in inbox
    assert BANNER in inbox  # the worker is still late: only the web process swept
    api = api_as(rita).get(f"/api/v1/tenants/acme/runs/{run_id}")
    assert api.status_code == 200, api.content
    assert api.json()["run"]["recovery_state"] == "ambiguous"

    assert inprocess.catch_up() is None  # the sweep is no longer late: nothing to do


@pytest.mark.parametrize("down", ["broker", "sequencer"])
def test_the_watchdog_seals_the_audit_trail_while_beat_is_down(acme, wendy, with_broker,
                                                               down):
    """(stop 32, the attack's finding) Beat's audit sequencer stops with the broker: the
    watchdog caught up the sweep, retention and notifications, never the sequencer, so
    every audit event stayed unsealed for the whole outage. Now it integrates them when
    the sweep is late (``broker``), or when the sequencer's own rounds stopped while
    sweeps go on (``sequencer``)."""
    from checkpoints.models import AuditPending

    services.audit_integrate_all()  # beat's sequencer ran ...
    services.sweep_stale_runs(by="celery")
    put_checkpoint(wendy, acme, envelope())  # ... then an event waits for it
    if down == "broker":
        _age_heartbeats(3600)
    else:
        Heartbeat.objects.filter(name="audit.integrate").update(
            at=F("at") - timedelta(seconds=3600))
    assert AuditPending.objects.filter(tenant=acme).exists()
    stats = inprocess.catch_up()
    assert stats is not None and stats["audit"] >= 1
    assert not AuditPending.objects.filter(tenant=acme).exists()
    assert heartbeat.read()["audit.integrate"].age_s < 60
    assert inprocess.catch_up() is None  # nothing is late any more


def test_no_catch_up_and_no_banner_while_the_worker_sweeps(
        acme, wendy, rita, login, with_broker):
    run_id = _crashed_run(wendy, acme)
    services.sweep_stale_runs(by="celery")  # the worker's sweep, just now
    assert inprocess.catch_up() is None
    page = login(rita).get(f"/t/acme/runs/{run_id}/").content.decode()
    assert BANNER not in page
    inbox = login(rita).get("/t/acme/").content.decode()
    assert BANNER not in inbox


def test_the_banner_says_since_when(acme, rita, login, with_broker):
    services.sweep_stale_runs(by="celery")
    _age_heartbeats(3600)
    since = heartbeat.read()["sweep.celery"].at
    page = login(rita).get("/t/acme/").content.decode()
    assert BANNER in page
    assert f"since {since:%Y-%m-%d %H:%M:%S} UTC" in page


def test_a_worker_that_never_swept_is_late_too(acme, rita, login, with_broker):
    page = login(rita).get("/t/acme/").content.decode()
    assert BANNER in page and "no worker has finished a sweep yet" in page


def test_the_in_process_worker_s_own_heartbeat_counts_without_a_broker(
        acme, rita, login, settings, monkeypatch):
    monkeypatch.setattr(inprocess, "start", lambda **kw: False)  # no thread in the tests
    monkeypatch.setattr(inprocess, "started_at", [])  # this process started no thread
    settings.RECOVERY_INPROCESS_WORKER = True
    services.sweep_stale_runs(by="inprocess")
    assert BANNER not in login(rita).get("/t/acme/").content.decode()
    _age_heartbeats(settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S + 1)
    page = login(rita).get("/t/acme/").content.decode()
    assert BANNER in page and "sweeps stale runs itself" not in page


def test_a_fresh_in_process_worker_gets_its_first_round_before_the_banner(
        acme, rita, login, settings, monkeypatch):
    """(stop 33, a newcomer's finding) ``make demo``'s first seconds showed "Background
    work is not running ... (broker, beat or worker down)" for a demo with no broker,
    while ``/readyz`` said ``worker: ok``: the banner and the probe now share the grace
    of a fresh start (``inprocess.first_round_pending``)."""
    monkeypatch.setattr(inprocess, "start", lambda **kw: False)  # no thread in the tests
    settings.RECOVERY_INPROCESS_WORKER = True
    monkeypatch.setattr(inprocess, "started_at", [time.monotonic()])  # just started
    assert BANNER not in login(rita).get("/t/acme/").content.decode()
    # Within /readyz's bound, the one both read (``workerstatus``): both still wait.
    from checkpoints.ops import health

    monkeypatch.setattr(inprocess, "started_at",
                        [time.monotonic() - settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S + 5])
    assert BANNER not in login(rita).get("/t/acme/").content.decode()
    assert health.readiness()[1]["worker"] == "ok"
    monkeypatch.setattr(inprocess, "started_at",  # started long ago, never swept
                        [time.monotonic() - 2 * settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S])
    page = login(rita).get("/t/acme/").content.decode()
    assert BANNER in page and "no worker has finished a sweep yet" in page
    assert health.readiness()[1]["worker"] == "failed: WorkerSilent"


def test_the_web_process_starts_the_watchdog_only_with_a_broker(
        settings, monkeypatch, rf):
    started = []
    monkeypatch.setattr(inprocess, "start", lambda **kw: started.append(kw))
    monkeypatch.setattr(inprocess._started, "is_set", lambda: False)
    settings.RECOVERY_INPROCESS_WORKER = False
    settings.RECOVERY_SWEEP_WATCHDOG = True
    settings.CELERY_TASK_ALWAYS_EAGER = False
    inprocess.InProcessWorkerMiddleware(lambda r: None)(rf.get("/"))
    assert started == [{"watchdog": True}]
    settings.CELERY_TASK_ALWAYS_EAGER = True  # no broker, in-process worker off: nothing
    inprocess.InProcessWorkerMiddleware(lambda r: None)(rf.get("/"))
    assert started == [{"watchdog": True}]


@pytest.mark.django_db(transaction=True)
def test_the_watchdog_thread_sweeps_a_crashed_run_while_beat_is_silent(
        acme, wendy, vic, login, settings, monkeypatch):
    """End to end: a broker configured, beat silent; the first request starts the web
    process's watchdog thread (1 s rounds), which sweeps: the run becomes ambiguous
    without anyone calling the sweep, and not in the request that started it."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERY_INPROCESS_WORKER = False
    settings.RECOVERY_SWEEP_WATCHDOG = True
    settings.RECOVERY_SWEEP_INTERVAL_S = 1
    stop = threading.Event()
    monkeypatch.setattr(inprocess, "_started", threading.Event())
    real_start = inprocess.start
    monkeypatch.setattr(inprocess, "start", lambda **kw: real_start(stop, **kw))
    run_id = _crashed_run(wendy, acme)
    try:
        assert login(vic).get("/t/acme/").status_code == 200  # starts the thread
        deadline = time.monotonic() + 15
        # The sweep commits the run's new state, then writes its heartbeat in its own
        # statement: wait for both (the CI run once read between the two).
        while time.monotonic() < deadline:
            if (Run.objects.get(uuid=run_id).recovery_state == "ambiguous"
                    and "sweep.web" in heartbeat.read()):
                break
            time.sleep(0.2)
        assert Run.objects.get(uuid=run_id).recovery_state == "ambiguous"
        assert "sweep.web" in heartbeat.read()
    finally:
        stop.set()
        for thread in threading.enumerate():
            if thread.name == "recovery-inprocess-worker":
                thread.join(timeout=10)
                assert not thread.is_alive(), "the watchdog thread did not stop"


def _reconcile_queued(acme, rita, run_id) -> None:
    """A reconcile request stored and queued for a worker (the broker refuses at once, so
    nothing is sent: a worker would have taken it from the queue)."""
    with broker_at("redis://127.0.0.1:1/0"):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="died")


def test_a_reconcile_job_whose_worker_died_says_so_while_it_waits(
        stuck, acme, rita, login, api_as, with_broker):
    _reconcile_queued(acme, rita, stuck.run_id)
    req = ReconcileRequest.objects.get()
    # A worker claimed it, then died mid look-up: its claim ran out a minute ago.
    ReconcileRequest.objects.filter(pk=req.pk).update(state="running",
                                                      claimed_until=F("next_attempt_at"))
    age_world(60)
    page = login(rita).get(f"/t/acme/runs/{stuck.run_id}/").content.decode()
    assert "Reconcile job waiting for a worker since" in page
    api = api_as(rita).get(f"/api/v1/tenants/acme/runs/{stuck.run_id}").json()
    (shown,) = api["reconcile_requests"]
    assert shown["waiting_for_worker_since"] is not None
    assert shown["state"] == "running"


def test_a_reconcile_job_a_worker_is_on_does_not_say_it_waits(
        stuck, acme, rita, login, api_as, with_broker):
    _reconcile_queued(acme, rita, stuck.run_id)
    ReconcileRequest.objects.update(state="running", claimed_until=F("next_attempt_at")
                                    + timedelta(seconds=30))  # claimed, look-up under way
    page = login(rita).get(f"/t/acme/runs/{stuck.run_id}/").content.decode()
    assert "waiting for a worker" not in page
    api = api_as(rita).get(f"/api/v1/tenants/acme/runs/{stuck.run_id}").json()
    assert api["reconcile_requests"][0]["waiting_for_worker_since"] is None
