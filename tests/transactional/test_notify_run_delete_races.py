"""Deleting a run while the notification dispatcher writes rows naming it, on real
PostgreSQL: the delete never fails, the dispatch round never fails, and nothing naming
the run is left behind (``locks`` module docstring: "Rows naming a run").

The run deletes: retention's second phase (``retention._expire_one``, through
``retention_purge``) and the LangGraph thread delete (``graph_thread_delete``, whose
``_settle_run`` deletes a run nothing else refers to). The dispatcher's writers of rows
naming a run: the drain (``_drain_batch``) joining a run to an incident
(``NotificationIncidentRun``) and writing a message naming the run (a per-event message,
a ``run.resolved`` one). The aging step's mark and outbox row name only runs of
unknown outcome, which neither delete takes (the ``locks`` docstring says why): no race
to force there.

What keeps the drain and a delete apart is not a run lock (both deletes hold the run
``FOR NO KEY UPDATE``, which an insert's foreign-key check does not wait for) but the
outbox row the drain claimed: it names the run, and the delete's cascade deletes the
run's outbox rows first (before its incident runs, aging marks and messages). These tests
fail if that stops being so.

Both orders are forced, none by sleeping: a step waits until the other connection is
blocked on a lock (``pg_blocking_pids``) or has finished (``_blocked_or_done``).

- The writer first: once it has claimed its row, read the run and routed its event
  (``_Batch.write``, before any insert), the delete is asked on another connection; it
  waits for the drain at its cascade's first statement (the run's outbox rows), then
  deletes the run with what the drain wrote.
- The delete first: at three points of the delete (before its cascade; after the cascade
  deleted the run's incident runs; after the run row's ``DELETE``), each before its
  ``COMMIT``, the drain runs on another connection and ends without waiting: before the
  cascade it claims the row and writes as usual (the delete then takes what it wrote);
  later the row is the delete's, and the drain claims nothing and tells nobody.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.models.signals import post_delete, pre_delete

from checkpoints import services
from checkpoints.interop import langgraph
from checkpoints.models import (
    NotificationAgingMark,
    NotificationIncidentRun,
    NotificationMessage,
    NotificationOutbox,
    Run,
)
from checkpoints.services import notify_dispatch as nd
from checkpoints.vocab import NotificationEventType as E
from recovery_client.protocol import thread_run_id
from tests.helpers import age_world, envelope, graph_put, lg_put, put_checkpoint
from tests.services.test_notify_dispatch import endpoint
from tests.transactional.test_lock_order import _in_thread
from tests.transactional.test_notify_endpoint_delete_races import _blocked_or_done

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DAY = 86_400


# --- the deletes, each with its run (returns the run and the delete) ----------------------

def _retention(acme, wendy, adam):
    """A completed run whose payloads retention deleted, old enough for phase 2."""
    services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=1,
                             effect_retention_days=2, restart_interval_s=DAY)
    body = envelope(payload={"phase": "ready", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, {**body, "revision": 1,
                                 "payload": {"phase": "completed", "order_id": "A-1"}},
                   expected=0)
    age_world(DAY + DAY // 2)  # past the payloads' 1 day, not the records' 2
    assert services.retention_purge(tenant=acme)["purged"] == 1
    age_world(DAY)
    run = Run.objects.for_tenant(acme).get(uuid=body["run_id"])

    def delete():
        return services.retention_purge(tenant=acme)["expired"]
    return run, delete


def _langgraph(acme, wendy, adam):
    """A LangGraph thread whose run nothing else refers to: its delete deletes the run."""
    graph_put(wendy, acme, lg_put("t-gone", "1f0c-0001"))
    run = Run.objects.for_tenant(acme).get(uuid=thread_run_id("t-gone"))

    def delete():
        return int(langgraph.graph_thread_delete(actor=wendy, tenant=acme,
                                                 thread_id="t-gone") == 1)
    return run, delete


DELETES = {"retention": _retention, "langgraph": _langgraph}


# --- the writers: an endpoint and an outbox row the drain turns into a row naming the run;
# and what the drain answers (rows drained, messages written) -----------------------------

def _incident(acme, adam, run):
    endpoint(acme, adam)  # a window: the run joins an incident
    NotificationOutbox.objects.create(tenant=acme, run=run, from_state="healthy",
                                      to_state="ambiguous")
    return 1, 0


def _message(acme, adam, run):
    endpoint(acme, adam, group_window_s=0)
    NotificationOutbox.objects.create(tenant=acme, run=run, from_state="healthy",
                                      to_state="ambiguous")
    return 1, 1


def _resolved(acme, adam, run):
    endpoint(acme, adam, event_types=[E.RUN_RESOLVED])
    NotificationOutbox.objects.create(tenant=acme, run=run, from_state="ambiguous",
                                      to_state="completed")
    return 1, 1


WRITERS = {"incident run": _incident, "per-event message": _message,
           "resolved message": _resolved}


def _nothing_names(run) -> None:
    assert not Run.objects.filter(pk=run.pk).exists()
    assert not NotificationOutbox.objects.filter(run_id=run.pk).exists()
    assert not NotificationIncidentRun.objects.filter(run_id=run.pk).exists()
    assert not NotificationAgingMark.objects.filter(run_id=run.pk).exists()
    assert not NotificationMessage.objects.filter(run_id=run.pk).exists()


def _statement(box: dict) -> str:
    """The statement the thread's connection is running (``pg_stat_activity``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [box["pid"]])
        return cursor.fetchone()[0]


