"""Pure recovery rules: the run's recovery state and the resume decision.

Nothing here touches the database; ``services`` gathers a ``RunFacts`` snapshot under the
run's row lock and applies these functions, so the rules are testable as plain functions.
Sources: DESIGN.md section 4 (states, precedence), CONTRACT.md section 3 (resume answers),
RUNIFOLD.md sections 2-3 (``RejectAmbiguous`` by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

# Effect states that leave a run's side effect in doubt.
IN_DOUBT_EFFECT_STATES = frozenset({"submitted", "unresolved"})

# DESIGN.md section 4: schema_mismatch > unknown_outcome > awaiting_approval >
# retry_approved > ambiguous > conflicted > healthy/completed.
RECOVERY_PRECEDENCE = (
    "schema_mismatch",
    "unknown_outcome",
    "awaiting_approval",
    "retry_approved",
    "ambiguous",
    "conflicted",
)


@dataclass(frozen=True)
class RunFacts:
    """What the rules need to know about one run, read in one transaction.

    ``effect_states`` counts effects per state, leaving out ``unknown``/``not_executed``
    effects already covered by a consumed retry. Times are aware datetimes.
    """

    now: datetime
    phase_class: str  # of the latest checkpoint; "" when the run has none
    schema_error: str = ""
    last_write_at: datetime | None = None
    lease_owner: str = ""
    lease_expires_at: datetime | None = None
    ambiguity_threshold_s: int = 300
    effect_states: dict[str, int] = field(default_factory=dict)
    open_retry_state: str = ""  # "requested" | "approved" | ""
    unacknowledged_conflicts: int = 0
    identity: dict[str, str] = field(default_factory=dict)
    # state -> "service operation_key" of the first few effects in that state (submitted,
    # unresolved, unknown), so a reason can say *which* side effect is in doubt.
    effect_labels: dict[str, list[str]] = field(default_factory=dict)
    closed: bool = False  # a reviewer closed the run; its next write reopens it

    @property
    def lease_live(self) -> bool:
        return bool(self.lease_owner) and self.lease_expires_at is not None and (
            self.lease_expires_at > self.now
        )

    @property
    def owner_gone_at(self) -> datetime | None:
        """When the owner counts as gone (CONTRACT.md 1): the lease's expiry, or with no
        lease the last write plus the tenant's ambiguity threshold; ``None``: already."""
        if self.lease_owner and self.lease_expires_at is not None:
            return self.lease_expires_at
        if self.last_write_at is None:
            return None
        return self.last_write_at + timedelta(seconds=self.ambiguity_threshold_s)

    @property
    def owner_gone(self) -> bool:
        """CONTRACT.md 1: lease expired, or no lease and quiet longer than the threshold.
        The one rule for the sweep, reconciliation and the state shown."""
        gone_at = self.owner_gone_at
        return gone_at is None or gone_at <= self.now

    def count(self, *states: str) -> int:
        return sum(self.effect_states.get(s, 0) for s in states)


def _effects(facts: RunFacts, state: str, words: str) -> str:
    """``payments charge:A-1 unresolved`` or ``2 effects unresolved: a, b``."""
    n = facts.count(state)
    labels = facts.effect_labels.get(state, [])
    if n == 1 and labels:
        return f"{labels[0]} {words}"
    text = f"{n} effects {words}"
    if labels:
        text += ": " + ", ".join(labels) + (", …" if n > len(labels) else "")
    return text


def recovery_state(facts: RunFacts) -> tuple[str, str]:
    """The run's recovery state and a short human reason, by DESIGN.md's precedence;
    ``closed`` (a reviewer's mark, cleared by the run's next write) comes before all."""
    if facts.closed:
        return "closed", "closed by a reviewer"
    applies: dict[str, str] = {}
    if facts.phase_class == "unsupported":
        applies["schema_mismatch"] = facts.schema_error or "unsupported schema"
    # An open retry request is the human decision on an unknown outcome in progress, so
    # it shows as awaiting_approval / retry_approved instead (DESIGN.md's precedence would
    # hide every such run from the approvers' tab; see the issue note).
    if facts.count("unknown") and not facts.open_retry_state:
        applies["unknown_outcome"] = _effects(facts, "unknown", "outcome unknown")
    if facts.open_retry_state == "requested":
        applies["awaiting_approval"] = "retry requested, awaiting a second person"
    if facts.open_retry_state == "approved":
        applies["retry_approved"] = "retry approved, waiting for the runtime to resume"
    if facts.count("unresolved"):
        applies["ambiguous"] = _effects(facts, "unresolved", "unresolved")
    elif facts.owner_gone and facts.count("submitted"):
        applies["ambiguous"] = _effects(facts, "submitted", "submitted, owner gone")
    elif facts.owner_gone and facts.phase_class == "in_flight":
        applies["ambiguous"] = "checkpoint in flight, owner gone"
    if facts.unacknowledged_conflicts:
        applies["conflicted"] = f"{facts.unacknowledged_conflicts} refused write(s)"
    for state in RECOVERY_PRECEDENCE:
        if state in applies:
            return state, applies[state]
    if facts.phase_class == "completed":
        return "completed", ""
    return "healthy", ""


