"""``jsonparse.loads_object``'s fast paths (issue 22, item 3) held to what they replace, on
generated texts rather than examples:

- ``_scan_depth`` (strings cut out by a regular expression, then the brackets counted;
  nothing counted when the text opens no more than the limit) against the character
  loop it replaced (``_reference_depth``, kept here);
- the walk that names a refused value (``_check_values``) runs only when a value may be
  refused; ``loads_object`` answers every generated text exactly as a parse that always
  walks (``_reference_loads``).
"""

from __future__ import annotations

import json
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoints import jsonparse
from checkpoints.exceptions import InvalidPayload

LIMIT = 6


def _reference_depth(raw: str, limit: int) -> bool:
    """The character loop ``_scan_depth`` replaced: whether ``raw`` nests deeper than
    ``limit`` outside its strings."""
    depth, in_string, escaped = 0, False, False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _fast_depth(raw: str, limit: int) -> bool:
    try:
        jsonparse._scan_depth(raw, limit)
    except InvalidPayload:
        return True
    return False


#: Texts made of what matters to the scan: quotes, backslashes, brackets, newlines and
#: a few other characters, so open strings, escaped quotes and brackets inside strings
#: come often.
_SCAN_TEXT = st.text(alphabet='"\\[]{}\nab:,', max_size=80)


@settings(max_examples=3000, deadline=None)
@given(_SCAN_TEXT, st.integers(min_value=0, max_value=8))
def test_the_depth_scan_answers_as_the_character_loop(raw, limit):
    assert _fast_depth(raw, limit) == _reference_depth(raw, limit)


@pytest.mark.parametrize("raw", ['"\\', '"[[[[', '"\\"[[[[', '[[["]]]"[', '"a\\\n"[[[[[[[[',
                                 "[" * 7, '["' + "[" * 7])
def test_the_depth_scan_on_the_edges_it_must_get_right(raw):
    """An open string to the end (after a lone backslash too), an escaped quote, an
    escaped newline (``re.S``), brackets inside strings."""
    assert _fast_depth(raw, LIMIT) == _reference_depth(raw, LIMIT)


def _reference_loads(raw, limit):
    """``loads_object`` as it was: the scan, the parse, then always the walk."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    if _reference_depth(raw, limit):
        raise InvalidPayload(f"body: nesting deeper than {limit} levels")
    try:
        value = json.loads(raw, object_pairs_hook=jsonparse._pairs,
                           parse_float=partial(jsonparse._number, []),
                           parse_constant=partial(jsonparse._constant, []))
    except jsonparse._DuplicateKey as exc:
        raise InvalidPayload(f"body: duplicated key {jsonparse.printable(str(exc))!r}") \
            from None
    except RecursionError:
        raise InvalidPayload(f"body: nesting deeper than {limit} levels") from None
    except ValueError as exc:
        raise InvalidPayload(f"body: malformed JSON ({str(exc)[:200]})") from None
    if not isinstance(value, dict):
        raise InvalidPayload("body: must be a JSON object")
    jsonparse._check_values(value, "body")
    return value


def _answer(loads, raw):
    try:
        return ("ok", json.dumps(loads(raw), sort_keys=True))
    except InvalidPayload as exc:
        return ("refused", exc.detail)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
    st.text(max_size=8),
    # What the walk refuses, as JSON text: U+0000 and a lone surrogate escaped.
    st.sampled_from(["\x00", "a\ud800", "\udc80b"]),
)
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                      st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=12)
#: JSON texts the product refuses in other ways: the constants, an overflowing number, a
#: raw control character, a duplicated key, a non-object.
_SPLICES = st.sampled_from(["NaN", "-Infinity", "1e400", "-1.5e999", '"\x01"', '"\\u0000"',
                            '"\\ud800"', "[]", '"x"', "{}", "[[[[[[[1]]]]]]]"])


@st.composite
def _bodies(draw):
    value = draw(st.dictionaries(st.text(max_size=4), _VALUES, max_size=4))
    text = json.dumps(value, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):  # a spliced member, possibly a duplicate key
        key = draw(st.sampled_from(["k", *value][:3]))
        text = (text[:-1] + ("," if value else "") + json.dumps(key) + ":"
                + draw(_SPLICES) + "}")
    return text


@settings(max_examples=1500, deadline=None)
@given(_bodies(), st.booleans())
def test_loads_object_answers_as_a_parse_that_always_walks(text, as_bytes):
    raw = text.encode("utf-8", "surrogatepass") if as_bytes else text
    if as_bytes:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raw = text  # a lone surrogate is no UTF-8: send the str
    assert _answer(partial(jsonparse.loads_object, max_depth=LIMIT), raw) == _answer(
        lambda r: _reference_loads(r, LIMIT), raw)
