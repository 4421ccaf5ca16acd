"""Migrations between the schema versions of a kind, as a chain of upcasters (issue 19,
item 2; docs/migrations.md): pure, with no registry and no Django.

A ``Migration`` takes a payload of version N to version N+1 (``up``), and optionally
back (``down``, its inverse; the migration is reversible exactly when it has one).
``chain`` composes the registered steps between two versions: up, or down for a
reverse, and raises a ``MigrationError`` naming the missing or one-way step. The kind
registry (``kinds.register_migration``, ``kinds.migration_path``, ``kinds.migrate``)
keeps the steps per kind and checks every intermediate payload against its version's
schema; the operator's service (``services.migrations``) writes the result.

Each error carries the ``MigrationRefusal`` word a migration reports, and, like
``kinds.SchemaError``, names fields and versions, never a value from a payload.
``payload_diff`` says what a migration changed as key paths only, for previews shown to
people who may not see payloads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .vocab import MigrationRefusal


class MigrationError(ValueError):
    """A payload cannot be migrated; ``reason`` is the ``MigrationRefusal`` word."""

    reason: str = MigrationRefusal.NO_PATH


class NoMigrationPath(MigrationError):
    """No chain of registered steps leads from the payload's version to the target."""

    reason = MigrationRefusal.NO_PATH


class NotReversible(MigrationError):
    """A step back has no ``down``, or its ``down`` refuses this payload (it holds what
    only the newer version can say, e.g. a v4-only phase)."""

    reason = MigrationRefusal.NOT_REVERSIBLE


class InvalidAfter(MigrationError):
    """A step's result does not match its version's schema, or an ``up`` refused the
    payload (it cannot be said in the newer version)."""

    reason = MigrationRefusal.INVALID_AFTER


Step = Callable[[Any], Any]


@dataclass(frozen=True)
class Migration:
    """One step of a kind: ``up`` takes a payload of ``from_version`` (one its validator
    accepts) to ``from_version + 1``; ``down``, when given, is its exact inverse. Both are
    pure and deterministic: the same payload always gives the same result, and nothing
    else is read. A step may change the payload it is given (the chain's own copy) and
    return it. It refuses a payload it cannot carry over by raising ``InvalidAfter``
    (``up``) or ``NotReversible`` (``down``), naming the field, never its value; any
    other exception is a bug and stops the migration."""

    kind: str
    from_version: int
    up: Step
    down: Step | None = None
    name: str = ""

    @property
    def to_version(self) -> int:
        return self.from_version + 1

    @property
    def reversible(self) -> bool:
        return self.down is not None


@dataclass(frozen=True)
class Chain:
    """The steps from ``from_version`` to ``to_version``: ``(name, function, version of
    its result)`` in order; empty when the versions are equal. Calling it runs them on a
    copy of the payload (no schema check: ``kinds.migrate`` adds those)."""

    kind: str
    from_version: int
    to_version: int
    steps: tuple[tuple[str, Step, int], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.steps]

    @property
    def reverse(self) -> bool:
        return self.to_version < self.from_version

    def __call__(self, payload: Any) -> Any:
        current = copy.deepcopy(payload)
        for _, step, _ in self.steps:
            current = step(current)
        return current


def chain(kind: str, migrations: Mapping[int, Migration], from_version: int,
          to_version: int) -> Chain:
    """Compose ``migrations`` (by ``from_version``) from one version to another: each
    ``up`` from ``from_version`` to ``to_version``, or each ``down`` back when
    ``to_version`` is lower. Raises ``NoMigrationPath`` naming the first missing step,
    ``NotReversible`` naming the first step back without a ``down``."""
    steps: list[tuple[str, Step, int]] = []
    if from_version <= to_version:
        for version in range(from_version, to_version):
            migration = migrations.get(version)
            if migration is None:
                raise NoMigrationPath(f"{kind}: no migration from v{version} to "
                                      f"v{version + 1} is registered")
            steps.append((migration.name, migration.up, version + 1))
    else:
        for version in range(from_version - 1, to_version - 1, -1):
            migration = migrations.get(version)
            if migration is None:
                raise NoMigrationPath(f"{kind}: no migration between v{version} and "
                                      f"v{version + 1} is registered")
            if migration.down is None:
                raise NotReversible(f"{kind}: migration {migration.name} (v{version} to "
                                    f"v{version + 1}) is not reversible (no down)")
            steps.append((f"{migration.name} (down)", migration.down, version))
    return Chain(kind, from_version, to_version, tuple(steps))


