"""The embedded default's background worker: without a broker (no Celery workers, no
beat), the web process itself runs the stale-run sweep and the due reconcile requests
every ``RECOVERY_SWEEP_INTERVAL_S`` (DESIGN.md 4: "something always runs it"), the
retention purge every ``RECOVERY_RETENTION_INTERVAL_S`` (issue 20), and the notification
round (issue 21: the outbox dispatched, due messages sent; ``jobs.notify``) each time and
every ``RECOVERY_NOTIFY_INTERVAL_S`` between, and the audit sequencer every
``RECOVERY_AUDIT_INTEGRATE_INTERVAL_S`` (issue 22: ``services.audit_integrate_all``;
``_loop``).

Started once per process by ``InProcessWorkerMiddleware`` on the first request when
``RECOVERY_INPROCESS_WORKER`` is on (the default without ``CELERY_BROKER_URL``, off under
the test runner). Several processes may each run one: the sweep and the reconcile claims
are safe on many workers at once. A failed round is logged and the next one runs anyway.

With a broker, beat and the Celery workers sweep, and the web process only watches
(issue 17, item 6: the state a reviewer reads must not depend on the broker): with
``RECOVERY_SWEEP_WATCHDOG`` on (the default, off under the test runner) the same thread
wakes every interval and, when no sweep at all finished in the last two intervals (the
``sweep`` heartbeat, database clock), runs the sweep itself (``catch_up``): the same
service function, in this background thread (never in a request's handling path: a GET
writes nothing), at most one web process at a time (a PostgreSQL advisory lock, tried
without waiting); likewise the notification round when no round finished in two
notification intervals (the ``notify`` heartbeat), and the audit sequencer with the
sweep or when its own rounds stopped (``_audit_catch_up``). Reconcile jobs still wait for a worker (their look-ups are the
worker's); the run page says so (``ReconcileRequest.waiting_for_worker_since``).
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connections

from .. import audittree, heartbeat, locks, services
from ..services.retention import ROUND_HEARTBEAT as RETENTION_HEARTBEAT
from . import notify

log = logging.getLogger(__name__)

_started = threading.Event()
_lock = threading.Lock()
#: When (monotonic seconds) this process's worker thread started (for ``/readyz``'s grace).
started_at: list[float] = []
#: A PostgreSQL advisory lock key: one catch-up sweep at a time across web processes.
CATCH_UP_LOCK = 0x7265_636F_7665_7279 >> 1  # "recovery", as a positive bigint
#: Another: one catch-up notification round at a time across web processes.
NOTIFY_LOCK = CATCH_UP_LOCK - 1


def run_once() -> dict:
    """One round: the sweep, which also executes due reconcile requests here; then the
    retention purge when it is due (``retention_due``); then the notification round."""
    stats = services.sweep_stale_runs(by="inprocess")
    _retention_if_due(stats)
    _notify(stats)
    return stats


def _notify(stats: dict) -> None:
    """Run the notification round (``jobs.notify.notify_round``), adding its counts to
    ``stats``; its failure is logged as such (``/readyz`` names ``notifications`` while
    messages wait)."""
    try:
        stats["notify"] = notify.notify_round()
    except Exception:  # noqa: BLE001 - logged; the next round tries again
        log.exception("notification round failed; the next round tries again")


def notify_late(beats: dict | None = None) -> bool:
    """Whether no notification round finished in the last two notification intervals
    (``RECOVERY_NOTIFY_INTERVAL_S``, at least two sweep intervals: the watchdog wakes
    that often), or none ever did (the ``notify`` heartbeat, database clock)."""
    beats = heartbeat.read() if beats is None else beats
    found = beats.get(heartbeat.NOTIFY)
    late = 2 * max(settings.RECOVERY_NOTIFY_INTERVAL_S, settings.RECOVERY_SWEEP_INTERVAL_S)
    return found is None or found.age_s > late


def _retention_if_due(stats: dict) -> None:
    """Run the retention purge when it is due (``retention_due``), adding its counts to
    ``stats``. Its failure is logged as such, never as the sweep's (the sweep's heartbeat
    is already written); ``/readyz`` names ``retention`` until a round succeeds."""
    if not retention_due():
        return
    try:
        result = services.retention_purge_all()
    except Exception:  # noqa: BLE001 - logged; the next round tries again
        log.exception("retention purge failed; /readyz names retention until it succeeds")
        return
    stats["retention"] = {"purged": result["purged"], "expired": result["expired"],
                          "failed": result["failed"]}


def retention_due(beats: dict | None = None) -> bool:
    """Whether the retention purge is due: no round ran (the ``retention.round``
    heartbeat, database clock) in the last ``RECOVERY_RETENTION_INTERVAL_S``. Several
    processes may find it due at once: the per-tenant cleanup lease lets one through."""
    beats = heartbeat.read() if beats is None else beats
    last = beats.get(RETENTION_HEARTBEAT)
    return last is None or last.age_s >= settings.RECOVERY_RETENTION_INTERVAL_S


def catch_up() -> dict | None:
    """One watchdog round (with a broker): when no sweep finished in the last two
    intervals (``heartbeat.sweep_late``, database clock), run ``sweep_stale_runs`` here
    and return its counts; else, or when another web process is already catching up,
    return None. Never call it from a request's handling path (it writes). The
    notification round is caught up with the sweep, and on its own when its heartbeat
    stopped (``notify_late``): its counts under ``notify`` in what this returns (alone
    when only it was late)."""
    beats = heartbeat.read()
    sweep_late = heartbeat.sweep_late(beats)
    notified = _notify_catch_up(beats, force=sweep_late)
    sealed = _audit_catch_up(beats, force=sweep_late)
    if sealed:
        notified = (notified or {}) | sealed
    if not sweep_late:
        return notified
    with locks.try_session_lock(CATCH_UP_LOCK) as mine:
        if not mine:
            return None
        log.warning("no sweep finished in %s s (broker or beat down?): this web process "
                    "sweeps", heartbeat.late_after_s())
        stats = services.sweep_stale_runs(by="web")
        _retention_if_due(stats)  # beat down: its retention round is not coming either
        if notified:
            stats.update(notified)
        return stats


def _audit_catch_up(beats: dict, *, force: bool) -> dict | None:
    """The watchdog's audit sequencer round, when ``force`` (the sweep is late: beat or
    the broker is down, and beat's sequencer with them) or when sequencer rounds ran
    and stopped (``audit.integrate`` heartbeat older than two watchdog intervals):
    ``{"audit": events integrated}``, else None. Several web processes may run it at
    once: each tenant's sequencer lease lets one through (``audit_integrate``). Without
    it a broker outage left every audit event unsealed until beat came back (the
    attack's finding), past ``RECOVERY_AUDIT_LAG_MAX_S``."""
    found = beats.get(audittree.HEARTBEAT)
    stopped = found is not None and found.age_s > 2 * max(
        settings.RECOVERY_AUDIT_INTEGRATE_INTERVAL_S, settings.RECOVERY_SWEEP_INTERVAL_S)
    if not (force or stopped):
        return None
    log.warning("no audit sequencer round finished lately (broker or beat down?): this "
                "web process integrates the queued audit events")
    try:
        return {"audit": services.audit_integrate_all()}
    except Exception:  # noqa: BLE001 - logged; the next round tries again
        log.exception("audit integration failed; /readyz names audit while events wait")
        return None


def _notify_catch_up(beats: dict, *, force: bool) -> dict | None:
    """The watchdog's notification round, when ``force`` (the sweep is late: beat or the
    broker is down) or when rounds ran and stopped (``notify_late`` with a ``notify``
    heartbeat), and no other web process is running one: ``{"notify": counts}``, else
    None."""
    if not force and (heartbeat.NOTIFY not in beats or not notify_late(beats)):
        return None
    with locks.try_session_lock(NOTIFY_LOCK) as mine:
        if not mine:
            return None
        log.warning("no notification round finished lately (broker or beat down?): this "
                    "web process runs one")
        stats: dict = {}
        _notify(stats)
        return stats or None


def _integrate() -> None:
    """Run the audit sequencer over every tenant (``services.audit_integrate_all``); its
    failure is logged (``/readyz`` names ``audit`` while events wait too long)."""
    try:
        services.audit_integrate_all()
    except Exception:  # noqa: BLE001 - logged; the next tick tries again
        log.exception("audit integration failed; the next tick tries again")


def _loop(interval_s: float, stop: threading.Event, round_=run_once,
          notify_s: float | None = None, audit_s: float | None = None) -> None:
    """Run ``round_`` every ``interval_s``; with ``notify_s`` shorter (the in-process
    worker: ``RECOVERY_NOTIFY_INTERVAL_S``, 5 s, under the sweep's 10 s), run the
    notification round alone between rounds every ``notify_s``, so a message waits for
    the notification interval, not the sweep's; with ``audit_s`` (the in-process worker:
    ``RECOVERY_AUDIT_INTEGRATE_INTERVAL_S``, 1 s), run the audit sequencer every
    ``audit_s`` (issue 22, item 1)."""
    tick = min(x for x in (interval_s, notify_s, audit_s) if x)
    next_round = time.monotonic() + interval_s
    next_notify = time.monotonic() + (notify_s or 0)
    while not stop.wait(tick):
        try:
            close_old_connections()
            now = time.monotonic()
            if audit_s:
                _integrate()
            if now >= next_round - tick / 10:  # a round is due (a little early is fine)
                next_round = max(next_round + interval_s, now + tick)
                round_()
            elif notify_s and now >= next_notify - tick / 10:
                next_notify = max(next_notify + notify_s, now + tick)
                _notify({})
        except Exception:  # noqa: BLE001 - keep the worker alive; the next round retries
            log.exception("in-process sweep failed; retrying in %s s", interval_s)
        finally:
            connections.close_all()


def start(stop: threading.Event | None = None, *, watchdog: bool = False) -> bool:
    """Start the worker thread once per process; returns whether this call started it.
    With ``watchdog`` it runs ``catch_up`` each interval (a broker is configured) instead
    of sweeping every time."""
    with _lock:
        if _started.is_set():
            return False
        _started.set()
    started_at.append(time.monotonic())
    thread = threading.Thread(target=_loop, name="recovery-inprocess-worker", daemon=True,
                              args=(settings.RECOVERY_SWEEP_INTERVAL_S,
                                    stop or threading.Event(),
                                    catch_up if watchdog else run_once,
                                    None if watchdog else settings.RECOVERY_NOTIFY_INTERVAL_S,
                                    None if watchdog
                                    else settings.RECOVERY_AUDIT_INTEGRATE_INTERVAL_S))
    thread.start()
    return True


def running_for_s() -> float | None:
    """Seconds since this process started its worker thread (None: not started)."""
    return time.monotonic() - started_at[0] if started_at else None


def first_round_pending() -> bool:
    """Whether this process's worker thread started at most
    ``RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S`` ago, so its first round may not have come
    yet: the one grace of a fresh start, with one bound, for ``/readyz``'s ``worker``
    check and the dashboard's "background work is not running" banner alike (a newcomer
    saw the banner blame a broker the demo does not have in its first seconds while
    ``/readyz`` said ok; stop 33)."""
    running = running_for_s()
    return running is not None and running <= settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S


class InProcessWorkerMiddleware:
    """Starts the in-process worker (or, with a broker, the watchdog) on the first
    request when it is enabled."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.enabled = settings.RECOVERY_INPROCESS_WORKER
        self.watchdog = (not self.enabled and settings.RECOVERY_SWEEP_WATCHDOG
                         and heartbeat.broker_configured())

    def __call__(self, request):
        if self.enabled and not _started.is_set():
            start()
        elif self.watchdog and not _started.is_set():
            start(watchdog=True)
        return self.get_response(request)
