"""The checkpoint payload fixtures of every kind and version, ``tests/fixtures/kinds/``
(issue 19, item 3; docs/kinds.md, "Fixtures"), and how tests read them. No database.

Layout (``ROOT`` is ``tests/fixtures/kinds``)::

    <kind>/v<N>/<name>.json                    one payload of <kind> schema_version N
    <kind>/migrations/v<N>-v<N+1>/<name>.json  one case of the step from N to N+1
    _unsupported/<name>.json                   a kind or version the registry refuses

A version fixture is ``{"description", "payload", "expect"}``; ``expect`` holds
``phase_class``, ``label``, ``identity`` (the four parts), ``usage`` (``{counter:
int}``, ``{}`` for a kind without counters), ``resume`` (``{"action", "reason"}``:
``policy.resume_decision`` for a quiet run with no effects, the runtime presenting the
checkpoint's identity and usage, ``resume_of`` below) and, optionally, ``migrate``:
``{"<version>": "<MigrationRefusal word>"}`` for the versions it cannot be migrated to.

A migration case is ``{"description", "before" | "before_fixture", "after" |
"after_fixture", "up_refused"?, "down_refused"?}``: ``*_fixture`` names a version
fixture (``"acme.order/v1/ready"``) instead of repeating its payload. ``before`` and
``after``: the step's ``up`` gives ``after`` and, when the step is reversible, its
``down`` gives ``before`` back. ``up_refused`` / ``down_refused`` (``{"reason": word,
"says": [substrings of the message]}``) instead: that direction refuses the payload.

An unsupported fixture is ``{"description", "kind", "schema_version", "payload" |
"payload_fixture", "expect": {"says": [substrings of the error]}}``.

The kinds of ``KIND_MODULES`` (user kinds, ``RECOVERY_KIND_MODULES``) are loaded for the
suite with ``kind_modules_loaded``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent / "fixtures" / "kinds"
UNSUPPORTED = "_unsupported"
#: The user kinds (``RECOVERY_KIND_MODULES`` modules) whose fixtures live here too.
KIND_MODULES = ("examples.kinds.acme_refunds",)

_VERSION_DIR = re.compile(r"^v(\d+)\Z")
_STEP_DIR = re.compile(r"^v(\d+)-v(\d+)\Z")


@dataclasses.dataclass(frozen=True)
class Fixture:
    """One version fixture: ``payload`` of ``kind`` v``version``, and what ``expect``s."""

    kind: str
    version: int
    name: str
    description: str
    payload: Any
    expect: dict

    @property
    def ref(self) -> str:
        """``kind/vN/name``: how migration cases and other tests name it."""
        return f"{self.kind}/v{self.version}/{self.name}"


@dataclasses.dataclass(frozen=True)
class MigrationCase:
    """One case of ``kind``'s step from ``from_version`` to ``to_version`` (module doc);
    ``before`` / ``after`` are payloads (references resolved), ``None`` when absent."""

    kind: str
    from_version: int
    to_version: int
    name: str
    description: str
    before: Any
    after: Any
    up_refused: dict | None
    down_refused: dict | None

    @property
    def is_pair(self) -> bool:
        return self.before is not None and self.after is not None


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def kind_dirs() -> list[Path]:
    """The kind directories on disk (``_unsupported`` left out)."""
    return sorted(p for p in ROOT.iterdir() if p.is_dir() and p.name != UNSUPPORTED)


def version_dirs() -> list[tuple[str, str]]:
    """``(kind, directory name)`` of every directory in a kind's directory but
    ``migrations``: ``v<N>`` when well formed (the rule tests say which are not)."""
    return [(k.name, d.name) for k in kind_dirs() for d in sorted(k.iterdir())
            if d.is_dir() and d.name != "migrations"]


def fixtures(kind: str | None = None, version: int | None = None) -> list[Fixture]:
    """Every version fixture (of ``kind``, of ``version``), sorted by kind, version, name."""
    out = []
    for kind_name, dir_name in version_dirs():
        match = _VERSION_DIR.match(dir_name)
        if not match or (kind is not None and kind_name != kind):
            continue
        v = int(match.group(1))
        if version is not None and v != version:
            continue
        for path in sorted((ROOT / kind_name / dir_name).glob("*.json")):
            data = _read(path)
            out.append(Fixture(kind_name, v, path.stem, data.get("description", ""),
                               data["payload"], data["expect"]))
    return out


def fixture(ref: str) -> Fixture:
    """The version fixture ``kind/vN/name``; ``KeyError`` naming it when there is none."""
    kind, version, name = ref.split("/")
    path = ROOT / kind / version / f"{name}.json"
    if not _VERSION_DIR.match(version) or not path.is_file():
        raise KeyError(f"no fixture {ref} ({path})")
    data = _read(path)
    return Fixture(kind, int(version[1:]), name, data.get("description", ""),
                   data["payload"], data["expect"])


def payload(ref: str) -> Any:
    """A copy of fixture ``ref``'s payload, the caller's to change."""
    return copy.deepcopy(fixture(ref).payload)


def _resolved(data: dict, key: str) -> Any:
    if f"{key}_fixture" in data:
        return copy.deepcopy(fixture(data[f"{key}_fixture"]).payload)
    return data.get(key)


def step_dirs() -> list[tuple[str, str]]:
    """``(kind, directory name)`` of every directory in a kind's ``migrations``."""
    return [(k.name, d.name) for k in kind_dirs() if (k / "migrations").is_dir()
            for d in sorted((k / "migrations").iterdir()) if d.is_dir()]


