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

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import upcasters
from .vocab import MigrationMode, PhaseClass

# The migration errors (``upcasters``), under the registry's name too: ``kinds.NotReversible``.
MigrationError, NoMigrationPath = upcasters.MigrationError, upcasters.NoMigrationPath
NotReversible, InvalidAfter = upcasters.NotReversible, upcasters.InvalidAfter

logger = logging.getLogger(__name__)

KIND_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+\Z")


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


def registered() -> dict[str, list[int]]:
    """``{kind: [supported versions]}``, for reports and the UI."""
    return {k: sorted(v.versions) for k, v in sorted(_REGISTRY.items())}


def classify(kind: str, schema_version: int, payload: Any) -> Classification:
    """Phase and identity of a payload, or ``unsupported`` with the reason in ``error``.

    ``error`` names the kind, the version, the field and the rule; never a value taken
    from the payload (``SchemaError``).
    """
    spec = _REGISTRY.get(kind)
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
    Anything else is the kind's bug (``TypeError``, caught by ``classify``)."""
    if (not isinstance(phase, Phase) or phase.phase_class not in _KNOWN_PHASES
            or not isinstance(phase.label, str)):
        raise TypeError("phase() must return a Phase of stable, in_flight or completed")
    return phase


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
    longer than ``IDENTITY_LIMITS``, or not valid text (U+0000, unpaired surrogate)."""
    for name, limit in IDENTITY_LIMITS.items():
        value = getattr(identity, name)
        if not isinstance(value, str):
            raise SchemaError(f"identity {name} must be a string")
        if len(value) > limit:
            raise SchemaError(f"identity {name} is longer than {limit} characters")
        if "\x00" in value or _has_surrogate(value):
            raise SchemaError(f"identity {name} is not valid text")


def _has_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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


def migration_path(kind: str, from_version: int, to_version: int) -> upcasters.Chain:
    """The chain of registered steps from one version of ``kind`` to another (``up``s, or
    ``down``s for a reverse). Raises ``NoMigrationPath`` (unregistered kind or version, a
    missing step) or ``NotReversible`` (a step back without ``down``), naming it."""
    spec = _REGISTRY.get(kind)
    if spec is None:
        raise NoMigrationPath(f"kind {kind!r} is not registered")
    for version in (from_version, to_version):
        if version not in spec.versions:
            raise NoMigrationPath(f"{kind} v{version} is not registered")
    return upcasters.chain(kind, spec.migrations, from_version, to_version)


def migrate(kind: str, from_version: int, to_version: int, payload: Any
            ) -> tuple[Any, Classification, upcasters.Chain]:
    """``payload`` (a valid ``from_version``) migrated to ``to_version``: ``(new payload,
    its classification, the chain)``, each step's result checked against its version
    (``upcasters.run``). Raises ``NoMigrationPath``, ``NotReversible``, ``InvalidAfter``."""
    return upcasters.run(migration_path(kind, from_version, to_version), payload,
                         lambda version, p: classify(kind, version, p))


def set_migration_mode(kind: str, mode: str) -> None:
    """Make registered ``kind`` ``lazy`` (the default) or ``offline`` (``MigrationMode``)."""
    _REGISTRY[kind].mode = MigrationMode(mode)


def migration_required(kind: str, schema_version: int | None) -> bool:
    """Whether a checkpoint of ``kind`` at ``schema_version`` must be migrated before its
    run is resumed: its kind is ``offline`` and the version is older than its newest."""
    spec = _REGISTRY.get(kind)
    return (spec is not None and spec.mode == MigrationMode.OFFLINE
            and schema_version is not None and schema_version < max(spec.versions))


# --- small validation helpers ------------------------------------------------------------

def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise SchemaError(f"{where} must be an object")
    return value


def _str(obj: dict, key: str, where: str, *, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value:
        raise SchemaError(f"{where}.{key} must be a non-empty string")
    return value


#: runifold-core's counters are ``u64`` (RUNIFOLD.md 2): a larger one cannot be read back.
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
#: The counters of runifold's ``Usage`` (RUNIFOLD.md 2), each a ``u64`` when present.
USAGE_COUNTERS = ("tokens", "cost_microusd", "duration_micros", "turns", "tool_calls",
                  "delegations")


def _uint(obj: dict, key: str, where: str, *, positive: bool = False, bits: int = 64) -> int:
    """``obj[key]`` as a runifold unsigned integer (``u64`` unless ``bits=32``).

    Raises SchemaError naming ``where.key`` when it is not an integer, is below 0 (or 1 when
    ``positive``) or does not fit ``bits`` bits.
    """
    value = obj.get(key)
    if type(value) is not int or value < (1 if positive else 0):
        raise SchemaError(f"{where}.{key} must be an integer >= {1 if positive else 0}")
    maximum = U32_MAX if bits == 32 else U64_MAX
    if value > maximum:
        raise SchemaError(f"{where}.{key} must be at most {maximum} (a u{bits})")
    return value


def _usage(obj: dict, where: str) -> None:
    """``obj["usage"]``: an object whose runifold counters, where present, are ``u64``."""
    usage = _obj(obj.get("usage"), f"{where}.usage")
    for key in USAGE_COUNTERS:
        if key in usage:
            _uint(usage, key, f"{where}.usage")


def runifold_usage(payload: dict) -> dict[str, int]:
    """The runifold ``Usage`` counters of a validated payload (``payload["usage"]``),
    those present: ``{"tokens": 702, "cost_microusd": 215, ...}`` (RUNIFOLD.md 2)."""
    usage = payload["usage"]
    return {key: usage[key] for key in USAGE_COUNTERS if key in usage}


def _state(obj: dict, where: str, allowed: set[str]) -> str:
    phase = _obj(obj.get("phase"), f"{where}.phase")
    state = phase.get("state")
    if state not in allowed:
        raise SchemaError(f"{where}.phase.state must be one of {sorted(allowed)}")
    return state


# --- runifold.agent v1 ---------------------------------------------------------------------

_AGENT_STATES = {"ready_for_turn", "turn_in_flight", "completed"}


def _agent_validate(payload: Any) -> None:
    p = _obj(payload, "payload")
    _str(p, "agent", "payload")
    model = _obj(p.get("model"), "payload.model")
    _str(model, "provider", "payload.model")
    _str(model, "name", "payload.model")
    if not isinstance(p.get("transcript"), list):
        raise SchemaError("payload.transcript must be an array")
    for key in ("turns", "tool_calls", "delegations"):
        _uint(p, key, "payload")
    _usage(p, "payload")
    state = _state(p, "payload", _AGENT_STATES)
    if state == "turn_in_flight":
        _uint(p["phase"], "turn", "payload.phase", positive=True)
    if state == "completed":
        _obj(p["phase"].get("response"), "payload.phase.response")


def _agent_phase(p: dict) -> Phase:
    phase = p["phase"]
    state = phase["state"]
    if state == "turn_in_flight":
        return Phase(PhaseClass.IN_FLIGHT, f"turn_in_flight turn {phase['turn']}")
    if state == "completed":
        return Phase(PhaseClass.COMPLETED, f"completed after {p['turns']} turn(s)")
    return Phase(PhaseClass.STABLE, f"ready_for_turn turn {p['turns'] + 1}")


def _agent_identity(p: dict) -> Identity:
    return Identity(agent=p["agent"], model=f"{p['model']['provider']}/{p['model']['name']}")


register("runifold.agent", 1, VersionSpec(_agent_validate, _agent_phase, _agent_identity,
                                          runifold_usage),
         "runifold agent loop (RUNIFOLD.md section 2)")


# --- runifold.workflow v3, v4 --------------------------------------------------------------

_BRANCH_STATES = {"in_flight", "completed", "failed", "cancelled"}


def _workflow_validator(version: int) -> Callable[[Any], None]:
    states = {"ready", "step_in_flight", "parallel_in_flight", "race_in_flight", "completed"}
    if version >= 4:
        states = states | {"waiting"}

    def validate(payload: Any) -> None:
        p = _obj(payload, "payload")
        _str(p, "workflow", "payload")
        # RUNIFOLD.md §3: workflow_version is a u32 > 0.
        _uint(p, "workflow_version", "payload", positive=True, bits=32)
        _usage(p, "payload")  # the Usage snapshot (RUNIFOLD.md §3), counters u64
        layout = p.get("layout")
        if not isinstance(layout, list) or not all(isinstance(s, str) for s in layout):
            raise SchemaError("payload.layout must be an array of step ids")
        next_index = _uint(p, "next_index", "payload")
        if next_index > len(layout):
            raise SchemaError("payload.next_index is past the end of payload.layout")
        outputs = _obj(p.get("outputs"), "payload.outputs")
        if set(outputs) != set(layout[:next_index]):
            raise SchemaError("payload.outputs must hold exactly layout[:next_index]")
        state = _state(p, "payload", states)
        phase = p["phase"]
        if state in {"step_in_flight", "waiting", "parallel_in_flight", "race_in_flight"}:
            _str(phase, "step", "payload.phase")
        if state in {"parallel_in_flight", "race_in_flight"}:
            branches = _obj(phase.get("branches"), "payload.phase.branches")
            for name, branch in branches.items():
                b = _obj(branch, f"payload.phase.branches.{name}")
                if b.get("state") not in _BRANCH_STATES:
                    raise SchemaError(
                        f"payload.phase.branches.{name}.state must be one of "
                        f"{sorted(_BRANCH_STATES)}"
                    )
        if state == "waiting":
            _obj(phase.get("wait"), "payload.phase.wait")
        if state == "completed":
            _obj(phase.get("outcome"), "payload.phase.outcome")
            if next_index != len(layout):
                raise SchemaError("payload.next_index must equal len(layout) when completed")

    return validate


def _workflow_phase(p: dict) -> Phase:
    phase = p["phase"]
    state = phase["state"]
    step = phase.get("step", "")
    if state == "ready":
        nxt = p["layout"][p["next_index"]] if p["next_index"] < len(p["layout"]) else "end"
        return Phase(PhaseClass.STABLE, f"ready next {nxt}")
    if state == "waiting":
        return Phase(PhaseClass.STABLE, f"waiting {step} on {phase['wait'].get('kind', '?')}")
    if state == "step_in_flight":
        return Phase(PhaseClass.IN_FLIGHT, f"step_in_flight {step}")
    if state in {"parallel_in_flight", "race_in_flight"}:
        branches = phase["branches"]
        counts: dict[str, int] = {}
        for b in branches.values():
            counts[b["state"]] = counts.get(b["state"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        if state == "parallel_in_flight":
            settled = bool(branches) and counts.get("completed", 0) == len(branches)
        else:
            settled = counts.get("completed", 0) > 0 or (
                bool(branches) and counts.get("failed", 0) == len(branches)
            )
        return Phase(PhaseClass.STABLE if settled else PhaseClass.IN_FLIGHT, f"{state} {step} ({summary})")
    return Phase(PhaseClass.COMPLETED, f"completed {len(p['layout'])} step(s)")


def _workflow_identity(p: dict) -> Identity:
    return Identity(workflow=p["workflow"], definition_version=str(p["workflow_version"]))


for _v in (3, 4):
    register("runifold.workflow", _v,
             VersionSpec(_workflow_validator(_v), _workflow_phase, _workflow_identity,
                         runifold_usage),
             "runifold workflow (RUNIFOLD.md section 3)")


# --- acme.order v1, v2 (the demo kind) ----------------------------------------------------

ACME_PHASES = {
    "ready": PhaseClass.STABLE,
    "charging": PhaseClass.IN_FLIGHT,
    "charged": PhaseClass.STABLE,
    "shipping": PhaseClass.IN_FLIGHT,
    "completed": PhaseClass.COMPLETED,
    "cancelled": PhaseClass.COMPLETED,
}


def _acme_validator(version: int) -> Callable[[Any], None]:
    """v1: ``amount_cents`` (an integer >= 0); v2: ``amount`` (``{"cents": integer >= 0,
    "currency": three capital letters}``), and no ``amount_cents``."""

    def validate(payload: Any) -> None:
        p = _obj(payload, "payload")
        phase = p.get("phase")
        if phase not in ACME_PHASES:
            raise SchemaError(f"payload.phase must be one of {sorted(ACME_PHASES)}")
        for key in ("order_id", "workflow"):
            if key in p and not isinstance(p[key], str):
                raise SchemaError(f"payload.{key} must be a string")
        if version == 1:
            return _cents(p, "amount_cents", "payload")
        if "amount_cents" in p:
            raise SchemaError("payload.amount_cents is v1's; v2 holds payload.amount")
        if "amount" in p:
            amount = _obj(p["amount"], "payload.amount")
            _cents(amount, "cents", "payload.amount", required=True)
            if not re.fullmatch(r"[A-Z]{3}", str(amount.get("currency"))):  # ISO 4217
                raise SchemaError("payload.amount.currency must be three capital letters")

    return validate


def _cents(obj: dict, key: str, where: str, *, required: bool = False) -> None:
    if (key in obj or required) and (type(obj.get(key)) is not int or obj[key] < 0):
        raise SchemaError(f"{where}.{key} must be an integer >= 0")


def _acme_phase(p: dict) -> Phase:
    # The phase only: the order id is business data of the payload, and labels are shown
    # to viewers, who may not see payloads (issue 6, fault 3).
    return Phase(ACME_PHASES[p["phase"]], p["phase"])


def _acme_identity(p: dict) -> Identity:
    version = p.get("definition_version")
    return Identity(workflow=str(p.get("workflow") or "acme.order"),
                    definition_version="" if version is None else str(version))


for _v in (1, 2):
    register("acme.order", _v, VersionSpec(_acme_validator(_v), _acme_phase, _acme_identity),
             "demo order workflow: charge a card, then ship")

# The shipped migrations (the steps themselves: ``upcasters``).
register_migration("acme.order", 1, upcasters.acme_amount_up, upcasters.acme_amount_down,
                   name="acme.order amount_cents -> amount")
register_migration("runifold.workflow", 3, upcasters.workflow_v4_up, upcasters.workflow_v3_down,
                   name="runifold.workflow waiting + lineage")


# --- langgraph.checkpoint v1 (issue 10, docs/langgraph.md) --------------------------------
#
# The envelope of one LangGraph (thread, namespace): a summary of the namespace's head
# written by ``interop.langgraph`` (never channel values: labels are shown to viewers).

LANGGRAPH_KIND = "langgraph.checkpoint"
#: Longest node list a phase label spells out; the rest is "+N more".
_LABEL_NODES = 120


def _langgraph_validate(payload: Any) -> None:
    p = _obj(payload, "payload")
    for key, limit, required in (("thread_id", 256, True), ("checkpoint_ns", 256, False),
                                 ("checkpoint_id", 128, True)):
        value = p.get(key)
        if not isinstance(value, str) or (required and not value) or len(value) > limit:
            raise SchemaError(f"payload.{key} must be a string of "
                              f"{1 if required else 0}..{limit} characters")
    parent = p.get("parent_checkpoint_id")
    if parent is not None and (not isinstance(parent, str) or not 0 < len(parent) <= 128):
        raise SchemaError("payload.parent_checkpoint_id must be null or a string of "
                          "1..128 characters")
    step = p.get("step")
    if step is not None and type(step) is not int:
        raise SchemaError("payload.step must be an integer or null")
    if not isinstance(p.get("source", ""), str):
        raise SchemaError("payload.source must be a string")
    nxt = p.get("next")
    if not isinstance(nxt, list) or not all(isinstance(n, str) and n for n in nxt):
        raise SchemaError("payload.next must be an array of node names")
    tasks = _uint(p, "tasks", "payload")
    if tasks < len(nxt):
        raise SchemaError("payload.tasks must be at least len(payload.next)")
    _uint(p, "written_tasks", "payload")
    for key in ("interrupted", "errored"):
        if type(p.get(key)) is not bool:
            raise SchemaError(f"payload.{key} must be true or false")
    bp = p.get("breakpoint")
    if bp is not None:
        _obj(bp, "payload.breakpoint")
        nodes = bp.get("nodes")
        if bp.get("when") not in ("before", "after") or not isinstance(nodes, list) or not (
                nodes and all(isinstance(n, str) and n for n in nodes)):
            raise SchemaError('payload.breakpoint must be {"when": "before" | "after", '
                              '"nodes": [node names]}')
    identity = p.get("identity", {})
    _obj(identity, "payload.identity")
    unknown = set(identity) - set(IDENTITY_LIMITS)
    if unknown:
        raise SchemaError("payload.identity may hold only agent, model, workflow and "
                          "definition_version")


def _node_words(nodes: list[str]) -> str:
    """``"a, b"``; a long list ends with ``"+N more"`` (labels stay short)."""
    words, shown = "", 0
    for node in nodes:
        candidate = f"{words}, {node}" if words else node
        if len(candidate) > _LABEL_NODES:
            break
        words, shown = candidate, shown + 1
    if shown < len(nodes):
        more = f"+{len(nodes) - shown} more"
        words = f"{words} {more}" if words else more
    return words


def _langgraph_phase(p: dict) -> Phase:
    """From the head's summary (docs/langgraph.md, "Mapping"): no next node and no task:
    ``completed``; an interrupt write: ``stable`` (waiting for input); an error write:
    ``stable``; paused at a static breakpoint (``breakpoint``, no task written yet):
    ``stable`` ("paused before b"); every task has written: ``stable`` (between steps);
    else ``in_flight``. Labels name nodes (graph structure), never channel values."""
    nxt, tasks, written = p["next"], p["tasks"], p["written_tasks"]
    nodes = _node_words(nxt) if nxt else "sent tasks"
    if not nxt and tasks == 0:
        return Phase(PhaseClass.COMPLETED, "done")
    if p["interrupted"]:
        return Phase(PhaseClass.STABLE, f"waiting for input at {nodes}")
    if p["errored"]:
        return Phase(PhaseClass.STABLE, f"error in {nodes}")
    bp = p.get("breakpoint")
    if bp and written == 0:
        return Phase(PhaseClass.STABLE, f"paused {bp['when']} {_node_words(bp['nodes'])}")
    if written >= tasks:
        return Phase(PhaseClass.STABLE, "between steps")
    return Phase(PhaseClass.IN_FLIGHT, f"running {nodes} ({written}/{tasks} tasks written)")


def _langgraph_identity(p: dict) -> Identity:
    ident = p.get("identity", {})
    return Identity(**{name: ident.get(name, "") for name in IDENTITY_LIMITS})


register(LANGGRAPH_KIND, 1,
         VersionSpec(_langgraph_validate, _langgraph_phase, _langgraph_identity),
         "a LangGraph thread's namespace: a summary of its newest checkpoint (docs/langgraph.md)")


# --- the end of the built-in kinds; the user's come from RECOVERY_KIND_MODULES ------------

BUILTIN_KINDS = frozenset(_REGISTRY)


def description(kind: str) -> str:
    """The kind's one-line description (``register``), "" when it is not registered."""
    spec = _REGISTRY.get(kind)
    return spec.description if spec else ""
