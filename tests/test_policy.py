"""The pure recovery rules (checkpoints.policy): recovery-state precedence, owner-gone,
resume decisions and the effect transition table, without a database.

Sources: DESIGN.md section 4 (states, precedence), CONTRACT.md sections 1 and 3; the
effect table is read from docs/CONTRACT.md (tests/contract_tables.py), not copied.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from checkpoints import policy
from checkpoints.policy import RunFacts
from checkpoints.vocab import EffectSource
from tests import contract_tables

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
FRESH = NOW - timedelta(seconds=10)
QUIET = NOW - timedelta(seconds=301)


def facts(**kw) -> RunFacts:
    kw.setdefault("phase_class", "stable")
    kw.setdefault("last_write_at", FRESH)
    return RunFacts(now=NOW, **kw)


# Each condition alone, as RunFacts fields, and the state it produces.
CONDITIONS = {
    "schema_mismatch": dict(phase_class="unsupported", schema_error="acme.order v9 unsupported"),
    "unknown_outcome": dict(effect_states={"unknown": 1}),
    "awaiting_approval": dict(open_retry_state="requested"),
    "retry_approved": dict(open_retry_state="approved"),
    "ambiguous": dict(effect_states={"unresolved": 1}),
    "conflicted": dict(unacknowledged_conflicts=2),
}


@pytest.mark.parametrize("state", list(CONDITIONS))
def test_it_reports_each_state_when_it_is_the_only_condition(state):
    assert policy.recovery_state(facts(**CONDITIONS[state]))[0] == state


def _combine(*states: str) -> dict:
    merged: dict = {}
    for s in states:
        for key, value in CONDITIONS[s].items():
            if key == "effect_states":
                merged.setdefault(key, {}).update(value)
            elif key == "phase_class" or key not in merged:
                merged[key] = value
    return merged


@pytest.mark.parametrize(("higher", "lower"), [
    ("schema_mismatch", "unknown_outcome"),
    ("schema_mismatch", "conflicted"),
    ("schema_mismatch", "ambiguous"),
    ("unknown_outcome", "ambiguous"),
    ("unknown_outcome", "conflicted"),
    ("awaiting_approval", "ambiguous"),
    ("awaiting_approval", "conflicted"),
    ("retry_approved", "ambiguous"),
    ("retry_approved", "conflicted"),
    ("ambiguous", "conflicted"),
])
def test_it_applies_the_design_precedence(higher, lower):
    assert policy.recovery_state(facts(**_combine(higher, lower)))[0] == higher


def test_it_lets_an_open_retry_request_stand_in_for_an_unknown_outcome():
    # policy.py's documented deviation from DESIGN.md: the approvers' tab must show it.
    requested = facts(effect_states={"unknown": 1}, open_retry_state="requested")
    approved = facts(effect_states={"unknown": 1}, open_retry_state="approved")
    assert policy.recovery_state(requested)[0] == "awaiting_approval"
    assert policy.recovery_state(approved)[0] == "retry_approved"


@pytest.mark.parametrize("open_retry", ["requested", "approved"])
def test_an_open_retry_no_longer_applies_once_the_run_completed(open_retry):
    """(stop 33) A completed run is replayed, never retried, so its open retry request
    can never be consumed: the run read "retry approved, waiting for the runtime" for
    ever. It is completed; an effect still in doubt keeps it before a person."""
    done = facts(phase_class="completed", open_retry_state=open_retry)
    assert policy.recovery_state(done) == ("completed", "")
    assert policy.resume_decision(done, {}).action == "replay"
    in_doubt = facts(phase_class="completed", open_retry_state=open_retry,
                     effect_states={"unknown": 1})
    assert policy.recovery_state(in_doubt)[0] == "unknown_outcome"


def test_it_puts_schema_mismatch_above_everything_at_once():
    everything = facts(phase_class="unsupported", effect_states={"unknown": 1, "unresolved": 1},
                       open_retry_state="requested", unacknowledged_conflicts=1)
    assert policy.recovery_state(everything)[0] == "schema_mismatch"


def test_it_is_healthy_or_completed_when_nothing_applies():
    assert policy.recovery_state(facts()) == ("healthy", "")
    assert policy.recovery_state(facts(phase_class="completed")) == ("completed", "")
    assert policy.recovery_state(facts(phase_class="")) == ("healthy", "")


def test_it_shows_a_conflict_on_a_completed_run():
    assert policy.recovery_state(
        facts(phase_class="completed", unacknowledged_conflicts=1))[0] == "conflicted"


@pytest.mark.parametrize(("kw", "gone"), [
    (dict(lease_owner="w1", lease_expires_at=NOW + timedelta(seconds=1)), False),
    (dict(lease_owner="w1", lease_expires_at=NOW), True),  # expiry is exclusive
    (dict(lease_owner="w1", lease_expires_at=NOW - timedelta(seconds=1), last_write_at=NOW), True),
    (dict(last_write_at=NOW - timedelta(seconds=299)), False),
    (dict(last_write_at=NOW - timedelta(seconds=300)), True),
    (dict(last_write_at=NOW - timedelta(seconds=30), ambiguity_threshold_s=30), True),
    (dict(last_write_at=None), True),
])
def test_it_decides_when_the_owner_is_gone(kw, gone):
    assert facts(**kw).owner_gone is gone


@pytest.mark.parametrize(("kw", "state"), [
    (dict(phase_class="in_flight", last_write_at=QUIET), "ambiguous"),
    (dict(phase_class="in_flight", last_write_at=FRESH), "healthy"),
    (dict(phase_class="in_flight", last_write_at=QUIET, lease_owner="w",
          lease_expires_at=NOW + timedelta(seconds=5)), "healthy"),
    (dict(effect_states={"submitted": 1}, last_write_at=QUIET), "ambiguous"),
    (dict(effect_states={"submitted": 1}, last_write_at=FRESH), "healthy"),
    (dict(effect_states={"unresolved": 1}, last_write_at=FRESH), "ambiguous"),
    (dict(phase_class="stable", last_write_at=QUIET), "healthy"),
    (dict(effect_states={"confirmed": 3, "failed": 1, "planned": 1}, last_write_at=QUIET),
     "healthy"),
])
def test_it_calls_a_run_ambiguous_only_when_in_doubt_and_unowned(kw, state):
    assert policy.recovery_state(facts(**kw))[0] == state


# --- resume decisions -------------------------------------------------------------------

IDENT = {"agent": "refund-assistant", "model": "openai/gpt-4.1-mini", "workflow": "",
         "definition_version": ""}


RESUME_CASES = [
    (dict(phase_class=""), {}, "reject", "no_checkpoint"),
    (dict(phase_class="unsupported"), {}, "reject", "unsupported_schema"),
    (dict(), {"agent": "other-agent"}, "reject", "identity_mismatch"),
    (dict(), {"model": "openai/gpt-4o"}, "reject", "identity_mismatch"),
    (dict(), {"workflow": "refund-approval"}, "reject", "identity_mismatch"),
    (dict(), {"definition_version": "3"}, "reject", "identity_mismatch"),
    (dict(phase_class="completed"), {}, "replay", "completed"),
    # An older version of an offline kind (issue 19, item 2): even a completed run, whose
    # replay reads the payload; after the identity (a stranger's run is not ours to wait on).
    (dict(migration_required=True), {}, "reject", "migration_required"),
    (dict(migration_required=True, phase_class="completed"), {}, "reject",
     "migration_required"),
    (dict(migration_required=True), {"agent": "other-agent"}, "reject", "identity_mismatch"),
    (dict(phase_class="completed", effect_states={"unknown": 1}), {}, "replay", "completed"),
    (dict(open_retry_state="approved", phase_class="in_flight"), {}, "retry", "retry_approved"),
    (dict(open_retry_state="requested"), {}, "reject", "awaiting_approval"),
    (dict(effect_states={"unknown": 1}), {}, "reject", "outcome_unknown"),
    (dict(effect_states={"submitted": 1}), {}, "reconcile", "effects_in_doubt"),
    (dict(effect_states={"unresolved": 1}, phase_class="in_flight"), {}, "reconcile",
     "effects_in_doubt"),
    # An approval is not spent while an effect is still in doubt: reconcile first.
    (dict(open_retry_state="approved", phase_class="in_flight",
          effect_states={"unresolved": 1}), {}, "reconcile", "effects_in_doubt"),
    (dict(phase_class="in_flight"), {}, "reject", "in_flight"),
    (dict(), {}, "continue", "stable"),
    (dict(), {"agent": "refund-assistant", "model": "openai/gpt-4.1-mini"}, "continue",
     "stable"),
]


@pytest.mark.parametrize(("kw", "asked", "action", "reason"), RESUME_CASES)
def test_it_answers_each_resume_action_and_reason(kw, asked, action, reason):
    decision = policy.resume_decision(facts(identity=IDENT, **kw), asked)
    assert (decision.action, decision.reason) == (action, reason)
    assert decision.consume_retry is (action == "retry")


def test_it_checks_the_schema_before_the_identity():
    decision = policy.resume_decision(facts(phase_class="unsupported", identity=IDENT),
                                      {"agent": "someone-else"})
    assert decision.reason == "unsupported_schema"


def test_it_checks_the_identity_before_replaying_a_completed_run():
    decision = policy.resume_decision(facts(phase_class="completed", identity=IDENT),
                                      {"agent": "someone-else"})
    assert (decision.action, decision.reason) == ("reject", "identity_mismatch")


def test_it_covers_every_resume_action_the_contract_names():
    seen = set()
    for kw, asked, _, _ in RESUME_CASES:
        seen.add(policy.resume_decision(facts(identity=IDENT, **kw), asked).action)
    assert seen == {"replay", "continue", "reject", "retry", "reconcile"}


# --- the effect transition table (CONTRACT.md section 3, read from docs/CONTRACT.md) -------

CONTRACT_MOVES = contract_tables.effect_transitions()
STATES = list(contract_tables.effect_states())
ACTORS = [EffectSource.RUNTIME, EffectSource.RECONCILIATION, EffectSource.REVIEWER,
          EffectSource.SWEEP, EffectSource.RETRY]

BEYOND_CONTRACT = contract_tables.CODE_BEYOND_CONTRACT
allowed_by_contract = contract_tables.allowed_by_code


def test_the_table_names_exactly_the_actor_classes_of_the_code():
    assert set().union(*CONTRACT_MOVES.values()) == set(ACTORS)


def test_every_exception_is_outside_the_table():
    for src, dst, actor in BEYOND_CONTRACT:
        assert actor not in CONTRACT_MOVES.get((src, dst), set()), (src, dst, actor)


@pytest.mark.parametrize("src", STATES)
@pytest.mark.parametrize("dst", STATES)
@pytest.mark.parametrize("actor", ACTORS)
def test_it_allows_exactly_the_contract_table(src, dst, actor):
    assert policy.transition_allowed(src, dst, actor) is allowed_by_contract(src, dst, actor)


def test_it_knows_no_state_outside_the_table():
    assert {s for pair in policy.EFFECT_TRANSITIONS for s in pair} <= set(STATES)
    assert not policy.transition_allowed("planned", "submitted", "someone")


def test_it_never_leaves_a_state_the_table_never_leaves():
    # confirmed and failed are terminal in CONTRACT's table (no row starts there).
    terminal = [s for s in STATES if not any(src == s for src, _ in CONTRACT_MOVES)]
    assert terminal == ["confirmed", "failed"]
    for src in terminal:
        for dst in STATES:
            assert not any(policy.transition_allowed(src, dst, a) for a in ACTORS), (src, dst)


def test_it_names_the_side_effect_in_doubt_in_the_reason():
    one = facts(phase_class="in_flight", effect_states={"unresolved": 1},
                effect_labels={"unresolved": ["payments charge:A-9001"]})
    assert policy.recovery_state(one) == ("ambiguous", "payments charge:A-9001 unresolved")
    many = facts(effect_states={"unknown": 4},
                 effect_labels={"unknown": ["crm a", "crm b", "crm c"]})
    assert policy.recovery_state(many) == (
        "unknown_outcome", "4 effects outcome unknown: crm a, crm b, crm c, …")


def test_the_conflicted_reason_counts_in_words():
    assert policy.recovery_state(facts(unacknowledged_conflicts=1)) == (
        "conflicted", "1 refused write")
    assert policy.recovery_state(facts(unacknowledged_conflicts=2)) == (
        "conflicted", "2 refused writes")


@pytest.mark.parametrize(("owner", "expires_at", "ended_at", "live", "word"), [
    ("", None, None, False, ""),  # no lease owner: no lease state
    ("w-1", NOW + timedelta(hours=1), None, True, "live"),
    ("w-1", QUIET, None, False, "expired"),  # it timed out
    ("w-1", QUIET, QUIET, False, "ended"),  # a reviewer ended it (lease_revoke)
    # A record left behind by a later lease (its expiry moved) is not an ending.
    ("w-1", QUIET + timedelta(hours=1), QUIET, False, "expired"),
    ("w-1", NOW + timedelta(hours=1), QUIET, True, "live"),
])
def test_the_lease_state_word(owner, expires_at, ended_at, live, word):
    """The newcomer's finding: a lease a reviewer ended read "expired" (policy.lease_state,
    the run page's, the inbox's and the API's one rule)."""
    assert policy.lease_state(owner, expires_at, ended_at, live) == word
