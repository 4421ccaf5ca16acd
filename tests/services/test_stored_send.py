"""One send loop for stored background work (``services.stored_send.send_stored``):
reconcile requests, stored migration jobs and stored bulk jobs are published one Celery
message each, and a broker that fails part-way is recorded row by row.

The broker here takes two messages and then refuses (``Broker``): the two jobs it took
are marked ``dispatched_at`` and carry no error (they are on their way: no false
"broker unavailable" on their pages, not counted as undispatched), the third stays
``queued`` with the broker-down error and no ``dispatched_at``, and the answer still says
that not everything was handed over and that nothing is lost. The sweep's re-drive then
sends what waits, once due (``RECOVERY_RECONCILE_REDRIVE_GRACE_S`` with a broker).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F

from checkpoints import services
from checkpoints.models import BulkAction, MigrationJob, ReconcileRequest, Run
from checkpoints.selectors.nextstep import reconcile_rows
from checkpoints.services import bulk_jobs, migration_jobs, reconcile_requests
from checkpoints.vocab import PhaseClass, RecoveryState
from tests.faults.conftest import in_doubt_run
from tests.helpers import age_world

pytestmark = pytest.mark.django_db

GRACE_S = 30


class Broker:
    """A task queue that takes ``up_for`` messages, then refuses every one (as a Redis
    that went away mid-loop): ``taken`` lists the ``(task name, args)`` it took."""

    def __init__(self, up_for: int):
        self.up_for = up_for
        self.taken: list[tuple[str, list]] = []

    def send_task(self, app, name, args=None, countdown=None, **options):
        if len(self.taken) >= self.up_for:
            raise ConnectionRefusedError("redis://127.0.0.1:6379: connection refused")
        self.taken.append((name, list(args)))

    def pks(self) -> list[int]:
        return [args[0] for _, args in self.taken]


@pytest.fixture
def broker(settings, monkeypatch):
    """A broker configured (tasks are not run eagerly) that fails after two messages."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERY_RECONCILE_REDRIVE_GRACE_S = GRACE_S
    fake = Broker(up_for=2)
    monkeypatch.setattr("celery.app.base.Celery.send_task",
                        lambda app, *a, **kw: fake.send_task(app, *a, **kw))
    return fake


@dataclass
class Kind:
    """One kind of stored work: its model, how three of its rows are made through the
    services, its dispatch and its re-drive, and its queued state."""

    model: Any
    make: Any
    dispatch: Any
    redrive: Any
    queued: str = "queued"


def _requests(acme, wendy, rita, adam, monkeypatch) -> list[int]:
    run = in_doubt_run(wendy, acme, keys=("charge:A-1", "charge:A-2", "charge:A-3"))
    age_world(3600)
    queued = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                    reason="the worker died")
    return sorted(r.pk for r in queued.requests)


def _migration_jobs(acme, wendy, rita, adam, monkeypatch) -> list[int]:
    return [services.migration_job_submit(actor=adam, tenant=acme, kind="acme.order",
                                          to_version=2, client_token=uuid.uuid4())[0].pk
            for _ in range(3)]


def _bulk_jobs(acme, wendy, rita, adam, monkeypatch) -> list[int]:
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    rows = [Run(tenant=acme, uuid=uuid.uuid4(), kind="acme.order", workflow="acme.order",
                phase_class=PhaseClass.STABLE, phase_label=f"ready {i}",
                recovery_state=RecoveryState.HEALTHY) for i in range(4)]
    Run.objects.for_tenant(acme).bulk_create(rows)
    pks = []
    for _ in range(3):
        bulk, created = services.bulk_submit(
            actor=rita, tenant=acme, action="close", reason="incident 42",
            client_token=uuid.uuid4(), run_ids=[str(r.uuid) for r in rows])
        assert created and bulk.background
        pks.append(bulk.pk)
    return pks


KINDS = {
    "reconcile_requests": Kind(ReconcileRequest, _requests, reconcile_requests.dispatch,
                               reconcile_requests.redrive),
    "migration_jobs": Kind(MigrationJob, _migration_jobs,
                           migration_jobs.migration_job_dispatch,
                           migration_jobs.migration_jobs_redrive),
    "bulk_jobs": Kind(BulkAction, _bulk_jobs, bulk_jobs.bulk_job_dispatch,
                      bulk_jobs.bulk_jobs_redrive),
}


@pytest.fixture(params=sorted(KINDS))
def kind(request) -> Kind:
    return KINDS[request.param]


