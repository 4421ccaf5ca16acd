"""The notification outbox (issue 21, item 4): a run's change into or out of a state a
person must act on is written to ``NotificationOutbox`` in the transaction of the change,
by the trigger of migration 0031, whichever code makes it; nothing else is."""

from __future__ import annotations

import importlib

import pytest
from django.db import transaction

from checkpoints.models import NotificationOutbox, Run
from checkpoints.vocab import RecoveryState
from tests.helpers import ambiguous_run, envelope, put_checkpoint

S = RecoveryState


def outbox(tenant) -> list[tuple[str, str]]:
    return list(NotificationOutbox.objects.for_tenant(tenant).order_by("id")
                .values_list("from_state", "to_state"))


def test_the_trigger_and_the_vocabulary_name_the_same_states():
    migration = importlib.import_module("checkpoints.migrations.0031_notifications")
    assert set(migration.NEEDS_PERSON) == set(S.NEEDS_PERSON)
    assert S.NEEDS_REVIEW < S.NEEDS_PERSON
    assert S.HEALTHY not in S.NEEDS_PERSON and S.COMPLETED not in S.NEEDS_PERSON


@pytest.mark.django_db
def test_a_healthy_run_that_completes_writes_nothing(acme, wendy):
    put_checkpoint(wendy, acme, envelope())
    assert outbox(acme) == []


@pytest.mark.django_db
def test_a_run_going_ambiguous_and_back_is_written_with_the_database_clock(acme, wendy):
    run_id = ambiguous_run(wendy, acme)
    assert outbox(acme) == [(S.HEALTHY, S.AMBIGUOUS)]
    row = NotificationOutbox.objects.for_tenant(acme).get()
    run = Run.objects.for_tenant(acme).get(uuid=run_id)
    assert row.run_id == run.pk and row.event_type == "" and row.detail == {}
    Run.objects.for_tenant(acme).filter(pk=run.pk).update(recovery_state=S.CLOSED)
    assert outbox(acme)[-1] == (S.AMBIGUOUS, S.CLOSED)


@pytest.mark.django_db
def test_a_rolled_back_change_leaves_no_outbox_row(acme, wendy):
    put_checkpoint(wendy, acme, envelope())
    run = Run.objects.for_tenant(acme).get()
    with pytest.raises(RuntimeError), transaction.atomic():
        Run.objects.for_tenant(acme).filter(pk=run.pk).update(recovery_state=S.AMBIGUOUS)
        raise RuntimeError("rolled back")
    assert outbox(acme) == []
