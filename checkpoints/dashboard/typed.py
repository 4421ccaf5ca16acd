"""Values typed into the dashboard's POSTed forms that the services judge (the Data page,
the legal-hold form, the notification endpoint form): one value per field
(``posted``), a textarea's line breaks (``textarea_value``), a typed number read as the
API reads a JSON number (``typed_number``), and the Data page's subject-field lines
(``subject_line``, ``subject_lines``, ``policy_fields``). Nothing here writes; the
views hand the values to ``checkpoints.services``, which judge them as the API's bodies.
(Split from ``forms``, which parses query strings and the run actions' forms.)
"""

from __future__ import annotations

import json
import re

from django.core.exceptions import ValidationError
from django.http import QueryDict

from .. import services
from ..exceptions import InvalidPayload
from ..jsonparse import JSON_WHITESPACE, name_problem
from ..models.lifecycle import SUBJECT_FIELDS_MAX
from ..services.retention import POINTER_MAX

#: A textarea's line breaks, as a browser sends them (CR LF) or a client may (LF, CR):
#: only these end a line; any other character reaches the service's check.
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def textarea_value(raw: str) -> str:
    """A textarea's value as typed: every CR LF made LF, nothing else changed. A browser
    sends each line break of a textarea as CR LF whatever was typed or pasted (HTML's
    form submission normalises them), while a JSON payload's text, which the subject
    index holds as it is (``services.subject_value``), breaks its lines with LF. So a
    value typed over several lines reaches the service as the payload holds it. A lone
    CR or LF (a client that is no browser) is kept. The cost: a value holding CR LF
    itself can be held only through the API (``POST …/legal-holds``)."""
    return raw.replace("\r\n", "\n")


def subject_line(name: str, pointer: str) -> str:
    """One line of the Data page's ``subject_fields``: ``name = pointer``, the pointer as
    stored. A pointer ``services.subject_pointer_problem`` refuses (stored before that
    rule: a line break, a control, bidirectional or invisible character, surrounding
    whitespace) is written as a JSON string with those characters escaped
    (``x = "/a\\nb"``): it takes one line, shows what it holds, and ``policy_fields``
    reads it back unchanged. No pointer begins with ``"`` (RFC 6901: ``/``)."""
    if not services.subject_pointer_problem(pointer):
        return f"{name} = {pointer}"
    quoted = json.dumps(pointer, ensure_ascii=False)
    return f"{name} = " + "".join(
        f"\\u{ord(ch):04x}" if name_problem(ch) or (ch.isspace() and ch != " ") else ch
        for ch in quoted)


def subject_lines(text: str) -> dict[str, str]:
    """``policy_fields``' reading of ``subject_fields``: one ``name = pointer`` a line
    (CR LF, LF or CR; blank lines skipped), the spaces around ``=`` the separator's, the
    pointer to the line's end as typed (a trailing space is the pointer's: the service
    refuses it), or a JSON string (``subject_line``). Raises ``ValidationError`` for a
    line that is none of these or a name given twice (as the API's JSON refuses a
    duplicated key); every rule of the names and pointers is the service's
    (``services.data_policy_check``), so the page and ``PUT …/data-policy`` agree."""
    out: dict[str, str] = {}
    for line in LINE_BREAK.split(text):
        if not line.strip():
            continue
        name, eq, pointer = line.partition("=")
        name, pointer = name.strip(" \t"), pointer.lstrip(" \t")
        if not eq:
            raise ValidationError(f"{line.strip()[:64]!r}: write name = /pointer")
        if pointer.startswith('"'):
            try:
                pointer = json.loads(pointer)
            except ValueError:
                raise ValidationError(f"{name[:64]!r}: a pointer in quotes must be one JSON "
                                      'string ("/a\\u202eb")') from None
        if name in out:
            raise ValidationError(f"{name[:64]!r} is given twice")
        out[name] = pointer
    return out