@dataclass(frozen=True)
class Decision:
    """A resume answer: ``action`` in replay/continue/reject/retry/reconcile, ``reason`` a
    stable snake_case word. ``consume_retry`` tells the service to consume the approval and
    bump the fencing token in the same transaction."""

    action: str
    reason: str
    consume_retry: bool = False


IDENTITY_PARAMS = ("agent", "model", "workflow", "definition_version")


def resume_decision(facts: RunFacts, asked: dict[str, str]) -> Decision:
    """CONTRACT.md section 3, ``GET …/runs/{run_id}/resume``.

    Order: no checkpoint, unsupported schema, identity mismatch (each given parameter
    must equal the run's), completed -> replay (executes nothing, always safe), closed by
    a reviewer -> reject (handled outside the system), effects in
    doubt -> reconcile, approved retry -> retry, requested retry -> reject, unknown effect
    -> reject, in flight -> reject, stable -> continue.
    """
    if not facts.phase_class:
        return Decision("reject", "no_checkpoint")
    if facts.phase_class == "unsupported":
        return Decision("reject", "unsupported_schema")
    for key in IDENTITY_PARAMS:
        given = asked.get(key)
        if given is not None and given != facts.identity.get(key, ""):
            return Decision("reject", "identity_mismatch")
    if facts.phase_class == "completed":
        return Decision("replay", "completed")
    if facts.closed:
        return Decision("reject", "closed")
    # Effects in doubt come before an approved retry: the approval is not spent on a
    # resume that would stop at the unresolved effect anyway.
    if facts.count("submitted", "unresolved"):
        return Decision("reconcile", "effects_in_doubt")
    if facts.open_retry_state == "approved":
        return Decision("retry", "retry_approved", consume_retry=True)
    if facts.open_retry_state == "requested":
        return Decision("reject", "awaiting_approval")
    if facts.count("unknown"):
        return Decision("reject", "outcome_unknown")
    if facts.phase_class == "in_flight":
        return Decision("reject", "in_flight")
    return Decision("continue", "stable")


# Effect state machine (CONTRACT.md section 3). Keys: (from, to); value: who may do it.
RUNTIME, RECONCILIATION, REVIEWER, SWEEP, RETRY = (
    "runtime", "reconciliation", "reviewer", "sweep", "retry"
)
EFFECT_TRANSITIONS: dict[tuple[str, str], frozenset[str]] = {
    ("planned", "submitted"): frozenset({RUNTIME}),
    ("submitted", "confirmed"): frozenset({RUNTIME, RECONCILIATION}),
    ("submitted", "failed"): frozenset({RUNTIME, RECONCILIATION}),
    # Reconciliation too: its first step on a service that never saw the key.
    ("submitted", "unresolved"): frozenset({RUNTIME, SWEEP, RECONCILIATION}),
    # A runtime that reconciles by itself (runifold's execute_reconciled) is reconciliation.
    ("unresolved", "confirmed"): frozenset({RECONCILIATION, RUNTIME}),
    ("unresolved", "failed"): frozenset({RECONCILIATION, RUNTIME}),
    ("unresolved", "not_executed"): frozenset({RECONCILIATION, RUNTIME}),
    ("submitted", "unknown"): frozenset({REVIEWER, RECONCILIATION}),
    ("unresolved", "unknown"): frozenset({REVIEWER, RECONCILIATION}),
    ("not_executed", "planned"): frozenset({RETRY}),
    ("unknown", "planned"): frozenset({RETRY}),
}


def transition_allowed(from_state: str, to_state: str, by: str) -> bool:
    """Whether ``by`` (runtime/reconciliation/reviewer/sweep/retry) may move an effect."""
    return by in EFFECT_TRANSITIONS.get((from_state, to_state), frozenset())


# What an approved retry does to an effect in each state (the retry preview, issue 5):
# (outcome word, sentence for people).
RETRY_OUTCOMES: dict[str, tuple[str, str]] = {
    "confirmed": ("replay_receipt", "replays the confirmed receipt; not called again"),
    "failed": ("stays_failed", "stays failed; the run follows its own failure path"),
    "planned": ("submit", "submitted for the first time (it was never sent)"),
    "not_executed": ("submit_again", "submitted again: the service never saw it"),
    "unknown": ("possible_duplicate",
                "sent again although nobody can tell whether the first attempt happened: "
                "the approver accepts a possible duplicate"),
    "submitted": ("in_doubt", "still in doubt: reconcile it or mark it unknown first"),
    "unresolved": ("in_doubt", "still in doubt: reconcile it or mark it unknown first"),
}


def retry_outcome(state: str) -> tuple[str, str]:
    """``(outcome, words)`` for an effect in ``state`` under an approved retry."""
    return RETRY_OUTCOMES.get(state, ("unchanged", "unchanged"))
