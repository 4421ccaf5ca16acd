"""Celery application.

With ``CELERY_BROKER_URL`` unset (the embedded default) tasks run in-process
(``task_always_eager``) after the database commit that queued them; with a broker they
go to real workers. Beat runs the stale-run sweep every ``RECOVERY_SWEEP_INTERVAL_S``.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")

app = Celery("recovery")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