@pytest.fixture
def three(kind, acme, wendy, rita, adam, monkeypatch) -> list[int]:
    """Three stored rows of the kind, ``queued``, never sent (nothing is published inside
    the test's transaction: the services hand them over after commit)."""
    pks = kind.make(acme, wendy, rita, adam, monkeypatch)
    assert len(pks) == 3
    assert list(kind.model.objects.filter(pk__in=pks).values_list(
        "state", "dispatched_at", "last_error")) == [(kind.queued, None, "")] * 3
    return pks


def rows(kind: Kind, pks: list[int]) -> dict[int, Any]:
    return {r.pk: r for r in kind.model.objects.filter(pk__in=pks)}


def test_a_broker_failing_part_way_marks_only_the_unsent_with_the_error(
        kind, three, broker):
    sent = kind.dispatch(three)

    assert broker.pks() == three[:2]
    stored = rows(kind, three)
    for pk in three[:2]:  # taken by the broker: on their way, no error
        assert stored[pk].dispatched_at is not None
        assert stored[pk].last_error == ""
    waiting = stored[three[2]]  # never published: waits for the sweep, says why
    assert waiting.state == kind.queued and waiting.dispatched_at is None
    assert "broker unavailable (ConnectionRefusedError)" in waiting.last_error
    # The answer: not everything was handed over, nothing is lost, and how many went.
    assert sent.ok is False
    assert "2 of 3 queued for a worker" in sent.detail
    assert "worker is back (nothing is lost)" in sent.detail


def test_a_partial_send_of_reconcile_requests_answers_waiting(acme, wendy, rita, adam,
                                                              monkeypatch, broker):
    """Some requests still wait for the task queue: ``dispatch`` says ``waiting`` (not
    ``worker``), the value a reviewer reads as "not everything is on its way"."""
    pks = _requests(acme, wendy, rita, adam, monkeypatch)
    sent = reconcile_requests.dispatch(pks)
    assert (sent.ok, sent.dispatch) == (False, "waiting")
    # The run page and its next step count only the unsent one as waiting for the queue.
    shown = reconcile_rows(ReconcileRequest.objects.filter(pk__in=pks)
                           .select_related("effect").order_by("pk"))
    assert [row["broker_down"] for row in shown] == [False, False, True]


def test_a_broker_refusing_from_the_first_message_keeps_todays_words(kind, three, broker):
    broker.up_for = 0
    sent = kind.dispatch(three)
    assert sent.ok is False
    assert sent.detail == ("queued; the task queue is unavailable, so it will run when the "
                           "worker is back (nothing is lost)")
    assert all(r.dispatched_at is None and "broker unavailable" in r.last_error
               for r in rows(kind, three).values())


def test_a_broker_taking_everything_marks_everything_sent(kind, three, broker):
    broker.up_for = 3
    sent = kind.dispatch(three)
    assert (sent.ok, sent.detail) == (True, "queued for a worker")
    assert broker.pks() == three
    assert all(r.dispatched_at is not None and r.last_error == ""
               for r in rows(kind, three).values())


def _age(kind: Kind, seconds: int) -> None:
    """Each row's next attempt ``seconds`` earlier (the database clock's "later")."""
    kind.model.objects.filter(next_attempt_at__isnull=False).update(
        next_attempt_at=F("next_attempt_at") - timedelta(seconds=seconds))


def test_the_sweep_sends_what_waits_once_due_and_nothing_before_the_grace(
        kind, three, broker):
    kind.dispatch(three)
    broker.up_for, broker.taken = 10, []

    # Within the grace (the messages taken are on their way): nothing is sent again,
    # neither those two nor the one that waits.
    assert kind.redrive() == 0
    assert broker.pks() == []

    # Past it: the one that waits is sent; the two sent before are sent again too, as
    # for any message that may have been lost (a claim makes a second delivery harmless).
    _age(kind, GRACE_S + 1)
    assert kind.redrive() == 3
    assert sorted(broker.pks()) == three
    stored = rows(kind, three)
    assert all(r.dispatched_at is not None for r in stored.values())
    assert stored[three[2]].state == kind.queued


def test_a_row_sent_after_an_outage_loses_the_outages_error(kind, three, broker):
    """A send that gets through clears the "broker unavailable" an earlier send left
    (the job page showed it for the job's whole run); another error stays."""
    broker.up_for = 0
    kind.dispatch(three)
    kind.model.objects.filter(pk=three[2]).update(last_error="a look-up answered 500")
    broker.up_for, broker.taken = 10, []
    assert kind.dispatch(three).ok
    assert [rows(kind, three)[pk].last_error for pk in three] == [
        "", "", "a look-up answered 500"]
