"""The embedded default's background worker: without a broker (no Celery workers, no
beat), the web process itself runs the stale-run sweep and the due reconcile requests
every ``RECOVERY_SWEEP_INTERVAL_S`` (DESIGN.md 4: "something always runs it").

Started once per process by ``InProcessWorkerMiddleware`` on the first request when
``RECOVERY_INPROCESS_WORKER`` is on (the default without ``CELERY_BROKER_URL``, off under
the test runner). Several processes may each run one: the sweep and the reconcile claims
are safe on many workers at once. A failed round is logged and the next one runs anyway.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections, connections

log = logging.getLogger(__name__)

_started = threading.Event()
_lock = threading.Lock()


def run_once() -> dict:
    """One round: the sweep, which also executes due reconcile requests here."""
    from .services import sweep_stale_runs

    return sweep_stale_runs()


def _loop(interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        try:
            close_old_connections()
            run_once()
        except Exception:  # noqa: BLE001 - keep the worker alive; the next round retries
            log.exception("in-process sweep failed; retrying in %s s", interval_s)
        finally:
            connections.close_all()


def start(stop: threading.Event | None = None) -> bool:
    """Start the worker thread once per process; returns whether this call started it."""
    with _lock:
        if _started.is_set():
            return False
        _started.set()
    thread = threading.Thread(target=_loop, name="recovery-inprocess-worker", daemon=True,
                              args=(settings.RECOVERY_SWEEP_INTERVAL_S,
                                    stop or threading.Event()))
    thread.start()
    return True


class InProcessWorkerMiddleware:
    """Starts the in-process worker on the first request when it is enabled."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.enabled = settings.RECOVERY_INPROCESS_WORKER

    def __call__(self, request):
        if self.enabled and not _started.is_set():
            start()
        return self.get_response(request)