#: The Data page's policy fields that are numbers (``policy_fields``).
POLICY_NUMBERS = ("payload_retention_days", "effect_retention_days", "restart_interval_s",
                  "tombstone_retention_days", "payload_flag_bytes")
#: The longest ``subject_fields`` text the form reads: room for every line the page can
#: show (16 names of 64, " = ", a pointer of 512 stored before the one-line rule shown
#: escaped, up to six characters each, in quotes, and a line break); 20,000 refused saving
#: such a stored policy back (stop 34). A bound on the parse, not a policy rule.
SUBJECT_TEXT_MAX = SUBJECT_FIELDS_MAX * (64 + 3 + 6 * POINTER_MAX + 2 + 2)


def typed_number(raw: str) -> int | str | None:
    """A number as typed in a form (the Data page's policy, a notification endpoint's
    seconds), read as the API reads the same text as a JSON body's value: empty or only
    JSON's whitespace (``jsonparse.JSON_WHITESPACE``: space, tab, CR, LF) is ``None``
    (the API's ``null``: forever / never, or the field's default), ASCII digits with
    only that whitespace around them an int, anything else the text as typed, which the
    service refuses in its own words (``services.retention._int_or_none``: "must be an
    integer in 1..36500 or null"). So ``"30\x0b"``, ``"\u00a030"`` or ``"３０"`` are
    refused as the API refuses them, never read as 30 (``str.strip`` and ``int`` take
    them). No range here: the rule has one home, the service."""
    text = raw.strip(JSON_WHITESPACE)
    if not text:
        return None
    # 19 digits: past any bound of the policy, and far below Python's int-parse limit.
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return int(text)
    return raw


def posted(post: QueryDict, names) -> dict[str, str]:
    """The fields ``names`` a form posted, one value each (those left out are not in
    the dict); raises ``InvalidPayload`` (400) ``"<name>: given more than once"`` for a
    field posted twice, as a duplicated JSON key or query parameter is refused
    (``querystring.single_values``), rather than Django's last value winning (the
    stop-35 attack: ``payload_retention_days=30&payload_retention_days=`` saved "keep
    forever"). For the forms whose values a service judges (``policy_fields``, the
    legal hold's)."""
    fields = {}
    for name in names:
        values = post.getlist(name)
        if len(values) > 1:
            raise InvalidPayload(f"{name}: given more than once")
        if values:
            fields[name] = values[0]
    return fields


def policy_fields(post: QueryDict) -> dict:
    """The Data page's policy form as ``services.data_policy_set``'s fields, the API's
    ``PUT …/data-policy`` body: each field the form sent (one left out keeps its value,
    as in the API), numbers by ``typed_number``, ``secrets_policy`` as sent,
    ``subject_fields`` read by ``subject_lines`` (one ``name = /pointer`` a line, as
    ``subject_line`` shows them: what the page shows comes back unchanged). Every rule
    of the values is the service's (``services.data_policy_check``): the page and the
    API refuse the same input in the same words. Raises ``InvalidPayload`` naming
    ``subject_fields`` for a text that is no list of lines (too long, a line without
    ``=``, a name twice, a bad quoted pointer), and naming any field posted twice
    (``posted``)."""
    post = posted(post, (*POLICY_NUMBERS, "secrets_policy", "subject_fields"))
    fields: dict = {name: typed_number(post[name]) for name in POLICY_NUMBERS if name in post}
    if "secrets_policy" in post:
        fields["secrets_policy"] = post["secrets_policy"]
    if "subject_fields" in post:
        text = post["subject_fields"]
        if len(text) > SUBJECT_TEXT_MAX:
            raise InvalidPayload(f"subject_fields: at most {SUBJECT_TEXT_MAX} characters")
        try:
            fields["subject_fields"] = subject_lines(text)
        except ValidationError as exc:
            raise InvalidPayload(f"subject_fields: {exc.messages[0]}") from None
    return fields


# --------------------------------------------------------------------------------------
# Pages that move by themselves and the approver's queue (issue 21, items 8 and 9)
# --------------------------------------------------------------------------------------
