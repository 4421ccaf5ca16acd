"""Synthetic runifold JSON Lines for the bounded-memory test and ``bench/bench_runifold.py``
(issue 10, item 4): ``lines(n)`` yields ``n`` lines, in groups of four, shaped like the
fixtures in ``tests/fixtures/runifold/`` (RUNIFOLD.md 1-4; values invented): an agent
checkpoint in ``turn_in_flight``, the completed tool call of its first turn and the
started call of its second (their run comes from the agent key), and a workflow v4
checkpoint at ``step_in_flight``. Ids are deterministic (``seed``), so two calls with
the same seed yield the same file."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

CAPABILITY = "0190c2d1-44aa-7b10-8e21-6a7b8c9d0e1f"
TEXT = {"type": "text", "text": "Please refund order A-1042."}


def _id(seed: int, kind: int, i: int) -> str:
    """A UUIDv7-shaped id: the 48-bit "time" holds ``seed`` and ``kind``, the random bits
    hold ``i``."""
    ms = (0x0193 << 32) | ((seed & 0xFFFF) << 16) | (kind & 0xFFFF)
    return str(uuid.UUID(int=(ms << 80) | (7 << 76) | (0b10 << 62) | i))


def _effect(seed: int, i: int, n: int, key: str, status: dict, revision: int) -> dict:
    return {"revision": revision, "status": status,
            "request": {"effect_id": _id(seed, 3 + n, i), "invocation_id": _id(seed, 5 + n, i),
                        "kind": "Tool", "capability_id": CAPABILITY,
                        "input": {"order_id": f"A-{i}", "amount_cents": 2599},
                        "effect_class": "NonIdempotentWrite", "idempotency_key": key}}


def group(seed: int, i: int) -> list[dict]:
    """The four records of group ``i``."""
    cid, run = _id(seed, 1, i), _id(seed, 2, i)
    agent = {"id": cid, "revision": 3, "run_id": run, "kind": "runifold.agent",
             "schema_version": 1, "updated_at_ms": 1733040003150 + i,
             "payload": {"execution_id": cid, "agent": "refund-assistant",
                         "model": {"provider": "openai", "name": "gpt-4.1-mini"},
                         "transcript": [{"role": "user", "content": [TEXT], "metadata": {}}],
                         "turns": 1, "tool_calls": 1, "delegations": 0,
                         "usage": {"tokens": 702, "cost_microusd": 215, "duration_micros": 0,
                                   "turns": 1, "tool_calls": 1, "delegations": 0},
                         "phase": {"state": "turn_in_flight", "turn": 2}}}
    done = _effect(seed, i, 0, f"{cid}:agent:refund-assistant:turn:1:call:0",
                   {"state": "completed", "output": {"status": "success", "output": {
                       "content": [{"type": "text", "text": '{"refund_id":"re_88"}'}],
                       "model_visible": True}}}, 2)
    started = _effect(seed, i, 1, f"{cid}:agent:refund-assistant:turn:2:call:0",
                      {"state": "started"}, 1)
    wid, wrun = _id(seed, 8, i), _id(seed, 9, i)
    workflow = {"id": wid, "revision": 5, "run_id": wrun, "kind": "runifold.workflow",
                "schema_version": 4, "updated_at_ms": 1733047200950 + i,
                "payload": {"workflow": "refund-approval", "workflow_version": 3,
                            "layout": ["classify", "charge_back", "notify"], "next_index": 1,
                            "value": {"order_id": f"A-{i}", "risk": "low"},
                            "outputs": {"classify": {"order_id": f"A-{i}", "risk": "low"}},
                            "usage": {"tokens": 1840, "cost_microusd": 530,
                                      "duration_micros": 0, "turns": 2, "tool_calls": 1,
                                      "delegations": 0},
                            "phase": {"state": "step_in_flight", "step": "charge_back"}}}
    return [agent, done, started, workflow]


def lines(n: int, seed: int = 1) -> Iterator[bytes]:
    """``n`` lines (bytes, newline-terminated), generated one group at a time."""
    i = 0
    made = 0
    while made < n:
        for record in group(seed, i):
            if made == n:
                return
            yield json.dumps(record).encode("utf-8") + b"\n"
            made += 1
        i += 1


def write(path, n: int, seed: int = 1) -> int:
    """Write ``lines(n, seed)`` to ``path``; returns the file's size in bytes."""
    size = 0
    with open(path, "wb") as f:
        for line in lines(n, seed):
            f.write(line)
            size += len(line)
    return size