# --- the writer first --------------------------------------------------------------------

@pytest.mark.parametrize("deleter", list(DELETES))
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_delete_during_the_drain_waits_and_takes_what_was_written(
        acme, wendy, adam, monkeypatch, writer, deleter):
    run, delete = DELETES[deleter](acme, wendy, adam)
    wrote = WRITERS[writer](acme, adam, run)
    original = nd._Batch.write
    seen: dict = {}

    def hooked(batch):
        # The drain has read the run and routed its event; it has inserted nothing yet.
        if "thread" not in seen:
            seen["thread"], seen["box"] = _in_thread(delete)
            seen["state"] = _blocked_or_done(seen["box"])
            seen["waits_in"] = _statement(seen["box"])
        return original(batch)

    monkeypatch.setattr(nd._Batch, "write", hooked)
    try:
        result = nd._drain_batch()
    finally:
        if "thread" in seen:
            seen["thread"].join(timeout=30)
    assert result == wrote
    assert not seen["thread"].is_alive(), "the delete is stuck"
    assert seen["state"] == "blocked", "the delete did not wait for the writer"
    # It waited for the outbox row the drain claimed, before deleting any row naming the
    # run (had it deleted the run's incident runs or messages first, what the drain then
    # wrote would fail the delete's COMMIT).
    outbox = NotificationOutbox._meta.db_table
    assert seen["waits_in"].startswith(f'DELETE FROM "{outbox}"'), seen["waits_in"]
    assert seen["box"] == {"pid": seen["box"]["pid"], "result": 1}, seen["box"]
    _nothing_names(run)


# --- the delete first --------------------------------------------------------------------

#: Where the delete is when the drain runs: before its cascade collects (``pre_delete`` of
#: the run), once the cascade deleted the run's incident runs, once the run row is deleted
#: (``post_delete``); each before the delete's ``COMMIT``.
POINTS = ("before the cascade", "after the incident runs", "after the run row")


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("deleter", list(DELETES))
@pytest.mark.parametrize("writer", list(WRITERS))
def test_the_drain_during_a_delete_ends_cleanly_and_tells_nobody(
        acme, wendy, adam, writer, deleter, point):
    run, delete = DELETES[deleter](acme, wendy, adam)
    wrote = WRITERS[writer](acme, adam, run)
    seen: dict = {}

    def drain_now():
        if "thread" not in seen:
            seen["thread"], seen["box"] = _in_thread(nd._drain_batch)
            seen["state"] = _blocked_or_done(seen["box"])

    def on_signal(sender, instance, **kwargs):
        if instance.pk == run.pk:
            drain_now()

    table = NotificationIncidentRun._meta.db_table

    def on_statement(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith(f'DELETE FROM "{table}"'):
            drain_now()
        return result

    uid = f"run-delete-race-{uuid.uuid4().hex}"
    if point == POINTS[0]:
        pre_delete.connect(on_signal, sender=Run, dispatch_uid=uid)
    elif point == POINTS[2]:
        post_delete.connect(on_signal, sender=Run, dispatch_uid=uid)
    try:
        if point == POINTS[1]:
            with connection.execute_wrapper(on_statement):
                deleted = delete()
        else:
            deleted = delete()
    finally:
        pre_delete.disconnect(sender=Run, dispatch_uid=uid)
        post_delete.disconnect(sender=Run, dispatch_uid=uid)
        if "thread" in seen:
            seen["thread"].join(timeout=30)
    assert deleted == 1
    assert "thread" in seen, "the delete never reached the point"
    assert not seen["thread"].is_alive(), "the drain is stuck"
    assert seen["state"] == "done", "the drain waited for the delete"
    box = seen["box"]
    assert "error" not in box, box
    # Before the cascade the drain goes first as a whole; after, the run's outbox row is
    # the delete's (deleted, not committed yet) and the drain's claim skips it.
    assert box["result"] == (wrote if point == POINTS[0] else (0, 0)), box
    assert not NotificationOutbox.objects.exists()
    _nothing_names(run)
