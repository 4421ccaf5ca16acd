"""The migration operations of a declared kind (issue 19, item 2; docs/migrations.md
"Declared migrations"): ``rename``, ``move``, ``add``, ``map_values``, ``set_default``,
``remove``, checked (``_check_op``) and compiled into a step up and, when every operation
has one, its derived inverse (``compile_ops``). Pure: no Django. Imported by
``kinds.declarative`` at its end (it reads its pointer helpers); use it as
``declarative.compile_ops``."""

from __future__ import annotations

import copy
from typing import Any

from .. import upcasters
from .declarative import (
    _MISSING,
    MAX_PHASE_VALUES,
    DeclarationError,
    _get,
    _show,
    canonical,
    parse_pointer,
)

_OPS = {"rename": ("from", "to"), "move": ("from", "to"), "add": ("path", "value"),
        "set_default": ("path", "value"), "remove": ("path",), "map_values": ("path", "map")}
ONE_WAY_OPS = ("set_default", "remove")


def _check_op(op: Any, index: int) -> dict:
    where = f"migration.ops[{index}]"
    if not isinstance(op, dict) or op.get("op") not in _OPS:
        raise DeclarationError(f"{where}/op", f"must be one of {', '.join(_OPS)}")
    keys = _OPS[op["op"]]
    if set(op) != {"op", *keys}:
        raise DeclarationError(where, f"{op['op']} takes exactly {', '.join(keys)}")
    out = {"op": op["op"]}
    for key in keys:
        if key in ("from", "to", "path"):
            out[key] = parse_pointer(op[key], f"{where}/{key}")
        else:
            out[key] = op[key]
    if op["op"] == "rename" and out["from"][:-1] != out["to"][:-1]:
        raise DeclarationError(f"{where}/to", "a rename stays in the same object (use move)")
    if op["op"] in ("rename", "move") and (out["from"] == out["to"][:len(out["from"])]
                                            or out["to"] == out["from"][:len(out["to"])]):
        raise DeclarationError(f"{where}/to", "must not be inside from, or from inside it")
    if op["op"] == "map_values":
        mapping = op["map"]
        if not isinstance(mapping, dict) or not mapping or len(mapping) > MAX_PHASE_VALUES:
            raise DeclarationError(f"{where}/map", f"must be an object of 1.."
                                   f"{MAX_PHASE_VALUES} old value -> new value")
        if not all(isinstance(v, str | int | bool) or v is None for v in mapping.values()):
            raise DeclarationError(f"{where}/map", "maps to strings, integers, booleans or null")
    return out


def compile_ops(ops: tuple[dict, ...]):
    """``(up, down)`` of a checked list of operations; ``down`` is ``None`` when one of
    them is one-way (``ONE_WAY_OPS``, or a ``map_values`` that maps two values to one).
    ``up`` raises ``InvalidAfter`` and ``down`` ``NotReversible`` naming the field when
    a payload cannot be carried over exactly (a target already present, a source value
    that is also a target: the round trip ``down(up(x)) == x`` would not hold)."""
    def up(payload: Any) -> Any:
        for op in ops:
            payload = _apply(op, payload, upcasters.InvalidAfter)
        return payload

    inverses = [_inverse(op) for op in reversed(ops)]
    if any(inverse is None for inverse in inverses):
        return up, None

    def down(payload: Any) -> Any:
        for op in inverses:
            payload = _apply(op, payload, upcasters.NotReversible)
        return payload

    return up, down


def _inverse(op: dict) -> dict | None:
    kind = op["op"]
    if kind in ("rename", "move"):
        return {"op": kind, "from": op["to"], "to": op["from"]}
    if kind == "add":
        return {"op": "_drop", "path": op["path"], "value": op["value"]}
    if kind == "map_values":
        mapping = op["map"]
        targets = [canonical(v) for v in mapping.values()]
        if len(set(targets)) != len(targets):
            return None
        return {"op": "map_values", "path": op["path"], "_inverse": True, "map": mapping}
    return None


def _parent(payload: Any, tokens: tuple[str, ...], error, create: bool = False) -> dict:
    current = payload
    for token in tokens[:-1]:
        if not isinstance(current, dict):
            raise error(f"payload{_show(tokens)}: its parent is not an object")
        if token not in current and create:
            current[token] = {}
        current = current.get(token)
    if not isinstance(current, dict):
        raise error(f"payload{_show(tokens)}: its parent is not an object (a step makes no "
                    "parent up: add it first)")
    return current


def _apply(op: dict, payload: Any, error) -> Any:
    kind = op["op"]
    if kind in ("rename", "move"):
        source, target = op["from"], op["to"]
        if _get(payload, source) is _MISSING:
            if _get(payload, target) is not _MISSING:
                raise error(f"payload{_show(target)} is there already")
            return payload
        if _get(payload, target) is not _MISSING:
            raise error(f"payload{_show(target)} is there already")
        target_parent = _parent(payload, target, error)  # never made up: down could not undo it
        target_parent[target[-1]] = _parent(payload, source, error).pop(source[-1])
        return payload
    if kind == "add":
        parent = _parent(payload, op["path"], error)
        if op["path"][-1] in parent:
            raise error(f"payload{_show(op['path'])} is there already")
        parent[op["path"][-1]] = copy.deepcopy(op["value"])
        return payload
    if kind == "_drop":
        parent = _parent(payload, op["path"], error)
        if op["path"][-1] not in parent:
            raise error(f"payload{_show(op['path'])} is missing")
        if canonical(parent[op["path"][-1]]) != canonical(op["value"]):
            raise error(f"payload{_show(op['path'])} no longer holds the value the step added")
        del parent[op["path"][-1]]
        return payload
    if kind == "set_default":
        parent = _parent(payload, op["path"], error, create=True)
        parent.setdefault(op["path"][-1], copy.deepcopy(op["value"]))
        return payload
    if kind == "remove":
        if _get(payload, op["path"]) is not _MISSING:
            del _parent(payload, op["path"], error)[op["path"][-1]]
        return payload
    if kind == "map_values":
        value = _get(payload, op["path"])
        if value is _MISSING:
            return payload
        pairs = [(k, v) for k, v in op["map"].items()]
        if op.get("_inverse"):
            lookup = {canonical(v): k for k, v in pairs}
            sources = {canonical(k) for k, _ in pairs}
        else:
            lookup = {canonical(k): v for k, v in pairs}
            sources = {canonical(v) for _, v in pairs}
        key = canonical(value)
        if key in lookup:
            _parent(payload, op["path"], error)[op["path"][-1]] = copy.deepcopy(lookup[key])
        elif key in sources:
            raise error(f"payload{_show(op['path'])} holds a value the map also produces: "
                        "the step could not be undone exactly")
        return payload
    raise AssertionError(kind)
