"""The validator a declared kind's schema runs (issue 19; ``kinds.declarative``):
jsonschema's Draft 2020-12 with ``pattern`` in RE2 (linear time, never Python's
backtracking ``re``), ``uniqueItems`` by hashing (linear, not pairwise), and every keyword
charged against a per-payload budget of steps (``MAX_VALIDATION_STEPS``) and nesting
(``MAX_VALIDATION_NESTING``), so no declaration, however hostile, makes one payload's
validation take more than a few seconds or overflow the stack. Pure: no Django."""

from __future__ import annotations

import contextvars
from typing import Any

import jsonschema
import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

# --- the schema and its bounds ----------------------------------------------------------

def _re2_pattern(validator, pattern, instance, schema):
    """``pattern`` through RE2 (linear time) instead of Python's backtracking ``re``."""
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"does not match the schema's pattern {pattern[:80]!r}")


_PATTERNS: dict[str, Any] = {}


def _compiled(pattern: str):
    found = _PATTERNS.get(pattern)
    if found is None:
        if len(_PATTERNS) > 4096:
            _PATTERNS.clear()
        options = re2.Options()
        options.max_mem = 1 << 20
        options.log_errors = False
        found = _PATTERNS[pattern] = re2.compile(pattern, options)
    return found


# --- the validation budget ----------------------------------------------------------------
#
# The schema's bounds (``MAX_SCHEMA_COST``, its size) cannot bound the work of validating a
# payload: ``allOf`` of 999 subschemas under ``items`` is one cheap schema, and applied to
# the 500,000 items of a 1 MiB payload it is hours of work; so is ``enum`` of 7,000
# values, and ``uniqueItems`` over objects (jsonschema compares them pairwise). So every
# keyword the validator runs is charged against ``MAX_VALIDATION_STEPS`` for one payload:
# one step, plus the subschemas it applies (``_FAN_OUT``: each branch of allOf/anyOf/oneOf,
# each item or property it descends into) and ``enum``'s comparisons. Past the budget the
# payload is refused (``SchemaError``, so the checkpoint is stored as schema_mismatch):
# the same answer for the same payload and declaration on every machine, under any load,
# unlike a clock. The weights are measured (docs/kinds.md "Hostile declarations").

#: Keywords nested in one another while a payload is checked, at most (2 to 3 of
#: Python's stack frames each: a payload 64 levels deep under ``{"items": {"$ref": "#"}}``
#: nests 128), so validation never overflows the stack, whoever calls it.
MAX_VALIDATION_NESTING = 250
#: Steps one payload's validation may take (a few seconds of work on one core, measured).
MAX_VALIDATION_STEPS = 1_000_000
#: The weight of one subschema an applicator descends into, and of one ``enum`` value compared.
_DESCEND = 2
_ENUM_PER_STEP = 8
#: The weight of one error a keyword reports (jsonschema builds an object for each).
_ERROR = 2

_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "declared_validation_budget", default=None)


class TooCostly(Exception):
    """The payload's validation went past ``MAX_VALIDATION_STEPS``."""


class TooDeep(TooCostly):
    """The payload's validation nested keywords deeper than ``MAX_VALIDATION_NESTING``."""


def _fan_out(keyword: str, value: Any, instance: Any) -> int:
    if keyword in ("allOf", "anyOf", "oneOf"):
        return _DESCEND * len(value) if isinstance(value, list) else 0
    if keyword == "enum":
        return len(value) // _ENUM_PER_STEP if isinstance(value, list) else 0
    if keyword in ("not", "if", "then", "else", "$ref", "contentSchema"):
        return _DESCEND
    if isinstance(instance, list | dict):  # items, properties, contains, unevaluated*, ...
        return _DESCEND * len(instance)
    return 0


def _charged(keyword: str, function):
    """``function`` (a jsonschema keyword), charged against the running budget first."""
    def run(validator, value, instance, schema):
        budget = _BUDGET.get()
        if budget is None:
            yield from function(validator, value, instance, schema) or ()
            return
        budget[0] -= 1 + _fan_out(keyword, value, instance)
        if budget[0] < 0:
            raise TooCostly
        budget[1] += 1
        try:
            if budget[1] > MAX_VALIDATION_NESTING:
                raise TooDeep
            for error in function(validator, value, instance, schema) or ():
                budget[0] -= _ERROR
                if budget[0] < 0:
                    raise TooCostly
                yield error
        finally:
            budget[1] -= 1
    return run


def _json_key(value: Any):
    """A hashable key equal for JSON values jsonschema deems equal (``1 == 1.0``, never
    ``true == 1``; objects by their keys and values), for ``uniqueItems`` in linear time."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_json_key(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _json_key(v)) for k, v in value.items()))
    return ("?", id(value))


def _unique_items(validator, unique, instance, schema):
    """``uniqueItems`` by hashing (jsonschema's compares objects pairwise: quadratic)."""
    if unique and validator.is_type(instance, "array"):
        if len({_json_key(item) for item in instance}) != len(instance):
            yield ValidationError("has non-unique elements")


def _budgeted(base):
    keywords = dict(base.VALIDATORS)
    keywords["pattern"] = _re2_pattern
    keywords["uniqueItems"] = _unique_items
    return validators.extend(base, {k: _charged(k, f) for k, f in keywords.items()})


#: Draft 2020-12 with ``pattern`` in RE2, ``uniqueItems`` in linear time and every keyword
#: charged against the validation budget; no format assertions, no remote references.
Validator = _budgeted(Draft202012Validator)


def budgeted_errors(validator, payload: Any, steps: int = MAX_VALIDATION_STEPS):
    """The best-matching ``ValidationError`` of ``payload`` or ``None``, within ``steps``
    (raises ``TooCostly`` past them)."""
    token = _BUDGET.set([steps, 0])  # steps left, keywords open
    try:
        return jsonschema.exceptions.best_match(validator.iter_errors(payload))
    finally:
        _BUDGET.reset(token)
