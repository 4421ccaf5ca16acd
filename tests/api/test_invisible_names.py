"""Names that show nothing (``jsonparse.name_problem``, ``jsonparse.blank``): every
character the one rule refuses, generated from its tables rather than a few examples,
and the doors that take a name (a body, a query, a notification endpoint's name and
filters, a tenant's display name).

The rule: Unicode's Default_Ignorable_Code_Point set and the interlinear annotation
controls are refused in a name, but for the zero-width joiner and non-joiner where they
join (after a virama, between joining letters, inside an emoji sequence) and the
variation selectors (right after a character that has variants). A name of nothing but
whitespace and such characters is blank where a blank name is refused.
"""

from __future__ import annotations

import sys
import unicodedata

import pytest

from checkpoints import jsonparse
from checkpoints.jsonparse import (
    INVISIBLE,
    JOINERS,
    SHOWS_NOTHING,
    VARIATION_SELECTORS,
    blank,
    name_problem,
    printable_problem,
    shown,
)
from tests.api.apihelpers import new_checkpoint, post, put, snapshot, url

WORDS = "an invisible character is not allowed"
CONTROL = "a control character is not allowed"

#: Format characters (category Cf) that show, or join the signs of one script, and so
#: stay in names: the prepended concatenation marks (Arabic number signs, end of ayah,
#: Syriac abbreviation mark, Kaithi number signs) and the Egyptian hieroglyph format
#: controls.
VISIBLE_FORMATS = frozenset(
    chr(cp) for first, last in ((0x0600, 0x0605), (0x06DD, 0x06DD), (0x070F, 0x070F),
                                (0x0890, 0x0891), (0x08E2, 0x08E2), (0x110BD, 0x110BD),
                                (0x110CD, 0x110CD), (0x13430, 0x1343F))
    for cp in range(first, last + 1))

#: The characters the task named as passing before this rule, each refused now.
NAMED = ("\u2061\u2062\u2063\u2064\u034f\u115f\u1160\u3164\uffa0\u17b4\u17b5"
         "\ufff9\ufffa\ufffb" + "".join(chr(cp) for cp in range(0xE0000, 0xE0080)))


def _every_code_point():
    return (chr(cp) for cp in range(sys.maxunicode + 1) if not 0xD800 <= cp <= 0xDFFF)


def test_every_invisible_character_is_refused_in_a_name_and_kept_in_a_reason():
    """The generated table: every code point of ``INVISIBLE`` (Default_Ignorable but
    the joiners, selectors and bidirectional controls, and U+FFF9-U+FFFB), anywhere in a
    name, gets the rule's words; a reason keeps it; ``shown`` writes it as its escape.
    The bidirectional controls among the default ignorables are refused as controls."""
    assert len(INVISIBLE) > 3800  # the whole table, tags and reserved planes included
    for ch in sorted(INVISIBLE):
        for name in (ch, f"a{ch}b", f"ab{ch}", f"{ch} "):
            assert name_problem(name) == WORDS, (hex(ord(ch)), name)
        assert printable_problem(f"a{ch}b") == ""
        assert shown(f"a{ch}b", 40) == "a" + ch.encode("unicode_escape").decode() + "b"
    for ch in NAMED:
        assert ch in INVISIBLE and name_problem(f"x{ch}y") == WORDS, hex(ord(ch))
    for ch in jsonparse.BIDI_CONTROLS:
        assert name_problem(f"a{ch}b") == CONTROL


def test_every_format_character_is_refused_but_the_joiners_and_those_that_show():
    """Cross-check of the explicit table against ``unicodedata``: every format character
    (Cf) of Python's Unicode is refused in a name (as a control or as invisible) but the
    joiners and ``VISIBLE_FORMATS``; every character of the table is a format
    character, a mark, a Hangul filler (Lo) or unassigned (Cn), none a letter that shows."""
    for ch in _every_code_point():
        if unicodedata.category(ch) == "Cf" and ch not in JOINERS | VISIBLE_FORMATS:
            assert name_problem(f"a{ch}b"), hex(ord(ch))
    allowed = {"Cf", "Mn", "Cn"}
    for ch in INVISIBLE | VARIATION_SELECTORS | JOINERS:
        assert unicodedata.category(ch) in allowed or ch in "\u115f\u1160\u3164\uffa0", \
            hex(ord(ch))


