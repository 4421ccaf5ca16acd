"""Two LangGraph invocations resuming one thread at once (issue 10): exactly one wins, the
other's ``invoke`` raises ``ThreadConflict``, the thread's history stays one chain (every
checkpoint's parent is the one before it), and the refused write is a conflict of the run
(the dashboard's). Two savers are two processes' worth (own client, own lease owner); the
graphs run in two threads and meet at a barrier inside the node, so both have read the
same head before either writes. Also: with leases, and a saver whose lease lapsed while
it was paused is fenced. Plus the 1 MiB limit: refused before any request."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from checkpoints.models import AuditEvent, Conflict, GraphCheckpoint, Run
from recovery_client import protocol
from recovery_client.client import CheckpointError
from recovery_client.langgraph import ThreadConflict
from tests.helpers import age_world
from tests.langgraph.graphs import chain_graph

pytestmark = pytest.mark.django_db(transaction=True)


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def paused_before_charge(saver, thread: str) -> str:
    """Start ``thread`` and stop before its charge node; the head checkpoint id."""
    graph = chain_graph(saver, interrupt_before=["charge"])
    graph.invoke({"order": "A-1042", "log": []}, cfg(thread))
    state = graph.get_state(cfg(thread))
    assert state.next == ("charge",)
    return state.config["configurable"]["checkpoint_id"]


def race(savers, thread: str) -> list:
    """Resume ``thread`` with each saver in its own thread, all inside charge at once;
    each one's result or exception."""
    barrier = threading.Barrier(len(savers), timeout=60)
    outcomes: list = [None] * len(savers)

    def resume(i, saver):
        graph = chain_graph(saver, hooks={"charge": barrier.wait})
        try:
            outcomes[i] = graph.invoke(None, cfg(thread))
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[i] = exc

    workers = [threading.Thread(target=resume, args=(i, s)) for i, s in enumerate(savers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers)
    return outcomes


def assert_one_chain(saver, thread: str, head_before: str) -> list[str]:
    """Every checkpoint's parent is the next older one; the head_before is on the chain.
    Returns the ids, newest first."""
    history = list(saver.list(cfg(thread)))
    ids = [t.config["configurable"]["checkpoint_id"] for t in history]
    parents = [t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
               for t in history]
    assert parents == ids[1:] + [None], "the thread's history forked"
    assert head_before in ids
    return ids


def test_two_resumes_at_once_one_wins_the_other_gets_a_conflict(make_saver):
    thread = f"race-{uuid.uuid4()}"
    head = paused_before_charge(make_saver(), thread)
    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    conflicts_before = Conflict.objects.filter(run=run).count()

    outcomes = race([make_saver(), make_saver()], thread)

    lost = [o for o in outcomes if isinstance(o, BaseException)]
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], ThreadConflict), repr(lost[0])
    assert (lost[0].status, lost[0].error, lost[0].thread_id) == (412, "conflict", thread)
    assert won[0]["log"] == ["plan A-1042", "charge A-1042"]
    ids = assert_one_chain(make_saver(), thread, head)
    assert lost[0].head_checkpoint_id in ids
    refused = Conflict.objects.filter(run=run).order_by("pk")[conflicts_before:]
    assert [c.reason for c in refused] == ["stale_revision"]
    assert refused[0].target_uuid == protocol.thread_checkpoint_id(thread, "")
    assert GraphCheckpoint.objects.filter(thread_id=thread).count() == len(ids)


def test_with_leases_the_second_resume_is_refused_at_the_lease(make_saver):
    thread = f"race-lease-{uuid.uuid4()}"
    head = paused_before_charge(make_saver(), thread)
    writes_before = GraphCheckpoint.objects.filter(thread_id=thread).count()

    outcomes = race([make_saver(lease_ttl_s=60, owner="worker-a"),
                     make_saver(lease_ttl_s=60, owner="worker-b")], thread)

    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(lost) == 1, outcomes
    assert isinstance(lost[0], ThreadConflict) and lost[0].error == "lease_held"
    ids = assert_one_chain(make_saver(lease_ttl_s=60, owner="reader"), thread, head)
    # The winner wrote its checkpoints; the loser wrote none (refused before writing).
    assert len(ids) == writes_before + 1
    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    assert run.lease_owner in ("worker-a", "worker-b") and run.fencing_token == 1


