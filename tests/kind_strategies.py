"""Hypothesis strategies of valid payloads, per (kind, schema version) (issue 19, item 3).

``STRATEGIES[(kind, version)]`` draws payloads that kind's version accepts; the property
test of tests/test_kind_fixtures.py runs every registered reversible migration's
``down(up(x)) == x`` on the strategy of its *from* version, and a rule test there fails
when a reversible migration has none. A kind's author who registers a reversible
migration adds the strategy of its older version here (docs/kinds.md, "Fixtures").

Each strategy is wider than the fixtures (any other keys a version keeps, any JSON below
them, counters up to a ``u64``) but never leaves its version's schema: the test checks
``kinds.classify`` accepts every drawn payload first.
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

from checkpoints import jsonparse, kinds

TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
               max_size=12)
#: Text a run identity part may be (``jsonparse.name_problem``: no control character,
#: line or paragraph separator, bidirectional control, invisible character or
#: variation selector, which only a name's place judges); a valid
#: payload's identity is a name.
NAME = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp"),
                             exclude_characters="".join(
                                 jsonparse.BIDI_CONTROLS | jsonparse.INVISIBLE
                                 | jsonparse.VARIATION_SELECTORS)),
               max_size=12)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
U64 = st.integers(min_value=0, max_value=kinds.U64_MAX)


def _with_extra(known: st.SearchStrategy, taken: set[str]) -> st.SearchStrategy:
    """``known``'s dicts plus up to three other keys (not in ``taken``) holding any JSON."""
    return st.builds(lambda k, extra: {**extra, **k}, known,
                     st.dictionaries(TEXT.filter(lambda key: key not in taken), JSON,
                                     max_size=3))


# --- acme.order v1: a phase, the optional fields v1 knows, any other key but ``amount``
# (v2's; a v1 payload holding one is refused by the step up: a fixture case).

ACME_V1 = _with_extra(
    st.fixed_dictionaries(
        {"phase": st.sampled_from(sorted(kinds.ACME_PHASES))},
        optional={"order_id": TEXT, "workflow": NAME,
                  "amount_cents": st.integers(min_value=0, max_value=2**70),
                  "definition_version": st.integers(-10**12, 10**12) | NAME}),
    {"phase", "order_id", "workflow", "amount_cents", "definition_version", "amount"})


# --- runifold.workflow (RUNIFOLD.md 3) ----------------------------------------------------

STEP = st.text(string.ascii_lowercase + "_", min_size=1, max_size=8)
BRANCH = st.one_of(
    st.just({"state": "in_flight"}),
    st.fixed_dictionaries({"state": st.just("completed"), "output": JSON}),
    st.fixed_dictionaries({"state": st.just("failed"), "message": TEXT}),
    st.just({"state": "cancelled"}))
WORKFLOW_FIELDS = {"workflow", "workflow_version", "usage", "layout", "next_index",
                   "outputs", "phase", "value"}


@st.composite
def workflow(draw, version: int) -> dict:
    """A ``runifold.workflow`` payload of ``version`` (3 or 4) in any of its phases:
    ``outputs`` hold exactly the steps before ``next_index``, a completed one is at the
    end of its layout, branches in any of their four states."""
    states = ["ready", "step_in_flight", "parallel_in_flight", "race_in_flight", "completed"]
    if version >= 4:
        states.append("waiting")
    state = draw(st.sampled_from(states))
    layout = draw(st.lists(STEP, max_size=5))
    next_index = len(layout) if state == "completed" else draw(st.integers(0, len(layout)))
    phase: dict = {"state": state}
    if state != "ready" and state != "completed":
        phase["step"] = draw(STEP)
    if state in ("parallel_in_flight", "race_in_flight"):
        phase["branches"] = draw(st.dictionaries(STEP, BRANCH, max_size=4))
    if state == "waiting":
        phase["wait"] = draw(st.dictionaries(TEXT, JSON, max_size=2))
    if state == "completed":
        phase["outcome"] = draw(st.dictionaries(TEXT, JSON, max_size=2))
    known = {
        "workflow": draw(NAME.filter(bool)),
        "workflow_version": draw(st.integers(1, kinds.U32_MAX)),
        "usage": draw(st.fixed_dictionaries(
            {}, optional={counter: U64 for counter in kinds.USAGE_COUNTERS})),
        "layout": layout,
        "next_index": next_index,
        "outputs": {step: draw(JSON) for step in layout[:next_index]},
        "phase": phase,
    }
    if draw(st.booleans()):
        known["value"] = draw(JSON)
    return draw(_with_extra(st.just(known), WORKFLOW_FIELDS))


#: ``(kind, version) -> strategy`` of the payloads that version accepts.
STRATEGIES: dict[tuple[str, int], st.SearchStrategy] = {
    ("acme.order", 1): ACME_V1,
    ("runifold.workflow", 3): workflow(3),
}
