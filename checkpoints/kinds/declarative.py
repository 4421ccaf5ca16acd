"""Declarative kinds (issue 19, item 1; docs/kinds.md "Declaring a kind without Python"):
a tenant's admin declares a kind version as data, a JSON Schema (Draft 2020-12, checked
with the ``jsonschema`` library) and a phase map, and optionally the migration from the
version before it as a list of operations. This module turns such a declaration into
the same ``VersionSpec`` and ``upcasters.Migration`` a Python kind registers; it is pure
(no Django, no I/O). The store, the rights and the audit are ``services.kinds``; the
per-tenant look-up, ``checkpoints.declared``.

The declaration (the body of ``PUT …/kinds/{kind}/versions/{v}``; every key but
``schema`` and ``phase`` optional, any other key refused)::

    {"description": "Refunds, declared",
     "schema": {...JSON Schema, Draft 2020-12...},
     "phase": {"pointer": "/state", "stable": ["ready"], "in_flight": ["refunding"],
               "completed": ["refunded", "rejected"], "label": "refund {phase}, try {/try}"},
     "identity": {"agent": "/agent", "model": "/model", "workflow": "/workflow",
                  "definition_version": "/code_version"},
     "usage": {"tokens": "/usage/tokens"},
     "migration": {"ops": [{"op": "rename", "from": "/amount", "to": "/amount_cents"}]}}

- ``phase.pointer`` (RFC 6901) names the phase field; its value must be one of the
  listed strings, each in exactly one class. ``label`` (default ``"{phase}"``) may name
  ``{phase}`` and ``{/pointer}`` of an integer or boolean field, never a string field: a
  label is shown to viewers, who may not see payloads (issue 6, fault 3).
- ``identity`` pointers name string (or integer, for ``definition_version``) fields; a
  missing field is an empty part. ``usage`` pointers name integer counters in 0..2^64-1
  that never decrease from one revision to the next (CONTRACT.md 8).
- ``migration.ops``: the step from version ``v-1`` to this one, applied in order; its
  inverse is derived (``compile_ops``). ``rename`` / ``move`` ``{from, to}``, ``add``
  ``{path, value}`` and ``map_values`` ``{path, map}`` with a one-to-one map are
  reversible (the parent object of a ``to`` or ``path`` must exist: ``add`` it first, so
  the inverse can remove exactly what the step made); ``set_default`` ``{path, value}`` and ``remove`` ``{path}`` are not, and
  make the whole step one-way.

A hostile schema is refused, naming why (``DeclarationError``): more than
``MAX_DECLARATION_BYTES`` of JSON or ``MAX_SCHEMA_DEPTH`` levels; not a valid Draft
2020-12 schema; a ``$ref`` outside the document, or ``$id`` / ``$anchor`` /
``$dynamicRef`` / ``$dynamicAnchor``; ``patternProperties``; a ``pattern`` that RE2
(linear time, no backtracking: ``google-re2``) cannot compile, or that nests groups
deeper than ``MAX_PATTERN_NESTING``; a chain of ``$ref`` /
``allOf`` / ``anyOf`` / ``oneOf`` / ``not`` / ``if`` that loops without descending
into the payload; or more than ``MAX_SCHEMA_COST`` subschemas applied to one value of
the payload. Every pattern runs in linear time; and validating one payload is bounded
by ``MAX_VALIDATION_STEPS`` (the validation budget below; past it the payload is refused).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError as JsonSchemaError

from .. import upcasters
from ..jsonparse import name_problem, shown
from ..vocab import PhaseClass
from . import Identity, Phase, SchemaError, VersionSpec  # the registry (it never imports this)
from .validation import (  # noqa: F401 - the validator's bounds, read as declarative.X too
    MAX_VALIDATION_NESTING,
    MAX_VALIDATION_STEPS,
    TooCostly,
    TooDeep,
    Validator,
    _compiled,
    budgeted_errors,
)

#: Bounds of one declaration (the whole body, as compact JSON) and of its schema.
MAX_DECLARATION_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
#: Groups nested in one ``pattern``, at most (the schema check's ``regex`` format compiles
#: it with Python's ``re`` too, whose parser recurses once per level).
MAX_PATTERN_NESTING = 64
#: Subschemas applied in place (``$ref``, ``allOf``, ...) to one value of a payload, at most.
MAX_SCHEMA_COST = 1_000
#: The longest chain of ``$ref``/``allOf``/... from one subschema without descending into
#: the payload (jsonschema recurses through each: a chain of 400 ``$ref`` overflowed
#: Python's stack when checked, and of 900 when declared).
MAX_IN_PLACE_CHAIN = 16
MAX_POINTER_TOKENS = 16
MAX_PHASE_VALUES = 100
MAX_OPS = 50
MAX_LABEL = 200
U64_MAX = 2**64 - 1

_BODY_KEYS = {"description", "schema", "phase", "identity", "usage", "migration"}
_PHASE_KEYS = {"pointer", "label", PhaseClass.STABLE, PhaseClass.IN_FLIGHT, PhaseClass.COMPLETED}
_IDENTITY_KEYS = ("agent", "model", "workflow", "definition_version")
_COUNTER_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
_LABEL_FIELD_RE = re.compile(r"\{([^{}]*)\}")
#: Keywords that apply a subschema to the same value (cost), and those that descend.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("not", "if", "then", "else")
_REFUSED_KEYWORDS = ("$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
                     "$recursiveAnchor", "patternProperties")


class DeclarationError(ValueError):
    """A declaration refused; ``field`` names where (``schema``, ``phase.pointer``,
    ``migration.ops[2].from`` ...), the message why (never a payload value)."""

    def __init__(self, field: str, message: str):
        field = shown(field, 200)  # a client's key, echoed: one printable line (stop 33)
        super().__init__(f"{field}: {message}")
        self.field = field


# --- JSON pointers (RFC 6901) -----------------------------------------------------------

_MISSING = object()


def parse_pointer(text: Any, field: str) -> tuple[str, ...]:
    """``"/a/b~1c"`` -> ``("a", "b/c")``. The root (``""``) is refused: a declaration's
    pointers name a field. Raises ``DeclarationError`` naming ``field``."""
    if not isinstance(text, str) or not text.startswith("/") or len(text) > 512:
        raise DeclarationError(field, "must be a JSON pointer such as \"/phase\" (RFC 6901)")
    tokens = tuple(t.replace("~1", "/").replace("~0", "~") for t in text[1:].split("/"))
    if len(tokens) > MAX_POINTER_TOKENS or any(re.search(r"~(?![01])", t)
                                               for t in text[1:].split("/")):
        raise DeclarationError(field, f"must be a JSON pointer of at most "
                                      f"{MAX_POINTER_TOKENS} parts (RFC 6901)")
    return tokens


def _get(payload: Any, tokens: tuple[str, ...]) -> Any:
    current = payload
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                return _MISSING
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            return _MISSING
    return current


def _show(tokens: tuple[str, ...]) -> str:
    return "/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in tokens)


def check_schema(schema: Any) -> None:
    """Refuse a schema that is not Draft 2020-12 or is hostile (module docstring).
    Raises ``DeclarationError`` with ``field`` ``schema`` or ``schema<pointer>``."""
    if not isinstance(schema, dict):
        raise DeclarationError("schema", "must be a JSON Schema object (Draft 2020-12)")
    dialect = schema.get("$schema", jsonschema.Draft202012Validator.META_SCHEMA["$id"])
    if dialect != Draft202012Validator.META_SCHEMA["$id"]:
        raise DeclarationError("schema/$schema", "must be "
                               f"{Draft202012Validator.META_SCHEMA['$id']} (Draft 2020-12)")
    nodes: dict[tuple, Any] = {}
    _walk(schema, (), 0, nodes)
    try:
        Draft202012Validator.check_schema(schema)
    except RecursionError:  # a bound above missed something: refused, never a 500
        raise DeclarationError("schema", "is too deeply nested to check") from None
    except JsonSchemaError as exc:
        where = _show(tuple(str(p) for p in exc.path)) if exc.path else ""
        raise DeclarationError("schema" + where, f"not a valid Draft 2020-12 schema "
                                                 f"({exc.validator} rule)") from None
    _check_cost(schema, nodes)


def _walk(node: Any, path: tuple, depth: int, nodes: dict) -> None:
    """Depth, refused keywords, local references, RE2 patterns; fills ``nodes`` with
    every subschema (by path) for ``_check_cost``."""
    if depth > MAX_SCHEMA_DEPTH:
        raise DeclarationError("schema", f"is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, (*path, str(i)), depth + 1, nodes)
        return
    if not isinstance(node, dict):
        return
    nodes[path] = node
    where = "schema" + _show(path) if path else "schema"
    for keyword in _REFUSED_KEYWORDS:
        if keyword in node and not (path and path[-1] in ("properties", "$defs")):
            raise DeclarationError(f"{where}/{keyword}", "is not allowed in a declared kind "
                                   "(local \"#/...\" references only; no patternProperties: "
                                   "use propertyNames with a pattern)")
    ref = node.get("$ref")
    if ref is not None and not (path and path[-1] in ("properties", "$defs")):
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise DeclarationError(f"{where}/$ref", "must be a local reference (\"#\" or "
                                   "\"#/...\"): nothing outside the schema is fetched")
    pattern = node.get("pattern")
    if isinstance(pattern, str) and not (path and path[-1] in ("properties", "$defs")):
        if _nesting(pattern) > MAX_PATTERN_NESTING:
            raise DeclarationError(f"{where}/pattern", f"nests groups deeper than "
                                   f"{MAX_PATTERN_NESTING} levels")
        try:
            _compiled(pattern)
        except Exception:  # re2.error, and RE2's own limits
            raise DeclarationError(f"{where}/pattern", "must be a regular expression RE2 "
                                   "accepts (no backreferences or lookaround; linear time)") \
                from None
    for key, value in node.items():
        _walk(value, (*path, key), depth + 1, nodes)


def _nesting(pattern: str) -> int:
    """How deep ``pattern``'s parentheses nest (escaped ones and those in a class not
    counted; an unbalanced one is RE2's to refuse)."""
    depth = deepest = 0
    escaped = in_class = False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(0, depth - 1)
    return deepest


