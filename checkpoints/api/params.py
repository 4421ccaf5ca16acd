"""Query parameters of the API, validated in one place (CONTRACT.md section 6: "and the
same in query parameters"; issue 6, fault 4).

Each endpoint declares the parameters it takes as a ``Params`` serializer (views:
``TenantApi.params``); ``validate`` checks a request against it right after the tenant
is resolved, before any query, and the same class documents the parameters in the
OpenAPI schema (``extend_schema(parameters=[...])``), so the schema and the checks cannot
drift apart. The rules, each a 400 ``{"error": "invalid_payload", "detail": "<name>: ..."}``:

- a parameter the endpoint does not take (typos such as ``recovery_sate`` would
  otherwise silently list everything), or one given twice (like a duplicated JSON key);
- a string with U+0000 or an unpaired surrogate (DRF's ``CharField`` validators; the
  same rule as ``jsonparse.text_problem``), or longer than the column it is compared
  with (limits read from the models, so they follow the columns);
- an integer not written as ASCII digits (``5.0``, ``５``, ``5 ``: 400) or outside
  its range, a UUID that is not one, a value outside a choice.

An empty value is checked like any other: ``?run=`` is not a UUID and ``?limit=`` not
an integer (400), while an empty text filter (``?kind=``) filters nothing. Whitespace is
kept: filters compare exactly.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers
from rest_framework.request import Request

from ..exceptions import InvalidPayload
from ..jsonparse import name_problem, printable
from ..models import MAX_REVISION, AuditEvent, BulkAction, Effect, RecoveryState, Run
from ..querystring import refusal_words, single_values
from ..selectors import (
    BULK_LIST_MAX,
    BULK_LIST_PAGE,
    RETRY_LIST_STATES,
    RETRY_SORTS,
    RUN_SORTS,
    SEARCH_MAX,
    filter_limit,
)
from ..vocab import BulkActionKind, BulkState


def column_limit(model, field: str) -> int:
    """``max_length`` of ``model.field``: the longest value the store can hold."""
    return model._meta.get_field(field).max_length


class Text(serializers.CharField):
    """A string as given: never a number turned into one, whitespace kept, no U+0000 and
    no unpaired surrogate (DRF's validators), at most ``max_length``."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_blank", True)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class Name(Text):
    """A ``Text`` that is a name (``jsonparse.name_problem``: one printable line, no
    control or bidirectional character), the same rule in a query and in a body."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        problem = name_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class PlainInt(serializers.IntegerField):
    """An integer written as ASCII digits only, with a leading ``-`` only where the range
    allows negatives: CONTRACT.md 6 refuses floats "and the same in query parameters",
    so ``5.0`` (which DRF's ``IntegerField`` takes), full-width or other Unicode digits
    and surrounding whitespace (which ``int()`` takes) are 400 (issue 10)."""

    default_error_messages = {
        "invalid": "must be an integer written with the digits 0-9 only",
    }

    def to_internal_value(self, data):
        allowed = _SIGNED_RE if self.min_value is None or self.min_value < 0 else _DIGITS_RE
        if not isinstance(data, str) or not allowed.fullmatch(data):
            self.fail("invalid")
        return super().to_internal_value(data)


_DIGITS_RE = re.compile(r"[0-9]{1,100}")
_SIGNED_RE = re.compile(r"-?[0-9]{1,100}")


def _int(minimum: int, maximum: int, help_text: str, default: int | None = None):
    """A ``PlainInt`` query parameter in ``minimum..maximum``, optional."""
    kwargs: dict[str, Any] = {"required": False, "min_value": minimum, "max_value": maximum,
                              "help_text": help_text}
    if default is not None:
        kwargs["default"] = default
    return PlainInt(**kwargs)


class Params(serializers.Serializer):
    """Base of every endpoint's query parameters; on its own: the endpoint takes none."""


class RunListParams(Params):
    """``GET …/runs``."""

    recovery_state = serializers.ChoiceField(choices=RecoveryState.values, required=False)
    kind = Text(max_length=filter_limit("kind"))
    subject = Text(max_length=filter_limit("subject"),
                   help_text="agent or workflow name, substring")
    age_s_min = _int(0, 10**9, "only runs quiet for at least this many seconds")
    q = Text(max_length=SEARCH_MAX,
             help_text="search, case-insensitive: run id or checkpoint id (prefix), an "
                       "effect's operation key, phase label, agent, workflow or lease "
                       "owner (substring, only when q holds 3 letters or digits in a "
                       "row); no control characters; blank: no search")
    sort = serializers.ChoiceField(
        choices=list(RUN_SORTS), required=False,
        help_text="-created: newest run first (default); created: oldest first. Runs are "
                  "ordered by when they were first recorded, which no write changes, so "
                  "paging never skips or repeats a run")
    cursor = Text(max_length=512, help_text="from the previous page's next or previous "
                                            "URL; only valid with the same filters and sort")
    limit = _int(1, 200, "page size", default=50)


class EffectListParams(Params):
    """``GET …/effects``."""

    service = Name(max_length=column_limit(Effect, "service"))
    operation_key = Name(max_length=column_limit(Effect, "operation_key"))
    run = serializers.UUIDField(required=False, help_text="run_id")
    limit = _int(1, 500, "page size", default=100)


class RetryListParams(Params):
    """``GET …/retry-requests``."""

    state = serializers.ChoiceField(
        choices=list(RETRY_LIST_STATES), required=False,
        help_text="requested (the default without run): awaiting a decision, the "
                  "dashboard's Approvals queue (a request on a run that completed since is "
                  "not listed there); another state; or all: every state (the default "
                  "with run)")
    run = serializers.UUIDField(required=False,
                                help_text="run_id: only this run's requests, in every state "
                                          "unless state is given")
    sort = serializers.ChoiceField(
        choices=list(RETRY_SORTS), required=False,
        help_text="-created: newest request first (default); created: oldest first, the "
                  "Approvals page's order. Requests are ordered by when they were filed, "
                  "which no decision changes, so paging never skips or repeats one")
    cursor = _int(1, 2**63 - 1, "from the previous page's next URL: the id of the last "
                                "request of that page (only valid with the same sort)")
    limit = _int(1, 200, "page size", default=50)


class BulkListParams(Params):
    """``GET …/bulk-actions`` (``selectors.bulk_list``)."""

    # Blank is "any", as the page's filter form sends it (``dashboard.forms.BulkListForm``;
    # the stop-39 attack: the page's own URL answered 400 here).
    action = serializers.ChoiceField(choices=BulkActionKind.values, required=False,
                                     allow_blank=True,
                                     help_text="only bulk actions doing this; blank: any")
    state = serializers.ChoiceField(choices=BulkState.values, required=False,
                                    allow_blank=True,
                                    help_text="only bulk actions in this state; blank: any")
    requested_by = Name(max_length=column_limit(BulkAction, "requested_by_name"),
                        help_text="only those this username submitted (exact); blank: "
                                  "everyone's")
    cursor = _int(1, 2**63 - 1, "from the previous page's next URL (only valid with the "
                                "same filters)")
    limit = _int(1, BULK_LIST_MAX, "page size", default=BULK_LIST_PAGE)


class AuditListParams(Params):
    """``GET …/audit-events``."""

    run = serializers.UUIDField(required=False, help_text="run_id")
    actor = Text(max_length=column_limit(AuditEvent, "actor_name"),
                 help_text='username, or "system"')
    action = Text(max_length=column_limit(AuditEvent, "action"))
    before_seq = _int(1, MAX_REVISION, "from the previous page's next URL")
    q = Text(max_length=SEARCH_MAX,
             help_text="only events of the runs this search finds (as GET …/runs?q=), and "
                       "events whose incident reference starts with it (case-insensitive)")
    limit = _int(1, 200, "page size", default=100)


class AuditProofParams(Params):
    """``GET …/audit-events/{id}/proof``."""

    tree_size = _int(1, 2**63 - 1, "prove under the signed tree head of this many leaves "
                                   "(from the event's leaf index + 1 to the newest head's "
                                   "size); default the newest head")


class TombstoneListParams(Params):
    """``GET …/tombstones``."""

    after = _int(0, 2**63 - 1, "from the previous page's next URL: the last id of that page")
    limit = _int(1, 500, "page size", default=100)


class RevisionListParams(Params):
    """``GET …/checkpoints/{id}/revisions``."""

    cursor = _int(0, MAX_REVISION, "from the previous page's next URL: the last revision "
                                   "of that page")
    limit = _int(1, 100, "page size (a page also stops at about four times the body limit "
                         "of payload bytes)", default=20)


class IdentityParams(Params):
    """The run identity a runtime resumes as: ``GET …/resume`` query parameters and the
    ``POST …/resume`` body. Each at most as long as the run's column (a longer one could
    never match, and CONTRACT.md 6 refuses values the store cannot hold)."""

    agent = Name(max_length=column_limit(Run, "agent"))
    model = Name(max_length=column_limit(Run, "model"), help_text="provider/name")
    workflow = Name(max_length=column_limit(Run, "workflow"))
    definition_version = Name(max_length=column_limit(Run, "definition_version"))



class ReportParams(Params):
    """``GET …/report``: ``range`` (``24h``, ``7d`` the default, ``30d``, ``custom``) or
    ``from``/``to`` (ISO 8601 date or date-time, UTC without an offset; ``to`` after
    ``from``, at most 366 days apart); the rules between them are
    ``checkpoints.reports.window``'s."""

    range = serializers.ChoiceField(choices=["24h", "7d", "30d", "custom"], required=False,
                                    help_text="the last 24 hours, 7 days, 30 days, or custom")
    # ``from`` is a keyword: the two fields are declared by name.
    locals()["from"] = Text(max_length=32, help_text="custom range start: 2026-11-01 or "
                                                     "2026-11-01T12:00Z")
    locals()["to"] = Text(max_length=32, help_text="custom range end; a date alone "
                                                   "includes that day")

class LangGraphListParams(Params):
    """``GET …/langgraph/checkpoints`` (issue 10, docs/langgraph.md). Texts are checked
    again by the service's rules (length at least 1 where an id is meant, no control
    characters), naming the parameter."""

    thread_id = Text(max_length=256, help_text="the LangGraph thread; omitted: every thread")
    checkpoint_ns = Text(max_length=256, help_text='the namespace ("" is the root graph); '
                                                   "omitted: every namespace")
    checkpoint_id = Text(max_length=128, help_text="one checkpoint (get_tuple)")
    before = Text(max_length=128, help_text="only checkpoints whose id sorts before this "
                                            "one: the previous page's next_before")
    limit = _int(1, 1000, "at most this many checkpoints", default=100)
    filter = Text(max_length=65536, help_text="a JSON object: metadata keys and the values "
                                              "they must equal")


def check(params_class: type[Params], data: dict) -> dict[str, Any]:
    """Validate ``data`` (one value per name) against ``params_class``.

    Returns every declared name: its value, its default, or ``None`` when not given.
    Raises ``InvalidPayload`` naming the first unknown or refused name.
    """
    fields = params_class().fields
    for name in data:
        if name not in fields:
            raise InvalidPayload(f"{printable(name)}: unknown parameter")
    serializer = params_class(data=data)
    if not serializer.is_valid():
        name, errors = next(iter(serializer.errors.items()))
        raise InvalidPayload(f"{name}: {refusal_words(fields[name], errors[0])}")
    return {name: serializer.validated_data.get(name) for name in fields}


def validate(request: Request, params_class: type[Params]) -> dict[str, Any]:
    """The request's query parameters checked against ``params_class`` (module doc).

    Returns ``check``'s dict. Raises ``InvalidPayload`` (400) naming the parameter: not
    UTF-8, unknown, repeated (``checkpoints.querystring.single_values``, shared with the
    dashboard's ``forms.QueryForm``), or refused by its field.
    """
    data = single_values(request.META.get("QUERY_STRING", ""), request.query_params)
    return check(params_class, data)