def test_a_variation_selector_is_a_name_s_only_right_after_a_character_that_shows():
    """An emoji's presentation selector or an ideograph's variant stays; a selector at
    the start, after whitespace, after a joiner or after another selector (a run of
    them carries hidden bytes, one a byte) is refused, each of them."""
    for vs in sorted(VARIATION_SELECTORS):
        # Each kind of selector after a base it has (jsonparse._selects): a symbol takes
        # VS1-16, an ideograph the ideographic ones, a Mongolian letter the FVS.
        base = ("\u1820" if vs in "\u180b\u180c\u180d\u180f"
                else "\u845b" if vs >= "\U000E0100" else "\u2764")
        assert name_problem(f"{base}{vs}") == "", hex(ord(vs))
        for name in (vs, f"a {vs}", f"a\u200d{vs}", f"a{vs}{vs}", f"a\u2061{vs}"):
            assert name_problem(name) == WORDS, (hex(ord(vs)), name)
            assert "\\u" in shown(name, 80) or "\\U" in shown(name, 80)
    for name in ("dev-\U0001F469\u200d\U0001F4BB",               # an emoji ZWJ sequence
                 "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, ZWNJ
                 "\u2764\ufe0f", "1\ufe0f\u20e3",                 # presentation, keycap
                 "\U0001F3F3\ufe0f\u200d\U0001F308",              # the rainbow flag
                 "\u845b\U000E0100",                               # an ideograph variant
                 "\u1820\u180b",                                   # Mongolian FVS1
                 "\u2800\u2801 braille", "\u0600\u0661"):          # shows, stays
        assert name_problem(name) == "", name
        assert shown(name, 80) == name


def test_a_name_of_nothing_that_shows_is_blank():
    """``blank``: every character whitespace or one of ``SHOWS_NOTHING`` (each of them
    alone, and mixed with spaces); one character that shows makes it no blank."""
    assert blank("") and blank("  \t")
    for ch in sorted(SHOWS_NOTHING):
        assert blank(ch) and blank(f" {ch}\u3000{ch} "), hex(ord(ch))
        assert not blank(f"{ch}a"), hex(ord(ch))
    assert blank("\u200d\u200c") and blank("\u2800\ufe0f")
    assert not blank("\u2764\ufe0f") and not blank("\u0600")


@pytest.mark.parametrize("name", ["x\u2062y", "\u3164x", "flag\U000E0067\U000E007F",
                                  "\ufe0fx", "cgj\u034f"])
def test_each_kind_of_name_door_refuses_them_with_the_rules_words(
        api_as, wendy, adam, acme, name):
    """One field of each kind: a body's name (the lease owner, a resume identity), a
    query value (``querystring.single_values``: the rule's own words), a notification
    endpoint's name and a filter value; each a 400 naming the field, nothing written."""
    w = api_as(wendy)
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": name, "ttl_s": 5})
    assert r.status_code == 400 and r.json()["detail"] == f"owner: {WORDS}", r.content
    r = post(w, "acme", f"runs/{rid}/resume", {"agent": name})
    assert r.status_code == 400 and r.json()["detail"].startswith("agent: "), r.content
    r = w.get(url("acme", "effects"), {"operation_key": name})
    assert r.status_code == 400 and r.json()["detail"] == f"operation_key: {WORDS}"
    a = api_as(adam)
    base = {"name": "hook", "channel": "webhook", "url": "https://hooks.example.com/x",
            "event_types": ["run.needs_review"]}
    for change, field in (({"name": name}, "name"), ({"agents": ["ok", name]}, "agents")):
        r = a.post(url("acme", "notification-endpoints"), {**base, **change}, format="json")
        assert r.status_code == 400 and r.json()["detail"] == f"{field}: {WORDS}", r.content
    assert snapshot() == before