def _resolve_local(schema: dict, ref: str) -> tuple | None:
    if ref == "#":
        return ()
    tokens = tuple(t.replace("~1", "/").replace("~0", "~") for t in ref[2:].split("/"))
    node: Any = schema
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise DeclarationError("schema/$ref", f"{ref[:100]!r} points at nothing in the schema")
    return tokens


def _in_place(schema: dict, path: tuple, node: dict) -> list[tuple]:
    out = []
    if isinstance(node.get("$ref"), str):
        out.append(_resolve_local(schema, node["$ref"]))
    for keyword in _IN_PLACE_LISTS:
        if isinstance(node.get(keyword), list):
            out.extend((*path, keyword, str(i)) for i in range(len(node[keyword])))
    for keyword in _IN_PLACE_ONE:
        if isinstance(node.get(keyword), dict):
            out.append((*path, keyword))
    if isinstance(node.get("dependentSchemas"), dict):
        out.extend((*path, "dependentSchemas", k) for k in node["dependentSchemas"])
    return out


def _check_cost(schema: dict, nodes: dict) -> None:
    """How many subschemas apply to one payload value through ``$ref`` and the in-place
    applicators, from each subschema: a loop, or more than ``MAX_SCHEMA_COST``, refuses."""
    cost: dict[tuple, int] = {}
    active: set[tuple] = set()

    def visit(path: tuple) -> int:
        if path in cost:
            return cost[path]
        if path in active:
            raise DeclarationError("schema" + _show(path), "is reached again from itself "
                                   "through $ref/allOf/anyOf/oneOf/not/if without descending "
                                   "into the payload (an endless loop)")
        node = nodes.get(path)
        if not isinstance(node, dict):
            return 1
        if len(active) >= MAX_IN_PLACE_CHAIN:
            raise DeclarationError("schema" + _show(path), f"ends a chain of more than "
                                   f"{MAX_IN_PLACE_CHAIN} $ref/allOf/anyOf/oneOf/not/if "
                                   "without descending into the payload")
        active.add(path)
        total = 1 + sum(visit(child) for child in _in_place(schema, path, node))
        active.discard(path)
        if total > MAX_SCHEMA_COST:
            raise DeclarationError("schema" + _show(path), f"applies more than "
                                   f"{MAX_SCHEMA_COST} subschemas to one value "
                                   "(nested $ref/anyOf/oneOf multiply)")
        cost[path] = total
        return total

    for path in list(nodes):
        visit(path)


