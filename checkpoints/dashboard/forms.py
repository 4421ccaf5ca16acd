"""Dashboard forms: they only parse and validate request parameters.

Nothing here writes; the views hand the cleaned values to ``checkpoints.services`` (writes)
and ``checkpoints.selectors`` (reads). ``first_error`` turns a form's errors into the one
line the dashboard shows, naming the field (bad input is a 400, never a 500). Every field
is bounded by the column it reaches (text: ``max_length``, and Django's ``CharField``
refuses U+0000; integers: at most 2^63-1), so nothing out of range gets to a query
(CONTRACT.md section 6, ``docs/security/input.md``).
"""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

from django import forms
from django.core.exceptions import ValidationError
from django.http import HttpRequest, QueryDict

from .. import audit
from ..exceptions import InvalidPayload
from ..intranges import SCHEMA_VERSION
from ..models import BULK_MAX_RUNS, MAX_REVISION, BulkAction, RecoveryState, Run
from ..querystring import refusal_words, single_values
from ..selectors import (
    DEFAULT_RUN_SORT,
    MICROS_MAX,
    RUN_SORTS,
    SEARCH_MAX,
    filter_limit,
    search_terms,
)
from ..vocab import BulkActionKind, BulkState

#: Inbox "age" filter choices: only runs whose last write is at least this many seconds old.
AGE_CHOICES = [
    ("", "any age"),
    ("300", "quiet ≥ 5 min"),
    ("3600", "quiet ≥ 1 h"),
    ("86400", "quiet ≥ 1 day"),
    ("604800", "quiet ≥ 7 days"),
]

#: The inbox tabs are ``RecoveryState.INBOX_TABS``; this pseudo-state lists every state.
ALL_TAB = "all"
DEFAULT_TAB = RecoveryState.AMBIGUOUS.value


def first_error(form: forms.Form) -> str:
    """``"field: message"`` for the first invalid field of a bound, invalid form (a
    refused choice also names the choices: ``querystring.refusal_words``)."""
    for field, errors in form.errors.as_data().items():
        name = "form" if field == "__all__" else field
        return f"{name}: {refusal_words(form.fields.get(field), errors[0])}"
    return ""


class ReasonForm(forms.Form):
    """Every review action and payload reveal needs a reason (CONTRACT.md 3); at most
    4000 characters, as ``services._require_reason`` enforces."""

    reason = forms.CharField(max_length=4000, strip=True,
                             error_messages={"required": "a reason is required"})


class RevisionNumberField(forms.IntegerField):
    """A revision or sequence number in a query string or a form (the reveal and diff
    forms' revisions): ASCII digits only (Django's ``IntegerField`` would take ``" 7"``,
    ``"+7"`` or ``"\u0661"``, and the API's parameters do not), ``min_value`` (1 unless
    given) to ``MAX_REVISION`` (the column's range). Given empty (``?before=``) it is
    refused like any typed API parameter; absent, it is ``None``."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_REVISION)
        super().__init__(**kwargs)

    def to_python(self, value):
        if value is not None and not (
                isinstance(value, str) and value.isascii() and value.isdigit()):
            raise ValidationError("must be a number (digits 0-9)")
        return super().to_python(value)


class RevealForm(ReasonForm):
    """Reveal one revision of a checkpoint's payload; no ``revision`` means the latest."""

    # Read as every other revision field is (``RevisionNumberField``: digits only): Django's
    # IntegerField revealed "1.0", "+1", " 1" or "\u0661" as revision 1 (stop 36's attack).
    revision = RevisionNumberField(required=False, min_value=0)


class CloseForm(ReasonForm):
    """Close a run (reviewer): a reason, and a ticked ``confirm`` box, because the
    reviewer cannot undo it (only the runtime's next write reopens the run)."""

    confirm = forms.BooleanField(
        error_messages={"required": "tick the box to confirm closing the run"})


class MarkUnknownForm(ReasonForm):
    """Mark an effect's outcome unknown (reviewer, dashboard): a reason, and a ticked
    ``confirm`` box like ``CloseForm``'s, because nothing moves the effect back: a retry
    then needs an approver who accepts a possible duplicate. The API's body stays
    ``{"reason"}`` (CONTRACT.md): the confirmation is the dashboard's (issue 9, item 5)."""

    confirm = forms.BooleanField(
        error_messages={"required": "tick the box to confirm marking the outcome unknown"})


