"""The kind registry's validators and labels: each names the field it refuses, never a
value, and takes what RUNIFOLD.md allows up to its limits.

Every phase of every supported version, and the kinds and versions that are unsupported,
are the fixtures of ``tests/fixtures/kinds/`` (tests/test_kind_fixtures.py); the payloads
below are those fixtures, broken one rule at a time.
"""

from __future__ import annotations

import pytest

from checkpoints import kinds
from tests.kind_fixtures import payload as fixture_payload


def test_it_names_the_versions_it_supports_when_refusing_one():
    result = kinds.classify("runifold.workflow", 5, {})
    assert "supported: 3, 4" in result.error


def _agent_payload() -> dict:
    return fixture_payload("runifold.agent/v1/ready_for_turn")


#: The v4 fixture a workflow test breaks, by phase state.
WORKFLOW_FIXTURES = {"ready": "ready", "step_in_flight": "step_in_flight",
                     "parallel_in_flight": "parallel-branch-in-flight",
                     "waiting": "waiting", "completed": "completed"}


def _workflow_payload(state: str) -> dict:
    return fixture_payload(f"runifold.workflow/v4/{WORKFLOW_FIXTURES[state]}")


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda p: p.pop("agent"), "payload.agent"),
    (lambda p: p.update(model={"provider": "openai"}), "payload.model.name"),
    (lambda p: p.update(transcript={}), "payload.transcript"),
    (lambda p: p.update(turns=-1), "payload.turns"),
    (lambda p: p.update(turns=True), "payload.turns"),
    (lambda p: p.update(turns=2**64), "payload.turns"),
    (lambda p: p.update(usage=[]), "payload.usage"),
    (lambda p: p["usage"].update(tokens="lots"), "payload.usage.tokens"),
    (lambda p: p["usage"].update(cost_microusd=2**64), "payload.usage.cost_microusd"),
    (lambda p: p["usage"].update(delegations=1.5), "payload.usage.delegations"),
    (lambda p: p.update(phase={"state": "turn_in_flight"}), "payload.phase.turn"),
    (lambda p: p.update(phase={"state": "turn_in_flight", "turn": 0}), "payload.phase.turn"),
    (lambda p: p.update(phase={"state": "completed"}), "payload.phase.response"),
    (lambda p: p.update(phase={"state": "sleeping"}), "payload.phase.state"),
])
def test_it_refuses_an_agent_payload_that_breaks_the_schema(mutate, field):
    payload = _agent_payload()
    mutate(payload)
    result = kinds.classify("runifold.agent", 1, payload)
    assert result.phase.phase_class == "unsupported"
    assert field in result.error


def test_it_takes_a_workflow_version_up_to_a_u32():
    payload = _workflow_payload("ready")
    payload["workflow_version"] = 2**32 - 1
    result = kinds.classify("runifold.workflow", 4, payload)
    assert result.phase.phase_class != "unsupported", result.error


def test_it_takes_usage_counters_up_to_a_u64():
    payload = _agent_payload()
    payload["usage"].update(tokens=2**64 - 1, cost_microusd=0)
    result = kinds.classify("runifold.agent", 1, payload)
    assert result.phase.phase_class != "unsupported", result.error


@pytest.mark.parametrize(("state", "mutate", "field"), [
    ("ready", lambda p: p.update(next_index=9), "payload.next_index"),
    ("ready", lambda p: p.update(outputs={"notify": {}}), "payload.outputs"),
    ("ready", lambda p: p.update(workflow_version=0), "payload.workflow_version"),
    ("ready", lambda p: p.update(workflow_version=2**32), "payload.workflow_version"),
    ("ready", lambda p: p.update(layout="classify"), "payload.layout"),
    ("step_in_flight", lambda p: p["phase"].pop("step"), "payload.phase.step"),
    ("parallel_in_flight", lambda p: p["phase"]["branches"]["fraud"].update(state="lost"),
     "payload.phase.branches.fraud.state"),
    ("waiting", lambda p: p["phase"].pop("wait"), "payload.phase.wait"),
    ("completed", lambda p: p.update(next_index=4, outputs={
        k: v for k, v in p["outputs"].items() if k != "notify"}), "payload.next_index"),
])
def test_it_refuses_a_workflow_payload_that_breaks_the_schema(state, mutate, field):
    payload = _workflow_payload(state)
    mutate(payload)
    result = kinds.classify("runifold.workflow", 4, payload)
    assert result.phase.phase_class == "unsupported"
    assert field in result.error


@pytest.mark.parametrize("payload", [
    {"phase": "teleporting"}, {"phase": "ready", "amount_cents": -1},
    {"phase": "ready", "order_id": 7}, [], "ready",
])
def test_it_refuses_a_bad_acme_order_payload(payload):
    assert kinds.classify("acme.order", 1, payload).phase.phase_class == "unsupported"