# --- the declaration --------------------------------------------------------------------

@dataclass(frozen=True)
class Declaration:
    """A checked declaration of one kind version (module docstring); ``body`` is the
    declaration as given, ``digest`` the SHA-256 of its canonical JSON."""

    kind: str
    version: int
    body: dict
    digest: str
    description: str
    phase_pointer: tuple[str, ...]
    phases: dict[str, str]  # phase value -> phase class
    label: str
    identity: dict[str, tuple[str, ...]]
    usage: dict[str, tuple[str, ...]]
    ops: tuple[dict, ...] | None

    def spec(self):
        """The ``VersionSpec`` (validate, phase, identity, usage) of this version."""
        validator = Validator(self.body["schema"])
        where = _show(self.phase_pointer)

        def validate(payload: Any) -> None:
            try:
                error = budgeted_errors(validator, payload)
            except TooDeep:
                raise SchemaError(f"payload nests deeper than the declared schema can check "
                                  f"({MAX_VALIDATION_NESTING} keywords within one another)") \
                    from None
            except TooCostly:
                raise SchemaError(f"payload takes more than {MAX_VALIDATION_STEPS} steps to "
                                  "check against the declared schema (a smaller payload, or "
                                  "a schema with fewer alternatives or enum values)") from None
            if error is not None:
                # The schema's own path, never the payload's: a payload's keys may be data.
                rule = _show(tuple(str(p) for p in error.absolute_schema_path))
                raise SchemaError(f"payload breaks the schema's rule at #{rule[:200]}")
            value = _get(payload, self.phase_pointer)
            if not isinstance(value, str) or value not in self.phases:
                raise SchemaError(f"payload{where} must be one of "
                                  f"[{', '.join(sorted(self.phases))}]")

        def phase(payload: dict):
            value = _get(payload, self.phase_pointer)
            return Phase(self.phases[value], self._label(payload, value))

        def identity(payload: dict):
            parts = {}
            for name, tokens in self.identity.items():
                value = _get(payload, tokens)
                if value is _MISSING or value is None:
                    value = ""
                elif name == "definition_version" and type(value) is int:
                    value = str(value)
                elif not isinstance(value, str):
                    raise SchemaError(f"payload{_show(tokens)} ({name}) must be a string")
                parts[name] = value
            return Identity(**parts)

        def usage(payload: dict) -> dict[str, int]:
            counters = {}
            for name, tokens in self.usage.items():
                value = _get(payload, tokens)
                if value is _MISSING:
                    continue
                if type(value) is not int or not 0 <= value <= U64_MAX:
                    raise SchemaError(f"payload{_show(tokens)} (usage {name}) must be an "
                                      "integer in 0..2^64-1")
                counters[name] = value
            return counters

        return VersionSpec(validate, phase, identity, usage if self.usage else None)

    def _label(self, payload: dict, value: str) -> str:
        def field(match: re.Match) -> str:
            name = match.group(1)
            if name == "phase":
                return value
            found = _get(payload, parse_pointer(name, "phase.label"))
            return str(found).lower() if type(found) in (int, bool) else "?"
        return _LABEL_FIELD_RE.sub(field, self.label)[:256]

    def migration(self, kind: str) -> upcasters.Migration | None:
        """The step from ``version - 1`` to this version, or ``None`` if none is declared."""
        if self.ops is None:
            return None
        up, down = compile_ops(self.ops)
        return upcasters.Migration(kind, self.version - 1, up, down,
                                   f"{kind} v{self.version - 1}->v{self.version} (declared)")


