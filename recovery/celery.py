"""Celery application.

With ``CELERY_BROKER_URL`` unset (the embedded default) tasks run in-process
(``task_always_eager``) after the database commit that queued them; with a broker they
go to real workers. Beat runs the stale-run sweep every ``RECOVERY_SWEEP_INTERVAL_S``.
"""

import os

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
    for handler in logger.handlers:
        handler.addFilter(CorrelationId(correlation_id_field="request_id"))
        if formatter is not None:
            handler.setFormatter(formatter)
