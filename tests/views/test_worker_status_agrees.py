"""The banner and ``/readyz`` read one rule (``jobs.workerstatus.worker_status``).

A newcomer's finding: with ``CELERY_BROKER_URL`` set and no worker, every dashboard page
said "Background work is not running ... (no sweep has finished yet)" while ``/readyz``
showed ``sweep.web`` 7 s ago; and the banner called a worker late after two sweep
intervals while ``/readyz`` waited ``RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S``. In each
situation below the banner shows exactly when ``/readyz`` names the worker.
Time passes by ageing the stored heartbeats, never by sleeping.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db.models import F

from checkpoints import heartbeat, services
from checkpoints.jobs import inprocess
from checkpoints.models import Heartbeat
from checkpoints.ops import health

pytestmark = pytest.mark.django_db

BANNER = "Background work is not running"


def _age(seconds: float) -> None:
    Heartbeat.objects.update(at=F("at") - timedelta(seconds=seconds))


@pytest.fixture
def broker(settings, monkeypatch):
    monkeypatch.setattr(inprocess, "start", lambda **kw: False)  # no thread in the tests
    monkeypatch.setattr(health, "_check_broker", lambda: None)  # it answers
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERY_INPROCESS_WORKER = False
    settings.RECOVERY_SWEEP_WATCHDOG = True
    return settings


@pytest.fixture
def embedded(settings, monkeypatch):
    monkeypatch.setattr(inprocess, "start", lambda **kw: False)
    monkeypatch.setattr(inprocess, "started_at", [])  # this process started no thread
    settings.RECOVERY_INPROCESS_WORKER = True
    return settings


def _both(login, rita) -> tuple[bool, str, str]:
    """(banner shown, the page, /readyz's worker check)."""
    page = login(rita).get("/t/acme/").content.decode()
    return BANNER in page, page, health.readiness()[1]["worker"]


def _stale(settings) -> float:
    """An age past two sweep intervals (the banner's old rule) within /readyz's bound."""
    age = 3 * settings.RECOVERY_SWEEP_INTERVAL_S
    assert 2 * settings.RECOVERY_SWEEP_INTERVAL_S < age < settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S
    return age


@pytest.mark.parametrize("situation", [
    "no sweep yet", "a recent sweep", "a sweep between the old bounds", "a stale sweep",
    "silent worker, the web sweeps"])
def test_with_a_broker_the_banner_shows_exactly_when_readyz_names_the_worker(
        situation, acme, rita, login, broker):
    bound = broker.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S
    if situation == "a recent sweep":
        services.sweep_stale_runs(by="celery")
    elif situation == "a sweep between the old bounds":
        services.sweep_stale_runs(by="celery")
        _age(_stale(broker))
    elif situation == "a stale sweep":
        services.sweep_stale_runs(by="celery")
        _age(bound + 1)
    elif situation == "silent worker, the web sweeps":
        _age(0)
        assert inprocess.catch_up() is not None  # no sweep at all yet: the web sweeps
        _age(7)
    shown, page, worker = _both(login, rita)
    assert shown == (worker == "failed: WorkerSilent"), (shown, worker)
    expect_late = situation in ("no sweep yet", "a stale sweep", "silent worker, the web sweeps")
    assert shown == expect_late
    if situation == "silent worker, the web sweeps":
        # It names the web's sweep instead of claiming none finished.
        web = heartbeat.read()["sweep"].at
        assert "no sweep has finished yet" not in page
        assert "no worker has finished a sweep yet" in page
        assert f"last sweep {web:%Y-%m-%d %H:%M:%S} UTC" in page


@pytest.mark.parametrize("situation", [
    "no sweep yet", "a recent sweep", "a sweep between the old bounds", "a stale sweep",
    "a fresh start"])
def test_in_process_the_banner_shows_exactly_when_readyz_names_the_worker(
        situation, acme, rita, login, embedded, monkeypatch):
    bound = embedded.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S
    if situation != "no sweep yet" and situation != "a fresh start":
        services.sweep_stale_runs(by="inprocess")
    if situation == "a sweep between the old bounds":
        _age(_stale(embedded))
    elif situation == "a stale sweep":
        _age(bound + 1)
    elif situation == "a fresh start":  # started moments ago, no round yet
        monkeypatch.setattr(inprocess, "started_at", [time.monotonic() - _stale(embedded)])
    shown, _page, worker = _both(login, rita)
    assert shown == (worker == "failed: WorkerSilent"), (shown, worker)
    assert shown == (situation in ("no sweep yet", "a stale sweep"))
    assert "sweeps stale runs itself" not in _page


def test_without_any_worker_neither_names_one(acme, rita, login, settings):
    settings.RECOVERY_INPROCESS_WORKER = False  # the test runner's own setting, explicit
    shown, _page, worker = _both(login, rita)
    assert not shown and worker == "not configured"
