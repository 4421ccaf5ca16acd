"""The notification dispatcher under concurrency on real PostgreSQL (issue 21): dispatch
rounds run by several workers at once (threads on a barrier, each on its own connection)
claim different outbox rows (``SKIP LOCKED``), and whatever the interleaving each event
becomes one message per endpoint, one incident per cause, one page per incident and one
digest per endpoint and day."""

from __future__ import annotations

from collections import Counter

import pytest

from checkpoints.models import NotificationIncident, NotificationMessage, NotificationOutbox
from checkpoints.services import notify_dispatch as nd
from checkpoints.vocab import NotificationEventType as E
from tests.helpers import age_world, sweep_later
from tests.services.test_notify_dispatch import WINDOW, endpoint, in_flight
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 60
WORKERS = 3


def test_concurrent_rounds_write_each_message_once(acme, wendy, adam, monkeypatch, settings):
    monkeypatch.setattr(nd, "BATCH", 7)  # many small batches, so the workers interleave
    settings.RECOVERY_NOTIFY_DIGEST_HOUR = 0
    each = endpoint(acme, adam, name="each", group_window_s=0)
    grouped = endpoint(acme, adam, name="grouped")
    runs = [in_flight(wendy, acme) for _ in range(RUNS)]
    sweep_later()
    assert NotificationOutbox.objects.count() == RUNS

    results = race(WORKERS, lambda _i: nd.dispatch_round())
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(r["dispatched"] for r in results) == RUNS
    assert NotificationOutbox.objects.count() == 0

    told = Counter(m.run.uuid for m in NotificationMessage.objects.filter(
        endpoint=each, event_type=E.RUN_NEEDS_REVIEW).select_related("run"))
    assert told == Counter({run: 1 for run in runs})
    (incident,) = NotificationIncident.objects.filter(endpoint=grouped)
    assert incident.run_count == RUNS
    digests = NotificationMessage.objects.filter(event_type=E.DIGEST)
    assert sorted(digests.values_list("endpoint_id", flat=True)) == sorted([each.pk,
                                                                           grouped.pk])

    age_world(WINDOW + 1)
    race(WORKERS, lambda _i: nd.dispatch_round())
    (page,) = NotificationMessage.objects.filter(endpoint=grouped,
                                                 event_type=E.RUN_NEEDS_REVIEW)
    assert page.payload["data"]["run_count"] == RUNS
    assert NotificationMessage.objects.filter(event_type=E.DIGEST).count() == 2
