"""What ``generate_load`` makes (issue 8): its tenants, roles, state mix, services and
effect paths, and the payload templates of each kind, phase and version.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from checkpoints import crypto, kinds
from checkpoints.jsonparse import dumps
from checkpoints.models import (
    Tenant,
)
from checkpoints.vocab import (
    EffectClass,
    EffectSource,
    EffectState,
    PhaseClass,
    RecoveryState,
    Role,
)

User = get_user_model()
SLUG_PREFIX = "load-"
NAME_PREFIX = "generate_load tenant "
#: Bounds of one call, so a typo cannot run for hours: runs added, revisions per run.
MAX_RUNS = 10_000_000
MAX_RUN_REVISIONS = 100_000
ROLES = (("reviewer", Role.REVIEWER), ("approver", Role.APPROVER),
         ("approver2", Role.APPROVER), ("viewer", Role.VIEWER), ("writer", Role.WRITER))


#: Share of generated runs per recovery state (the rest of the inbox is history).
STATE_WEIGHTS = {
    RecoveryState.HEALTHY: 30,
    RecoveryState.COMPLETED: 40,
    RecoveryState.AMBIGUOUS: 8,
    RecoveryState.UNKNOWN_OUTCOME: 3,
    RecoveryState.CONFLICTED: 5,
    RecoveryState.AWAITING_APPROVAL: 3,
    RecoveryState.RETRY_APPROVED: 2,
    RecoveryState.SCHEMA_MISMATCH: 3,
    RecoveryState.CLOSED: 6,
}


SERVICES = (("payments", EffectClass.NON_IDEMPOTENT), ("crm", EffectClass.NON_IDEMPOTENT),
            ("email", EffectClass.IDEMPOTENT), ("inventory", EffectClass.IDEMPOTENT),
            ("search", EffectClass.READ_ONLY))


#: Effect history per final state: (state, source) per revision, revision 0 first.
EFFECT_PATHS = {
    EffectState.PLANNED: ((EffectState.PLANNED, EffectSource.RUNTIME),),
    EffectState.SUBMITTED: ((EffectState.PLANNED, EffectSource.RUNTIME),
                            (EffectState.SUBMITTED, EffectSource.RUNTIME)),
    EffectState.CONFIRMED: ((EffectState.PLANNED, EffectSource.RUNTIME),
                            (EffectState.SUBMITTED, EffectSource.RUNTIME),
                            (EffectState.CONFIRMED, EffectSource.RUNTIME)),
    EffectState.FAILED: ((EffectState.PLANNED, EffectSource.RUNTIME),
                         (EffectState.SUBMITTED, EffectSource.RUNTIME),
                         (EffectState.FAILED, EffectSource.RUNTIME)),
    EffectState.UNRESOLVED: ((EffectState.PLANNED, EffectSource.RUNTIME),
                             (EffectState.SUBMITTED, EffectSource.RUNTIME),
                             (EffectState.UNRESOLVED, EffectSource.SWEEP)),
    EffectState.UNKNOWN: ((EffectState.PLANNED, EffectSource.RUNTIME),
                          (EffectState.SUBMITTED, EffectSource.RUNTIME),
                          (EffectState.UNRESOLVED, EffectSource.SWEEP),
                          (EffectState.UNKNOWN, EffectSource.REVIEWER)),
}


_WORDS = ("refund", "order", "customer", "invoice", "shipping", "label", "carrier", "card",
          "charge", "receipt", "policy", "window", "approved", "manager", "ticket", "note")


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + "."


def agent_payload(turn: int, state: str = "ready_for_turn", *, seed: int = 0,
                  agent: str = "refund-assistant", model: str = "gpt-4.1-mini") -> dict:
    """A ``runifold.agent`` v1 payload (RUNIFOLD.md 2) of about 1 KB of JSON: a system
    prompt, a user request, ``turn`` tool round trips (the last few kept), usage and the
    phase ``state`` (``ready_for_turn``, ``turn_in_flight`` or ``completed``)."""
    rng = random.Random(seed * 7919 + turn)
    transcript = [
        {"role": "system", "content": [{"type": "text", "text": "You handle refund requests "
                                        "for Acme. Check the order, the refund window and "
                                        "the payment before refunding."}], "metadata": {}},
        {"role": "user", "content": [{"type": "text", "text": f"Please refund order "
                                      f"A-{1000 + seed % 9000}. {_text(rng, 8)}"}],
         "metadata": {"channel": "email"}},
    ]
    for t in range(max(0, turn - 2), turn):
        transcript.append({"role": "assistant", "content": [
            {"type": "tool_call", "id": f"call_{seed}_{t}", "name": "lookup_order",
             "arguments": {"order_id": f"A-{1000 + seed % 9000}", "fields": ["status", "paid"]}}],
            "metadata": {"turn": t + 1}})
        transcript.append({"role": "tool", "content": [
            {"type": "tool_result", "id": f"call_{seed}_{t}", "text": _text(rng, 10)}],
            "metadata": {}})
    phase: dict = {"state": state}
    if state == "turn_in_flight":
        phase["turn"] = turn + 1
    elif state == "completed":
        phase["response"] = {"text": _text(rng, 12)}
    return {
        "execution_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "agent": agent,
        "model": {"provider": "openai", "name": model},
        "transcript": transcript,
        "turns": turn, "tool_calls": turn, "delegations": 0,
        "usage": {"tokens": 900 + 310 * turn, "cost_microusd": 270 + 95 * turn,
                  "duration_micros": 1_200_000 * turn, "turns": turn, "tool_calls": turn,
                  "delegations": 0},
        "phase": phase,
    }


def workflow_payload(step_index: int, state: str, *, seed: int = 0) -> dict:
    """A ``runifold.workflow`` v4 payload (RUNIFOLD.md 3) at ``layout[step_index]``:
    ``ready``, ``step_in_flight`` or ``completed``."""
    layout = ["classify", "enrich", "quote", "manager_review", "notify"]
    rng = random.Random(seed * 104729 + step_index)
    done = len(layout) if state == "completed" else min(step_index, len(layout) - 1)
    outputs = {step: {"ok": True, "note": _text(rng, 6)} for step in layout[:done]}
    phase: dict = {"state": state}
    if state == "step_in_flight":
        phase["step"] = layout[done]
    elif state == "completed":
        phase["outcome"] = {"status": "refunded", "amount_cents": 2599}
    return {
        "workflow": "refund-approval", "workflow_version": 3, "layout": layout,
        "next_index": done, "value": {"order_id": f"A-{1000 + seed % 9000}",
                                      "amount_cents": 2599, "note": _text(rng, 10)},
        "outputs": outputs,
        "usage": {"tokens": 1840, "cost_microusd": 530, "duration_micros": 0, "turns": 2,
                  "tool_calls": 1, "delegations": 0},
        "phase": phase,
    }


def order_payload(phase: str, *, seed: int = 0) -> dict:
    """An ``acme.order`` v1 payload (the demo kind) in ``phase``."""
    rng = random.Random(seed)
    return {"phase": phase, "order_id": f"A-{1000 + seed % 9000}", "amount_cents": 2599,
            "workflow": "acme.order", "definition_version": 1,
            "lines": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 3),
                       "note": _text(rng, 8)} for _ in range(6)]}


@dataclass(frozen=True)
class Template:
    """One stored payload: kind, version, its classification and its ciphertext."""

    kind: str
    schema_version: int
    phase_class: str
    phase_label: str
    identity: kinds.Identity
    ciphertext: str
    size: int


def _template(kind: str, version: int, payload: dict) -> Template:
    cls = kinds.classify(kind, version, payload)
    text = dumps(payload)
    label = (cls.error if not cls.supported else cls.phase.label)[:256]
    return Template(kind, version, cls.phase.phase_class, label, cls.identity,
                    # One template serves every tenant, so it is written in the legacy
                    # master-key form (rotate_payload_keys moves it to the tenants' keys).
                    crypto.encrypt_text(text, tenant=None), len(text.encode("utf-8")))


def _templates() -> dict[str, list[Template]]:
    """Templates per final phase class (``unsupported`` for schema_mismatch runs); each
    supported one checked against the phase class it was made for."""
    out: dict[str, list[Template]] = {c: [] for c in PhaseClass.values}
    wanted = []
    for s in range(3):
        wanted += [
            (PhaseClass.STABLE, "runifold.agent", 1, agent_payload(2 + s, seed=s)),
            (PhaseClass.IN_FLIGHT, "runifold.agent", 1,
             agent_payload(2 + s, "turn_in_flight", seed=s)),
            (PhaseClass.COMPLETED, "runifold.agent", 1, agent_payload(3 + s, "completed", seed=s)),
            (PhaseClass.STABLE, "runifold.workflow", 4, workflow_payload(1 + s, "ready", seed=s)),
            (PhaseClass.IN_FLIGHT, "runifold.workflow", 4,
             workflow_payload(1 + s, "step_in_flight", seed=s)),
            (PhaseClass.COMPLETED, "runifold.workflow", 4,
             workflow_payload(5, "completed", seed=s)),
            (PhaseClass.STABLE, "acme.order", 1, order_payload("charged", seed=s)),
            (PhaseClass.IN_FLIGHT, "acme.order", 1, order_payload("charging", seed=s)),
            (PhaseClass.COMPLETED, "acme.order", 1, order_payload("completed", seed=s)),
        ]
    wanted += [(PhaseClass.UNSUPPORTED, "acme.legacy_order", 1, order_payload("ready", seed=9)),
               (PhaseClass.UNSUPPORTED, "runifold.workflow", 9,
                workflow_payload(1, "ready", seed=9))]
    for phase_class, kind, version, payload in wanted:
        t = _template(kind, version, payload)
        if t.phase_class != phase_class:
            raise CommandError(f"generate_load: template {kind} v{version} classifies as "
                               f"{t.phase_class}, not {phase_class}")
        out[phase_class].append(t)
    return out


@dataclass
class _Tenant:
    tenant: Tenant
    users: dict[str, object]


@dataclass
class _Effect:
    uuid: uuid.UUID
    service: str
    effect_class: str
    key: str
    state: str
    created_at: datetime


@dataclass
class _RunPlan:
    state: str
    template: Template
    created_at: datetime
    last_write_at: datetime
    effects: list[_Effect] = field(default_factory=list)
    lease_owner: str = ""
    lease_expires_at: datetime | None = None
    fencing_token: int = 0
    conflicts: int = 0
    retry_state: str = ""
    closed: bool = False
