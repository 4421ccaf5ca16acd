"""The retention purge is scheduled (issue 20, item 1): a Celery beat entry with a
broker, the in-process worker's round without one, due once per
``RECOVERY_RETENTION_INTERVAL_S`` on the database clock (the ``retention`` heartbeat)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import F

from checkpoints import heartbeat
from checkpoints.jobs import inprocess, tasks
from checkpoints.models import Heartbeat, Tombstone
from tests.helpers import age_world

from .retention_world import DAY, completed_run, set_policy

pytestmark = pytest.mark.django_db


def test_beat_schedules_the_purge_every_interval():
    entry = settings.CELERY_BEAT_SCHEDULE["retention-purge"]
    assert entry["task"] == tasks.retention_purge.name
    assert entry["schedule"].total_seconds() == settings.RECOVERY_RETENTION_INTERVAL_S


def test_the_task_purges_and_beats(acme, wendy):
    completed_run(wendy, acme)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    assert tasks.retention_purge() == {"purged": 1, "expired": 0}
    assert "retention" in heartbeat.read()


def test_the_inprocess_round_purges_once_per_interval(acme, wendy, settings):
    settings.RECOVERY_RETENTION_INTERVAL_S = 3600
    set_policy(acme, payload_retention_days=1)
    completed_run(wendy, acme, order_id="first")
    age_world(2 * DAY)
    assert inprocess.run_once()["retention"] == {"purged": 1, "expired": 0, "failed": []}
    completed_run(wendy, acme, order_id="second")
    age_world(2 * DAY)  # the heartbeat is not aged: the purge ran a moment ago
    assert "retention" not in inprocess.run_once()
    assert Tombstone.objects.count() == 1
    Heartbeat.objects.filter(name="retention.round").update(at=F("at") - timedelta(seconds=3600))
    assert inprocess.run_once()["retention"]["purged"] == 1  # an interval later: due
