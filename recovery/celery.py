"""Celery application.

With ``CELERY_BROKER_URL`` unset (the embedded default) tasks run in-process
(``task_always_eager``) after the database commit that queued them; with a broker they
go to real workers. Beat runs the stale-run sweep every ``RECOVERY_SWEEP_INTERVAL_S``.
"""

import logging
import os
import re

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from recovery import kombu_ack

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
# A failed ack must not stop the worker consuming (issue 17, item 11; recovery/kombu_ack.py).
kombu_ack.install()

app = Celery("recovery")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The tasks live in the job layer, checkpoints/jobs/tasks.py (docs/architecture.md); their
# names stay "checkpoints.tasks.*", the names queued messages and the beat schedule carry.
app.autodiscover_tasks(["checkpoints.jobs"])


class QuietHousekeeping(logging.Filter):
    """Drops the worker's and beat's INFO lines about beat's own periodic tasks (the
    audit sequencer every second, the sweep, notifications and retention: "Scheduler:
    Sending due task …", "Task … received", "Task … succeeded"), which at
    ``--loglevel=INFO`` were 391 of 541 worker lines in 3.5 minutes (a newcomer's
    finding; about 170,000 a day). Their warnings and errors pass; that they run shows
    in their heartbeats (``/readyz``, ``recovery_heartbeat_age_seconds``). Only those
    three routine lines are dropped: a retry ("Task … retry: Retry in 5s", which Celery
    logs at INFO) and anything else about these tasks pass, so failing housekeeping stays
    visible (stop 33)."""

    #: The routine lines, as Celery words them (``celery.app.trace.LOG_RECEIVED``,
    #: ``LOG_SUCCESS``; ``celery.beat``'s "Sending due task").
    ROUTINE = re.compile(r"^(?:Task \S+ received\Z|Task \S+ succeeded in |"
                         r"Scheduler: Sending due task )")

    def __init__(self, tasks):
        super().__init__()
        # A task's name as Celery's lines carry it: "NAME[id]", or "(NAME)" in beat's.
        self.names = re.compile("|".join(rf"{re.escape(t)}[\[)]" for t in tasks))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        message = record.getMessage()
        return not (self.ROUTINE.match(message) and self.names.search(message))


@after_setup_logger.connect
@after_setup_task_logger.connect
def structured_worker_logs(logger, **kwargs):
    """The worker's and beat's log lines as the web's (settings ``RECOVERY_LOG_FORMAT``):
    each carries ``request_id`` (django-guid's Celery integration: the id of the request
    that sent the task, or a fresh one per task from beat), and with ``json`` each line is
    a JSON object. Celery keeps its own handlers and ``--loglevel``."""
    # Imported when a worker sets up its logging: this module is imported (by
    # recovery/__init__) before Django's settings are configured.
    from django.conf import settings
    from django_guid.log_filters import CorrelationId
    from pythonjsonlogger.json import JsonFormatter

    formatter = None
    if settings.RECOVERY_LOG_FORMAT == "json":
        spec = settings.LOGGING["formatters"]["json"]
        formatter = JsonFormatter(spec["format"], rename_fields=spec["rename_fields"],
                                  datefmt=spec["datefmt"])
    quiet = QuietHousekeeping(spec["task"] for spec in settings.CELERY_BEAT_SCHEDULE.values())
    for handler in logger.handlers:
        handler.addFilter(CorrelationId(correlation_id_field="request_id"))
        handler.addFilter(quiet)
        if formatter is not None:
            handler.setFormatter(formatter)