def migration_cases(kind: str | None = None) -> list[MigrationCase]:
    """Every migration case (of ``kind``), references resolved (module doc)."""
    out = []
    for kind_name, dir_name in step_dirs():
        match = _STEP_DIR.match(dir_name)
        if not match or (kind is not None and kind_name != kind):
            continue
        for path in sorted((ROOT / kind_name / "migrations" / dir_name).glob("*.json")):
            data = _read(path)
            out.append(MigrationCase(kind_name, int(match.group(1)), int(match.group(2)),
                                     path.stem, data.get("description", ""),
                                     _resolved(data, "before"), _resolved(data, "after"),
                                     data.get("up_refused"), data.get("down_refused")))
    return out


def unsupported() -> list[tuple[str, dict]]:
    """``(name, data)`` of every unsupported fixture, its payload resolved."""
    out = []
    for path in sorted((ROOT / UNSUPPORTED).glob("*.json")):
        data = _read(path)
        data["payload"] = _resolved(data, "payload")
        out.append((path.stem, data))
    return out


# --- what the suite checks against ---------------------------------------------------------

#: The database's "now" of the resume decisions: any instant; the run is quiet (no lease,
#: no write time), so its owner counts as gone whatever it is.
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def resume_of(kind: str, version: int, cls, usage: dict | None = None):
    """``policy.resume_decision`` for a run whose latest checkpoint classified as ``cls``
    (a ``kinds.Classification`` of ``kind`` v``version``): no lease, no effect, no retry
    request, no conflict, asked by a runtime presenting the checkpoint's identity and
    ``usage`` (the checkpoint's own when ``None``)."""
    from checkpoints import kinds, policy

    identity = dataclasses.asdict(cls.identity)
    facts = policy.RunFacts(
        now=NOW, phase_class=cls.phase.phase_class, schema_error=cls.error,
        identity=identity, usage=cls.usage,
        migration_required=kinds.migration_required(kind, version))
    return policy.resume_decision(facts, identity, cls.usage if usage is None else usage)


@contextmanager
def registry_restored() -> Iterator[Any]:
    """The kind registry (``checkpoints.kinds``), put back as it was on leaving: its
    kinds, their versions, migrations and modes; the kind modules imported meanwhile
    (``tests.kindmodules.*``, ``examples.kinds.*``) are forgotten, so the next
    ``load_kind_modules`` imports, and registers, them again."""
    from checkpoints import kinds

    saved = {name: dataclasses.replace(spec, versions=dict(spec.versions),
                                       migrations=dict(spec.migrations))
             for name, spec in kinds._REGISTRY.items()}
    imported = set(sys.modules)
    try:
        yield kinds
    finally:
        kinds._REGISTRY.clear()
        kinds._REGISTRY.update(saved)
        for name in set(sys.modules) - imported:
            if name.startswith(("tests.kindmodules.", "examples.kinds.")):
                del sys.modules[name]


@contextmanager
def kind_modules_loaded(modules=KIND_MODULES) -> Iterator[Any]:
    """The registry with ``modules`` loaded (``apps.load_kind_modules``), restored after."""
    from checkpoints.apps import load_kind_modules

    with registry_restored() as kinds:
        load_kind_modules(list(modules))
        yield kinds