@pytest.mark.parametrize("name", ["\u200d", "\u200c \u200d", "\u2800", " \ufe0f"])
def test_a_blank_of_invisibles_is_refused_with_the_blank_words(api_as, adam, acme, name):
    """A notification endpoint's name or filter value of joiners, braille blanks and
    selectors shows nothing: refused as a blank one is ("must be a non-empty string"),
    by the API (the dashboard form: tests/views/test_notifications_page.py)."""
    a = api_as(adam)
    before = snapshot()
    base = {"name": "hook", "channel": "webhook", "url": "https://hooks.example.com/x",
            "event_types": ["run.needs_review"]}
    r = a.post(url("acme", "notification-endpoints"), {**base, "name": name}, format="json")
    # Blank comes first (``check_name``'s ``blank_words``), a lone selector included.
    assert r.json()["detail"] == "name: must be a non-empty string", r.content
    r = a.post(url("acme", "notification-endpoints"), {**base, "kinds": [name]},
               format="json")
    assert r.status_code == 400 and r.json()["detail"].startswith("kinds: ")
    assert snapshot() == before


def test_a_tenant_name_of_joiners_is_blank(db):
    """A tenant's display name (the create_tenant command's ``--name``: tests/
    test_commands.py) of zero-width joiners shows as nothing on every page of the
    tenant: refused with the blank name's words, no tenant made."""
    from checkpoints import services
    from checkpoints.exceptions import InvalidPayload
    from checkpoints.models import Tenant

    for name in ("\u200d", "\u200c\u200d", " \u200d ", "\u2800"):
        with pytest.raises(InvalidPayload, match="^name: must not be blank"):
            services.tenant_create(slug="ghost", name=name)
    assert not Tenant.objects.filter(slug="ghost").exists()
    assert services.tenant_create(slug="ghost", name="\U0001F469\u200d\U0001F4BB co").name


@pytest.mark.parametrize("name", [" ", "\u200d", "\u200c \u200d", "\u2800"])
def test_a_required_name_of_nothing_that_shows_is_refused_as_an_empty_one(
        api_as, wendy, name):
    """(stop 35) An operation key, an effect's service or a lease owner made only of
    spaces, joiners or braille blanks passed the old ``not value`` and showed as nothing
    on the run page a reviewer reconciles from. Each is refused with the empty value's
    words (``check_name(..., blank_words=...)``), nothing written; the import's
    idempotency key: tests/test_runifold_io.py."""
    from tests.helpers import effect_body

    w = api_as(wendy)
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": name, "ttl_s": 5})
    assert r.status_code == 400, r.content
    assert r.json()["detail"] == ("owner: must be a non-empty string of at most 256 "
                                  "characters"), r.content
    for field in ("operation_key", "service"):
        body = effect_body(run_id=rid, **{field: name})
        r = put(w, "acme", "effects", body, create=True)
        assert r.status_code == 400, r.content
        assert r.json()["detail"] == f"{field}: must be a non-empty string", r.content
    assert snapshot() == before


def test_no_joiner_or_selector_hides_beside_an_ascii_character():
    """(stop 35, the attack's finding) The generated table over every printable ASCII
    character: a joiner beside it (either side) and a variation selector after it are
    refused, but for a keycap's presentation (``1\\ufe0f\\u20e3``); beside characters
    outside ASCII both stay (the emoji and Persian names above)."""
    for c in map(chr, range(0x20, 0x7F)):
        for joiner in sorted(JOINERS):
            for name in (f"x{c}{joiner}\u00e9", f"\u00e9{joiner}{c}x", f"{c}{joiner}{c}"):
                assert name_problem(name) == WORDS, (c, hex(ord(joiner)), name)
        for vs in sorted(VARIATION_SELECTORS):
            keycap = c in "0123456789#*" and vs in "\ufe0e\ufe0f"
            assert name_problem(f"x{c}{vs}") == WORDS, (c, hex(ord(vs)))  # no keycap follows
            assert (name_problem(f"x{c}{vs}\u20e3") == "") is keycap, (c, hex(ord(vs)))
    assert name_problem("\u845b\ufe00") == ""


#: Names that hold a joiner where it joins (RFC 5892 Appendix A; Unicode TS #51).
JOINED = (
    "\u0915\u094d\u200d\u0937",                          # Devanagari half form (ZWJ)
    "\u0915\u094d\u200c\u0937",                          # explicit virama (ZWNJ)
    "\u09b0\u200d\u09cd\u09af\u09be\u09ac",                  # Bengali ya-phala (ZWJ, virama)
    "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",  # Scotland
    "\u0dc1\u0dca\u200d\u0dbb",                          # Sinhala (al-lakuna, ZWJ)
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",    # Persian (ZWNJ)
    "\u0628\u064e\u200c\u0628",                          # a transparent mark between
    "dev-\U0001F469\u200d\U0001F4BB",                     # emoji ZWJ sequence
    "\U0001F469\U0001F3FD\u200d\U0001F4BB",                # with a skin tone
    "\U0001F3F3\ufe0f\u200d\U0001F308",                    # with the emoji selector
    "\u2764\ufe0f\u200d\U0001F525",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467",           # a family
)


