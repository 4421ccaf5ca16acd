"""Migrations between a kind's versions as a chain of upcasters (issue 19, item 2;
docs/migrations.md): the registry's rules (``kinds.register_migration``,
``kinds.migration_path``, ``kinds.migrate``, ``kinds.registered_migrations``) on a toy
kind, the lazy/offline flag and the preview's diff. The shipped migrations against every
fixture, their fixture pairs and the property test of every reversible step's round trip
are tests/test_kind_fixtures.py. Pure: no database."""

from __future__ import annotations

import json

import pytest

from checkpoints import kinds, upcasters

TOY = "test.migrating"


def _spec(required: str) -> kinds.VersionSpec:
    """A toy version whose payload must hold ``required`` (an integer)."""
    def validate(p):
        if not isinstance(p, dict) or type(p.get(required)) is not int:
            raise kinds.SchemaError(f"payload.{required} must be an integer")
    return kinds.VersionSpec(validate, lambda p: kinds.Phase("stable", "ok"),
                             lambda p: kinds.Identity())


@pytest.fixture
def toy():
    """``test.migrating`` v1 {a} -> v2 {b} (reversible) -> v3 {c} (one way), and v4 {d}
    with no step to it; removed from the registry afterwards."""
    for version, key in ((1, "a"), (2, "b"), (3, "c"), (4, "d")):
        kinds.register(TOY, version, _spec(key))
    kinds.register_migration(TOY, 1, lambda p: {"b": p.pop("a") * 10},
                             lambda p: {"a": p.pop("b") // 10}, name="a to b")
    kinds.register_migration(TOY, 2, lambda p: {"c": p.pop("b") + 1}, name="b to c")
    yield TOY
    kinds._REGISTRY.pop(TOY)


# --- the registry's rules ---------------------------------------------------------------

def test_it_composes_a_chain_up_and_back(toy):
    up = kinds.migration_path(toy, 1, 3)
    assert up.names == ["a to b", "b to c"]
    assert [version for _, _, version in up.steps] == [2, 3]
    assert up({"a": 4}) == {"c": 41}
    down = kinds.migration_path(toy, 2, 1)
    assert down.names == ["a to b (down)"] and down.reverse
    assert down({"b": 40}) == {"a": 4}
    assert kinds.migration_path(toy, 2, 2).steps == ()


def test_a_reverse_through_a_one_way_step_is_refused_naming_it(toy):
    with pytest.raises(kinds.NotReversible, match="b to c .*not reversible"):
        kinds.migration_path(toy, 3, 1)
    assert not kinds._REGISTRY[toy].migrations[2].reversible
    assert kinds._REGISTRY[toy].migrations[1].reversible


def test_a_missing_step_is_refused_naming_it(toy):
    with pytest.raises(kinds.NoMigrationPath, match="no migration from v3 to v4"):
        kinds.migration_path(toy, 1, 4)
    with pytest.raises(kinds.NoMigrationPath, match="v9 is not registered"):
        kinds.migration_path(toy, 1, 9)
    with pytest.raises(kinds.NoMigrationPath, match="not registered"):
        kinds.migration_path("test.nothing", 1, 2)


def test_the_registry_lists_its_steps_per_kind_in_order(toy):
    steps = kinds.registered_migrations()
    assert [(m.from_version, m.to_version, m.name, m.reversible) for m in steps[toy]] == [
        (1, 2, "a to b", True), (2, 3, "b to c", False)]
    assert [m.name for m in steps["acme.order"]] == ["acme.order amount_cents -> amount"]
    assert "langgraph.checkpoint" not in steps  # a kind with no step is not listed
    steps[toy].clear()  # a copy: the registry keeps its steps
    assert len(kinds.registered_migrations()[toy]) == 2


def test_the_errors_carry_the_refusal_word(toy):
    assert kinds.NoMigrationPath("x").reason == "no_path"
    assert kinds.NotReversible("x").reason == "not_reversible"
    assert kinds.InvalidAfter("x").reason == "invalid_after"


def test_a_migration_needs_both_versions_registered(toy):
    with pytest.raises(ValueError, match="v5 is not registered"):
        kinds.register_migration(toy, 4, lambda p: p)
    with pytest.raises(ValueError, match="not registered"):
        kinds.register_migration("test.nothing", 1, lambda p: p)
    with pytest.raises(TypeError):
        kinds.register_migration(toy, 3, "not a function")


def test_migrate_checks_each_result_against_its_version(toy):
    new, cls, path = kinds.migrate(toy, 1, 3, {"a": 2})
    assert new == {"c": 21} and cls.supported and path.names == ["a to b", "b to c"]
    kinds.register_migration(toy, 1, lambda p: {"x": 1}, name="broken")
    with pytest.raises(kinds.InvalidAfter, match="broken: payload does not match "
                                                 "test.migrating v2: payload.b"):
        kinds.migrate(toy, 1, 2, {"a": 2})


def test_migrate_takes_only_a_valid_payload_and_never_changes_it(toy):
    with pytest.raises(kinds.NoMigrationPath, match="stored payload does not match"):
        kinds.migrate(toy, 1, 2, {"a": "two"})
    payload = {"a": 3}
    kinds.migrate(toy, 1, 3, payload)
    assert payload == {"a": 3}


# --- lazy and offline kinds ---------------------------------------------------------------

def test_a_kind_is_lazy_unless_it_says_offline(toy):
    assert kinds._REGISTRY["acme.order"].mode == "lazy"
    assert not kinds.migration_required(toy, 1)
    kinds.set_migration_mode(toy, "offline")
    assert kinds.migration_required(toy, 1) and kinds.migration_required(toy, 3)
    assert not kinds.migration_required(toy, 4)  # the newest
    assert not kinds.migration_required(toy, None)
    assert not kinds.migration_required("test.nothing", 1)
    with pytest.raises(ValueError):
        kinds.set_migration_mode(toy, "eager")


# --- what a preview shows: key paths, never values -----------------------------------------

def test_the_diff_names_key_paths_and_no_value():
    before = {"phase": "ready", "amount_cents": 2599, "order_id": "A-1042",
              "meta": {"x": 1, "y": [1, 2]}}
    after = {"phase": "ready", "amount": {"cents": 2599, "currency": "USD"},
             "order_id": "A-1043", "meta": {"x": 1, "y": [1, 3], "z": None}}
    diff = upcasters.payload_diff(before, after)
    assert diff == {"added": ["amount", "meta.z"], "removed": ["amount_cents"],
                    "changed": ["meta.y", "order_id"]}
    assert "2599" not in json.dumps(diff) and "A-104" not in json.dumps(diff)
    assert upcasters.payload_diff([1], {"a": 1}) == {"added": [], "removed": [],
                                                      "changed": ["(payload)"]}


def test_a_long_diff_is_cut():
    diff = upcasters.payload_diff({}, {f"k{i:03}": i for i in range(60)})
    assert len(diff["added"]) == upcasters.DIFF_PATHS + 1
    assert diff["added"][-1] == "+10 more"
