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


def readme_lines() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Bring your runtime", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section shows one Python block"
    return blocks[0]


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