def test_a_joiner_stays_only_where_it_joins():
    """(stop 36's judged leftover) A joiner between two letters of a script that neither
    joins nor has a virama read as the letters (``\u00e9\u200d\u00e9`` as
    ``\u00e9\u00e9``: a second operation key that looks like the first). Now the rules
    that say where one belongs decide. The generated table: every letter of the Basic
    Multilingual Plane that joins no neighbour (no Arabic-style joining type), with
    either joiner on both sides of it, is refused; the names that need one stay."""
    # The joining types RFC 5892's rule reads (function-level: this test alone needs them).
    from idna.idnadata import joining_types
    from idna.intranges import intranges_contain


    for name in JOINED:
        assert name_problem(name) == "", name
        assert shown(name, 80) == name
    refused = 0
    for cp in range(0x80, 0x10000):
        ch = chr(cp)
        if (0xD800 <= cp <= 0xDFFF or not unicodedata.category(ch).startswith("L")
                or any(intranges_contain(cp, r) for r in joining_types.values())):
            continue
        for joiner in sorted(JOINERS):
            name = f"{ch}{joiner}{ch}"
            assert name_problem(name) == WORDS, (hex(cp), hex(ord(joiner)))
            refused += 1
    assert refused > 80_000  # the table is the plane's letters, not a handful
    for name in ("\u0627\u200c\u0628",   # alef joins nothing after it
                 "\u0628\u200c",          # nothing to join to
                 "\u0915\u200d\u0937",    # no virama before the joiner
                 "\u2764\u200d",          # an emoji joined to nothing
                 "\u2764\u200d\u00e9",    # an emoji joined to a letter
                 "\u200d\U0001F308",      # at the start
                 "\u0915\u094d\u200c-1",  # after a virama, before ASCII (stop 37)
                 "\u0d28\u0d4d\u200d",    # the old chillu at the end: U+0D7B is its spelling
                 "\u00b0\u200d\u00b0",    # two symbols that are no emoji
                 "\U0001F600\u200d\U0001F600",  # two emoji Unicode joins into nothing
                 "\U0001F3F4\U000E0067\U000E007F"):  # a tag sequence of no flag
        assert name_problem(name) == WORDS, name


def test_a_selector_follows_only_a_base_that_has_variants():
    """(stop 35, the second attack's finding) The generated table over every character
    of the Basic Multilingual Plane outside ASCII that shows: a selector after a letter of
    a script with no variation sequences (``charg\u00e9\U000E0100``) hides and is refused;
    after a symbol or punctuation mark (VS1-16), an ideograph (VS1-14 and the
    ideographic ones) or a Mongolian letter (its FVS) it stays."""
    import unicodedata as ud

    for cp in range(0x80, 0x10000):
        ch = chr(cp)
        if 0xD800 <= cp <= 0xDFFF or not jsonparse._base(ch):
            continue
        category = ud.category(ch)
        ideograph = ud.name(ch, "").startswith("CJK ")
        for vs in ("\ufe00", "\ufe0f", "\U000E0100", "\u180b"):
            if vs == "\u180b":
                shows = 0x1800 <= cp <= 0x18AF
            elif vs == "\U000E0100":
                shows = ideograph
            elif category[0] in "SP" or (vs == "\ufe0f" and ch == "\u2139"):
                shows = True
            else:
                shows = category[0] == "L" and vs == "\ufe00" and (
                    ideograph or any(a <= cp <= b for a, b in jsonparse._VARIANT_LETTERS))
            assert (name_problem(f"{ch}{vs}") == "") is shows, (hex(cp), hex(ord(vs)))
    for name in ("charg\u00e9\U000E0100:A-1042", "charg\u00e9\ufe00:A-1042",
                 "\u0430\ufe0f", "\u05d0\ufe00", "\u0661\ufe0f"):  # Latin, Cyrillic, Hebrew, digit
        assert name_problem(name) == WORDS, name