class LeaseRevokeForm(ReasonForm):
    """End the run's live lease (``services.lease_revoke``): a reason, a ticked ``confirm``
    box as ``CloseForm``'s, and the ``owner`` the page showed (its ``expected_owner``).
    The token it showed is read by the view as the API reads it (``lease_token``)."""

    # As the page showed it: a name may begin or end with a space (the stop-37 attack's
    # "worker-1 " could not be ended from the page).
    owner = forms.CharField(max_length=Run._meta.get_field("lease_owner").max_length,
                            strip=False,
                            error_messages={"required": "reload the page"})
    confirm = forms.BooleanField(
        error_messages={"required": "tick the box to confirm ending the lease"})


class DiffForm(ReasonForm):
    """Diff two revisions (``from_rev`` -> ``to_rev``) of one checkpoint; both are revealed."""

    from_rev = RevisionNumberField(min_value=0, label="from")
    to_rev = RevisionNumberField(min_value=0, label="to")


class QueryForm(forms.Form):
    """Base of every dashboard page's query string: its fields are the parameters the
    page takes (the team's rule: "query parameters are validated like bodies";
    docs/search.md, ``docs/security/input.md`` section 4). A page reads it with
    ``from_request`` (a form posting a query string, with ``from_string``), never
    ``Form(request.GET)``: first the raw query string (``querystring.single_values``, the
    API's own check: a parameter the page does not take, one given more than once,
    percent-encoded bytes that are not UTF-8), then the fields. Either refusal is
    ``InvalidPayload`` (400) naming the parameter, which ``common.domain_errors`` shows as
    the dashboard's error page or fragment. A page taking no parameter uses ``NoQuery``."""

    @classmethod
    def from_request(cls, request: HttpRequest) -> QueryForm:
        """The bound, valid form of ``request``'s query string; raises ``InvalidPayload``
        (400) naming the first parameter refused (class doc)."""
        return cls._checked(request.META.get("QUERY_STRING", ""), request.GET)

    @classmethod
    def from_string(cls, raw: str, *, name: str) -> QueryForm:
        """As ``from_request``, for a query string posted as the field ``name`` (the bulk
        bar's ``filters``); the refusal names both: ``filters: q: given more than once``."""
        try:
            return cls._checked(raw, QueryDict(raw))
        except InvalidPayload as exc:
            raise InvalidPayload(f"{name}: {exc.detail}") from None

    @classmethod
    def _checked(cls, raw: str, query: QueryDict) -> QueryForm:
        single_values(raw, query, known=cls.base_fields)
        form = cls(query)
        if not form.is_valid():
            raise InvalidPayload(first_error(form))
        return form


class NoQuery(QueryForm):
    """The query string of a page that takes no parameter (the run page, its audit
    fragment, the bulk result page, ``/``): any parameter is a 400 naming it."""


def _searchable(value: str) -> None:
    """A ``q`` the search can read (``selectors.search_terms``: no control character)."""
    try:
        search_terms(value)
    except InvalidPayload as exc:
        raise ValidationError(exc.detail.removeprefix("q: ")) from None


def search_field() -> forms.CharField:
    """The search box ``q`` (``selectors.RunFilters.q``): at most ``SEARCH_MAX``
    characters (the longest column searched), no control characters; blank = none."""
    return forms.CharField(required=False, max_length=SEARCH_MAX, strip=True,
                           validators=[_searchable])


def name_filter(name: str) -> forms.CharField:
    """The inbox's text filter ``name`` (``kind``; ``subject``: agent or workflow),
    optional: every value a write can store in the run columns it is matched against, as
    sent. Whitespace is kept, never stripped (a run identity may begin or end with a
    space: the name rule, ``jsonparse.name_problem``, which ``querystring.single_values``
    applies to every query value; a stripped ``"refund "`` also matched ``"refund"``, and
    ``" "`` filtered nothing), as ``GET …/runs`` and a bulk body's ``filters`` keep it; at
    most ``selectors.filter_limit(name)``, the longest of those columns, as the API's (the
    stop-38 attack: ``subject`` read ``Run.agent`` alone, so a widened workflow column
    made the API take a subject the inbox refused). Blank: no filter."""
    return forms.CharField(required=False, max_length=filter_limit(name), strip=False)


