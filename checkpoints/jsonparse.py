"""Strict JSON for request bodies (CONTRACT.md section 6).

Refused, each with ``InvalidPayload`` naming the field: malformed JSON, a non-object
body, a duplicated key, NaN/Infinity or a number that overflows to them (``1e400``),
U+0000 or an unpaired surrogate (``"\\ud800"``) in any string or key, nesting deeper
than ``RECOVERY_MAX_JSON_DEPTH``.
Integers keep full precision (Python ints), and escaped strings such as ``"\\u0000"``
(a backslash, not a NUL) round-trip byte for byte through ``dumps``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from functools import partial
from typing import Any

import idna
from django.conf import settings

from .exceptions import InvalidPayload


class _DuplicateKey(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _NonFinite(float):
    """A parsed NaN/Infinity/overflowing number, refused by ``_check_values`` with its path."""

    source: str


def _number(found: list, text: str) -> float:
    """``parse_float``: the number, or a ``_NonFinite`` (also added to ``found``)."""
    value = float(text)
    if math.isfinite(value):
        return value
    marked = _NonFinite(value)
    marked.source = f"number {text[:40]} overflows to infinity"
    found.append(marked)
    return marked


def _constant(found: list, name: str) -> float:
    """``parse_constant`` (NaN, Infinity, -Infinity): a ``_NonFinite``, added to ``found``."""
    marked = _NonFinite(float(name.replace("Infinity", "inf")))
    marked.source = f"{name} is not allowed"
    found.append(marked)
    return marked


#: A JSON string with its quotes and escapes (one left open runs to the end of the text,
#: a lone backslash at the end included), and the brackets ``_scan_depth`` counts.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def _scan_depth(raw: str, limit: int, what: str = "body") -> None:
    """Refuse nesting deeper than ``limit`` before json.loads recurses into it: the
    brackets outside strings, opened and closed in order (``_STRINGS`` cut out first, so
    a bracket inside a string never counts). In C but for the loop over brackets, and
    not even that when the text opens no more than ``limit`` of them in all (issue 22,
    item 3: the character loop it replaces cost about 50 us of a 1.6 KB PUT).
    ``tests/test_jsonparse_scan.py`` holds it to that loop on generated texts."""
    if raw.count("[") + raw.count("{") <= limit:
        return
    depth = 0
    for ch in _BRACKETS.findall(_STRINGS.sub("", raw)):
        if ch in "[{":
            depth += 1
            if depth > limit:
                raise InvalidPayload(f"{what}: nesting deeper than {limit} levels")
        else:
            depth -= 1


#: JSON's insignificant whitespace (RFC 8259, section 2: space, tab, line feed, carriage
#: return), what may surround a value in a body, so what the dashboard's forms drop
#: around a typed number (``dashboard.typed.typed_number``), and nothing else:
#: ``str.strip`` also drops a vertical tab, a form feed, U+001C-U+001F, a no-break space
#: and every Unicode space, which a JSON body refuses around a number.
JSON_WHITESPACE = " \t\n\r"


def text_problem(text: str) -> str:
    """Why ``text`` cannot be stored ("" if it can): U+0000, or an unpaired surrogate
    (not a Unicode scalar value, so not valid UTF-8 and refused by PostgreSQL).

    The one rule for text from outside (CONTRACT.md section 6), used for JSON strings and
    keys here, and by ``checkpoints.api.params`` (query parameters), ``services`` (reasons)
    and ``manage.py`` (command-line arguments).
    """
    if "\x00" in text:
        return "U+0000 is not allowed"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "an unpaired surrogate (\\ud800-\\udfff) is not allowed"
    return ""


def printable_problem(text: str) -> str:
    """Why ``text`` is no printable reason ("" if it is): ``text_problem``'s, or a control
    character other than tab, newline and carriage return, C1's included, or a
    bidirectional control (an ESC sequence shown to the next reviewer rewrites their
    terminal; a direction override turns the text after it around). The one rule for the reasons people
    write: review actions (``services.common``) and lifecycle requests
    (``services.holds``) alike (the attack found the first accepting ``"a\\x1b[2Jb"``)."""
    return _char_problem(text, _unprintable, "must be printable (no control characters)")


def name_problem(text: str) -> str:
    """Why ``text`` is no printable name ("" if it is): ``text_problem``'s, or any
    control character (Unicode category Cc: C0 with tab and newline, DEL, C1), a line or
    paragraph separator, a bidirectional control (``BIDI_CONTROLS``), or an invisible
    character (``INVISIBLE``: Unicode's default ignorable code points but the joiners and
    variation selectors; a variation selector only right after a character that shows).
    Not blankness: ``""`` is a name here, and the callers that refuse a blank one use
    ``blank``. A name is one line shown as it is: a lease
    owner, an effect's service and operation key, a run identity, a LangGraph thread, a
    query value, a notification endpoint's name. The one rule for them all (issue 22,
    stop 33: four checks of their own had drifted apart, the POST resume body's
    identity taking what its GET query refused); reasons, which may span lines, take
    ``printable_problem``."""
    problem = _char_problem(text, _control, "a control character is not allowed")
    if problem or not _hides(text):
        return problem
    return "an invisible character is not allowed"


def _hides(text: str) -> bool:
    """Whether ``text`` holds a character a name may not (``_hidden``): one ``INVISIBLE``
    holds, or a variation selector or joiner out of its place."""
    return any(_hidden(text, i) for i in range(len(text)))


def _hidden(text: str, i: int) -> bool:
    """Whether ``text[i]`` hides in a name: one of ``INVISIBLE``; a variation selector
    that selects nothing (``_selects``); a joiner that joins nothing (``_joins``)."""
    ch = text[i]
    previous = text[i - 1] if i else ""
    following = text[i + 1] if i + 1 < len(text) else ""
    if ch in _TAGS:
        return not _tag_sequence(text, i)
    if ch in INVISIBLE:
        return True
    if ch in VARIATION_SELECTORS:
        return not _selects(previous, ch, following)
    return ch in JOINERS and not _joins(text, i, previous, following)


#: ASCII characters with a presentation selector of their own: the keycap emoji's
#: digits, ``#`` and ``*``, when the keycap follows (``1\ufe0f\u20e3``).
_KEYCAP_BASES = frozenset("0123456789#*")
_KEYCAP = "\u20e3"
_PRESENTATION = frozenset("\ufe0e\ufe0f")
_MONGOLIAN_FVS = frozenset("\u180b\u180c\u180d\u180f")
#: Scripts whose letters have standardized variation sequences (StandardizedVariants.txt):
#: Myanmar (with its extensions), Phags-pa, Manichaean, Egyptian hieroglyphs; CJK
#: ideographs are told by name (``_ideograph``).
_VARIANT_LETTERS = ((0x1000, 0x109F), (0xA9E0, 0xA9FF), (0xAA60, 0xAA7F), (0xA840, 0xA87F),
                    (0x10AC0, 0x10AFF), (0x13000, 0x1342F))


def _ideograph(ch: str) -> bool:
    """A CJK ideograph (unified or compatibility), the base of ideographic variation
    sequences (``\u845b\U000E0100``)."""
    return unicodedata.name(ch, "").startswith("CJK ")


def _selects(previous: str, selector: str, following: str = "") -> bool:
    """Whether a variation selector between ``previous`` and ``following`` selects a
    glyph of ``previous``, rather than hiding (one selector a byte, "emoji smuggling";
    the stop-35 attacks: ``charge:A\ufe00-1042``, ``charge:A-1\ufe0f042`` and
    ``charg\u00e9\U000E0100`` read as the names without them). Unicode's variation
    sequences, by the kinds of base they have (``unicodedata`` has not the table itself):

    - the text or emoji presentation (U+FE0E, U+FE0F) of a symbol or punctuation mark
      outside ASCII (``\u2764\ufe0f``, ``\u203c\ufe0f``), of ``\u2139`` (the one letter
      among the emoji), and of a keycap's digit, ``#`` or ``*`` when the keycap follows;
    - VS1-VS14 after a symbol or punctuation mark outside ASCII (mathematical variants,
      CJK punctuation), a CJK ideograph or a letter of ``_VARIANT_LETTERS``;
    - the ideographic variation selectors (VS17-VS256) after a CJK ideograph;
    - the Mongolian free variation selectors after a Mongolian letter.

    Never after an ASCII character but the keycap's, a letter of another script
    (``\u00e9``), a mark, a number, whitespace, a joiner, another selector or nothing."""
    if previous.isascii():
        return (previous in _KEYCAP_BASES and selector in _PRESENTATION
                and following == _KEYCAP)
    if not _base(previous):
        return False
    if selector in _MONGOLIAN_FVS:
        return 0x1800 <= ord(previous) <= 0x18AF
    if selector >= "\U000E0100":
        return _ideograph(previous)
    category = unicodedata.category(previous)
    if category[0] in "SP":
        return True
    if selector in _PRESENTATION and previous == "\u2139":
        return True
    return category[0] == "L" and selector not in _PRESENTATION and (
        _ideograph(previous)
        or any(first <= ord(previous) <= last for first, last in _VARIANT_LETTERS))


#: How far ``_joins`` looks on each side of a joiner (RFC 5892's rule skips transparent
#: marks between it and the letters it joins; no name needs more than a few).
_CONTEXT = 32
_ZWJ = "\u200d"
#: What may follow an emoji inside one element of its ZWJ sequence (Unicode TS #51): the
#: emoji presentation selector and the five skin tone modifiers.
_EMOJI_TRAILERS = frozenset("\ufe0f\U0001F3FB\U0001F3FC\U0001F3FD\U0001F3FE\U0001F3FF")
_VIRAMA = 9  # the canonical combining class of a virama


def _joins(text: str, i: int, previous: str, following: str) -> bool:
    """Whether the zero-width joiner or non-joiner ``text[i]`` (between ``previous`` and
    ``following``) joins something, by the rules that say where one belongs:

    - RFC 5892 Appendix A (IDNA's CONTEXTJ, via the ``idna`` package): either joiner
      right after a virama (Indic conjuncts and half forms: ``\u0915\u094d\u200d\u0937``),
      with a letter or mark of the same kind after it (never ASCII, a space or the end:
      the stop-37 attack's ``\u0915\u094d\u200c-1042``); the non-joiner between a letter
      that joins to the left and one that joins to the right, transparent marks aside
      (Persian ``\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645``);
    - the joiner between a letter and a virama (Bengali's ya-phala after RA,
      ``\u09b0\u200d\u09cd\u09af``: the Unicode Standard, chapter 12);
    - Unicode TS #51: the joiner inside an emoji ZWJ sequence that Unicode recommends
      (RGI, via the ``emoji`` package: ``\U0001F469\U0001F3FD\u200d\U0001F4BB``,
      ``\U0001F3F3\ufe0f\u200d\U0001F308``), the whole sequence, not any two symbols
      (the attack's ``\u00b0\u200d\u00b0`` and two grinning faces).

    Anywhere else it joins nothing and only hides: at the start, beside ASCII (the
    stop-35 attack's ``charge:\u200dA-1042``), and between two letters of a script that
    neither joins nor has a virama (``\u00e9\u200d\u00e9`` reads as ``\u00e9\u00e9``)."""
    if not previous or not following:
        return False
    if text[i] == _ZWJ and _emoji_sequence(text, i):
        return True
    if unicodedata.combining(following) == _VIRAMA:
        return text[i] == _ZWJ and unicodedata.category(previous)[0] == "L" and \
            not previous.isascii()
    if following.isascii() or unicodedata.category(following)[0] not in "LM":
        return False
    start = max(0, i - _CONTEXT)
    try:
        return idna.core.valid_contextj(text[start:i + _CONTEXT + 1], i - start)
    except (ValueError, idna.IDNAError):  # an unassigned neighbour: nothing to join
        return False


def _rgi() -> dict:
    """Unicode's emoji sequences (``emoji.EMOJI_DATA``: RGI ZWJ and tag sequences, with
    their minimally qualified forms)."""
    # Imported on first use: its table costs about 7 MB and 0.25 s per process, and only
    # a name holding an emoji's joiner or tag needs it.
    import emoji

    return emoji.EMOJI_DATA


def _emoji_sequence(text: str, i: int) -> bool:
    """Whether the joiner ``text[i]`` is inside an RGI emoji ZWJ sequence: the elements
    it joins (each an emoji and its trailers, ``_EMOJI_TRAILERS``), with the elements
    further joined on either side, are one sequence of ``emoji.EMOJI_DATA``."""
    start = i
    while start > 0:
        start -= 1
        while start > 0 and text[start] in _EMOJI_TRAILERS:
            start -= 1
        if start == 0 or text[start - 1] != _ZWJ:
            break
        start -= 1
    end = i
    while end + 1 < len(text):
        end += 1
        while end + 1 < len(text) and text[end + 1] in _EMOJI_TRAILERS:
            end += 1
        if end + 1 >= len(text) or text[end + 1] != _ZWJ:
            break
        end += 1
    return text[start:end + 1] in _rgi()


#: The tag characters (U+E0020-U+E007F): hidden, but for an emoji tag sequence's
#: (a subdivision flag: the black flag, tags naming the region, the cancel tag).
_TAGS = frozenset(chr(cp) for cp in range(0xE0020, 0xE0080))
_CANCEL_TAG = "\U000E007F"


def _tag_sequence(text: str, i: int) -> bool:
    """Whether the tag character ``text[i]`` is inside an RGI emoji tag sequence
    (``\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F``, the flag
    of Scotland: the stop-37 attack's finding), the whole sequence one of
    ``emoji.EMOJI_DATA``."""
    start = i
    while start > 0 and text[start - 1] in _TAGS:
        start -= 1
    end = i
    while end + 1 < len(text) and text[end] != _CANCEL_TAG and text[end + 1] in _TAGS:
        end += 1
    return start > 0 and text[end] == _CANCEL_TAG and \
        text[start - 1:end + 1] in _rgi()


def _base(ch: str) -> bool:
    """Whether ``ch`` shows: not whitespace, not one of ``SHOWS_NOTHING``, not a
    control (so a selector may select its glyph, a joiner join it)."""
    return bool(ch) and not ch.isspace() and ch not in SHOWS_NOTHING and not _control(ch)


def blank(text: str) -> bool:
    """Whether ``text`` shows nothing at all: every character of it (none, for ``""``)
    is whitespace (``str.isspace``) or one of ``SHOWS_NOTHING`` (an invisible character,
    the zero-width joiners and variation selectors a name may hold, the braille blank).
    The one test behind every "must not be blank" of a name (a tenant's display name, a
    notification endpoint's name and filter values): ``"\u200d\u200c"`` passes
    ``name_problem`` but is as blank as ``"  "``. Reasons (free text) keep
    ``str.strip`` (``services.common``)."""
    return all(ch.isspace() or ch in SHOWS_NOTHING for ch in text)


def check_name(value: str, field: str, *, blank_words: str | None = None) -> str:
    """``value`` when it is a name (``name_problem``), else ``InvalidPayload`` (400)
    ``"<field>: <why>"``: the services' and imports' one check of a name they take.

    ``blank_words``: the name is required, and one that shows nothing (``blank``: only
    spaces, joiners, braille blanks) is refused as an empty one, ``"<field>:
    <blank_words>"`` (an operation key or lease owner of ``"\u200d"`` passed the old
    ``not value`` and showed as nothing on the run page; stop 35)."""
    if blank_words is not None and blank(value):  # first: "\u200d" is blank, not a hider
        raise InvalidPayload(f"{field}: {blank_words}")
    problem = name_problem(value)
    if problem:
        raise InvalidPayload(f"{field}: {problem}")
    return value


def padding_problem(text: str) -> str:
    """Why ``text`` is no value matched exactly that a form shows one a line ("" if it
    is): leading or trailing whitespace (``str.isspace``: a space, a tab, a no-break
    space...), which a person cannot see on the line and which makes the value another
    one (``"refund "`` matches no agent ``refund``). The one rule of such values, the
    API's and the dashboard form's alike: a subject field's pointer
    (``services.retention.subject_pointer_problem``). Not a notification endpoint's filter
    values, which take what a run's column can hold, spaces included (a run's agent may be
    ``"refund "``: ``services.notify_endpoints._filter``). Refused,
    not stripped: a stripped value silently matches something else than what was sent
    (labels such as an endpoint's name, matched against nothing, are stripped)."""
    if text != text.strip():
        return "leading or trailing whitespace is not allowed (a form line cannot show it)"
    return ""


def _char_problem(text: str, refused, words: str) -> str:
    """``text_problem``'s, else ``words`` when ``refused`` (a predicate of one
    character) holds for a character of ``text``, else ""."""
    return text_problem(text) or (words if any(refused(ch) for ch in text) else "")


def _code_points(ranges) -> frozenset[str]:
    """The characters of ``ranges`` (pairs of first and last code point, inclusive)."""
    return frozenset(chr(cp) for first, last in ranges for cp in range(first, last + 1))


#: Unicode's bidirectional controls (embeddings, overrides, isolates and marks): they
#: turn the text shown after them around ("evil\u202egnp.exe" reads "evilexe.png").
BIDI_CONTROLS = frozenset("\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e"
                          "\u2066\u2067\u2068\u2069")

#: Unicode's Default_Ignorable_Code_Point property (DerivedCoreProperties.txt, Unicode
#: 14.0: the version of Python 3.11's unicodedata): the
#: characters a renderer shows as nothing when it cannot show them otherwise. Python's
#: ``unicodedata`` has no such property, hence this table (cross-checked against every
#: format character, category Cf, by tests/api/test_invisible_names.py).
DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),    # soft hyphen
    (0x034F, 0x034F),    # combining grapheme joiner
    (0x061C, 0x061C),    # Arabic letter mark (a bidirectional control)
    (0x115F, 0x1160),    # Hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),    # Khmer inherent vowels AQ, AA
    (0x180B, 0x180F),    # Mongolian free variation selectors 1-3, vowel separator, FVS 4
    (0x200B, 0x200F),    # zero-width space, non-joiner, joiner; LRM, RLM
    (0x202A, 0x202E),    # bidirectional embeddings and overrides
    (0x2060, 0x206F),    # word joiner, invisible operators, isolates, deprecated formats
    (0x3164, 0x3164),    # Hangul filler
    (0xFE00, 0xFE0F),    # variation selectors 1-16
    (0xFEFF, 0xFEFF),    # zero-width no-break space (byte order mark)
    (0xFFA0, 0xFFA0),    # halfwidth Hangul filler
    (0xFFF0, 0xFFF8),    # reserved
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbols begin beam .. end phrase
    (0xE0000, 0xE0FFF),  # tags (language tag, tag letters, cancel tag), selectors 17-256
)

#: The variation selectors (Mongolian free variation selectors, VS1-16, VS17-256): a name
#: may hold one right after a character that shows (``_base``: ``"\u2764\ufe0f"``, an
#: emoji's presentation; an ideograph's variant), never elsewhere (``name_problem``).
VARIATION_SELECTORS = _code_points(((0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F),
                                    (0xE0100, 0xE01EF)))

#: The zero-width non-joiner and joiner: a name holds them anywhere (emoji ZWJ sequences,
#: Persian and Indic text need them).
JOINERS = frozenset("\u200c\u200d")

#: The invisible characters no name holds (stop 34, the last attack's doubt; widened by
#: the next): a zero-width space, word joiner, byte order mark, soft hyphen or Mongolian
#: vowel separator shows nothing, so ``"charge:\u200bA-1042"`` reads as ``charge:A-1042``,
#: another operation key a reviewer would take for the one they know (and paste into the
#: service's console). The rule is Unicode's, not a list of the characters seen so far:
#: every Default_Ignorable_Code_Point (``DEFAULT_IGNORABLE``: the invisible operators
#: U+2061-U+2064, the combining grapheme joiner, the Hangul fillers, the Khmer inherent
#: vowels, the tag characters, which carry hidden ASCII "tag smuggling" to a language
#: model, so the three subdivision flag emoji go with them), and the interlinear
#: annotation controls U+FFF9-U+FFFB (format characters outside that set, but their text
#: is meant to be hidden or shown apart), but for ``JOINERS`` and
#: ``VARIATION_SELECTORS``, which ``name_problem`` judges by place, and the bidirectional
#: controls, refused as controls (``BIDI_CONTROLS``). Left visible:
#: the prepended concatenation marks (U+0600-U+0605 and the like, format characters that
#: show) and the Egyptian hieroglyph format controls (the joiners of that script). The
#: braille blank U+2800 is the braille word space: a name holds it, but it is blank
#: (``SHOWS_NOTHING``). Reasons, free text, may hold all of these.
INVISIBLE = (_code_points(DEFAULT_IGNORABLE + ((0xFFF9, 0xFFFB),))
             - JOINERS - VARIATION_SELECTORS - BIDI_CONTROLS)

#: What shows nothing on its own (``blank``): ``INVISIBLE``, the joiners and variation
#: selectors a name may hold, the bidirectional controls, the braille blank, the Egyptian
#: hieroglyph format controls.
SHOWS_NOTHING = (INVISIBLE | JOINERS | VARIATION_SELECTORS | BIDI_CONTROLS
                 | _code_points(((0x2800, 0x2800), (0x13430, 0x1343F))))


def _unprintable(ch: str) -> bool:
    """A control character (Unicode category Cc: C0, DEL and C1, whose U+009B a
    terminal reads as ``ESC [``) other than tab, newline and carriage return, or a
    bidirectional control."""
    return ch not in "\t\n\r" and _control(ch)


#: The Unicode categories no name holds: control characters (Cc) and the line and
#: paragraph separators (Zl, Zp: U+2028 and U+2029 break a name into two lines; the
#: final attack's finding, stop 33).
_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def _control(ch: str) -> bool:
    """A control character, a line or paragraph separator, or a bidirectional control."""
    return unicodedata.category(ch) in _REFUSED_CATEGORIES or ch in BIDI_CONTROLS


def _check_values(value: Any, path: str) -> None:
    """Refuse U+0000 and unpaired surrogates in strings and keys, and non-finite numbers,
    naming the field."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, _NonFinite):
            raise InvalidPayload(f"{where}: {item.source}")
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise InvalidPayload(f"{where}: {problem}")
        elif isinstance(item, dict):
            for key, sub in item.items():
                problem = text_problem(key)
                if problem:
                    raise InvalidPayload(f"{where}: {problem} in a key")
                stack.append((sub, f"{where}.{printable(key)}"))
        elif isinstance(item, list):
            for i, sub in enumerate(item):
                stack.append((sub, f"{where}[{i}]"))


def printable(key: str) -> str:
    """A key or name as it may appear in an error message: ``shown(key, 60)``."""
    return shown(key, 60)


def shown(text: str, limit: int) -> str:
    """``text`` as one storable, printable line for a person to read, of at most
    ``limit`` characters as stored: NUL as ``\\0``, a lone surrogate as ``\\udc80``, and
    every character ``name_problem`` refuses (a control, separator, bidirectional or
    invisible character, a variation selector after no base character) as its escape
    (``\\x1b``, ``\\n``, ``\\u202e``), so an error message
    echoing a client's name, or a reconciler's free-text detail stored and shown on the
    run page, never carries an ESC sequence or a direction override (stop 33). Cut after
    escaping, on a character's boundary, so the text fits its column and never ends in
    half an escape (the final attack's finding)."""
    text = str(text)
    if len(text) <= limit and text_problem(text) == "" and not any(
            _control(ch) for ch in text) and not _hides(text):
        return text
    out, size = [], 0
    for i in range(len(text)):
        piece = _escape(text, i)
        if size + len(piece) > limit:
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _escape(text: str, i: int) -> str:
    """``text[i]`` as ``shown`` writes it: NUL as ``\\0``, a lone surrogate, a character
    ``_control`` refuses, or one that hides in a name (``_hidden``) as its Python escape,
    anything else as it is."""
    ch = text[i]
    if ch == "\x00":
        return "\\0"
    if _control(ch) or _hidden(text, i):
        return ch.encode("unicode_escape").decode("ascii")
    if "\ud800" <= ch <= "\udfff":
        return ch.encode("utf-8", "backslashreplace").decode("utf-8")
    return ch


def loads_object(raw: bytes | str, *, max_depth: int | None = None, what: str = "body") -> dict:
    """Parse a request body (or an outside service's answer) that must be one JSON object.

    ``what`` names the document in error messages (``body``, ``answer``). Returns the
    dict; raises ``InvalidPayload`` (400) for every case in the module doc. Outside
    services' answers go through this same function (CONTRACT.md 6, last paragraph).
    """
    limit = max_depth or settings.RECOVERY_MAX_JSON_DEPTH
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidPayload(f"{what}: not UTF-8 ({exc.reason})") from None
        sound = True  # valid UTF-8: no lone surrogate
    else:
        # A str may hold lone surrogates that bytes decoded as UTF-8 cannot.
        sound = raw.isascii() or not text_problem(raw)
    _scan_depth(raw, limit, what)
    found: list = []
    try:
        value = json.loads(raw, object_pairs_hook=_pairs, parse_float=partial(_number, found),
                           parse_constant=partial(_constant, found))
    except _DuplicateKey as exc:
        raise InvalidPayload(f"{what}: duplicated key {printable(str(exc))!r}") from None
    except RecursionError:
        raise InvalidPayload(f"{what}: nesting deeper than {limit} levels") from None
    except ValueError as exc:
        raise InvalidPayload(f"{what}: malformed JSON ({str(exc)[:200]})") from None
    if not isinstance(value, dict):
        raise InvalidPayload(f"{what}: must be a JSON object")
    # The walk that names a refused value's field runs only when there may be one: a
    # non-finite number was parsed, or a string may hold U+0000 or a lone surrogate,
    # which only a \\u escape (json.loads refuses a raw control character in a string)
    # or a str argument not valid as UTF-8 can bring. Else it would find nothing: it
    # cost more than the parse itself (issue 22, item 3).
    if found or not sound or "\\u" in raw:
        _check_values(value, what)
    return value


def dumps(value: Any) -> str:
    """Canonical compact JSON text (sorted keys, UTF-8 kept, no NaN)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                      allow_nan=False)


def content_sha256(text: str) -> str:
    """SHA-256 hex of ``text`` as UTF-8: how an audit event names stored content (a
    payload's or receipt's JSON text exactly as stored) without holding it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def loads_any(text: str) -> Any:
    """Parse JSON text this service wrote itself (stored payloads); ints keep full precision."""
    return json.loads(text)
