"""Pure recovery rules: the run's recovery state and the resume decision.

Nothing here touches the database; ``services`` gathers a ``RunFacts`` snapshot under the
run's row lock and applies these functions, so the rules are testable as plain functions.
Sources: DESIGN.md section 4 (states, precedence), CONTRACT.md section 3 (resume answers),
RUNIFOLD.md sections 2-3 (``RejectAmbiguous`` by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from . import kinds
from .vocab import (
    EffectSource,
    EffectState,
    LeaseState,
    PhaseClass,
    RecoveryState,
    ResumeAction,
    ResumeReason,
    RetryOutcome,
    RetryState,
)


def lease_live(owner: str, expires_at: datetime | None, now: datetime) -> bool:
    """Whether a run's lease is live at ``now`` (the database's time, CONTRACT.md 3): it
    has an owner and expires after ``now``."""
    return bool(owner) and expires_at is not None and expires_at > now


def lease_state(owner: str, expires_at: datetime | None, ended_at: datetime | None,
                live: bool) -> str:
    """The word for a run's lease (a ``LeaseState``, or ``""`` when the run has no lease
    owner): the one rule of the run page, the inbox and the API's run
    (``RunSerializer.lease_state``); the newcomer's finding that a lease a reviewer ended
    read "expired", exactly as one that timed out.

    ``live`` is ``lease_live`` at the database's time (the reads annotate it,
    ``selectors.common.LEASE_LIVE``). ``ended`` when a reviewer ended it:
    ``services.lease_revoke`` sets ``Run.lease_ended_at`` and the expiry to the same
    database time, and whatever takes the lease since (``lease_acquire``, which also
    clears the record; a retry's resume, which drops the owner) moves the expiry, so a
    record left behind never calls a later lease ended. Otherwise ``expired``."""
    if not owner:
        return ""
    if live:
        return LeaseState.LIVE
    if ended_at is not None and ended_at == expires_at:
        return LeaseState.ENDED
    return LeaseState.EXPIRED


@dataclass(frozen=True)
class RunFacts:
    """What the rules need to know about one run, read in one transaction.

    ``effect_states`` counts effects per state, leaving out ``unknown``/``not_executed``
    effects already covered by a consumed retry. Times are aware datetimes.
    """

    now: datetime
    phase_class: str  # a PhaseClass of the latest checkpoint; "" when the run has none
    schema_error: str = ""
    last_write_at: datetime | None = None
    lease_owner: str = ""
    lease_expires_at: datetime | None = None
    ambiguity_threshold_s: int = 300
    effect_states: dict[str, int] = field(default_factory=dict)
    open_retry_state: str = ""  # one of RetryState.OPEN, or ""
    unacknowledged_conflicts: int = 0
    identity: dict[str, str] = field(default_factory=dict)
    # state -> "service operation_key" of the first few effects in that state (submitted,
    # unresolved, unknown), so a reason can say *which* side effect is in doubt.
    effect_labels: dict[str, list[str]] = field(default_factory=dict)
    closed: bool = False  # a reviewer closed the run; its next write reopens it
    # The latest checkpoint's usage counters (``kinds.Classification.usage``), filled in by
    # the resume services only (``services.runs.resume_preview`` / ``resume_claim``).
    usage: dict[str, int] = field(default_factory=dict)
    # The latest checkpoint is an older version of an ``offline`` kind
    # (``kinds.migration_required``): the operator migrates it before a resume.
    migration_required: bool = False

    @classmethod
    def of(cls, run, *, now: datetime, ambiguity_threshold_s: int,
           effect_states: dict[str, int] | None = None, open_retry_state: str = "",
           effect_labels: dict[str, list[str]] | None = None) -> RunFacts:
        """The facts of ``run`` at ``now``: the one place a run's row becomes
        ``RunFacts`` (issue 18, item 2). ``run`` is a ``Run``, saved or not (the SQL write
        path and ``generate_load`` build one from what they read), and is only read:
        its phase (``phase_class``; ``phase_label`` is the schema error of an
        unsupported one), ``last_write_at``, lease, ``unacknowledged_conflicts``,
        identity fields, ``closed_at``, and ``kind``/``schema_version`` (whether its
        kind requires a migration first). The counts, the open retry request's state and
        the labels come from the caller's queries (``services.runs.run_facts`` reads
        them in one round trip)."""
        unsupported = run.phase_class == PhaseClass.UNSUPPORTED
        return cls(
            now=now,
            phase_class=run.phase_class,
            schema_error=run.phase_label if unsupported else "",
            last_write_at=run.last_write_at,
            lease_owner=run.lease_owner,
            lease_expires_at=run.lease_expires_at,
            ambiguity_threshold_s=ambiguity_threshold_s,
            effect_states=effect_states or {},
            open_retry_state=open_retry_state or "",
            unacknowledged_conflicts=run.unacknowledged_conflicts,
            identity={"agent": run.agent, "model": run.model, "workflow": run.workflow,
                      "definition_version": run.definition_version},
            effect_labels=effect_labels or {},
            closed=run.closed_at is not None,
            migration_required=kinds.migration_required(run.kind, run.schema_version),
        )

    @property
    def lease_live(self) -> bool:
        return lease_live(self.lease_owner, self.lease_expires_at, self.now)

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
    text = f"{n} effect{'' if n == 1 else 's'} {words}"
    if labels:
        text += ": " + ", ".join(labels) + (", …" if n > len(labels) else "")
    return text


def retry_applies(phase_class: str) -> bool:
    """Whether a retry request can still be consumed on a run whose latest checkpoint is
    of ``phase_class``: not once it completed, since ``resume_decision`` answers
    ``replay`` before it would consume an approval (CONTRACT.md 8). The one rule of
    ``recovery_state`` (an open request no longer decides a completed run's state), of
    the retry actions (no request and no approval for a completed run:
    ``services.review``; the run page offers neither), and of the approvers' queue
    (``selectors.approval_queue``); stop 33. The request itself is left open, not
    expired: a run's phase is its latest write's, which can complete and go on (a
    LangGraph subgraph that finishes inside a run that does not), so a derived rule
    and not a write (the second attack's finding against expiring it)."""
    return phase_class != PhaseClass.COMPLETED


def recovery_state(facts: RunFacts) -> tuple[str, str]:
    """The run's recovery state and a short human reason, by DESIGN.md's precedence;
    ``closed`` (a reviewer's mark, cleared by the run's next write) comes before all."""
    if facts.closed:
        return RecoveryState.CLOSED, "closed by a reviewer"
    applies: dict[str, str] = {}
    if facts.phase_class == PhaseClass.UNSUPPORTED:
        applies[RecoveryState.SCHEMA_MISMATCH] = facts.schema_error or "unsupported schema"
    # A completed run is replayed, never retried (``resume_decision`` answers replay
    # before it would consume an approval), so an open retry request no longer applies:
    # the run read "retry approved, waiting for the runtime" for ever after its runtime
    # finished (stop 33). Its effects in doubt still need a person (unknown_outcome).
    open_retry = facts.open_retry_state if retry_applies(facts.phase_class) else ""
    # An open retry request is the human decision on an unknown outcome in progress, so
    # it shows as awaiting_approval / retry_approved instead (DESIGN.md's precedence would
    # hide every such run from the approvers' tab; see the issue note).
    if facts.count(EffectState.UNKNOWN) and not open_retry:
        applies[RecoveryState.UNKNOWN_OUTCOME] = _effects(facts, EffectState.UNKNOWN,
                                                          "outcome unknown")
    if open_retry == RetryState.REQUESTED:
        applies[RecoveryState.AWAITING_APPROVAL] = "retry requested, awaiting a second person"
    if open_retry == RetryState.APPROVED:
        applies[RecoveryState.RETRY_APPROVED] = "retry approved, waiting for the runtime to resume"
    if facts.count(EffectState.UNRESOLVED):
        applies[RecoveryState.AMBIGUOUS] = _effects(facts, EffectState.UNRESOLVED, "unresolved")
    elif facts.owner_gone and facts.count(EffectState.SUBMITTED):
        applies[RecoveryState.AMBIGUOUS] = _effects(facts, EffectState.SUBMITTED,
                                                    "submitted, owner gone")
    elif facts.owner_gone and facts.phase_class == PhaseClass.IN_FLIGHT:
        applies[RecoveryState.AMBIGUOUS] = "checkpoint in flight, owner gone"
    if facts.unacknowledged_conflicts:
        n = facts.unacknowledged_conflicts
        applies[RecoveryState.CONFLICTED] = f"{n} refused write{'' if n == 1 else 's'}"
    for state in RecoveryState.PRECEDENCE:
        if state in applies:
            return state, applies[state]
    if facts.phase_class == PhaseClass.COMPLETED:
        return RecoveryState.COMPLETED, ""
    return RecoveryState.HEALTHY, ""


@dataclass(frozen=True)
class Decision:
    """A resume answer: ``action`` a ``ResumeAction``, ``reason`` a ``ResumeReason``. ``consume_retry`` tells the service to consume the approval and
    bump the fencing token in the same transaction."""

    action: str
    reason: str
    consume_retry: bool = False


IDENTITY_PARAMS = ("agent", "model", "workflow", "definition_version")


def resume_decision(facts: RunFacts, asked: dict[str, str],
                    usage: dict[str, int] | None = None) -> Decision:
    """CONTRACT.md sections 3 and 8, ``GET``/``POST …/runs/{run_id}/resume``.

    ``usage``, the runtime's counters when it sent them, must suit the decision
    (``usage_allows``: equal for ``continue``/``replay``, at least the checkpoint's
    ``facts.usage`` for ``retry``), else ``reject``/``usage_mismatch``, and an approved
    retry is not consumed.
    """
    decision = _decision(facts, asked)
    if usage is not None and not usage_allows(decision.action, facts.usage, usage):
        return Decision(ResumeAction.REJECT, ResumeReason.USAGE_MISMATCH)
    return decision


def _decision(facts: RunFacts, asked: dict[str, str]) -> Decision:
    """``resume_decision`` before the usage check.

    Order: no checkpoint, unsupported schema, identity mismatch (each given parameter
    must equal the run's), an older version of an offline kind -> migration required
    (the runtime reads only the newest version, even to replay), completed -> replay (executes nothing, always safe), closed by
    a reviewer -> reject (handled outside the system), effects in
    doubt -> reconcile, approved retry -> retry, requested retry -> reject, unknown effect
    -> reject, in flight -> reject, stable -> continue.
    """
    reject, reason = ResumeAction.REJECT, ResumeReason
    if not facts.phase_class:
        return Decision(reject, reason.NO_CHECKPOINT)
    if facts.phase_class == PhaseClass.UNSUPPORTED:
        return Decision(reject, reason.UNSUPPORTED_SCHEMA)
    for key in IDENTITY_PARAMS:
        given = asked.get(key)
        if given is not None and given != facts.identity.get(key, ""):
            return Decision(reject, reason.IDENTITY_MISMATCH)
    if facts.migration_required:
        return Decision(reject, reason.MIGRATION_REQUIRED)
    if facts.phase_class == PhaseClass.COMPLETED:
        return Decision(ResumeAction.REPLAY, reason.COMPLETED)
    if facts.closed:
        return Decision(reject, reason.CLOSED)
    # Effects in doubt come before an approved retry: the approval is not spent on a
    # resume that would stop at the unresolved effect anyway.
    if facts.count(*EffectState.IN_DOUBT):
        return Decision(ResumeAction.RECONCILE, reason.EFFECTS_IN_DOUBT)
    if facts.open_retry_state == RetryState.APPROVED:
        return Decision(ResumeAction.RETRY, reason.RETRY_APPROVED, consume_retry=True)
    if facts.open_retry_state == RetryState.REQUESTED:
        return Decision(reject, reason.AWAITING_APPROVAL)
    if facts.count(EffectState.UNKNOWN):
        return Decision(reject, reason.OUTCOME_UNKNOWN)
    if facts.phase_class == PhaseClass.IN_FLIGHT:
        return Decision(reject, reason.IN_FLIGHT)
    return Decision(ResumeAction.CONTINUE, reason.STABLE)


def migration_required_detail(kind: str, schema_version: int, *, tenant: str,
                              run_id: str) -> str:
    """The words of a ``reject`` / ``migration_required`` resume answer (its ``detail``;
    issue 19, item 2: "with the command to run"): which version must be migrated, and how,
    for this run: ``manage.py migrate_checkpoints`` with the kind, the newest version, the
    tenant and the run, or the Kinds page's *Migrate to vN* (the tenant's admin). Names no
    payload value. ``kind`` is a kind registered in code (only those have an offline
    mode, ``kinds.migration_required``)."""
    newest = max(kinds.versions(kind), default=schema_version)
    return (f"{kind} v{schema_version} must be migrated to v{newest} before this run is "
            f"resumed ({kind} migrates offline): python manage.py migrate_checkpoints "
            f"{kind} --to {newest} --tenant {tenant} --run {run_id}, or Migrate to "
            f"v{newest} on the tenant's Kinds page (its admin)")


def usage_decrease(previous: dict[str, int], sent: dict[str, int]) -> tuple[str, int, int] | None:
    """The first counter (by name, whatever order a database kept the keys in) that
    ``sent`` puts below ``previous``,
    as ``(counter, previous, sent)``, or ``None`` (CONTRACT.md 8, RUNIFOLD.md 2: restored
    usage never decreases). A counter ``sent`` lacks counts as 0; one ``previous`` lacks
    (a revision written before its kind declared it) is not compared. Both are the
    ``{counter: int}`` of ``kinds.Classification.usage``."""
    for counter, before in sorted(previous.items()):
        now = sent.get(counter, 0)
        if now < before:
            return counter, before, now
    return None


def usage_allows(action: str, checkpoint: dict[str, int], runtime: dict[str, int]) -> bool:
    """Whether a runtime whose usage counters are ``runtime`` may take the resume
    ``action`` from a checkpoint whose counters are ``checkpoint`` (RUNIFOLD.md 2 and 3;
    CONTRACT.md 8): ``continue`` and ``replay`` need each counter equal, ``retry`` at least
    the checkpoint's (the interrupted attempt may have spent more). A counter the runtime
    does not send counts as 0. Other actions do not depend on usage."""
    if action in (ResumeAction.CONTINUE, ResumeAction.REPLAY):
        return all(runtime.get(k, 0) == v for k, v in checkpoint.items())
    if action == ResumeAction.RETRY:
        return all(runtime.get(k, 0) >= v for k, v in checkpoint.items())
    return True


def usage_burnt(checkpoint: dict[str, int], runtime: dict[str, int]) -> dict[str, int]:
    """What an interrupted attempt spent beyond its checkpoint, per counter: the
    runtime's counters above the checkpoint's (``{counter: int}``, counters spent only;
    issue 19, item 4). Recorded when a retry is consumed; the run page and the report
    show it as what recovery cost."""
    return {k: v - checkpoint.get(k, 0) for k, v in runtime.items() if v > checkpoint.get(k, 0)}


def fence_refuses(token_sent: int | None, current_token: int, lease_live: bool) -> bool:
    """Whether a write carrying ``token_sent`` (``None``: no ``Fencing-Token`` header) is
    refused as fenced (CONTRACT.md 3): a token other than the current one always is; no
    token is while the run holds a live lease, and once ownership has begun
    (``current_token > 0``: a lease was taken or a retry consumed), so a zombie cannot
    slip past fencing by leaving the header out."""
    if token_sent is not None:
        return token_sent != current_token
    return lease_live or current_token > 0


# Effect state machine (CONTRACT.md section 3). Keys: (from, to); value: who may do it.
_S, _B = EffectState, EffectSource
EFFECT_TRANSITIONS: dict[tuple[str, str], frozenset[str]] = {
    (_S.PLANNED, _S.SUBMITTED): frozenset({_B.RUNTIME}),
    (_S.SUBMITTED, _S.CONFIRMED): frozenset({_B.RUNTIME, _B.RECONCILIATION}),
    (_S.SUBMITTED, _S.FAILED): frozenset({_B.RUNTIME, _B.RECONCILIATION}),
    # Reconciliation too: its first step on a service that never saw the key.
    (_S.SUBMITTED, _S.UNRESOLVED): frozenset({_B.RUNTIME, _B.SWEEP, _B.RECONCILIATION}),
    # A runtime that reconciles by itself (runifold's execute_reconciled) is reconciliation.
    (_S.UNRESOLVED, _S.CONFIRMED): frozenset({_B.RECONCILIATION, _B.RUNTIME}),
    (_S.UNRESOLVED, _S.FAILED): frozenset({_B.RECONCILIATION, _B.RUNTIME}),
    (_S.UNRESOLVED, _S.NOT_EXECUTED): frozenset({_B.RECONCILIATION, _B.RUNTIME}),
    (_S.SUBMITTED, _S.UNKNOWN): frozenset({_B.REVIEWER, _B.RECONCILIATION}),
    (_S.UNRESOLVED, _S.UNKNOWN): frozenset({_B.REVIEWER, _B.RECONCILIATION}),
    (_S.NOT_EXECUTED, _S.PLANNED): frozenset({_B.RETRY}),
    (_S.UNKNOWN, _S.PLANNED): frozenset({_B.RETRY}),
}


def transition_allowed(from_state: str, to_state: str, by: str) -> bool:
    """Whether ``by`` (an ``EffectSource``) may move an effect from one state to another."""
    return by in EFFECT_TRANSITIONS.get((from_state, to_state), frozenset())


# What an approved retry does to an effect in each state (the retry preview, issue 5):
# (outcome word, sentence for people).
_STILL_IN_DOUBT = (RetryOutcome.IN_DOUBT, "still in doubt: reconcile it or mark it unknown first")
RETRY_OUTCOMES: dict[str, tuple[str, str]] = {
    _S.CONFIRMED: (RetryOutcome.REPLAY_RECEIPT,
                   "replays the confirmed receipt; not called again"),
    _S.FAILED: (RetryOutcome.STAYS_FAILED, "stays failed; the run follows its own failure path"),
    _S.PLANNED: (RetryOutcome.SUBMIT, "submitted for the first time (it was never sent)"),
    _S.NOT_EXECUTED: (RetryOutcome.SUBMIT_AGAIN, "submitted again: the service never saw it"),
    _S.UNKNOWN: (RetryOutcome.POSSIBLE_DUPLICATE,
                 "sent again although nobody can tell whether the first attempt happened: "
                 "the approver accepts a possible duplicate"),
    **{state: _STILL_IN_DOUBT for state in _S.IN_DOUBT},
}


def retry_outcome(state: str) -> tuple[str, str]:
    """``(outcome, words)`` for an effect in ``state`` under an approved retry."""
    return RETRY_OUTCOMES.get(state, (RetryOutcome.UNCHANGED, "unchanged"))
