"""Beat's periodic tasks expire (the operator's walk: with the worker stopped 25 s the
broker held 33 tasks, and every one ran on restart; the audit task's 1 s interval makes
that ~86,000 a day of outage). Each entry of ``CELERY_BEAT_SCHEDULE`` carries
``options.expires`` (seconds): at least its interval, so a tick is never dropped before
the next is sent, and at most ``max(3 x interval, 30 s)``, so a stopped worker's backlog
is skipped on restart, not run (the work is idempotent; the next tick sends a fresh one)."""

from __future__ import annotations

from datetime import UTC, datetime
from unittest import mock

from celery.beat import Scheduler
from django.conf import settings

from checkpoints.jobs import tasks  # registers the tasks beat names
from recovery.celery import app


def test_every_beat_entry_expires_within_a_small_multiple_of_its_interval():
    assert settings.CELERY_BEAT_SCHEDULE  # the four housekeeping tasks
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        interval = entry["schedule"].total_seconds()
        expires = entry.get("options", {}).get("expires")
        assert isinstance(expires, int | float), (name, expires)
        assert interval <= expires <= max(3 * interval, 30), (name, interval, expires)


def test_beat_sends_each_task_with_its_expiry():
    """What beat really sends: Celery's scheduler passes the entry's options to the
    task's ``apply_async``, and the message then carries an absolute ``expires``."""
    scheduler = Scheduler(app, lazy=True)
    scheduler.setup_schedule()
    scheduler.update_from_dict(app.conf.beat_schedule)
    sent = {}
    for name in settings.CELERY_BEAT_SCHEDULE:
        entry = scheduler.schedule[name]
        task = app.tasks[entry.task]
        with mock.patch.object(type(task), "apply_async") as apply_async:
            scheduler.apply_async(entry, producer=mock.Mock(), advance=False)
        sent[name] = apply_async.call_args.kwargs["expires"]
    assert sent == {name: entry["options"]["expires"]
                    for name, entry in settings.CELERY_BEAT_SCHEDULE.items()}
    # Celery turns the seconds into a deadline when it builds the message.
    message = app.amqp.as_task_v2("id-1", tasks.audit_integrate.name,
                                  expires=sent["audit-integrate"])
    deadline = datetime.fromisoformat(message.headers["expires"])
    left = (deadline - datetime.now(UTC)).total_seconds()
    assert 0 < left <= sent["audit-integrate"]
