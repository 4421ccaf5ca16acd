"""The refund graph: a real LangGraph ``StateGraph`` with one payment tool (issue 10, item 3).

::

    START -> classify --refund---------> charge -> receipt --> END
                      \\--manual_review--> needs_review -------/

No model is called: ``classify`` decides by a fixed rule (an amount above
``AUTO_REFUND_LIMIT_CENTS`` goes to a person: ``needs_review``), ``charge`` calls the
LangChain tool ``issue_refund``, and ``receipt`` records the charge id. ``issue_refund`` is a
``@recorded_effect`` on service ``payments`` with operation key ``refund:<order_id>``: it
``POST``s ``/charges`` to the demo payment service (``checkpoints/demo/payments.py``) with
that key as ``Idempotency-Key``. A crash inside it leaves the effect ``submitted``; once
reconciliation has confirmed it, LangGraph's resume re-runs ``charge`` and the tool
returns the recorded receipt without calling the service again.

State (``RefundState``): input ``order_id`` (str), ``amount_cents`` (int >= 0); then
``decision`` (``refund`` or ``manual_review``), ``charge_id`` (the payment service's id,
``ch_...``), ``receipt`` (``{"order_id", "charge_id", "amount_cents"}``) and ``status``
(``refunded`` or ``needs_review``).
"""

from __future__ import annotations

from typing import TypedDict

from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph

from checkpoints.demo.worker import die, post_json
from recovery_client.effects import recorded_effect

AUTO_REFUND_LIMIT_CENTS = 50_000
# The run identity a checkpoint names (the saver sends it; the resume claim checks it).
WORKFLOW = "langgraph_refund"
DEFINITION_VERSION = "1"


class RefundState(TypedDict, total=False):
    order_id: str
    amount_cents: int
    decision: str
    charge_id: str
    receipt: dict
    status: str


def make_refund_tool(payments_url: str, *, crash_in_tool: bool = False):
    """The ``issue_refund`` tool against the payment service at ``payments_url``.

    With ``crash_in_tool`` the process SIGKILLs itself inside the tool right after the
    service answered (the charge is committed), before the effect is confirmed: the
    ``after_call`` boundary of ``checkpoints.demo.worker``.
    """
    charges_url = payments_url.rstrip("/") + "/charges"

    @tool
    @recorded_effect(service="payments", key=lambda order_id, **_: f"refund:{order_id}")
    def issue_refund(order_id: str, amount_cents: int, idempotency_key: str) -> dict:
        """Refund an order: charge the refund to the payment service, once per order."""
        receipt = post_json(charges_url, idempotency_key,
                            {"order_id": order_id, "amount_cents": amount_cents})
        if crash_in_tool:
            die()
        return receipt

    return issue_refund


def build_graph(payments_url: str, *, crash_in_tool: bool = False) -> StateGraph:
    """The uncompiled graph (``.compile(checkpointer=...)`` it); nodes as the module says."""
    issue_refund = make_refund_tool(payments_url, crash_in_tool=crash_in_tool)

    def classify(state: RefundState) -> dict:
        small = 0 <= state["amount_cents"] <= AUTO_REFUND_LIMIT_CENTS
        return {"decision": "refund" if small else "manual_review"}

    def charge(state: RefundState) -> dict:
        receipt = issue_refund.invoke({"order_id": state["order_id"],
                                       "amount_cents": state["amount_cents"]})
        return {"charge_id": receipt["charge_id"]}

    def receipt(state: RefundState) -> dict:
        return {"receipt": {"order_id": state["order_id"], "charge_id": state["charge_id"],
                            "amount_cents": state["amount_cents"]},
                "status": "refunded"}

    def needs_review(state: RefundState) -> dict:
        return {"status": "needs_review"}

    graph = StateGraph(RefundState)
    graph.add_node("classify", classify)
    graph.add_node("charge", charge)
    graph.add_node("receipt", receipt)
    graph.add_node("needs_review", needs_review)
    graph.add_edge(START, "classify")
    graph.add_conditional_edges("classify", lambda s: s["decision"],
                                {"refund": "charge", "manual_review": "needs_review"})
    graph.add_edge("charge", "receipt")
    graph.add_edge("receipt", END)
    graph.add_edge("needs_review", END)
    return graph
