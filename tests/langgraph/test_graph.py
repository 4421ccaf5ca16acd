"""A real LangGraph ``StateGraph`` compiled with ``RecoverySaver`` against a live server
(issue 10): invoke, continue a thread, interrupt and resume with ``Command(resume=...)``,
state history, binary channel values. Each graph also runs on LangGraph's own
``InMemorySaver`` with the same inputs: the two must agree on every state, step, source
and parent (the reference behaviour is LangGraph's, not ours)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from checkpoints.models import Run
from recovery_client import protocol
from tests.langgraph.graphs import chain_graph, refund_graph

pytestmark = pytest.mark.django_db(transaction=True)


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def shape(graph, thread: str) -> list[tuple]:
    """The thread's history as comparable facts, newest first: values, next nodes, step,
    source, and whether the parent is the next (older) snapshot's checkpoint."""
    history = list(graph.get_state_history(cfg(thread)))
    out = []
    for i, snap in enumerate(history):
        parent = snap.parent_config["configurable"]["checkpoint_id"] if snap.parent_config \
            else None
        older = history[i + 1].config["configurable"]["checkpoint_id"] \
            if i + 1 < len(history) else None
        out.append((snap.values, snap.next, snap.metadata["step"], snap.metadata["source"],
                    parent == older))
    return out


def test_invoke_and_continue_a_thread_as_langgraphs_own_saver_does(saver, make_saver):
    thread = f"order-{uuid.uuid4()}"
    graph, reference = chain_graph(saver), chain_graph(InMemorySaver())

    for g in (graph, reference):
        first = g.invoke({"order": "A-1", "log": []}, cfg(thread))
        second = g.invoke({"order": "A-2"}, cfg(thread))  # the thread's state goes on

    assert first["log"] == ["plan A-1", "charge A-1"]
    assert second["log"] == ["plan A-1", "charge A-1", "plan A-2", "charge A-2"]
    assert second["receipt"] == b"\x00receipt\xffA-2"
    assert shape(graph, thread) == shape(reference, thread)
    history = list(graph.get_state_history(cfg(thread)))
    steps = [s.metadata["step"] for s in history]
    assert steps == sorted(steps, reverse=True) and len(history) == 8
    assert all(ok for *_, ok in shape(graph, thread))  # one chain, no fork
    assert history[-1].parent_config is None
    # Another process (a new saver) sees the same state, binary value included.
    fresh = chain_graph(make_saver())
    assert fresh.get_state(cfg(thread)).values == second
    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    assert run.phase_class == "completed"


def test_interrupt_and_resume_with_command(saver, make_saver):
    thread = f"refund-{uuid.uuid4()}"
    graph, reference = refund_graph(saver), refund_graph(InMemorySaver())

    for g in (graph, reference):
        paused = g.invoke({"order": "R-7", "log": []}, cfg(thread))
        assert [i.value for i in paused["__interrupt__"]] == ["approve refund of R-7?"]
        state = g.get_state(cfg(thread))
        assert state.next == ("approve",)
        assert state.tasks[0].interrupts[0].value == "approve refund of R-7?"

    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    assert (run.phase_class, run.kind) == ("stable", protocol.KIND)
    assert "waiting for input" in run.phase_label and "approve" in run.phase_label

    # Resumed by another process: a new saver, as after a restart.
    resumed_graph = refund_graph(make_saver())
    done = resumed_graph.invoke(Command(resume="yes"), cfg(thread))
    ref_done = reference.invoke(Command(resume="yes"), cfg(thread))

    assert done == ref_done
    assert done["approved"] is True
    assert done["log"] == ["plan R-7", "approve yes", "charge R-7"]
    assert graph.get_state(cfg(thread)).next == ()
    assert shape(graph, thread) == shape(reference, thread)
    run.refresh_from_db()
    assert run.phase_class == "completed"


def test_the_async_graph_api_gives_the_same_history(make_saver):
    thread = f"refund-async-{uuid.uuid4()}"
    saver = make_saver()
    graph, reference = refund_graph(saver), refund_graph(InMemorySaver())

    async def run(g):
        await g.ainvoke({"order": "R-8", "log": []}, cfg(thread))
        out = await g.ainvoke(Command(resume="no"), cfg(thread))
        history = [s async for s in g.aget_state_history(cfg(thread))]
        return out, [(s.values, s.next, s.metadata["step"]) for s in history]

    async def both():
        try:
            return await run(graph), await run(reference)
        finally:
            await saver.aclose()

    (out, history), (ref_out, ref_history) = asyncio.run(both())
    assert out == ref_out and out["approved"] is False
    assert history == ref_history
    assert shape(graph, thread) == shape(reference, thread)


def test_replaying_from_an_older_checkpoint_is_refused_as_a_fork(saver):
    """LangGraph's time travel writes a checkpoint whose parent is not the head: a fork of
    the thread, which this store refuses (docs/langgraph.md, "Refused on purpose")."""
    from recovery_client.langgraph import ThreadConflict

    thread = f"travel-{uuid.uuid4()}"
    graph = chain_graph(saver)
    graph.invoke({"order": "A-1", "log": []}, cfg(thread))
    history = list(graph.get_state_history(cfg(thread)))
    before_charge = next(s for s in history if s.next == ("charge",))

    with pytest.raises(ThreadConflict) as err:
        graph.invoke(None, before_charge.config)

    assert err.value.status == 412
    assert err.value.head_checkpoint_id == history[0].config["configurable"]["checkpoint_id"]
    assert len(list(graph.get_state_history(cfg(thread)))) == len(history)
