"""The README's ten LangGraph lines ("Bring your runtime") run as written against the real
API (``live_server``): only the tool's body (``...`` there) is filled in, and ``URL``,
``token``, ``builder`` and ``inputs`` are given. The graph's one node calls the decorated
tool, so the lines are shown to checkpoint the thread and record the side effect."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from checkpoints.models import Effect, Run
from recovery_client import effects
from recovery_client.protocol import thread_run_id

pytestmark = pytest.mark.django_db(transaction=True)

README = Path(__file__).resolve().parents[2] / "README.md"
TOOL_STUB = "-> dict: ..."


def readme_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Bring your runtime", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "the section shows the ten lines, then the restart's"
    return blocks


def readme_lines() -> str:
    return readme_blocks()[0]


def test_the_readme_block_is_ten_lines_of_code():
    code = [line for line in readme_lines().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert len(code) <= 10, code
    assert TOOL_STUB in readme_lines()


class State(TypedDict, total=False):
    order: str
    receipt: dict


def test_the_readme_lines_checkpoint_the_thread_and_record_the_effect(live_server, wendy_token,
                                                                       acme):
    charged: list[str] = []
    namespace: dict = {}

    def pay(state: State) -> dict:
        return {"receipt": namespace["charge"](order_id=state["order"], amount_cents=2599)}

    builder = StateGraph(State)
    builder.add_node("pay", pay)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    namespace.update(URL=live_server.url, token=wendy_token, builder=builder,
                     inputs={"order": "A-1042"})
    source = readme_lines().replace(
        TOOL_STUB, "-> dict:\n    charged.append(idempotency_key)\n"
                   "    return {'charge_id': 'ch_' + order_id}")
    namespace["charged"] = charged
    try:
        exec(compile(source, str(README), "exec"), namespace)  # noqa: S102 - our own README
    finally:
        namespace["saver"].close()
        effects.set_default_store(None)

    assert charged == ["refund:A-1042"]
    run = Run.objects.for_tenant(acme).get(uuid=thread_run_id("refund-A-1042"))
    assert run.kind == "langgraph.checkpoint"
    assert run.phase_class == "completed"
    effect = Effect.objects.for_tenant(acme).get(run=run)
    assert (effect.operation_key, effect.state) == ("refund:A-1042", "confirmed")
    assert effect.receipt == {"charge_id": "ch_A-1042"}


class Crash(BaseException):
    """The process dying inside the node (LangGraph records no error write for it)."""


def test_the_readme_restart_lines_wait_for_an_approved_retry(live_server, make_saver, acme,
                                                              rita, april):
    """(stop 32, the newcomer's finding) The README's restart lines: a graph that died
    inside its node is not invoked again on the claim's ``reject`` (``in_flight``), and
    is after a retry two people approved, which the claim consumes. Before, the README
    stopped at the ten lines, and a newcomer restarting with ``invoke(None, config)``
    re-ran the node of an ambiguous run with no approval and left an approved retry
    unconsumed on a finished run."""
    from checkpoints import services
    from checkpoints.models import RetryRequest
    from tests.helpers import age_world

    ran: list[str] = []

    def step(state: State) -> dict:
        ran.append(state["order"])
        if len(ran) == 1:
            raise Crash
        return {"receipt": {"ok": True}}

    builder = StateGraph(State)
    builder.add_node("pay", step)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    config = {"configurable": {"thread_id": "refund-R-7", "workflow": "refund"}}
    first = builder.compile(checkpointer=make_saver(lease_ttl_s=60))
    with pytest.raises(Crash):
        first.invoke({"order": "R-7"}, config, durability="sync")
    age_world(120)  # the dead process's lease ran out
    run_id = thread_run_id("refund-R-7")

    restart = make_saver(lease_ttl_s=60)
    namespace = {"saver": restart, "config": config,
                 "graph": builder.compile(checkpointer=restart)}
    exec(compile(readme_blocks()[1], str(README), "exec"), namespace)  # noqa: S102
    assert (namespace["decision"]["action"], namespace["decision"]["reason"]) == (
        "reject", "in_flight")
    assert ran == ["R-7"]  # not run again

    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="again")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="fine")
    exec(compile(readme_blocks()[1], str(README), "exec"), namespace)  # noqa: S102
    assert namespace["decision"]["action"] == "retry"
    assert ran == ["R-7", "R-7"]
    assert RetryRequest.objects.get(pk=retry.pk).state == "consumed"
    run = Run.objects.for_tenant(acme).get(uuid=run_id)
    assert (run.phase_class, run.recovery_state) == ("completed", "completed")