class InboxFilterForm(QueryForm):
    """Inbox query string: ``state`` (a recovery state or ``all``), ``q`` (the search),
    ``kind``, ``subject`` (agent or workflow, substring), ``age`` (seconds, from
    ``AGE_CHOICES``), ``sort`` (``selectors.RUN_SORTS``), ``cursor`` (only bounded here;
    the inbox, its tab counts and its poll decode it against the tab, the filters and the
    sort: ``inbox.check_cursor``)."""

    state = forms.ChoiceField(
        required=False,
        choices=[(ALL_TAB, ALL_TAB)] + RecoveryState.choices,
    )
    kind = name_filter("kind")
    subject = name_filter("subject")
    age = forms.ChoiceField(required=False, choices=AGE_CHOICES)
    q = search_field()
    sort = forms.ChoiceField(required=False, choices=[(k, k) for k in RUN_SORTS])
    cursor = forms.CharField(required=False, max_length=512)

    def clean_state(self) -> str:
        return self.cleaned_data.get("state") or DEFAULT_TAB

    def clean_sort(self) -> str:
        return self.cleaned_data.get("sort") or DEFAULT_RUN_SORT

    def clean_age(self) -> int | None:
        value = self.cleaned_data.get("age")
        return int(value) if value else None


#: The longest ``back`` a run page takes (an inbox URL with its filters and cursor).
BACK_MAX = 1024


class RunPageForm(QueryForm):
    """The run page's query string: ``back``, where its back link returns (the inbox tab,
    filters and page the reviewer came from; issue 21, item 10). Here only its form: a
    path on this site (``/`` then no second ``/`` or ``\\``, no scheme or host, no control
    character, at most ``BACK_MAX`` characters); the view then requires the tenant's
    inbox path and an inbox query string (``back_target``), so it never leads
    elsewhere (no open redirect)."""

    back = forms.CharField(required=False, max_length=BACK_MAX, strip=False)

    def clean_back(self) -> str:
        value = self.cleaned_data.get("back") or ""
        if value and (not value.startswith("/") or value.startswith(("//", "/\\"))
                      or "\\" in value or any(ord(c) < 32 or ord(c) == 127 for c in value)):
            raise ValidationError("must be a path of this dashboard's inbox")
        return value


def back_target(back: str, inbox_path: str) -> tuple[str, str] | None:
    """``(href, state)`` of a checked ``RunPageForm`` ``back`` when it is exactly the
    tenant's inbox (``inbox_path``) with an inbox query string (``InboxFilterForm``,
    checked as the inbox checks it), ``state`` its tab or ``""``; ``None`` for no
    ``back``. Raises ``InvalidPayload`` naming ``back`` for anything else: another path,
    another tenant, a host, a scheme, a query string the inbox would refuse."""
    if not back:
        return None
    parts = urlsplit(back)
    if parts.scheme or parts.netloc or parts.fragment or parts.path != inbox_path:
        raise InvalidPayload("back: must be a path of this dashboard's inbox")
    form = InboxFilterForm.from_string(parts.query, name="back")
    state = form.data.get("state", "")
    if form.cleaned_data["cursor"] and state:
        # A page after the first (the inbox's paging links always name their tab): its
        # cursor checked as the inbox checks it, so the link never leads to a 400. A
        # cursor without its tab is the inbox's to judge against its landing tab (which
        # depends on the counts): taken as the inbox takes it (the final attack's finding).
        from .inbox import check_cursor  # inbox imports this module

        try:
            check_cursor(form.cleaned_data, state)
        except InvalidPayload as exc:
            raise InvalidPayload(f"back: {exc.detail}") from None
    return (f"{inbox_path}?{parts.query}" if parts.query else inbox_path), state


#: An incident reference a reviewer types (``INC-2041``): kept in their session while
#: they work and stored on each audit event they cause (issue 21, item 10); its rule
#: and length live in ``audit.incident_ref_checked`` (the API's ``Incident-Ref`` too).
INCIDENT_REF_MAX = audit.INCIDENT_REF_MAX


class IncidentForm(forms.Form):
    """The incident a reviewer works on: ``incident_ref`` (empty: none), at most
    ``INCIDENT_REF_MAX`` characters of printable text (no control character)."""

    incident_ref = forms.CharField(required=False, max_length=INCIDENT_REF_MAX, strip=True)

    def clean_incident_ref(self) -> str:
        value = self.cleaned_data.get("incident_ref") or ""
        problem = audit.incident_ref_problem(value)
        if problem:
            raise ValidationError(problem)
        return value


class AuditFilterForm(QueryForm):
    """Audit log query string: ``q`` (the events of the runs the inbox search finds, and
    those whose incident reference starts with it: ``selectors.audit_list``),
    ``actor`` (username or ``system``), ``action``, ``run`` (a run UUID) and ``before``
    (page backwards from this sequence number)."""

    q = search_field()
    actor = forms.CharField(required=False, max_length=150, strip=True)
    action = forms.CharField(required=False, max_length=64, strip=True)
    run = forms.UUIDField(required=False)
    before = RevisionNumberField(required=False)


