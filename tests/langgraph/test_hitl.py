"""Every human-in-the-loop pattern LangGraph documents, run on ``RecoverySaver`` against a
live server and, side by side, on LangGraph's own ``InMemorySaver`` (issue 17 item 2).

For each pattern the same script (a first input, then resumes; an error fixed between
two invocations) drives both graphs, sync and async, and they must agree on every
invocation's result (its ``__interrupt__`` values included), the final state, and the
thread's history: the number of checkpoints, each one's ``next``, values, step, source,
its tasks' interrupts, and, for a subgraph, the checkpoints of every namespace. The
reference is LangGraph's behaviour, not ours. A new pattern is one ``Pattern`` entry.

Between invocations the run must never read ``in_flight``: a graph paused for a human
(``interrupt()``, a static breakpoint) or stopped by an error is stable, so the stale-run
sweep never takes a waiting graph for a crashed one.
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

from checkpoints.models import Run
from recovery_client import protocol

pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    items: list[int]
    done: Annotated[list[str], operator.add]


class Broken(RuntimeError):
    """What a node raises while its ``env["broken"]`` is set."""


# --------------------------------------------------------------------------------------
# The graphs. ``build(checkpointer, env, **compile_kw)`` -> a compiled graph; ``env`` is
# the script's world (one per graph, so both savers see the same one); ``compile_kw`` the
# pattern's static breakpoints, also given to the saver (docs/langgraph.md, "Phases").
# --------------------------------------------------------------------------------------

def _line(*nodes: str):
    """``nodes`` in a line, each appending its name to ``log``."""
    def build(checkpointer, env, **compile_kw):
        g = StateGraph(State)
        for node in nodes:
            g.add_node(node, lambda s, _n=node: {"log": [_n]})
        g.add_edge(START, nodes[0])
        for a, b in zip(nodes, nodes[1:], strict=False):
            g.add_edge(a, b)
        g.add_edge(nodes[-1], END)
        return g.compile(checkpointer=checkpointer, **compile_kw)
    return build


def interrupt_once(checkpointer, env, **compile_kw):
    def approve(state):
        answer = interrupt("approve?")
        return {"log": [f"approve {answer}"]}

    g = StateGraph(State)
    g.add_node("plan", lambda s: {"log": ["plan"]})
    g.add_node("approve", approve)
    g.add_node("charge", lambda s: {"log": ["charge"]})
    g.add_edge(START, "plan")
    g.add_edge("plan", "approve")
    g.add_edge("approve", "charge")
    g.add_edge("charge", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


def interrupt_thrice_in_one_node(checkpointer, env, **compile_kw):
    def ask(state):
        name = interrupt("name?")
        amount = interrupt("amount?")
        confirm = interrupt(f"send {amount} to {name}?")
        return {"log": [f"{name} {amount} {confirm}"]}

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_node("after", lambda s: {"log": ["after"]})
    g.add_edge(START, "ask")
    g.add_edge("ask", "after")
    g.add_edge("after", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


def interrupts_in_two_nodes(checkpointer, env, **compile_kw):
    def first(state):
        return {"log": [f"first {interrupt('one?')} {interrupt('two?')}"]}

    def second(state):
        return {"log": [f"second {interrupt('three?')}"]}

    g = StateGraph(State)
    g.add_node("first", first)
    g.add_node("second", second)
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    g.add_edge("second", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


def error_then_fixed(checkpointer, env, **compile_kw):
    def charge(state):
        if env.get("broken"):
            raise Broken("card service down")
        return {"log": ["charge"]}

    g = StateGraph(State)
    g.add_node("plan", lambda s: {"log": ["plan"]})
    g.add_node("charge", charge)
    g.add_edge(START, "plan")
    g.add_edge("plan", "charge")
    g.add_edge("charge", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


def send_fan_out(checkpointer, env, **compile_kw):
    """Map-reduce: one ``work`` task per item (``Send``), item 2 asks a human."""
    def work(arg):
        item = arg["item"]
        if item == 2:
            return {"done": [f"{item} {interrupt(f'keep {item}?')}"]}
        return {"done": [str(item)]}

    g = StateGraph(State)
    g.add_node("split", lambda s: {"log": ["split"]})
    g.add_node("work", work)
    g.add_node("reduce", lambda s: {"log": [f"reduce {sorted(s['done'])}"]})
    g.add_edge(START, "split")
    g.add_conditional_edges("split", lambda s: [Send("work", {"item": i}) for i in s["items"]],
                            ["work"])
    g.add_edge("work", "reduce")
    g.add_edge("reduce", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


def subgraph_interrupt(checkpointer, env, **compile_kw):
    """The parent's ``review`` node is a compiled subgraph (its own ``checkpoint_ns``)
    whose ``ask`` node interrupts."""
    def ask(state):
        return {"log": [f"ask {interrupt('inner approve?')}"]}

    inner = StateGraph(State)
    inner.add_node("prepare", lambda s: {"log": ["prepare"]})
    inner.add_node("ask", ask)
    inner.add_edge(START, "prepare")
    inner.add_edge("prepare", "ask")
    inner.add_edge("ask", END)

    g = StateGraph(State)
    g.add_node("plan", lambda s: {"log": ["plan"]})
    g.add_node("review", inner.compile())
    g.add_node("finish", lambda s: {"log": ["finish"]})
    g.add_edge(START, "plan")
    g.add_edge("plan", "review")
    g.add_edge("review", "finish")
    g.add_edge("finish", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


# --------------------------------------------------------------------------------------
# Scripts
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One invocation: ``input`` (a state update, a ``Command`` or ``None``), after
    ``before(env)``; ``raises``: the exception type the invocation must raise."""

    input: Any
    before: Callable[[dict], None] | None = None
    raises: type[BaseException] | None = None


