"""Issue 17, item 14: every reader of ``dbclock.db_now()`` keeps the database's clock
while the process clock is a day off (CONTRACT.md 3: "every other time comparison uses the
database's clock, never a process's").

``tests/faults/test_clocks.py`` covers the locked path (``run.db_now``, read with the
run's row). These cover the places that ask ``db_now()`` in a query of their own: a new
run's first ``last_write_at``, a bulk action's ``finished_at``, a runifold import's
times, the owner status on the run page, and the report's ``as_of``. Each compares what
was stored or answered with the database's clock read here by SQL of the test's own.
A ``db_now`` returning the process clock fails the bulk, runifold, owner-status and
report tests (curated mutant ``clock-db_now-process-clock``). The new run's first
``last_write_at`` (``services.runs._lock_run``) is overwritten in the same transaction by
the write's own time, read with the locked row (``NOW``), on every path that creates a
run (checkpoint, effect, LangGraph put: tried), so there that reader is not observable;
the test pins what is stored.
"""

from __future__ import annotations

import io
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from checkpoints import reports, selectors, services
from checkpoints.interop import runifold
from checkpoints.interop.runifold import jsonl_lines
from checkpoints.models import BulkAction, Effect, Run
from tests import runifold_synth
from tests.helpers import envelope, put_checkpoint

SKEW = timedelta(days=1)
CLOSE = timedelta(minutes=5)  # far below the skew, far above a slow machine's pauses


def database_clock() -> datetime:
    """The database's time, by SQL of this test's own (not through ``dbclock``)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT CLOCK_TIMESTAMP()")
            value = cursor.fetchone()[0]
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


@pytest.fixture(params=[1, -1], ids=["ahead", "behind"])
def skewed(request, monkeypatch):
    """This process's clock (``timezone.now``, ``time.time``) a day ahead or behind."""
    sign = request.param
    real_now, real_time = timezone.now, time.time
    monkeypatch.setattr(timezone, "now", lambda: real_now() + sign * SKEW)
    monkeypatch.setattr(time, "time", lambda: real_time() + sign * SKEW.total_seconds())
    assert abs(timezone.now() - database_clock()) > SKEW - CLOSE  # the skew is real
    return sign


def on_the_database_clock(value: datetime | None, what: str) -> None:
    assert value is not None, f"{what}: not set"
    off = abs(value - database_clock())
    assert off < CLOSE, f"{what} is {off} off the database's clock (the process clock's?)"


def test_a_new_run_starts_on_the_database_clock(acme, wendy, skewed):
    body = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, body)
    run = Run.objects.get(uuid=body["run_id"])
    on_the_database_clock(run.last_write_at, "the new run's last_write_at")


def test_a_bulk_action_finishes_on_the_database_clock(acme, wendy, rita, skewed):
    body = envelope(payload={"phase": "charged"})
    put_checkpoint(wendy, acme, body)
    bulk, created = services.bulk_submit(
        actor=rita, tenant=acme, action="acknowledge_conflicts", reason="seen",
        run_ids=[body["run_id"]], client_token=uuid.uuid4())
    assert created
    on_the_database_clock(BulkAction.objects.get(pk=bulk.pk).finished_at,
                          "the bulk action's finished_at")


def test_a_runifold_import_writes_on_the_database_clock(acme, skewed):
    data = b"".join(runifold_synth.lines(8))
    report = runifold.runifold_import(actor=None, tenant=acme,
                                      lines=jsonl_lines(io.BytesIO(data)))
    assert report.imported > 0
    runs = list(Run.objects.filter(tenant=acme))
    assert runs
    for run in runs:
        on_the_database_clock(run.last_write_at, f"imported run {run.uuid}'s last_write_at")
    effects = list(Effect.objects.filter(tenant=acme, submitted_at__isnull=False))
    assert effects
    for effect in effects:
        on_the_database_clock(effect.submitted_at, f"imported effect {effect.uuid}'s "
                                                   "submitted_at")


def test_the_owner_status_is_judged_on_the_database_clock(acme, wendy, vic, skewed):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=body["run_id"], owner="worker-1",
                           ttl_s=600)
    run = selectors.run_get(user=vic, tenant=acme, run_id=body["run_id"])

    status = selectors.run_owner_status(user=vic, tenant=acme, run=run)

    # Ahead, the process would call the 10-minute lease long gone; behind, it would call
    # it live for a day: on the database's clock it is live and ends with the lease.
    assert status.live and status.owner == "worker-1"
    assert status.gone_at == run.lease_expires_at
    on_the_database_clock(status.gone_at - timedelta(seconds=600), "the lease's start")


def test_the_report_is_as_of_the_database_clock(acme, vic, skewed):
    answer = reports.figures(user=vic, tenant=acme, range_name="24h")
    on_the_database_clock(answer["as_of"], "the report's as_of")


def test_a_refused_write_is_kept_on_the_database_clock(acme, wendy, vic, skewed):
    """The report buckets conflicts by ``Conflict.created_at`` inside a database-clock
    window: the row's time is the database's (it was the process's, ``auto_now_add``)."""
    from checkpoints.exceptions import StaleRevision
    from checkpoints.models import Conflict

    body = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, body)
    with pytest.raises(StaleRevision):
        put_checkpoint(wendy, acme, body)  # created twice: refused, kept as a conflict
    conflict = Conflict.objects.for_tenant(acme).get()
    on_the_database_clock(conflict.created_at, "the conflict's created_at")
    answer = reports.figures(user=vic, tenant=acme, range_name="24h")
    assert sum(sum(series) for series in answer["conflicts"].values()) == 1, answer["conflicts"]
