"""The declared migration operations (``kinds.declarative.compile_ops``; issue 19, item
2, declarative kinds): for ANY list of operations whose inverse is derived and ANY
payload, the step up either refuses (``InvalidAfter``, naming a field) or its inverse
gives the payload back exactly: ``down(up(x)) == x``. One-way lists have no ``down``.
No database."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoints import upcasters
from checkpoints.kinds import declarative

KEYS = st.sampled_from(["a", "b", "c", "phase", "x~y", "s/t"])
POINTER = st.lists(KEYS, min_size=1, max_size=3).map(
    lambda ts: "/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in ts))
SCALAR = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["r", "s", "t"])
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=2)
                     | st.dictionaries(KEYS, inner, max_size=3), max_leaves=6)
PAYLOAD = st.dictionaries(KEYS, VALUE, max_size=4)
MAP = st.dictionaries(st.sampled_from(["r", "s", "t", "u"]), SCALAR, min_size=1, max_size=3)

OP = st.one_of(
    st.builds(lambda f, t: {"op": "move", "from": f, "to": t}, POINTER, POINTER),
    st.builds(lambda f, t: {"op": "rename", "from": f, "to": t}, KEYS, KEYS).map(
        lambda op: {**op, "from": "/" + op["from"].replace("~", "~0").replace("/", "~1"),
                    "to": "/" + op["to"].replace("~", "~0").replace("/", "~1")}),
    st.builds(lambda p, v: {"op": "add", "path": p, "value": v}, POINTER, VALUE),
    st.builds(lambda p, m: {"op": "map_values", "path": p, "map": m}, POINTER, MAP),
    st.builds(lambda p, v: {"op": "set_default", "path": p, "value": v}, POINTER, VALUE),
    st.builds(lambda p: {"op": "remove", "path": p}, POINTER),
)


def _compiled(ops: list[dict]):
    checked = tuple(declarative._check_op(op, i) for i, op in enumerate(ops))
    return declarative.compile_ops(checked)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.lists(OP, min_size=1, max_size=4), PAYLOAD)
def test_down_after_up_is_the_payload_or_up_refuses(ops, payload):
    try:
        up, down = _compiled(ops)
    except declarative.DeclarationError:
        return  # a list the declaration check refuses (a move into itself...)
    try:
        after = up(copy.deepcopy(payload))
    except upcasters.InvalidAfter:
        return
    if down is None:
        assert any(op["op"] in declarative.ONE_WAY_OPS or op["op"] == "map_values"
                   for op in ops)
        return
    assert down(copy.deepcopy(after)) == payload


@pytest.mark.parametrize("op", [
    {"op": "set_default", "path": "/a", "value": 1},
    {"op": "remove", "path": "/a"},
    {"op": "map_values", "path": "/a", "map": {"r": 1, "s": 1}},
])
def test_a_lossy_operation_makes_the_step_one_way(op):
    assert _compiled([{"op": "rename", "from": "/b", "to": "/c"}, op])[1] is None


def test_a_map_refuses_a_value_it_also_produces():
    up, down = _compiled([{"op": "map_values", "path": "/phase",
                           "map": {"charging": "paying"}}])
    assert up({"phase": "charging"}) == {"phase": "paying"}
    with pytest.raises(upcasters.InvalidAfter, match=r"payload/phase holds a value"):
        up({"phase": "paying"})  # down could not tell it from a mapped "charging"
    assert down({"phase": "paying"}) == {"phase": "charging"}


def test_refusals_name_the_field_never_the_value():
    up, _ = _compiled([{"op": "add", "path": "/secret", "value": 1}])
    with pytest.raises(upcasters.InvalidAfter) as refused:
        up({"secret": "hunter2"})
    assert "payload/secret" in str(refused.value) and "hunter2" not in str(refused.value)
