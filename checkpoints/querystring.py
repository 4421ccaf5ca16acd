"""Query strings checked before any field sees a value: one place for the API
(``checkpoints.api.params.validate``) and the dashboard
(``checkpoints.dashboard.forms.QueryForm``), so both doors refuse the same things (the
team's rule: "query parameters are validated like bodies"; CONTRACT.md section 6;
``docs/security/input.md`` section 4).

Each refusal is ``InvalidPayload`` (400) whose detail names the parameter:

- percent-encoded bytes that are not UTF-8 (``%FF``, ``%ED%A0%80``: an encoded unpaired
  surrogate): Django decodes them to U+FFFD before any field sees them, so the raw
  query string is read (``check_utf8``);
- a name holding U+0000 or an unpaired surrogate, or one the page or operation does not
  take (``known``): ``unknown parameter``;
- a name given more than once (like a duplicated JSON key): ``given more than once``;
- a value holding a control character (C0, DEL, C1) or a bidirectional control
  (``jsonparse.name_problem``, the rule of every name; U+0000 and lone surrogates are
  refused as the fields' ``text_problem``): no identifier, filter or search the store
  answers has one, and a log or an audit filter that echoes it could be misread:
  ``control character``.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import unquote_to_bytes

from django.utils.datastructures import MultiValueDict

from .exceptions import InvalidPayload
from .jsonparse import name_problem, printable, text_problem


def check_utf8(query_string: str) -> None:
    """Refuse percent-encoded bytes that are not UTF-8 in ``query_string`` (the raw
    ``QUERY_STRING``: ``a=1&b=%FF``), in a name or a value. Raises ``InvalidPayload``
    naming the parameter (``<name>: not UTF-8 ...``)."""
    for pair in query_string.split("&"):
        if "%" not in pair:
            continue
        raw_name, _, raw_value = pair.partition("=")
        name = unquote_to_bytes(raw_name.replace("+", " ")).decode("utf-8", "replace")
        for part in (raw_name, raw_value):
            try:
                unquote_to_bytes(part.replace("+", " ")).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidPayload(
                    f"{printable(name)}: not UTF-8 (an unpaired surrogate or a stray byte)"
                ) from None


def single_values(query_string: str, query: MultiValueDict,
                  known: Collection[str] | None = None) -> dict[str, str]:
    """``query`` (the decoded ``QueryDict`` of the raw ``query_string``) as one value per
    name, after ``check_utf8(query_string)``. ``known``: the names taken (``None``: any
    name, the caller checks them). Raises ``InvalidPayload`` naming the first parameter
    that is not UTF-8, unknown, or given more than once (module doc)."""
    check_utf8(query_string)
    data: dict[str, str] = {}
    for name, values in query.lists():
        if text_problem(name) or (known is not None and name not in known):
            raise InvalidPayload(f"{printable(name)}: unknown parameter")
        if len(values) > 1:
            raise InvalidPayload(f"{printable(name)}: given more than once")
        problem = "" if text_problem(values[0]) else name_problem(values[0])
        if problem:  # name_problem's words, as a body's name gets them (stop 34)
            raise InvalidPayload(f"{printable(name)}: {problem}")
        data[name] = values[0]
    return data



def refusal_words(field, error) -> str:
    """The words of a query parameter's refusal by its field: the field's own, and for a
    choice that is not one also the choices there are ("... is not a valid choice. One
    of: 24h, 7d, 30d, custom."; the stop-38 newcomer met the bare words on ``?range=`` and
    ``?recovery_state=`` and guessed). One home for the API (``api.params.check``: a DRF
    field and its ``ErrorDetail``) and the dashboard (``dashboard.forms.first_error``,
    ``reports.ReportRangeForm``: a Django form field and its ``ValidationError``)."""
    words = " ".join(error.messages) if hasattr(error, "messages") else str(error)
    if getattr(error, "code", "") != "invalid_choice":
        return words
    choices = getattr(field, "choices", None)
    if isinstance(choices, dict):  # DRF: {value: label}
        values = list(choices)
    elif isinstance(choices, list | tuple):  # Django: [(value, label), ...]
        values = [v for v, _ in choices]
    else:  # a model's or a callable's: not listed
        return words
    values = [str(v) for v in values if v not in ("", None)]
    return f"{words} One of: {', '.join(values)}." if values else words