def run(path: Chain, payload: Any, classify: Callable[[int, Any], Any]) -> tuple[Any, Any, Chain]:
    """Run ``path`` on ``payload`` with a schema check before and after each step:
    ``classify(version, payload)`` answers a ``kinds.Classification``. Returns ``(the
    migrated payload, its classification, path)``; ``payload`` is never changed.

    Raises ``NoMigrationPath`` when ``payload`` does not match its own version (steps are
    defined on valid payloads only), ``InvalidAfter`` when a step's result does not match
    the step's version, and what a step raises (its ``MigrationError`` prefixed with the
    step's name)."""
    cls = classify(path.from_version, payload)
    if not cls.supported:
        raise NoMigrationPath(f"the stored payload does not match: {cls.error}")
    current = copy.deepcopy(payload)
    for name, step, version in path.steps:
        try:
            current = step(current)
        except MigrationError as exc:
            raise type(exc)(f"{name}: {exc}") from None
        cls = classify(version, current)
        if not cls.supported:
            raise InvalidAfter(f"{name}: {cls.error}")
    return current, cls, path


# --- The shipped steps (registered by ``kinds``; docs/migrations.md) ---------------------

def acme_amount_up(p: dict) -> dict:
    """``acme.order`` v1 -> v2: ``amount_cents`` becomes ``amount: {"cents", "currency":
    "USD"}`` (v1 had no currency: its orders were in US dollars). Refuses a v1 payload
    that holds an ``amount`` of its own (v2 would overwrite it)."""
    if "amount" in p:
        raise InvalidAfter("payload.amount: v1 does not define it, and v2's would replace it")
    if "amount_cents" in p:
        p["amount"] = {"cents": p.pop("amount_cents"), "currency": "USD"}
    return p


def acme_amount_down(p: dict) -> dict:
    """``acme.order`` v2 -> v1: ``amount.cents`` back to ``amount_cents``. Only an amount
    of exactly ``{"cents", "currency": "USD"}`` has a v1 form; another is refused."""
    if "amount" in p:
        amount = p["amount"]
        if set(amount) != {"cents", "currency"} or amount["currency"] != "USD":
            raise NotReversible("payload.amount: only {cents, currency USD} has a v1 form "
                                "(amount_cents)")
        p["amount_cents"] = p.pop("amount")["cents"]
    return p


def workflow_v4_up(p: dict) -> dict:
    """``runifold.workflow`` v3 -> v4: every v3 payload is a v4 payload (v4 only adds the
    ``waiting`` phase; fork lineage lives on the control plane's task row, RUNIFOLD.md
    5, not in the payload), so the step is the identity."""
    return p


def workflow_v3_down(p: dict) -> dict:
    """``runifold.workflow`` v4 -> v3: the identity, except that the v4-only ``waiting``
    phase (a durable wait whose lease was released) has no v3 form: refused."""
    if p["phase"]["state"] == "waiting":
        raise NotReversible("payload.phase.state: waiting exists only in v4 (a v3 runtime "
                            "cannot resume a durable wait)")
    return p


#: How deep ``payload_diff`` looks, and how many paths it names per list.
DIFF_DEPTH, DIFF_PATHS = 6, 50


def payload_diff(before: Any, after: Any) -> dict[str, list[str]]:
    """What changed from ``before`` to ``after``, as dotted key paths of objects, never
    values: ``{"added": [...], "removed": [...], "changed": [...]}``. ``changed`` is a
    path present in both whose value differs (a list compared whole; anything below
    ``DIFF_DEPTH`` levels too). Each list is sorted and holds at most ``DIFF_PATHS``
    paths, then ``"+N more"``."""
    out: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
    _walk(before, after, "", 0, out)
    for key, paths in out.items():
        paths.sort()
        if len(paths) > DIFF_PATHS:
            out[key] = paths[:DIFF_PATHS] + [f"+{len(paths) - DIFF_PATHS} more"]
    return out


def _walk(before: Any, after: Any, path: str, depth: int, out: dict[str, list[str]]) -> None:
    if isinstance(before, dict) and isinstance(after, dict) and depth < DIFF_DEPTH:
        for key in before.keys() | after.keys():
            where = f"{path}.{key}" if path else str(key)
            if key not in after:
                out["removed"].append(where)
            elif key not in before:
                out["added"].append(where)
            else:
                _walk(before[key], after[key], where, depth + 1, out)
    elif type(before) is not type(after) or before != after:
        out["changed"].append(path or "(payload)")
