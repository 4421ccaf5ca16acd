"""Fixtures from every supported version (issue 19, item 3): ``tests/fixtures/kinds/``
(the layout: ``tests/kind_fixtures.py``; for a kind's author: docs/kinds.md, "Fixtures").

Each version fixture is classified (phase class, label, identity, usage), given its
resume decision by ``policy.resume_decision``, migrated to every version a registered
path reaches and back, and round-tripped through canonical JSON (and, for runifold's
kinds, through a runifold file line). Each migration case is run both ways. The rule
tests derive from the registry, the user kinds of ``KIND_MODULES`` loaded: a registered
version without fixtures, a migration step without a fixture pair, a reversible step
without a payload strategy, or a fixture of an unregistered kind or version fails. The
property test runs ``down(up(x)) == x`` for every registered reversible step.
No database.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoints import crypto, jsonparse, kinds
from examples.kinds import acme_refunds
from tests import kind_fixtures as kf
from tests.kind_strategies import STRATEGIES

FIXTURES = kf.fixtures()
CASES = kf.migration_cases()
UNSUPPORTED = kf.unsupported()

with kf.kind_modules_loaded() as _registry:
    #: The reversible steps at collection (the rule test reads the registry again).
    REVERSIBLE = [(m.kind, m.from_version) for steps in _registry.registered_migrations().values()
                  for m in steps if m.reversible]


@pytest.fixture(scope="module")
def registry():
    """``checkpoints.kinds`` with the user kinds of ``kf.KIND_MODULES`` loaded, restored
    after the module."""
    with kf.kind_modules_loaded() as loaded:
        yield loaded


def _ids(items, attr="ref"):
    return [getattr(i, attr) if attr else i for i in items]


# --- the rules ----------------------------------------------------------------------------

def _versions_without_fixtures(registry) -> list[str]:
    return [f"{kind}/v{v}" for kind, versions in registry.registered().items()
            for v in versions if not kf.fixtures(kind, v)]


def _steps_without_a_pair(registry) -> list[str]:
    pairs = {(c.kind, c.from_version, c.to_version) for c in CASES if c.is_pair}
    return [f"{m.kind}/migrations/v{m.from_version}-v{m.to_version}"
            for steps in registry.registered_migrations().values() for m in steps
            if (m.kind, m.from_version, m.to_version) not in pairs]


def _reversible_without_a_strategy(registry) -> list[str]:
    return [f"{m.kind} v{m.from_version}" for ms in registry.registered_migrations().values()
            for m in ms if m.reversible and (m.kind, m.from_version) not in STRATEGIES]


def test_every_registered_version_has_fixtures(registry):
    missing = _versions_without_fixtures(registry)
    assert not missing, (f"registered kind versions without a fixture in {kf.ROOT}: "
                         f"{missing} (docs/kinds.md, 'Fixtures')")


def test_every_registered_migration_step_has_a_fixture_pair(registry):
    missing = _steps_without_a_pair(registry)
    assert not missing, f"migration steps without a before/after fixture pair: {missing}"


def test_every_fixture_names_a_registered_kind_version_or_step(registry):
    registered = registry.registered()
    steps = {(m.kind, f"v{m.from_version}-v{m.to_version}")
             for ms in registry.registered_migrations().values() for m in ms}
    stray = [f"{kind}/{d}" for kind, d in kf.version_dirs()
             if d not in {f"v{v}" for v in registered.get(kind, [])}]
    stray += [f"{kind}/migrations/{d}" for kind, d in kf.step_dirs() if (kind, d) not in steps]
    assert not stray, f"fixture directories of no registered kind, version or step: {stray}"


def test_every_fixture_file_is_read_by_the_suite():
    read = {kf.ROOT / f.kind / f"v{f.version}" / f"{f.name}.json" for f in FIXTURES}
    read |= {kf.ROOT / c.kind / "migrations" / f"v{c.from_version}-v{c.to_version}"
             / f"{c.name}.json" for c in CASES}
    read |= {kf.ROOT / kf.UNSUPPORTED / f"{name}.json" for name, _ in UNSUPPORTED}
    unread = sorted(str(p.relative_to(kf.ROOT)) for p in kf.ROOT.rglob("*") if p.is_file()
                    and p not in read)
    assert not unread, f"files the suite never reads (misplaced?): {unread}"


def test_every_reversible_migration_has_a_payload_strategy(registry):
    missing = _reversible_without_a_strategy(registry)
    assert not missing, f"reversible steps without a strategy in tests/kind_strategies.py: {missing}"
    assert sorted(REVERSIBLE) == sorted(
        (m.kind, m.from_version) for ms in registry.registered_migrations().values()
        for m in ms if m.reversible)


def test_the_rules_name_a_new_version_and_step_that_have_none(kind_registry):
    """The rules above can fail: a kind registered without fixtures, with a reversible
    step and no strategy, is named by each."""
    def spec(key):
        def validate(p):
            if not isinstance(p, dict) or key not in p:
                raise kinds.SchemaError(f"payload.{key} is required")
        return kinds.VersionSpec(validate, lambda p: kinds.Phase("stable", "ok"),
                                 lambda p: kinds.Identity())
    kind_registry.register("test.unfixtured", 1, spec("a"))
    kind_registry.register("test.unfixtured", 2, spec("b"))
    kind_registry.register_migration("test.unfixtured", 1, lambda p: {"b": p.pop("a")},
                                     lambda p: {"a": p.pop("b")})
    assert _versions_without_fixtures(kind_registry) == ["test.unfixtured/v1",
                                                         "test.unfixtured/v2"]
    assert _steps_without_a_pair(kind_registry) == ["test.unfixtured/migrations/v1-v2"]
    assert _reversible_without_a_strategy(kind_registry) == ["test.unfixtured v1"]


# --- every phase of every version ---------------------------------------------------------

WORKFLOW = {"ready", "step_in_flight", "parallel_in_flight", "race_in_flight", "completed"}
#: ``(kind, version) -> the phases its fixtures must cover`` (as ``_phase_word`` says them).
PHASES = {
    ("runifold.agent", 1): {"ready_for_turn", "turn_in_flight", "completed"},
    ("runifold.workflow", 3): WORKFLOW,
    ("runifold.workflow", 4): WORKFLOW | {"waiting"},
    ("acme.order", 1): set(kinds.ACME_PHASES),
    ("acme.order", 2): set(kinds.ACME_PHASES),
    ("acme.refund", 1): set(acme_refunds.PHASES),
    # Every rule of the LangGraph mapping (docs/langgraph.md), by its label's first word.
    ("langgraph.checkpoint", 1): {"running", "between", "waiting", "error", "paused", "done"},
}
BRANCH_STATES = {"in_flight", "completed", "failed", "cancelled"}


def _phase_word(fx: kf.Fixture) -> str:
    if fx.kind == kinds.LANGGRAPH_KIND:
        return fx.expect["label"].split(" ")[0]
    phase = fx.payload["phase"]
    return phase["state"] if isinstance(phase, dict) else phase


def test_the_fixtures_cover_every_phase_of_every_version(registry):
    versions = {(k, v) for k, vs in registry.registered().items() for v in vs}
    assert versions == set(PHASES), "PHASES must name the phases of every registered version"
    for (kind, version), phases in PHASES.items():
        assert {_phase_word(f) for f in kf.fixtures(kind, version)} == phases, (kind, version)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("state", ["parallel_in_flight", "race_in_flight"])
def test_the_workflow_fixtures_hold_branches_in_every_state(version, state):
    seen = {b["state"] for f in kf.fixtures("runifold.workflow", version)
            if f.payload["phase"]["state"] == state
            for b in f.payload["phase"]["branches"].values()}
    assert seen == BRANCH_STATES
    classes = {f.expect["phase_class"] for f in kf.fixtures("runifold.workflow", version)
               if f.payload["phase"]["state"] == state}
    assert classes == {"stable", "in_flight"}  # settled and not


# --- each version fixture -----------------------------------------------------------------

@pytest.mark.parametrize("fx", FIXTURES, ids=_ids(FIXTURES))
def test_a_fixture_classifies_as_it_expects(registry, fx):
    cls = registry.classify(fx.kind, fx.version, fx.payload)
    assert cls.error == ""
    assert (cls.phase.phase_class, cls.phase.label) == (fx.expect["phase_class"],
                                                        fx.expect["label"])
    assert dataclasses.asdict(cls.identity) == fx.expect["identity"]
    assert cls.usage == fx.expect["usage"]


@pytest.mark.parametrize("fx", FIXTURES, ids=_ids(FIXTURES))
def test_a_fixture_gets_the_resume_decision_it_expects(registry, fx):
    cls = registry.classify(fx.kind, fx.version, fx.payload)
    decision = kf.resume_of(fx.kind, fx.version, cls)
    assert {"action": decision.action, "reason": decision.reason} == fx.expect["resume"]
    assert not decision.consume_retry
    if cls.usage and decision.action in ("continue", "replay"):
        # The runtime's usage must equal the checkpoint's: one counter more is refused,
        # and so is none at all (counted as 0) when the checkpoint spent something.
        counter = sorted(cls.usage)[0]
        more = {**cls.usage, counter: cls.usage[counter] + 1}
        mismatch = type(decision)("reject", "usage_mismatch")
        assert kf.resume_of(fx.kind, fx.version, cls, more) == mismatch
        if any(cls.usage.values()):
            assert kf.resume_of(fx.kind, fx.version, cls, {}) == mismatch


def _paths_from(registry, kind: str, version: int) -> list[int]:
    """The other versions of ``kind`` a registered chain reaches from ``version``."""
    out = []
    for other in registry.registered()[kind]:
        if other == version:
            continue
        try:
            registry.migration_path(kind, version, other)
        except kinds.MigrationError:
            continue
        out.append(other)
    return out


@pytest.mark.parametrize("fx", FIXTURES, ids=_ids(FIXTURES))
def test_a_fixture_migrates_to_every_version_a_path_reaches_and_back(registry, fx):
    refusals = {int(v): word for v, word in fx.expect.get("migrate", {}).items()}
    reached = _paths_from(registry, fx.kind, fx.version)
    assert set(refusals) <= set(reached), "expect.migrate names a version with no path"
    before = copy.deepcopy(fx.payload)
    for other in reached:
        if other in refusals:
            with pytest.raises(kinds.MigrationError) as refused:
                registry.migrate(fx.kind, fx.version, other, fx.payload)
            assert refused.value.reason == refusals[other]
            continue
        moved, cls, _ = registry.migrate(fx.kind, fx.version, other, fx.payload)
        # A migration keeps what the run is: its phase class and who resumes it.
        assert cls.phase.phase_class == fx.expect["phase_class"]
        assert dataclasses.asdict(cls.identity) == fx.expect["identity"]
        if fx.version in _paths_from(registry, fx.kind, other):
            assert registry.migrate(fx.kind, other, fx.version, moved)[0] == fx.payload
    assert fx.payload == before  # never changed in place


@pytest.mark.parametrize("fx", FIXTURES, ids=_ids(FIXTURES))
def test_a_fixture_round_trips_through_canonical_json(registry, fx):
    text = jsonparse.dumps(fx.payload)
    assert jsonparse.loads_any(text) == fx.payload
    body = jsonparse.loads_object(jsonparse.dumps({"payload": fx.payload}))
    assert body["payload"] == fx.payload
    assert jsonparse.dumps(body["payload"]) == text
    assert registry.classify(fx.kind, fx.version, body["payload"]) \
        == registry.classify(fx.kind, fx.version, fx.payload)


RUNIFOLD = [f for f in FIXTURES if f.kind in ("runifold.agent", "runifold.workflow")]


@pytest.mark.parametrize("fx", RUNIFOLD, ids=_ids(RUNIFOLD))
def test_a_runifold_fixture_round_trips_through_a_file_line(registry, fx):
    from checkpoints.interop.runifold import exports, lines

    cid, rid = uuid.uuid5(uuid.NAMESPACE_URL, fx.ref), uuid.uuid5(uuid.NAMESPACE_DNS, fx.ref)
    line = exports._envelope_line(cid, rid, 3, fx.kind, fx.version,
                                  jsonparse.dumps(fx.payload), 1733040000000)
    parsed = lines.parse_line(line.encode("utf-8"), 1)
    assert isinstance(parsed, lines.CheckpointLine)
    assert parsed.envelope.payload == fx.payload
    assert parsed.cls == registry.classify(fx.kind, fx.version, fx.payload)
    assert crypto.decrypt_text(parsed.ciphertext) == parsed.envelope.payload_json
    e = parsed.envelope
    assert exports._envelope_line(e.checkpoint_id, e.run_id, e.revision, e.kind, e.schema_version,
                                  e.payload_json, e.updated_at_ms) == line


# --- each migration case ------------------------------------------------------------------

def _refused(registry, case, frm: int, to: int, payload, expected: dict) -> None:
    with pytest.raises(kinds.MigrationError) as refused:
        registry.migrate(case.kind, frm, to, payload)
    assert refused.value.reason == expected["reason"]
    for words in expected["says"]:
        assert words in str(refused.value)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.kind}/v{c.from_version}-v{c.to_version}/"
                                             f"{c.name}" for c in CASES])
def test_a_migration_case_holds_both_ways(registry, case):
    assert case.to_version == case.from_version + 1
    assert case.before is not None or case.after is not None
    step = registry._REGISTRY[case.kind].migrations[case.from_version]
    if case.up_refused:
        _refused(registry, case, case.from_version, case.to_version, case.before,
                 case.up_refused)
    elif case.before is not None:
        after, cls, path = registry.migrate(case.kind, case.from_version, case.to_version,
                                            case.before)
        assert after == case.after and path.names == [step.name]
        assert cls.supported
    if case.down_refused:
        _refused(registry, case, case.to_version, case.from_version, case.after,
                 case.down_refused)
    elif case.is_pair and step.reversible:
        assert registry.migrate(case.kind, case.to_version, case.from_version,
                                case.after)[0] == case.before


# --- kinds and versions the registry refuses ----------------------------------------------

@pytest.mark.parametrize(("name", "data"), UNSUPPORTED, ids=[n for n, _ in UNSUPPORTED])
def test_an_unsupported_fixture_is_refused_naming_why(registry, name, data):
    cls = registry.classify(data["kind"], data["schema_version"], data["payload"])
    assert not cls.supported and cls.phase.phase_class == "unsupported"
    assert cls.identity == kinds.Identity() and cls.usage == {}
    for words in data["expect"]["says"]:
        assert words in cls.error
    decision = kf.resume_of(data["kind"], data["schema_version"], cls)
    assert (decision.action, decision.reason) == ("reject", "unsupported_schema")


# --- down(up(x)) == x for every reversible step -------------------------------------------

@pytest.mark.parametrize(("kind", "from_version"), REVERSIBLE,
                         ids=[f"{k} v{v}" for k, v in REVERSIBLE])
@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(data=st.data())
def test_down_after_up_is_the_identity_for_any_valid_payload(registry, kind, from_version,
                                                             data):
    payload = data.draw(STRATEGIES[(kind, from_version)], label="payload")
    assert registry.classify(kind, from_version, payload).supported, \
        registry.classify(kind, from_version, payload).error
    before = copy.deepcopy(payload)
    up, cls, _ = registry.migrate(kind, from_version, from_version + 1, payload)
    assert cls.supported, cls.error
    assert registry.migrate(kind, from_version + 1, from_version, up)[0] == payload
    assert payload == before  # the steps never change what they were given