@dataclass(frozen=True)
class Pattern:
    name: str
    build: Callable
    steps: tuple[Step, ...]
    env: dict = field(default_factory=dict)
    breakpoints: dict = field(default_factory=dict)  # interrupt_before / interrupt_after


def _fix(env: dict) -> None:
    env["broken"] = False


PATTERNS = [
    Pattern("interrupt once", interrupt_once,
            (Step({"log": []}), Step(Command(resume="yes")))),
    Pattern("interrupt three times in one node", interrupt_thrice_in_one_node,
            (Step({"log": []}), Step(Command(resume="ann")), Step(Command(resume="5")),
             Step(Command(resume="ok")))),
    Pattern("interrupts in two nodes", interrupts_in_two_nodes,
            (Step({"log": []}), Step(Command(resume="a")), Step(Command(resume="b")),
             Step(Command(resume="c")))),
    Pattern("interrupt_before", _line("a", "b", "c"), (Step({"log": []}), Step(None)),
            breakpoints={"interrupt_before": ["b"]}),
    Pattern("interrupt_before two nodes", _line("a", "b", "c"),
            (Step({"log": []}), Step(None), Step(None)),
            breakpoints={"interrupt_before": ["b", "c"]}),
    Pattern("interrupt_before every node", _line("a", "b"),
            (Step({"log": []}), Step(None), Step(None)),
            breakpoints={"interrupt_before": "*"}),
    Pattern("interrupt_after", _line("a", "b", "c"), (Step({"log": []}), Step(None)),
            breakpoints={"interrupt_after": ["a"]}),
    Pattern("interrupt_before and interrupt_after", _line("a", "b", "c"),
            (Step({"log": []}), Step(None), Step(None)),
            breakpoints={"interrupt_before": ["c"], "interrupt_after": ["a"]}),
    Pattern("error in a node, resumed after the fix", error_then_fixed,
            (Step({"log": []}, raises=Broken), Step(None, before=_fix)),
            env={"broken": True}),
    Pattern("Send fan-out with an interrupt in one branch", send_fan_out,
            (Step({"log": [], "items": [1, 2, 3]}), Step(Command(resume="yes")))),
    Pattern("subgraph with an interrupt", subgraph_interrupt,
            (Step({"log": []}), Step(Command(resume="yes")))),
]


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def _interrupts(result) -> list | None:
    if isinstance(result, dict) and "__interrupt__" in result:
        return [i.value for i in result["__interrupt__"]]
    return None


def _result(result) -> Any:
    if isinstance(result, dict):
        return ({k: v for k, v in result.items() if k != "__interrupt__"}, _interrupts(result))
    return result


def _snapshot(snap) -> tuple:
    return (snap.values, snap.next, snap.metadata["step"], snap.metadata["source"],
            [(t.name, [i.value for i in t.interrupts], t.error is not None)
             for t in snap.tasks])


def _namespaces(tuples) -> list[tuple]:
    """Every stored checkpoint of the thread, in all namespaces, as comparable facts:
    the namespace's node names (its task ids differ between savers), step, source."""
    out = []
    for t in tuples:
        ns = t.config["configurable"]["checkpoint_ns"]
        names = tuple(part.split(":")[0] for part in ns.split("|")) if ns else ()
        out.append((names, t.metadata["step"], t.metadata["source"]))
    return sorted(out)


def phase_of(thread: str) -> tuple[str, str]:
    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    return run.phase_class, run.phase_label