def canonical(body: Any) -> str:
    """The canonical JSON of a declaration (sorted keys, no spaces): what is digested."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_declaration(kind: str, version: int, body: Any) -> Declaration:
    """Check ``body`` as the declaration of ``kind`` version ``version`` (module docstring)
    and return it. Raises ``DeclarationError`` naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise DeclarationError("body", "must be a JSON object")
    unknown = sorted(set(body) - _BODY_KEYS)
    if unknown:
        raise DeclarationError(unknown[0][:64], f"unknown field (allowed: {', '.join(sorted(_BODY_KEYS))})")
    text = canonical(body)
    if len(text.encode("utf-8")) > MAX_DECLARATION_BYTES:
        raise DeclarationError("body", f"is larger than {MAX_DECLARATION_BYTES} bytes")
    _check_numbers(body)
    description = body.get("description", "")
    if not isinstance(description, str) or len(description) > 200:
        raise DeclarationError("description", "must be text of at most 200 characters")
    if "schema" not in body:
        raise DeclarationError("schema", "is required")
    check_schema(body["schema"])
    pointer, phases, label = _parse_phase(body.get("phase"))
    identity = _pointers(body.get("identity", {}), "identity", allowed=_IDENTITY_KEYS)
    usage = _pointers(body.get("usage", {}), "usage", allowed=None)
    ops = None
    if "migration" in body:
        migration = body["migration"]
        if not isinstance(migration, dict) or set(migration) != {"ops"}:
            raise DeclarationError("migration", "must be {\"ops\": [...]}")
        if version < 1:
            raise DeclarationError("migration", "version 0 has no version before it")
        ops = tuple(_check_op(op, i) for i, op in enumerate(_list(migration["ops"],
                                                                      "migration.ops")))
    return Declaration(kind, version, body, hashlib.sha256(text.encode("utf-8")).hexdigest(),
                       description, pointer, phases, label, identity, usage, ops)