@pytest.mark.parametrize(("payload", "field"), [
    ({"phase": "ready", "amount_cents": 5}, "payload.amount_cents"),  # v1's field
    ({"phase": "ready", "amount": 5}, "payload.amount"),
    ({"phase": "ready", "amount": {"currency": "USD"}}, "payload.amount.cents"),
    ({"phase": "ready", "amount": {"cents": -1, "currency": "USD"}}, "payload.amount.cents"),
    ({"phase": "ready", "amount": {"cents": True, "currency": "USD"}}, "payload.amount.cents"),
    ({"phase": "ready", "amount": {"cents": 1}}, "payload.amount.currency"),
    ({"phase": "ready", "amount": {"cents": 1, "currency": "usd"}}, "payload.amount.currency"),
    ({"phase": "ready", "amount": {"cents": 1, "currency": ["USD"]}},
     "payload.amount.currency"),
    ({"phase": "teleporting"}, "payload.phase"),
])
def test_it_refuses_a_bad_acme_order_v2_payload(payload, field):
    result = kinds.classify("acme.order", 2, payload)
    assert result.phase.phase_class == "unsupported"
    assert field in result.error


def test_acme_order_v1_and_v2_share_phases_and_identity():
    v1 = {"phase": "charging", "order_id": "A-1", "amount_cents": 7, "definition_version": 3}
    v2 = {"phase": "charging", "order_id": "A-1", "amount": {"cents": 7, "currency": "USD"},
          "definition_version": 3}
    one, two = kinds.classify("acme.order", 1, v1), kinds.classify("acme.order", 2, v2)
    assert (one.phase, one.identity) == (two.phase, two.identity)
    assert one.phase.phase_class == "in_flight"


def test_it_labels_branch_counts_for_parallel_steps():
    result = kinds.classify("runifold.workflow", 4, _workflow_payload("parallel_in_flight"))
    assert result.phase.label.startswith("parallel_in_flight enrich (")
    assert "1 in_flight" in result.phase.label


def test_it_refuses_to_register_a_kind_that_breaks_the_naming_rule():
    spec = kinds.VersionSpec(lambda p: None, lambda p: kinds.Phase("stable", ""),
                             lambda p: kinds.Identity())
    with pytest.raises(ValueError):
        kinds.register("NoDots", 1, spec)


# --- langgraph.checkpoint v1 (issue 10, docs/langgraph.md) -----------------------------

def _langgraph_payload() -> dict:
    return fixture_payload("langgraph.checkpoint/v1/running-no-task-written")


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda p: p.update(thread_id=""), "payload.thread_id"),
    (lambda p: p.update(thread_id="t" * 257), "payload.thread_id"),
    (lambda p: p.update(checkpoint_id=None), "payload.checkpoint_id"),
    (lambda p: p.update(checkpoint_ns=7), "payload.checkpoint_ns"),
    (lambda p: p.update(parent_checkpoint_id=""), "payload.parent_checkpoint_id"),
    (lambda p: p.update(step=1.5), "payload.step"),
    (lambda p: p.update(next="charge"), "payload.next"),
    (lambda p: p.update(next=[""]), "payload.next"),
    (lambda p: p.update(tasks=-1), "payload.tasks"),
    (lambda p: p.update(tasks=0), "payload.tasks"),  # fewer tasks than next nodes
    (lambda p: p.update(written_tasks=True), "payload.written_tasks"),
    (lambda p: p.update(interrupted=0), "payload.interrupted"),
    (lambda p: p.update(identity={"team": "x"}), "payload.identity"),
    (lambda p: p.update(identity={"workflow": "w" * 257}), "identity workflow"),
    (lambda p: p.update(breakpoint=["charge"]), "payload.breakpoint"),
    (lambda p: p.update(breakpoint={"when": "during", "nodes": ["charge"]}),
     "payload.breakpoint"),
    (lambda p: p.update(breakpoint={"when": "before", "nodes": []}), "payload.breakpoint"),
    (lambda p: p.update(breakpoint={"when": "before", "nodes": [""]}), "payload.breakpoint"),
])
def test_it_refuses_a_langgraph_summary_that_breaks_the_schema(mutate, field):
    payload = _langgraph_payload()
    mutate(payload)
    result = kinds.classify("langgraph.checkpoint", 1, payload)
    assert result.phase.phase_class == "unsupported"
    assert field in result.error


def test_it_shortens_a_long_list_of_next_nodes_in_the_label():
    payload = _langgraph_payload()
    payload["next"] = [f"node_{i:03}_{'x' * 20}" for i in range(40)]
    payload["tasks"] = 40
    label = kinds.classify("langgraph.checkpoint", 1, payload).phase.label
    assert label.startswith("running node_000_")
    assert "more (0/40 tasks written)" in label and len(label) < 256
