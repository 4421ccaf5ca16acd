"""The kind registry: turns a checkpoint payload into a phase class, a label and an identity.

A kind is registered with its supported schema versions; each version has a validator, a
phase extractor and an identity extractor (DESIGN.md section 3). Built in:

- ``runifold.agent`` v1 (RUNIFOLD.md section 2): ``ready_for_turn`` stable,
  ``turn_in_flight{turn}`` in flight, ``completed{response}`` completed.
- ``runifold.workflow`` v3 and v4 (RUNIFOLD.md section 3): ``ready`` stable,
  ``step_in_flight`` in flight, ``parallel_in_flight`` / ``race_in_flight`` in flight
  unless their branches settle the step (all completed; a race with a completed winner or
  all failed), ``waiting`` stable (the lease is released by design; only v4),
  ``completed{outcome}`` completed.
- ``acme.order`` v1 and v2, the demo kind: ``phase`` one of ``ready``, ``charging``,
  ``charged``, ``shipping``, ``completed``, ``cancelled``; v2's ``amount: {"cents",
  "currency"}`` was v1's ``amount_cents``.

Migrations between versions (``register_migration``, ``migration_path``, ``migrate``;
lazy or offline kinds) are described in docs/migrations.md; the steps, ``upcasters``.

More kinds come from the user's own Python modules, named in ``RECOVERY_KIND_MODULES``
and imported once at start-up (``apps.load_kind_modules``); they may not touch
the built-in ones (``BUILTIN_KINDS``). How to write one: docs/kinds.md.

A kind or version that is not registered, or a payload its validator refuses, is still
stored; ``classify`` then answers ``unsupported`` and the run becomes ``schema_mismatch``
(never guessed).

The identity a payload yields must fit the run's columns (``IDENTITY_LIMITS``, the
``max_length`` of ``Run.agent``/``model``/``workflow``/``definition_version``): a longer
part, or one holding U+0000 or an unpaired surrogate, makes the payload a schema error
like any other (stored, run ``schema_mismatch``, the error naming the identity field and
its limit, never the value). So no identity reaches a query it cannot be stored by
(issue 6, fault 4; ``docs/security/input.md``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import upcasters
from ..jsonparse import name_problem, shown, text_problem
from ..vocab import MigrationMode, PhaseClass

# The migration errors (``upcasters``), under the registry's name too: ``kinds.NotReversible``.
MigrationError, NoMigrationPath = upcasters.MigrationError, upcasters.NoMigrationPath
NotReversible, InvalidAfter = upcasters.NotReversible, upcasters.InvalidAfter

logger = logging.getLogger(__name__)

KIND_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+\Z")
#: The longest kind name (``Checkpoint.kind``, ``DeclaredKindVersion.kind``, ``MigrationJob.kind``).
KIND_MAX = 200


def is_kind_name(kind) -> bool:
    """Whether ``kind`` can be a kind's name (CONTRACT.md 1): text of at most ``KIND_MAX``
    characters matching ``KIND_RE``. The one check of a kind name, for a body's ``kind``,
    a declaration's and the URL's: a value that is not one is never looked up (a U+0000
    in it would reach PostgreSQL, which refuses it with an error, not an empty answer)."""
    return isinstance(kind, str) and len(kind) <= KIND_MAX and bool(KIND_RE.match(kind))


class SchemaError(ValueError):
    """The payload does not match its kind's schema. The message names the field and the
    rule, never the value found there: it becomes the run's phase label and recovery
    reason, stored in clear and shown to viewers, who may not see payloads (issue 6,
    fault 3)."""


#: Longest identity part a run can store: ``Run.<field>.max_length`` (a test keeps the two
#: equal; this module stays free of Django so the registry is testable on its own).
IDENTITY_LIMITS = {"agent": 256, "model": 256, "workflow": 256, "definition_version": 64}


@dataclass(frozen=True)
class Phase:
    """``phase_class`` is stable / in_flight / completed / unsupported; ``label`` is for humans."""

    phase_class: str
    label: str


@dataclass(frozen=True)
class Identity:
    """Who must resume a run: agent, ``provider/name`` model, workflow, definition version.

    Empty strings mean the kind does not carry that part.
    """

    agent: str = ""
    model: str = ""
    workflow: str = ""
    definition_version: str = ""


@dataclass(frozen=True)
class Classification:
    """What ``classify`` makes of a payload: its phase, identity and usage counters
    (``{counter: int}``, ``{}`` when the kind declares none or the payload is
    unsupported), or ``error`` naming why it is unsupported."""

    phase: Phase
    identity: Identity
    error: str = ""
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def supported(self) -> bool:
        return self.phase.phase_class != PhaseClass.UNSUPPORTED


@dataclass
class VersionSpec:
    """What one schema version of a kind is: three plain functions (docs/kinds.md).

    - ``validate(payload)``: gets the checkpoint's ``payload`` exactly as parsed from the
      envelope (any JSON value: an object, but also a list, a string, ``None``...) and
      returns nothing. It raises ``SchemaError`` when the payload does not match this
      version: its message names the field and the rule (``"payload.phase must be one of
      [...]"``) and **never a value found in the payload**, because it becomes the run's
      phase label and recovery reason, stored in clear and shown to viewers, who may not
      see payloads. Any other exception is a bug in the kind: the write is still stored
      (never lost, never a 500), classified ``unsupported`` with a reason naming the
      function and the exception's type (never its message), and the error is logged.
    - ``phase(payload)``: called only after ``validate`` passed, with the payload it
      accepted (an object, as a ``dict``, for every kind so far); returns a ``Phase``:
      ``phase_class`` one of ``PhaseClass.STABLE`` (a resume may continue from here),
      ``IN_FLIGHT`` (a step was started and its outcome is not recorded: never resumed
      blindly) or ``COMPLETED`` (the outcome is recorded: a resume replays it), and a
      short human ``label`` (cut at 256 characters; same rule: no payload values, only
      field names, states, counts).
    - ``identity(payload)``: called after ``validate`` passed; returns an ``Identity``
      (agent, ``provider/name`` model, workflow, definition version; empty strings for the
      parts the kind does not carry). A resume request naming another identity is
      refused. Each part must fit ``IDENTITY_LIMITS``, else the payload is a schema error.
      Either may raise ``SchemaError`` too (same rules as ``validate``).
    - ``usage(payload)`` (optional, after ``validate``): ``{counter: int}``, the usage
      counters the kind declares (runifold's ``tokens``, ``cost_microusd``, ...). They
      never decrease from one revision of a checkpoint to the next (a lower one is 422
      ``usage_decreased``), and a resume that carries the runtime's usage is compared with
      them (RUNIFOLD.md 2 and 3; CONTRACT.md 8).

    The functions are pure: no I/O, no clock, no database, the same answer for the same
    payload (they run on every checkpoint write).
    """

    validate: Callable[[Any], None]
    phase: Callable[[dict], Phase]
    identity: Callable[[dict], Identity]
    usage: Callable[[dict], dict[str, int]] | None = None


@dataclass
class KindSpec:
    kind: str
    versions: dict[int, VersionSpec] = field(default_factory=dict)
    description: str = ""
    migrations: dict[int, upcasters.Migration] = field(default_factory=dict)  # by from_version
    mode: str = MigrationMode.LAZY


_REGISTRY: dict[str, KindSpec] = {}

#: The kinds this module registers itself; set at its end. No ``register`` call may touch
#: them afterwards (a kind module cannot replace or extend them).
BUILTIN_KINDS: frozenset[str] = frozenset()


class BuiltinKindError(ValueError):
    """A registration for a built-in kind (``BUILTIN_KINDS``) from outside this module."""


def _check_registration(kind: str, version: int, spec: VersionSpec) -> None:
    """``register``'s checks past the kind's name (its docstring): the version's range, the
    spec's type and the built-in kinds. Raises ``ValueError`` / ``BuiltinKindError``."""
    if kind in BUILTIN_KINDS:
        own = "yourorg." + kind.split(".")[-1]
        raise BuiltinKindError(
            f"kind {kind!r} is built in: a kind module may not replace it or add a version "
            f"to it; register a kind of your own namespace (e.g. {own!r})")
    if type(version) is not int or not 0 <= version <= U32_MAX:
        raise ValueError(f"{kind}: schema version must be an integer in 0..{U32_MAX}")
    if not isinstance(spec, VersionSpec) or not all(
            callable(f) for f in (spec.validate, spec.phase, spec.identity)):
        raise ValueError(f"{kind} v{version}: spec must be a VersionSpec of three functions "
                         "(validate, phase, identity)")


def register(kind: str, version: int, spec: VersionSpec, description: str = "") -> None:
    """Register ``spec`` (``VersionSpec``: validate, phase, identity) for ``kind`` at
    schema ``version``; from then on every checkpoint written with that ``kind`` and
    ``schema_version`` is classified by it (``classify``). Call it at import time of a
    module named in ``RECOVERY_KIND_MODULES`` (``apps.load_kind_modules``; docs/kinds.md).

    - ``kind``: namespaced, ``^[a-z][a-z0-9_]*(\\.[a-z0-9_-]+)+$`` (CONTRACT.md 1), e.g.
      ``acme.refund``; else ``ValueError``.
    - ``version``: the envelope's ``schema_version`` this spec reads, an integer in
      0..2^32-1; else ``ValueError``. A change of payload format is a new version,
      registered beside the old one (never a changed spec under the old number).
    - ``description``: one line for the Kinds page, taken from the first registration
      of the kind.

    Registering a (kind, version) again replaces its spec, but never for a built-in kind
    (``BUILTIN_KINDS``: ``runifold.agent``, ``runifold.workflow``, ``acme.order``,
    ``langgraph.checkpoint``): that raises ``BuiltinKindError``, whatever the version.
    """
    if not KIND_RE.match(kind):
        raise ValueError(f"bad kind {kind!r}")
    _check_registration(kind, version, spec)
    entry = _REGISTRY.setdefault(kind, KindSpec(kind=kind, description=description))
    entry.versions[version] = spec


#: A tenant's declared kinds (``checkpoints.declared.lookup``): ``kind -> KindSpec | None``.
Lookup = Callable[[str], "KindSpec | None"]


def _spec(kind: str, lookup: Lookup | None) -> KindSpec | None:
    """The registered ``KindSpec`` of ``kind``; else, given a tenant's ``lookup``, the
    tenant's declared one (a kind in code always wins: a tenant cannot shadow it)."""
    spec = _REGISTRY.get(kind)
    if spec is None and lookup is not None and isinstance(kind, str):
        spec = lookup(kind)
    return spec


def registered(declared: dict[str, KindSpec] | None = None) -> dict[str, list[int]]:
    """``{kind: [supported versions]}``, for reports and the UI: the kinds in code, plus
    ``declared`` (a tenant's, ``checkpoints.declared.kinds``) when given."""
    found = dict(declared or {})
    found.update(_REGISTRY)
    return {k: sorted(v.versions) for k, v in sorted(found.items())}


def in_code(kind: str) -> bool:
    """Whether ``kind`` is registered in code (built in, or a ``RECOVERY_KIND_MODULES``
    module's): then no tenant's declaration is ever read for it."""
    return kind in _REGISTRY


def versions(kind: str, *, lookup: Lookup | None = None) -> list[int]:
    """The schema versions of ``kind`` (in code, else by ``lookup``), oldest first; ``[]``
    when the kind is unknown."""
    spec = _spec(kind, lookup) if isinstance(kind, str) else None
    return sorted(spec.versions) if spec is not None else []


def classify(kind: str, schema_version: int, payload: Any, *,
             lookup: Lookup | None = None) -> Classification:
    """Phase and identity of a payload, or ``unsupported`` with the reason in ``error``.
    ``lookup``: the writing tenant's declared kinds (``checkpoints.declared.lookup``).

    ``error`` names the kind, the version, the field and the rule; never a value taken
    from the payload (``SchemaError``).
    """
    spec = _spec(kind, lookup)
    if spec is None:
        return Classification(Phase(PhaseClass.UNSUPPORTED, f"unregistered kind {kind}"), Identity(),
                              f"kind {kind!r} is not registered")
    version = spec.versions.get(schema_version)
    if version is None:
        supported = ", ".join(str(v) for v in sorted(spec.versions))
        return Classification(
            Phase(PhaseClass.UNSUPPORTED, f"{kind} v{schema_version} unsupported"), Identity(),
            f"{kind} schema_version {schema_version} is not supported (supported: {supported})",
        )
    step = "validate"
    try:
        version.validate(payload)
        step = "identity"
        identity = version.identity(payload)
        _check_identity(identity)
        step = "usage"
        usage = _checked_usage(version.usage(payload) if version.usage is not None else {})
        step = "phase"
        return Classification(_checked_phase(version.phase(payload)), identity, usage=usage)
    except SchemaError as exc:
        return Classification(Phase(PhaseClass.UNSUPPORTED, f"{kind} v{schema_version} invalid"),
                              Identity(), f"payload does not match {kind} v{schema_version}: {exc}")
    except Exception as exc:  # a bug in the kind: the write is kept, never a 500
        logger.exception("kind %s v%s: its %s raised", kind, schema_version, step)
        return Classification(
            Phase(PhaseClass.UNSUPPORTED, f"{kind} v{schema_version} failed"), Identity(),
            f"{kind} v{schema_version}: its {step} function raised {type(exc).__name__} "
            f"(a bug in the kind; server log)")


_KNOWN_PHASES = (PhaseClass.STABLE, PhaseClass.IN_FLIGHT, PhaseClass.COMPLETED)


def _checked_phase(phase: Any) -> Phase:
    """A kind's ``phase`` answer, held to what the run's columns take: a ``Phase`` whose
    class is stable, in_flight or completed and whose label is text (cut at 256 later).
    Anything else is the kind's bug (``TypeError``, caught by ``classify``). The label,
    which kinds build from payload text (a step's name, a declared ``{/field}``), is
    shown to people as one printable line (``jsonparse.shown``: a control or
    bidirectional character escaped; the second attack's finding, stop 33)."""
    if (not isinstance(phase, Phase) or phase.phase_class not in _KNOWN_PHASES
            or not isinstance(phase.label, str)):
        raise TypeError("phase() must return a Phase of stable, in_flight or completed")
    label = shown(phase.label, 256)
    return phase if label == phase.label else dataclasses.replace(phase, label=label)


def _checked_usage(usage: Any) -> dict[str, int]:
    """A kind's ``usage`` answer: ``{counter name: integer in 0..2^64-1}``, else the kind's
    bug (``TypeError``, caught by ``classify``)."""
    if not isinstance(usage, dict) or not all(
            isinstance(k, str) and type(v) is int and 0 <= v <= U64_MAX
            for k, v in usage.items()):
        raise TypeError("usage() must return {counter: integer in 0..2^64-1}")
    return usage


def _check_identity(identity: Identity) -> None:
    """Raise ``SchemaError`` naming the identity part that its run column cannot hold:
    longer than ``IDENTITY_LIMITS``, or not valid text (U+0000, unpaired surrogate), or
    no name (``jsonparse.name_problem``: a control or bidirectional character), which
    the resume identity that must equal it could never be (the attack's finding, stop
    33: a stored ``"refund\u202eevil"`` could be matched by no runtime)."""
    for name, limit in IDENTITY_LIMITS.items():
        value = getattr(identity, name)
        if not isinstance(value, str):
            raise SchemaError(f"identity {name} must be a string")
        if len(value) > limit:
            raise SchemaError(f"identity {name} is longer than {limit} characters")
        if text_problem(value):
            raise SchemaError(f"identity {name} is not valid text")
        if name_problem(value):
            raise SchemaError(f"identity {name}: {name_problem(value)}")


# --- migrations between versions (issue 19, item 2; docs/migrations.md) -----------------

def register_migration(kind: str, from_version: int, up: Callable[[Any], Any],
                       down: Callable[[Any], Any] | None = None, *,
                       name: str = "") -> upcasters.Migration:
    """Register ``kind``'s step from ``from_version`` to the next: ``up`` a pure function of
    a payload its version accepts, ``down`` (optional: reversible iff given) its inverse;
    a step refusing a payload raises ``InvalidAfter`` (up) or ``NotReversible`` (down).
    Both versions must be registered first; re-registering replaces the step."""
    spec = _REGISTRY.get(kind)
    for version in (from_version, from_version + 1):
        if spec is None or version not in spec.versions:
            raise ValueError(f"register_migration: {kind} v{version} is not registered")
    if not callable(up) or (down is not None and not callable(down)):
        raise TypeError("register_migration: up and down must be functions")
    migration = upcasters.Migration(kind, from_version, up, down,
                                    name or f"{kind} v{from_version}->v{from_version + 1}")
    spec.migrations[from_version] = migration
    return migration


def migration_path(kind: str, from_version: int, to_version: int, *,
                   lookup: Lookup | None = None) -> upcasters.Chain:
    """The chain of registered steps from one version of ``kind`` to another (``up``s, or
    ``down``s for a reverse); ``lookup`` as ``classify``'s. Raises ``NoMigrationPath``
    (unregistered kind or version, a missing step) or ``NotReversible`` (a step back
    without ``down``), naming it."""
    spec = _spec(kind, lookup)
    if spec is None:
        raise NoMigrationPath(f"kind {kind!r} is not registered")
    for version in (from_version, to_version):
        if version not in spec.versions:
            raise NoMigrationPath(f"{kind} v{version} is not registered")
    return upcasters.chain(kind, spec.migrations, from_version, to_version)


def migrate(kind: str, from_version: int, to_version: int, payload: Any, *,
            lookup: Lookup | None = None) -> tuple[Any, Classification, upcasters.Chain]:
    """``payload`` (a valid ``from_version``) migrated to ``to_version``: ``(new payload,
    its classification, the chain)``, each step's result checked against its version
    (``upcasters.run``); ``lookup`` as ``classify``'s. Raises ``NoMigrationPath``,
    ``NotReversible``, ``InvalidAfter``."""
    return upcasters.run(migration_path(kind, from_version, to_version, lookup=lookup),
                         payload, lambda version, p: classify(kind, version, p, lookup=lookup))


def registered_migrations() -> dict[str, list[upcasters.Migration]]:
    """``{kind: [its migration steps, by from_version]}``, the kinds that have any: each
    an ``upcasters.Migration`` (``kind``, ``from_version``, ``to_version``, ``up``,
    ``down``, ``name``, ``reversible``), as registered by ``register_migration``. A read
    of the registry (a new dict and lists; the steps themselves are frozen), for reports
    and the fixture suite (tests/test_kind_fixtures.py: every step has a fixture pair,
    every reversible one a payload strategy)."""
    return {k: [spec.migrations[v] for v in sorted(spec.migrations)]
            for k, spec in sorted(_REGISTRY.items()) if spec.migrations}


def set_migration_mode(kind: str, mode: str) -> None:
    """Make registered ``kind`` ``lazy`` (the default) or ``offline`` (``MigrationMode``)."""
    _REGISTRY[kind].mode = MigrationMode(mode)


def migration_required(kind: str, schema_version: int | None) -> bool:
    """Whether a checkpoint of ``kind`` at ``schema_version`` must be migrated before its
    run is resumed: its kind is ``offline`` and the version is older than its newest."""
    spec = _REGISTRY.get(kind)
    return (spec is not None and spec.mode == MigrationMode.OFFLINE
            and schema_version is not None and schema_version < max(spec.versions))


#: runifold-core's counters are ``u64`` (RUNIFOLD.md 2): a larger one cannot be read back.
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
#: The counters of runifold's ``Usage`` (RUNIFOLD.md 2), each a ``u64`` when present.
USAGE_COUNTERS = ("tokens", "cost_microusd", "duration_micros", "turns", "tool_calls",
                  "delegations")


# --- the built-in kinds (``builtin``); the user's come from RECOVERY_KIND_MODULES -------

# Imported last: it registers through the functions above (the package is the registry,
# ``builtin`` its first user), and what callers read of it stays ``kinds.<name>``.
from .builtin import (  # noqa: E402, F401 - re-exported
    ACME_PHASES,
    LANGGRAPH_KIND,
    _workflow_validator,
    runifold_usage,
)

BUILTIN_KINDS = frozenset(_REGISTRY)

def description(kind: str, *, lookup: Lookup | None = None) -> str:
    """The kind's one-line description (``register``, or the newest declared version's),
    "" when it is not registered."""
    spec = _spec(kind, lookup)
    return spec.description if spec else ""
