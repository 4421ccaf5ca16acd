"""Small deterministic LangGraph graphs for the saver's tests and the bench (no model call).

``refund_graph``: plan -> approve (``interrupt`` asks for approval) -> charge -> END;
``chain_graph``: plan -> charge -> END, with ``hooks["charge"]`` called inside charge (a
barrier for the race tests). State: ``order`` (str), ``log`` (list, appended to),
``approved`` (bool), ``receipt`` (bytes: a binary channel value).
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


class OrderState(TypedDict, total=False):
    order: str
    log: Annotated[list[str], operator.add]
    approved: bool
    receipt: bytes


def _plan(state: OrderState) -> dict:
    return {"log": [f"plan {state['order']}"]}


def _charge(state: OrderState) -> dict:
    return {"log": [f"charge {state['order']}"],
            "receipt": b"\x00receipt\xff" + state["order"].encode()}


def refund_graph(checkpointer):
    def approve(state: OrderState) -> dict:
        answer = interrupt(f"approve refund of {state['order']}?")
        return {"approved": answer == "yes", "log": [f"approve {answer}"]}

    g = StateGraph(OrderState)
    g.add_node("plan", _plan)
    g.add_node("approve", approve)
    g.add_node("charge", _charge)
    g.add_edge(START, "plan")
    g.add_edge("plan", "approve")
    g.add_edge("approve", "charge")
    g.add_edge("charge", END)
    return g.compile(checkpointer=checkpointer)


def chain_graph(checkpointer, hooks: dict | None = None, **compile_kw):
    hooks = hooks or {}

    def charge(state: OrderState) -> dict:
        if "charge" in hooks:
            hooks["charge"]()
        return _charge(state)

    g = StateGraph(OrderState)
    g.add_node("plan", _plan)
    g.add_node("charge", charge)
    g.add_edge(START, "plan")
    g.add_edge("plan", "charge")
    g.add_edge("charge", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)
