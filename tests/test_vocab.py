"""One vocabulary (issue 7, item 3): every state, class, reason, action and role word is a
member of an enum in ``checkpoints.vocab``, its named sets are defined once there, and the
code compares against the enums, never a string literal.

The lint half parses ``checkpoints/`` with ``ast`` and fails, naming file:line, on a
vocabulary word written as a literal where a state is compared, filtered or assigned.
Wire values stay checked where they matter: tests elsewhere compare the JSON against the
literal strings of CONTRACT.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from checkpoints import policy, vocab
from checkpoints.vocab import (
    AuditAction,
    BulkState,
    EffectState,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    RetryOutcome,
    RetryState,
    TargetType,
)

ROOT = Path(__file__).resolve().parent.parent / "checkpoints"
# The demo workers run without Django and speak the wire format (as the runtime client,
# recovery_client, outside checkpoints/); migrations are history; vocab.py is the one
# place the words are written.
SKIP = ("demo/", "migrations/", "vocab.py")
# (file, word) pairs that are someone else's vocabulary, with why.
ALLOWED = {
    ("kinds/builtin.py", "completed"): "a payload's own phase word in the kinds' schemas "
                               "(runifold-core), which the registry maps to a PhaseClass",
    ("management/loaddata.py", "completed"):
        "the generated runifold payloads' own phase word (RUNIFOLD.md 2, 3), as in kinds/builtin.py",
}
ENUMS = [v for v in vars(vocab).values()
         if isinstance(v, type) and issubclass(v, vocab.TextChoices) and v is not vocab.TextChoices]
WORDS = {value for enum in ENUMS for value in enum.values}
# Keyword arguments and attributes that hold a vocabulary word.
STATE_NAMES = {"state", "state__in", "to_state", "from_state", "recovery_state",
               "recovery_state__in", "phase_class", "action", "target_type", "source", "outcome",
               "answer", "applied", "effect_class", "effects__state", "role", "open_retry_state"}


def _literal_words(node: ast.AST) -> list[str]:
    """The vocabulary words among the string constants of ``node`` (a literal, or a
    list/tuple/set of them)."""
    items = node.elts if isinstance(node, ast.List | ast.Tuple | ast.Set) else [node]
    return [i.value for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in WORDS]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def literal_uses(source: str, filename: str = "<snippet>") -> list[str]:
    """``file:line word`` for each vocabulary word written as a literal in a state
    position: a keyword argument or a comparison of a state-named attribute, variable or
    key (``state="queued"``, ``r.state == "queued"``, ``state__in=["a", "b"]``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        candidates: list[ast.AST] = []
        if isinstance(node, ast.keyword) and node.arg in STATE_NAMES:
            candidates.append(node.value)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_name(side) in STATE_NAMES for side in sides):
                candidates += sides
        elif isinstance(node, ast.Assign) and any(_name(t) in STATE_NAMES for t in node.targets):
            candidates.append(node.value)
        for candidate in candidates:
            for word in _literal_words(candidate):
                found.append(f"{filename}:{candidate.lineno} {word!r}")
    return found


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not any(rel == s or rel.startswith(s) for s in SKIP):
            yield rel, path.read_text()


def test_no_vocabulary_word_is_written_as_a_literal_in_the_code():
    found = [hit for rel, text in _sources() for hit in literal_uses(text, rel)
             if (rel, hit.split(" ", 1)[1].strip("'")) not in ALLOWED]
    assert found == [], "use the enums of checkpoints.vocab:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet", [
    'Effect.objects.filter(state__in=["submitted", "unresolved"])',
    'if effect.state == "unknown": pass',
    'audit_record(action="retry.approve", target_type="run")',
    'run.recovery_state = "closed"',
    'x = {"submitted"} if row["state"] in ("queued", "running") else None',
])
def test_the_literal_lint_finds_a_state_written_as_a_string(snippet):
    assert literal_uses(snippet)


def test_the_literal_lint_leaves_enums_and_other_strings_alone():
    assert literal_uses('Effect.objects.filter(state__in=EffectState.IN_DOUBT)\n'
                        'if e.state == EffectState.UNKNOWN: label = "unknown outcome"\n'
                        'log.info("queued")') == []


def test_every_audit_action_is_written_somewhere_and_nothing_else_is():
    """``AuditAction`` is exactly what the code records: each member is used outside
    ``vocab.py`` (``AuditAction.CONFLICT`` names the two conflict actions)."""
    text = "\n".join(t for _, t in _sources())
    unused = [a.name for a in AuditAction
              if f"AuditAction.{a.name}" not in text and a not in AuditAction.CONFLICT.values()]
    assert unused == []


def test_named_sets_are_sets_of_their_enum_and_not_members():
    sets = {
        EffectState: ("IN_DOUBT", "NEEDS_RETRY", "DOUBTFUL", "SETTLED", "WITH_RECEIPT"),
        RetryState: ("OPEN", "DECIDED"),
        ReconcileState: ("OPEN",),
        BulkState: ("OPEN",),
        RecoveryState: ("PRECEDENCE", "INBOX_TABS", "RETRYABLE"),
        ReconcileAnswer: ("SERVICE", "WITH_RECEIPT"),
        RetryOutcome: ("SENT_AGAIN",),
        AuditAction: ("REVEALS",),
        TargetType: ("WRITABLE",),
    }
    for enum, names in sets.items():
        for name in names:
            values = getattr(enum, name)
            assert values and set(values) <= set(enum.values), (enum.__name__, name)
            assert name not in enum.names  # an attribute, not a member or a choice
    assert len(EffectState.choices) == 7 and len(RecoveryState.PRECEDENCE) == 6


def test_the_sets_mean_what_contract_says():
    """The sets that encode rules, spelled out once in wire words (CONTRACT.md 3)."""
    assert EffectState.IN_DOUBT == {"submitted", "unresolved"}
    assert EffectState.NEEDS_RETRY == {"unknown", "not_executed"}
    assert RetryState.OPEN == {"requested", "approved"}
    assert set(ReconcileState.OPEN) == {"queued", "running"}
    assert BulkState.OPEN == {"queued", "running"}  # a bulk job a reviewer may abort
    assert RecoveryState.RETRYABLE == {"ambiguous", "unknown_outcome"}
    assert ReconcileAnswer.SETTLES == {"found": "confirmed", "failed": "failed",
                                       "not_executed": "not_executed", "no_lookup": "unknown"}
    # Every in-doubt state gets the "in doubt" retry outcome, from the one set.
    assert {s for s, (o, _) in policy.RETRY_OUTCOMES.items() if o == "in_doubt"} \
        == EffectState.IN_DOUBT