class HistoryForm(QueryForm):
    """History page query string (``run.checkpoint_history``, ``run.effect_history``):
    ``before``, the revisions below this number (none: from the latest), newest first."""

    before = RevisionNumberField(required=False)


#: The bulk form's ``scope``: the ticked runs, or every run the inbox's filters match.
BULK_SELECTED, BULK_MATCHING = "selected", "matching"


#: The longest run id the bulk form takes: the 36 characters of the form every page and
#: API answer shows (8-4-4-4-12 hex digits). ``uuid.UUID`` drops every dash, so a longer
#: value (32 digits and 40 dashes) would otherwise be read as a run id.
RUN_ID_MAX = 36


class RunIdsField(forms.Field):
    """The ticked runs of the inbox (``run``, repeated): each a run id (UUID) of at most
    ``RUN_ID_MAX`` characters, duplicates dropped, at most ``BULK_MAX_RUNS``. Cleans to a
    list of ``uuid.UUID``; a value that is not one is refused whole, never cut."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> list[uuid.UUID]:
        out: dict[uuid.UUID, None] = {}
        for raw in value or []:
            raw = str(raw)
            shown = repr(raw[:40] + ("…" if len(raw) > 40 else ""))
            if len(raw) > RUN_ID_MAX:
                raise forms.ValidationError(
                    f"{shown} is not a run id (at most {RUN_ID_MAX} characters)")
            try:
                out.setdefault(uuid.UUID(raw))
            except ValueError:
                raise forms.ValidationError(f"{shown} is not a run id") from None
        if len(out) > BULK_MAX_RUNS:
            raise forms.ValidationError(f"at most {BULK_MAX_RUNS} runs per bulk action")
        return list(out)


class BulkForm(ReasonForm):
    """The inbox's bulk bar (issue 9, item 3; ``bulk.bulk_submit``): ``action`` (a
    ``BulkActionKind``), ``reason``, ``client_token`` (the hidden UUID that makes a
    resubmission answer the first one's results), ``scope`` (``selected``: the ticked
    ``run`` boxes; ``matching``: every run ``filters`` selects, the inbox's query string
    as a hidden field), ``confirm`` (required for ``BulkActionKind.CONFIRM``) and
    ``lease_owner`` (``end_lease``'s owner, as sent; blank: none, which the service
    refuses for ``end_lease`` and requires for the others, naming the field)."""

    action = forms.ChoiceField(choices=BulkActionKind.choices)
    client_token = forms.UUIDField(
        error_messages={"required": "missing; reload the inbox and submit again",
                        "invalid": "not a UUID; reload the inbox and submit again"})
    scope = forms.ChoiceField(choices=[(BULK_SELECTED, "the ticked runs"),
                                       (BULK_MATCHING, "every run matching the filters")])
    run = RunIdsField(required=False)
    filters = forms.CharField(required=False, max_length=2000, strip=False)
    confirm = forms.BooleanField(required=False)
    lease_owner = forms.CharField(required=False, strip=False,
                                  max_length=Run._meta.get_field("lease_owner").max_length)
    #: The fields posted once each (``typed.posted``); ``run`` is the ticked runs, many.
    SINGLE = ("action", "reason", "client_token", "scope", "filters", "confirm",
              "lease_owner")

    def clean(self) -> dict:
        data = super().clean()
        data["lease_owner"] = data.get("lease_owner") or None
        if data.get("scope") == BULK_SELECTED and "run" in data and not data["run"]:
            self.add_error("run", "tick at least one run, or choose every run matching the "
                                  "filters")
        if data.get("action") in BulkActionKind.CONFIRM and not data.get("confirm"):
            self.add_error("confirm", f"tick the box to confirm: "
                                      f"{BulkActionKind(data['action']).label} cannot be "
                                      f"undone from the dashboard")
        return data


class BulkListForm(QueryForm):
    """The bulk actions page's query string (``bulk.bulk_list``), the filters of
    ``GET …/bulk-actions`` (``api.params.BulkListParams``, ``selectors.bulk_list``):
    ``action`` (a ``BulkActionKind``), ``state`` (a ``BulkState``), ``requested_by`` (a
    username, exact, as sent; blank: everyone's) and ``cursor`` (the previous page's
    last id). A value outside a choice is 400 naming the parameter and the choices."""

    action = forms.ChoiceField(required=False, choices=BulkActionKind.choices)
    state = forms.ChoiceField(required=False, choices=BulkState.choices)
    requested_by = forms.CharField(
        required=False, strip=False,
        max_length=BulkAction._meta.get_field("requested_by_name").max_length)
    cursor = RevisionNumberField(required=False, max_value=2**63 - 1)


class SchemaVersionField(RevisionNumberField):
    """A schema version in a query string or a form (``to``): ASCII digits only, in
    ``intranges.SCHEMA_VERSION`` (0..2^32-1, the API's range for a version), as
    ``RevisionNumberField``. Whether the kind has that version is the service's check
    (``services.migration_target_check``), never this field's."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", SCHEMA_VERSION.minimum)
        kwargs.setdefault("max_value", SCHEMA_VERSION.maximum)
        kwargs.setdefault("error_messages", {"required": "required: the version to "
                                                         "migrate to"})
        super().__init__(**kwargs)

    def to_python(self, value):
        if value in self.empty_values:  # given empty (a form's blank field): "required"
            return None
        return super().to_python(value)


class FlagField(forms.ChoiceField):
    """A yes/no parameter sent as ``1`` or ``0`` (absent or empty: no); cleans to a
    ``bool``. Anything else (``true``, ``yes``) is refused naming the field, as the API
    refuses a ``reverse`` that is not a boolean."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(choices=[("0", "no"), ("1", "yes")], **kwargs)

    def clean(self, value) -> bool:
        return super().clean(value) == "1"


class MigrationPreviewForm(QueryForm):
    """The migration preview's query string (``kinds.migration_preview_page``): ``to``
    (the target schema version, required) and ``reverse`` (``1``: down steps only)."""

    to = SchemaVersionField()
    reverse = FlagField()


class MigrationForm(forms.Form):
    """The preview's confirm form (``kinds.migration_submit``): the same ``to`` and
    ``reverse`` as the preview it was shown on, and ``client_token``, the hidden UUID
    that makes a resubmission answer the first job (as ``BulkForm``'s)."""

    to = SchemaVersionField()
    reverse = FlagField()
    client_token = forms.UUIDField(
        error_messages={"required": "missing; reload the preview and submit again",
                        "invalid": "not a UUID; reload the preview and submit again"})


class TombstonePageForm(QueryForm):
    """The Data page's query string (``data.data_page``): ``before``, the tombstones
    below this id (none: from the newest)."""

    before = RevisionNumberField(required=False)


class LiveRunForm(QueryForm):
    """The run page's poll: ``seen``, the marker of what the page shows
    (``selectors.RunLive.marker``, 12 hex digits)."""

    seen = forms.RegexField(regex=r"\A[0-9a-f]{12}\Z", max_length=12,
                            error_messages={"invalid": "must be 12 hex digits"})


class NewRunsForm(InboxFilterForm):
    """The inbox's "n new runs" poll: the inbox's own filters (a ``cursor`` is taken and
    checked as the inbox checks it, ``inbox.check_cursor``, then not used: new runs are
    counted over the tab, not one page) and ``since``, the database time the page was
    read at, in microseconds since the epoch (at most the last datetime,
    ``selectors.MICROS_MAX``)."""

    since = RevisionNumberField(required=True, max_value=MICROS_MAX)


class DecideForm(ReasonForm):
    """One decision in the approver's queue: ``decision`` (approve or reject) and the
    reason (required, audited)."""

    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])


class RetryIdsField(forms.Field):
    """The ticked retry requests of the queue: each a number (digits only, 1..the
    column's range), at most ``most``, repeats dropped; one outside is refused naming the
    field (a request decided meanwhile is not refused here: the service says so)."""

    widget = forms.MultipleHiddenInput

    def __init__(self, *, most: int, **kwargs):
        self.most = most
        super().__init__(**kwargs)

    def to_python(self, value) -> list[int]:
        values = list(value or [])
        if len(values) > self.most:
            raise ValidationError(f"at most {self.most} requests at once")
        out: list[int] = []
        for v in values:
            if not (isinstance(v, str) and v.isascii() and v.isdigit()
                    and 1 <= int(v) <= MAX_REVISION):
                raise ValidationError("each must be a request number (digits 0-9)")
            if int(v) not in out:
                out.append(int(v))
        return out

    def validate(self, value) -> None:
        if self.required and not value:
            raise ValidationError("tick at least one request")


class BulkApproveForm(ReasonForm):
    """The queue's bulk approve: the ticked requests (``retry``) and one reason for all
    (each approval audited on its own)."""

    retry = RetryIdsField(most=200)