def _check_numbers(body: dict) -> None:
    """Refuse a number the database would not give back as given, naming where
    (``schema/properties/n/const``): PostgreSQL's ``jsonb`` keeps numbers as decimals, so
    a float written with an exponent upwards (``1e300``, ``1e+16``: Python's form of any
    float of 16 digits or more) reads back as an integer (``const``/``enum`` then compare
    differently, and the stored body no longer has its digest), and ``-0.0`` as ``0.0``."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, (*path, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, str(i))) for i, v in enumerate(value))
        elif isinstance(value, float) and (
                "e+" in repr(value) or (value == 0 and math.copysign(1, value) < 0)):
            where = path[0] + _show(path[1:]) if len(path) > 1 else path[0]
            raise DeclarationError(where[:200], f"the number {value!r} would be stored as "
                                   "another one (the database keeps it as an integer, or "
                                   "-0.0 as 0): write it as an integer or without an "
                                   "exponent")


def _list(value: Any, field: str) -> list:
    if not isinstance(value, list) or not value or len(value) > MAX_OPS:
        raise DeclarationError(field, f"must be a list of 1..{MAX_OPS} items")
    return value


def _parse_phase(phase: Any):
    if not isinstance(phase, dict):
        raise DeclarationError("phase", "is required: {\"pointer\", \"stable\", "
                               "\"in_flight\", \"completed\", \"label\"?}")
    unknown = sorted(set(phase) - _PHASE_KEYS)
    if unknown:
        raise DeclarationError(f"phase.{unknown[0][:64]}", "unknown field")
    pointer = parse_pointer(phase.get("pointer"), "phase.pointer")
    phases: dict[str, str] = {}
    for cls in (PhaseClass.STABLE, PhaseClass.IN_FLIGHT, PhaseClass.COMPLETED):
        values = phase.get(cls, [])
        if not isinstance(values, list) or not all(
                isinstance(v, str) and 0 < len(v) <= 64 for v in values):
            raise DeclarationError(f"phase.{cls}", "must be a list of phase values "
                                   "(strings of 1..64 characters)")
        for value in values:
            if name_problem(value):  # a phase label is shown to people as it is
                raise DeclarationError(f"phase.{cls}", f"{value!r}: {name_problem(value)}")
            if value in phases:
                raise DeclarationError(f"phase.{cls}", f"{value!r} is listed twice")
            phases[value] = str(cls)
    if not phases or len(phases) > MAX_PHASE_VALUES:
        raise DeclarationError("phase", f"must list 1..{MAX_PHASE_VALUES} phase values")
    label = phase.get("label", "{phase}")
    if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL:
        raise DeclarationError("phase.label", f"must be text of 1..{MAX_LABEL} characters")
    if name_problem(label):
        raise DeclarationError("phase.label", name_problem(label))
    for name in _LABEL_FIELD_RE.findall(label):
        if name != "phase":
            parse_pointer(name, "phase.label")
    return pointer, phases, label


def _pointers(value: Any, field: str, allowed) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict) or len(value) > 16:
        raise DeclarationError(field, "must be an object of at most 16 names -> JSON pointers")
    out = {}
    for name, pointer in value.items():
        if allowed is not None and name not in allowed:
            raise DeclarationError(f"{field}.{str(name)[:64]}",
                                   f"unknown part (allowed: {', '.join(allowed)})")
        if allowed is None and not _COUNTER_RE.match(name):
            raise DeclarationError(f"{field}.{str(name)[:64]}", "a counter name must match "
                                   "^[a-z][a-z0-9_]{0,63}$")
        out[name] = parse_pointer(pointer, f"{field}.{name}")
    return out


# --- migration operations: ``declared_ops`` (imported last: it reads the pointer helpers
# above; import it through this module, ``declarative.compile_ops``) ---------------------

from .declared_ops import ONE_WAY_OPS, _check_op, compile_ops  # noqa: E402, F401