def run_sync(pattern: Pattern, graph, env: dict, thread: str, watch=None) -> dict:
    results = []
    for step in pattern.steps:
        if step.before:
            step.before(env)
        if step.raises:
            with pytest.raises(step.raises):
                graph.invoke(step.input, cfg(thread))
            results.append(step.raises.__name__)
        else:
            results.append(_result(graph.invoke(step.input, cfg(thread))))
        if watch:
            watch()
    saver = graph.checkpointer
    return {"results": results,
            "state": _snapshot(graph.get_state(cfg(thread))),
            "history": [_snapshot(s) for s in graph.get_state_history(cfg(thread))],
            "namespaces": _namespaces(saver.list(cfg(thread)))}


async def run_async(pattern: Pattern, graph, env: dict, thread: str) -> dict:
    results = []
    for step in pattern.steps:
        if step.before:
            step.before(env)
        if step.raises:
            with pytest.raises(step.raises):
                await graph.ainvoke(step.input, cfg(thread))
            results.append(step.raises.__name__)
        else:
            results.append(_result(await graph.ainvoke(step.input, cfg(thread))))
    saver = graph.checkpointer
    return {"results": results,
            "state": _snapshot(await graph.aget_state(cfg(thread))),
            "history": [_snapshot(s) async for s in graph.aget_state_history(cfg(thread))],
            "namespaces": _namespaces([t async for t in saver.alist(cfg(thread))])}


def _assert_same(ours: dict, reference: dict) -> None:
    assert ours["results"] == reference["results"]
    assert ours["state"] == reference["state"]
    assert len(ours["history"]) == len(reference["history"])
    assert ours["history"] == reference["history"]
    assert ours["namespaces"] == reference["namespaces"]


@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.name for p in PATTERNS])
def test_a_pattern_runs_as_on_langgraphs_own_saver(pattern, make_saver):
    thread = f"hitl-{uuid.uuid4()}"
    phases: list[tuple[str, str]] = []
    env, ref_env, kw = dict(pattern.env), dict(pattern.env), pattern.breakpoints
    ours = run_sync(pattern, pattern.build(make_saver(**kw), env, **kw), env, thread,
                    watch=lambda: phases.append(phase_of(thread)))
    reference = run_sync(pattern, pattern.build(InMemorySaver(), ref_env, **kw), ref_env,
                         thread)
    _assert_same(ours, reference)
    # Paused for a human or stopped by an error: never in flight; at the end: done.
    assert all(cls != "in_flight" for cls, _ in phases), phases
    assert phases[-1][0] == "completed", phases


@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.name for p in PATTERNS])
def test_a_pattern_runs_as_on_langgraphs_own_saver_async(pattern, make_saver):
    thread = f"hitl-async-{uuid.uuid4()}"
    kw = pattern.breakpoints
    saver = make_saver(**kw)

    async def both():
        try:
            env = dict(pattern.env)
            ours = await run_async(pattern, pattern.build(saver, env, **kw), env, thread)
        finally:
            await saver.aclose()
        ref_env = dict(pattern.env)
        reference = await run_async(pattern, pattern.build(InMemorySaver(), ref_env, **kw),
                                    ref_env, thread)
        return ours, reference

    ours, reference = asyncio.run(both())
    _assert_same(ours, reference)


@pytest.mark.parametrize(("breakpoints", "label"), [
    ({"interrupt_before": ["b"]}, "paused before b"),
    ({"interrupt_before": "*"}, "paused before a"),
    ({"interrupt_after": ["a"]}, "paused after a"),
])
def test_a_graph_paused_at_a_static_breakpoint_is_healthy_not_in_flight(make_saver,
                                                                         breakpoints, label):
    """LangGraph writes nothing at a static breakpoint: the pause is the checkpoint it
    put before checking. With the breakpoints the saver sends, the server applies
    LangGraph's own rule and reads it as paused (stable), so the stale-run sweep leaves
    it healthy however long the human takes; without them it is a node about to run."""
    from tests.helpers import sweep_later

    thread = f"paused-{uuid.uuid4()}"
    graph = _line("a", "b", "c")(make_saver(**breakpoints), {}, **breakpoints)
    graph.invoke({"log": []}, cfg(thread))
    assert graph.get_state(cfg(thread)).next == (label.split()[-1] if "before" in label
                                                 else "b",)
    assert phase_of(thread) == ("stable", label)
    sweep_later(hours=24)
    run = Run.objects.get(uuid=protocol.thread_run_id(thread))
    assert (run.recovery_state, run.phase_class, run.phase_label) == (
        "healthy", "stable", label)

    blind = f"blind-{uuid.uuid4()}"  # the same graph, the saver not told its breakpoints
    _line("a", "b", "c")(make_saver(), {}, **breakpoints).invoke({"log": []}, cfg(blind))
    assert phase_of(blind)[0] == "in_flight"
