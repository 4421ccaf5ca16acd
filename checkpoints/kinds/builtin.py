"""The built-in kinds (DESIGN.md section 3), registered when ``checkpoints.kinds`` is
imported: ``runifold.agent`` v1 and ``runifold.workflow`` v3 and v4 (RUNIFOLD.md sections
2 and 3), ``acme.order`` v1 and v2 (the demo's), ``langgraph.checkpoint`` v1
(docs/langgraph.md), and the migrations between their versions (``upcasters``). The
registry itself, and what each function must do, is ``checkpoints.kinds``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .. import upcasters
from ..vocab import PhaseClass
from . import (
    IDENTITY_LIMITS,
    U32_MAX,
    U64_MAX,
    USAGE_COUNTERS,
    Identity,
    Phase,
    SchemaError,
    VersionSpec,
    register,
    register_migration,
)

# --- small validation helpers ------------------------------------------------------------

def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise SchemaError(f"{where} must be an object")
    return value


def _str(obj: dict, key: str, where: str, *, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value:
        raise SchemaError(f"{where}.{key} must be a non-empty string")
    return value




def _uint(obj: dict, key: str, where: str, *, positive: bool = False, bits: int = 64) -> int:
    """``obj[key]`` as a runifold unsigned integer (``u64`` unless ``bits=32``).

    Raises SchemaError naming ``where.key`` when it is not an integer, is below 0 (or 1 when
    ``positive``) or does not fit ``bits`` bits.
    """
    value = obj.get(key)
    if type(value) is not int or value < (1 if positive else 0):
        raise SchemaError(f"{where}.{key} must be an integer >= {1 if positive else 0}")
    maximum = U32_MAX if bits == 32 else U64_MAX
    if value > maximum:
        raise SchemaError(f"{where}.{key} must be at most {maximum} (a u{bits})")
    return value


def _usage(obj: dict, where: str) -> None:
    """``obj["usage"]``: an object whose runifold counters, where present, are ``u64``."""
    usage = _obj(obj.get("usage"), f"{where}.usage")
    for key in USAGE_COUNTERS:
        if key in usage:
            _uint(usage, key, f"{where}.usage")


def runifold_usage(payload: dict) -> dict[str, int]:
    """The runifold ``Usage`` counters of a validated payload (``payload["usage"]``),
    those present: ``{"tokens": 702, "cost_microusd": 215, ...}`` (RUNIFOLD.md 2)."""
    usage = payload["usage"]
    return {key: usage[key] for key in USAGE_COUNTERS if key in usage}


def _state(obj: dict, where: str, allowed: set[str]) -> str:
    phase = _obj(obj.get("phase"), f"{where}.phase")
    state = phase.get("state")
    if state not in allowed:
        raise SchemaError(f"{where}.phase.state must be one of {sorted(allowed)}")
    return state


# --- runifold.agent v1 ---------------------------------------------------------------------

_AGENT_STATES = {"ready_for_turn", "turn_in_flight", "completed"}


def _agent_validate(payload: Any) -> None:
    p = _obj(payload, "payload")
    _str(p, "agent", "payload")
    model = _obj(p.get("model"), "payload.model")
    _str(model, "provider", "payload.model")
    _str(model, "name", "payload.model")
    if not isinstance(p.get("transcript"), list):
        raise SchemaError("payload.transcript must be an array")
    for key in ("turns", "tool_calls", "delegations"):
        _uint(p, key, "payload")
    _usage(p, "payload")
    state = _state(p, "payload", _AGENT_STATES)
    if state == "turn_in_flight":
        _uint(p["phase"], "turn", "payload.phase", positive=True)
    if state == "completed":
        _obj(p["phase"].get("response"), "payload.phase.response")


def _agent_phase(p: dict) -> Phase:
    phase = p["phase"]
    state = phase["state"]
    if state == "turn_in_flight":
        return Phase(PhaseClass.IN_FLIGHT, f"turn_in_flight turn {phase['turn']}")
    if state == "completed":
        return Phase(PhaseClass.COMPLETED, f"completed after {p['turns']} turn(s)")
    return Phase(PhaseClass.STABLE, f"ready_for_turn turn {p['turns'] + 1}")


def _agent_identity(p: dict) -> Identity:
    return Identity(agent=p["agent"], model=f"{p['model']['provider']}/{p['model']['name']}")


register("runifold.agent", 1, VersionSpec(_agent_validate, _agent_phase, _agent_identity,
                                          runifold_usage),
         "runifold agent loop (RUNIFOLD.md section 2)")


# --- runifold.workflow v3, v4 --------------------------------------------------------------

_BRANCH_STATES = {"in_flight", "completed", "failed", "cancelled"}


def _workflow_validator(version: int) -> Callable[[Any], None]:
    states = {"ready", "step_in_flight", "parallel_in_flight", "race_in_flight", "completed"}
    if version >= 4:
        states = states | {"waiting"}

    def validate(payload: Any) -> None:
        p = _obj(payload, "payload")
        _str(p, "workflow", "payload")
        # RUNIFOLD.md §3: workflow_version is a u32 > 0.
        _uint(p, "workflow_version", "payload", positive=True, bits=32)
        _usage(p, "payload")  # the Usage snapshot (RUNIFOLD.md §3), counters u64
        layout = p.get("layout")
        if not isinstance(layout, list) or not all(isinstance(s, str) for s in layout):
            raise SchemaError("payload.layout must be an array of step ids")
        next_index = _uint(p, "next_index", "payload")
        if next_index > len(layout):
            raise SchemaError("payload.next_index is past the end of payload.layout")
        outputs = _obj(p.get("outputs"), "payload.outputs")
        if set(outputs) != set(layout[:next_index]):
            raise SchemaError("payload.outputs must hold exactly layout[:next_index]")
        state = _state(p, "payload", states)
        phase = p["phase"]
        if state in {"step_in_flight", "waiting", "parallel_in_flight", "race_in_flight"}:
            _str(phase, "step", "payload.phase")
        if state in {"parallel_in_flight", "race_in_flight"}:
            branches = _obj(phase.get("branches"), "payload.phase.branches")
            for name, branch in branches.items():
                b = _obj(branch, f"payload.phase.branches.{name}")
                if b.get("state") not in _BRANCH_STATES:
                    raise SchemaError(
                        f"payload.phase.branches.{name}.state must be one of "
                        f"{sorted(_BRANCH_STATES)}"
                    )
        if state == "waiting":
            _obj(phase.get("wait"), "payload.phase.wait")
        if state == "completed":
            _obj(phase.get("outcome"), "payload.phase.outcome")
            if next_index != len(layout):
                raise SchemaError("payload.next_index must equal len(layout) when completed")

    return validate


def _workflow_phase(p: dict) -> Phase:
    phase = p["phase"]
    state = phase["state"]
    step = phase.get("step", "")
    if state == "ready":
        nxt = p["layout"][p["next_index"]] if p["next_index"] < len(p["layout"]) else "end"
        return Phase(PhaseClass.STABLE, f"ready next {nxt}")
    if state == "waiting":
        return Phase(PhaseClass.STABLE, f"waiting {step} on {phase['wait'].get('kind', '?')}")
    if state == "step_in_flight":
        return Phase(PhaseClass.IN_FLIGHT, f"step_in_flight {step}")
    if state in {"parallel_in_flight", "race_in_flight"}:
        branches = phase["branches"]
        counts: dict[str, int] = {}
        for b in branches.values():
            counts[b["state"]] = counts.get(b["state"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        if state == "parallel_in_flight":
            settled = bool(branches) and counts.get("completed", 0) == len(branches)
        else:
            settled = counts.get("completed", 0) > 0 or (
                bool(branches) and counts.get("failed", 0) == len(branches)
            )
        return Phase(PhaseClass.STABLE if settled else PhaseClass.IN_FLIGHT, f"{state} {step} ({summary})")
    return Phase(PhaseClass.COMPLETED, f"completed {len(p['layout'])} step(s)")


def _workflow_identity(p: dict) -> Identity:
    return Identity(workflow=p["workflow"], definition_version=str(p["workflow_version"]))


for _v in (3, 4):
    register("runifold.workflow", _v,
             VersionSpec(_workflow_validator(_v), _workflow_phase, _workflow_identity,
                         runifold_usage),
             "runifold workflow (RUNIFOLD.md section 3)")


# --- acme.order v1, v2 (the demo kind) ----------------------------------------------------

ACME_PHASES = {
    "ready": PhaseClass.STABLE,
    "charging": PhaseClass.IN_FLIGHT,
    "charged": PhaseClass.STABLE,
    "shipping": PhaseClass.IN_FLIGHT,
    "completed": PhaseClass.COMPLETED,
    "cancelled": PhaseClass.COMPLETED,
}


def _acme_validator(version: int) -> Callable[[Any], None]:
    """v1: ``amount_cents`` (an integer >= 0); v2: ``amount`` (``{"cents": integer >= 0,
    "currency": three capital letters}``), and no ``amount_cents``."""

    def validate(payload: Any) -> None:
        p = _obj(payload, "payload")
        phase = p.get("phase")
        if phase not in ACME_PHASES:
            raise SchemaError(f"payload.phase must be one of {sorted(ACME_PHASES)}")
        for key in ("order_id", "workflow"):
            if key in p and not isinstance(p[key], str):
                raise SchemaError(f"payload.{key} must be a string")
        if version == 1:
            return _cents(p, "amount_cents", "payload")
        if "amount_cents" in p:
            raise SchemaError("payload.amount_cents is v1's; v2 holds payload.amount")
        if "amount" in p:
            amount = _obj(p["amount"], "payload.amount")
            _cents(amount, "cents", "payload.amount", required=True)
            if not re.fullmatch(r"[A-Z]{3}", str(amount.get("currency"))):  # ISO 4217
                raise SchemaError("payload.amount.currency must be three capital letters")

    return validate


def _cents(obj: dict, key: str, where: str, *, required: bool = False) -> None:
    if (key in obj or required) and (type(obj.get(key)) is not int or obj[key] < 0):
        raise SchemaError(f"{where}.{key} must be an integer >= 0")


def _acme_phase(p: dict) -> Phase:
    # The phase only: the order id is business data of the payload, and labels are shown
    # to viewers, who may not see payloads (issue 6, fault 3).
    return Phase(ACME_PHASES[p["phase"]], p["phase"])


def _acme_identity(p: dict) -> Identity:
    version = p.get("definition_version")
    return Identity(workflow=str(p.get("workflow") or "acme.order"),
                    definition_version="" if version is None else str(version))


for _v in (1, 2):
    register("acme.order", _v, VersionSpec(_acme_validator(_v), _acme_phase, _acme_identity),
             "demo order workflow: charge a card, then ship")

# The shipped migrations (the steps themselves: ``upcasters``).
register_migration("acme.order", 1, upcasters.acme_amount_up, upcasters.acme_amount_down,
                   name="acme.order amount_cents -> amount")
register_migration("runifold.workflow", 3, upcasters.workflow_v4_up, upcasters.workflow_v3_down,
                   name="runifold.workflow waiting + lineage")


# --- langgraph.checkpoint v1 (issue 10, docs/langgraph.md) --------------------------------
#
# The envelope of one LangGraph (thread, namespace): a summary of the namespace's head
# written by ``interop.langgraph`` (never channel values: labels are shown to viewers).

LANGGRAPH_KIND = "langgraph.checkpoint"
#: Longest node list a phase label spells out; the rest is "+N more".
_LABEL_NODES = 120


def _langgraph_validate(payload: Any) -> None:
    p = _obj(payload, "payload")
    for key, limit, required in (("thread_id", 256, True), ("checkpoint_ns", 256, False),
                                 ("checkpoint_id", 128, True)):
        value = p.get(key)
        if not isinstance(value, str) or (required and not value) or len(value) > limit:
            raise SchemaError(f"payload.{key} must be a string of "
                              f"{1 if required else 0}..{limit} characters")
    parent = p.get("parent_checkpoint_id")
    if parent is not None and (not isinstance(parent, str) or not 0 < len(parent) <= 128):
        raise SchemaError("payload.parent_checkpoint_id must be null or a string of "
                          "1..128 characters")
    step = p.get("step")
    if step is not None and type(step) is not int:
        raise SchemaError("payload.step must be an integer or null")
    if not isinstance(p.get("source", ""), str):
        raise SchemaError("payload.source must be a string")
    nxt = p.get("next")
    if not isinstance(nxt, list) or not all(isinstance(n, str) and n for n in nxt):
        raise SchemaError("payload.next must be an array of node names")
    tasks = _uint(p, "tasks", "payload")
    if tasks < len(nxt):
        raise SchemaError("payload.tasks must be at least len(payload.next)")
    _uint(p, "written_tasks", "payload")
    for key in ("interrupted", "errored"):
        if type(p.get(key)) is not bool:
            raise SchemaError(f"payload.{key} must be true or false")
    bp = p.get("breakpoint")
    if bp is not None:
        _obj(bp, "payload.breakpoint")
        nodes = bp.get("nodes")
        if bp.get("when") not in ("before", "after") or not isinstance(nodes, list) or not (
                nodes and all(isinstance(n, str) and n for n in nodes)):
            raise SchemaError('payload.breakpoint must be {"when": "before" | "after", '
                              '"nodes": [node names]}')
    identity = p.get("identity", {})
    _obj(identity, "payload.identity")
    unknown = set(identity) - set(IDENTITY_LIMITS)
    if unknown:
        raise SchemaError("payload.identity may hold only agent, model, workflow and "
                          "definition_version")


def _node_words(nodes: list[str]) -> str:
    """``"a, b"``; a long list ends with ``"+N more"`` (labels stay short)."""
    words, shown = "", 0
    for node in nodes:
        candidate = f"{words}, {node}" if words else node
        if len(candidate) > _LABEL_NODES:
            break
        words, shown = candidate, shown + 1
    if shown < len(nodes):
        more = f"+{len(nodes) - shown} more"
        words = f"{words} {more}" if words else more
    return words


def _langgraph_phase(p: dict) -> Phase:
    """From the head's summary (docs/langgraph.md, "Mapping"): no next node and no task:
    ``completed``; an interrupt write: ``stable`` (waiting for input); an error write:
    ``stable``; paused at a static breakpoint (``breakpoint``, no task written yet):
    ``stable`` ("paused before b"); every task has written: ``stable`` (between steps);
    else ``in_flight``. Labels name nodes (graph structure), never channel values."""
    nxt, tasks, written = p["next"], p["tasks"], p["written_tasks"]
    nodes = _node_words(nxt) if nxt else "sent tasks"
    if not nxt and tasks == 0:
        return Phase(PhaseClass.COMPLETED, "done")
    if p["interrupted"]:
        return Phase(PhaseClass.STABLE, f"waiting for input at {nodes}")
    if p["errored"]:
        return Phase(PhaseClass.STABLE, f"error in {nodes}")
    bp = p.get("breakpoint")
    if bp and written == 0:
        return Phase(PhaseClass.STABLE, f"paused {bp['when']} {_node_words(bp['nodes'])}")
    if written >= tasks:
        return Phase(PhaseClass.STABLE, "between steps")
    return Phase(PhaseClass.IN_FLIGHT, f"running {nodes} ({written}/{tasks} tasks written)")


def _langgraph_identity(p: dict) -> Identity:
    ident = p.get("identity", {})
    return Identity(**{name: ident.get(name, "") for name in IDENTITY_LIMITS})


register(LANGGRAPH_KIND, 1,
         VersionSpec(_langgraph_validate, _langgraph_phase, _langgraph_identity),
         "a LangGraph thread's namespace: a summary of its newest checkpoint (docs/langgraph.md)")
