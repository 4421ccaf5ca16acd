"""LangGraph writes racing on real PostgreSQL (issue 10: "two LangGraph invocations
resuming one thread at once: exactly one wins, the other sees a conflict, the thread's
history has no fork"): threads on their own connections, released together on a barrier
(``tests/transactional/test_races.race``), calling the services.

The single-threaded versions, which run on SQLite too, are in
``tests/services/test_langgraph.py``.
"""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.exceptions import NotFound, ThreadConflict
from checkpoints.interop import langgraph
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    GraphCheckpoint,
    GraphWrite,
    Run,
)
from recovery_client.protocol import thread_checkpoint_id
from tests.helpers import graph_put, graph_writes, lg_put, lg_writes
from tests.transactional.test_races import kinds_of, race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WRITERS = 8
ROUNDS = 3


def cid(round_: int, writer: int = 0) -> str:
    """Checkpoint ids that grow with the round (then the writer), as uuid6 ids do."""
    return f"1f0c-{round_:04}-{writer:04}"


def test_graphs_resuming_one_thread_at_once_make_exactly_one_winner_and_no_fork(acme, wendy):
    head = cid(0)
    graph_put(wendy, acme, lg_put("t-race", head, nodes=["charge"]))
    for rnd in range(1, ROUNDS + 1):
        results = race(WRITERS, lambda i, rnd=rnd, head=head: graph_put(
            wendy, acme, lg_put("t-race", cid(rnd, i), parent=head, nodes=["charge"])))
        assert kinds_of(results) == {"dict": 1, "ThreadConflict": WRITERS - 1}, results
        (winner,) = [r for r in results if isinstance(r, dict)]
        assert {r.head_checkpoint_id for r in results
                if isinstance(r, ThreadConflict)} == {winner["checkpoint_id"]}
        head = winner["checkpoint_id"]
    rows = list(GraphCheckpoint.objects.order_by("checkpoint_id")
                .values_list("checkpoint_id", "parent_checkpoint_id"))
    # One chain: every checkpoint's parent is the one before it.
    assert [parent for _, parent in rows] == ["", *[c for c, _ in rows[:-1]]]
    losers = ROUNDS * (WRITERS - 1)
    assert Conflict.objects.count() == losers
    assert Run.objects.get().unacknowledged_conflicts == losers
    env = Checkpoint.objects.get(uuid=thread_checkpoint_id("t-race", ""))
    assert env.revision == ROUNDS
    assert list(CheckpointRevision.objects.filter(checkpoint=env).order_by("revision")
                .values_list("revision", flat=True)) == list(range(ROUNDS + 1))
    assert AuditEvent.objects.filter(action="checkpoint.conflict").count() == losers
    assert services.audit_verify(tenant=acme)[0]


def test_pending_writes_racing_the_next_put_make_no_conflict(acme, wendy):
    """LangGraph saves a step's writes and the next checkpoint in the background: writes
    that land after the put are stored on their (no longer head) checkpoint; none is a
    spurious conflict, because each write locks the run and the envelope first."""
    head = cid(0)
    graph_put(wendy, acme, lg_put("t-race", head, nodes=[f"n{i}" for i in range(WRITERS)]))

    def write(i):
        if i == 0:
            return graph_put(wendy, acme, lg_put("t-race", cid(1), parent=head))
        return graph_writes(wendy, acme, lg_writes("t-race", head, f"task-{i}",
                                                   [(0, "out", i)]))

    results = race(WRITERS, write)
    assert kinds_of(results) == {"dict": 1, "int": WRITERS - 1}, results
    assert Conflict.objects.count() == 0
    assert GraphWrite.objects.count() == WRITERS - 1
    env = Checkpoint.objects.get(uuid=thread_checkpoint_id("t-race", ""))
    on_head = env.revision - 1  # the put wrote one revision, each write on the head one
    late = AuditEvent.objects.filter(action="langgraph.writes").count()
    assert on_head + late == WRITERS - 1
    assert services.audit_verify(tenant=acme)[0]


def test_first_puts_on_a_new_thread_at_once_make_one_run_and_one_chain(acme, wendy):
    results = race(WRITERS, lambda i: graph_put(wendy, acme, lg_put("t-new", cid(1, i))))
    accepted = [r for r in results if isinstance(r, dict)]
    assert accepted and all(isinstance(r, dict | ThreadConflict) for r in results), results
    assert Run.objects.count() == 1 and Checkpoint.objects.count() == 1
    # Accepted in lock order, each after the head: their ids grow with their revisions.
    rows = list(GraphCheckpoint.objects.order_by("envelope_revision")
                .values_list("checkpoint_id", flat=True))
    assert rows == sorted(rows) and len(rows) == len(accepted)
    assert Conflict.objects.count() == WRITERS - len(accepted)


def test_deleting_a_thread_while_graphs_write_to_it_leaves_no_half_thread(acme, wendy):
    head = cid(0)
    graph_put(wendy, acme, lg_put("t-race", head, nodes=["n"]))

    def act(i):
        if i == 0:
            return langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="t-race")
        if i % 2:
            return graph_writes(wendy, acme, lg_writes("t-race", head, f"t{i}", [(0, "x", i)]))
        return graph_put(wendy, acme, lg_put("t-race", cid(1, i), parent=head))

    results = race(WRITERS, act)
    allowed = (int, dict, ThreadConflict, NotFound)
    assert all(isinstance(r, allowed) for r in results), results
    # Whatever survived is whole: every row has its envelope, every envelope a row.
    envelopes = set(Checkpoint.objects.values_list("pk", flat=True))
    assert set(GraphCheckpoint.objects.values_list("envelope_id", flat=True)) == envelopes
    assert not GraphWrite.objects.exclude(graph_checkpoint__in=GraphCheckpoint.objects.all()
                                          ).exists()
    assert services.audit_verify(tenant=acme)[0]
