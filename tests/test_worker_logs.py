"""The worker's and beat's log lines (recovery/celery.py): beat's periodic tasks say
nothing at INFO, everything else does (stop 32, a newcomer's finding: the audit
sequencer's one-second task was 391 of 541 worker lines in 3.5 minutes)."""

from __future__ import annotations

import logging

from django.conf import settings

from recovery.celery import QuietHousekeeping, structured_worker_logs


def _record(name: str, level: int, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_beats_periodic_tasks_are_quiet_at_info_and_heard_when_they_fail():
    quiet = QuietHousekeeping(s["task"] for s in settings.CELERY_BEAT_SCHEDULE.values())
    for line in ("Task checkpoints.tasks.audit_integrate[9f1c] succeeded in 0.01s: 0",
                 "Task checkpoints.tasks.audit_integrate[9f1c] received",
                 "Scheduler: Sending due task audit-integrate "
                 "(checkpoints.tasks.audit_integrate)",
                 "Task checkpoints.tasks.sweep_stale_runs[1] succeeded in 0.2s: {}",
                 "Task checkpoints.tasks.notify[2] received"):
        assert not quiet.filter(_record("celery.app.trace", logging.INFO, line)), line
    failed = _record("celery.app.trace", logging.ERROR,
                     "Task %s[9f1c] raised unexpected: %r", "checkpoints.tasks.audit_integrate",
                     RuntimeError("db down"))
    assert quiet.filter(failed)
    reconcile = _record("celery.app.trace", logging.INFO,
                        "Task checkpoints.tasks.reconcile_effect[3] succeeded in 1.2s: None")
    assert quiet.filter(reconcile)
    longer = _record("celery.app.trace", logging.INFO,
                     "Task checkpoints.tasks.notify_digest[4] received")  # a name it starts
    assert quiet.filter(longer)
    # (stop 33) Celery logs a retry at INFO: failing housekeeping that retries stays
    # visible, as does any line about these tasks but the three routine ones.
    for line in ("Task checkpoints.tasks.audit_integrate[9f1c] retry: Retry in 5s: "
                 "OperationalError('db down')",
                 "Task checkpoints.tasks.sweep_stale_runs[1] received, but was revoked"):
        assert quiet.filter(_record("celery.app.trace", logging.INFO, line)), line


def test_the_worker_and_beat_handlers_get_the_filter():
    logger = logging.getLogger("test-worker-logs")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    try:
        structured_worker_logs(logger)
        assert any(isinstance(f, QuietHousekeeping) for f in handler.filters)
    finally:
        logger.removeHandler(handler)