def test_a_leased_graph_on_a_new_thread_writes_without_a_single_refusal(make_saver):
    """The first put of a new thread goes without a token (no run to lease yet); the
    step's writes sent beside it wait for the lease taken right after, so none is fenced."""
    for _ in range(3):
        thread = f"leased-{uuid.uuid4()}"
        graph = chain_graph(make_saver(lease_ttl_s=60, owner="worker-1"))
        graph.invoke({"order": "A-1", "log": []}, cfg(thread))
        done = graph.invoke({"order": "A-2"}, cfg(thread))
        assert done["log"] == ["plan A-1", "charge A-1", "plan A-2", "charge A-2"]
        run = Run.objects.get(uuid=protocol.thread_run_id(thread))
        assert (run.lease_owner, run.fencing_token) == ("worker-1", 1)
        assert not Conflict.objects.filter(run=run).exists()


def test_a_saver_whose_lease_lapsed_while_paused_is_fenced_and_the_write_kept(make_saver):
    thread = f"fence-{uuid.uuid4()}"
    # A long ttl: sleepy must not reach its own renewal time (half the ttl, by its
    # monotonic clock) while the test runs, however loaded the machine is.
    sleepy = make_saver(lease_ttl_s=3600, owner="sleepy")
    head = paused_before_charge(sleepy, thread)
    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    assert (run.lease_owner, run.fencing_token) == ("sleepy", 1)

    age_world(7200)  # sleepy's process stood still for two hours: its lease expired
    other = make_saver(lease_ttl_s=3600, owner="other")
    done = chain_graph(other).invoke(None, cfg(thread))
    assert done["log"] == ["plan A-1042", "charge A-1042"]

    # sleepy wakes up; by its own clock the lease is young, so it writes with token 1.
    with pytest.raises(ThreadConflict) as err:
        chain_graph(sleepy).invoke({"order": "A-2"}, cfg(thread))
    assert (err.value.status, err.value.error) == (409, "fenced")
    # Each refused write is kept (LangGraph sends a step's writes beside its put, so a
    # zombie invocation may have sent a few before it stopped), all with the old token.
    refused = Conflict.objects.filter(run=run)
    assert refused.exists()
    assert {(c.reason, c.fencing_token_sent, c.fencing_token_current) for c in refused} == {
        ("fenced", 1, 2)}
    ids = assert_one_chain(other, thread, head)
    assert GraphCheckpoint.objects.filter(thread_id=thread).count() == len(ids)
    assert not any(t.checkpoint["channel_values"].get("order") == "A-2"
                   for t in other.list(cfg(thread)))


class Recording(httpx.BaseTransport):
    """A real transport that keeps (method, path) of every request it sends."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.sent: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_body_over_the_limit_is_refused_before_any_request(make_saver):
    wire = Recording()
    saver = make_saver(transport=wire)
    thread = f"big-{uuid.uuid4()}"
    checkpoint = {"v": 4, "id": "1f0-big", "ts": "2026-12-01T00:00:00+00:00",
                  "channel_values": {"log": ["x" * (1024 * 1024)]},
                  "channel_versions": {"log": 1}, "versions_seen": {},
                  "updated_channels": None}

    with pytest.raises(CheckpointError) as err:
        saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
                  checkpoint, {"source": "input", "step": -1}, {"log": 1})

    assert err.value.kind == "invalid_payload"
    assert "1,048,576 bytes" in err.value.message
    assert wire.sent == []


def test_a_graph_whose_state_outgrows_the_limit_stops_and_stores_nothing(make_saver):
    thread = f"big-{uuid.uuid4()}"
    wire = Recording()
    graph = chain_graph(make_saver(transport=wire))
    audit_before = AuditEvent.objects.count()

    with pytest.raises(CheckpointError) as err:
        graph.invoke({"order": "A-1", "log": ["x" * (1024 * 1024)]}, cfg(thread))

    assert err.value.kind == "invalid_payload"
    # The oversized checkpoint was never sent (LangGraph may have sent a task's writes
    # meanwhile: refused, 404, as their checkpoint was never stored).
    assert ("POST", "/api/v1/tenants/acme/langgraph/checkpoints") not in wire.sent
    assert not Run.objects.filter(uuid=protocol.thread_run_id(thread)).exists()
    assert not GraphCheckpoint.objects.filter(thread_id=thread).exists()
    assert AuditEvent.objects.count() == audit_before
