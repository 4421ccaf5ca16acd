"""Reads: every query filters by tenant first, then by the caller's role on the tenant.

Views and the API never call ``Model.objects`` directly. Lists read metadata columns only
(never payload ciphertext), and paginate by keyset on ``(last_write_at, id)`` so a page
costs the same at any depth.

Nothing here grows with the tenant or the run (issue 8): every list is one index scan in
the order of an index (``models.Run.Meta.indexes`` and the others) stopped by its LIMIT,
every count an index-only GROUP BY, and a run's history (checkpoint revisions, effect
revisions) is read one page of ``HISTORY_PAGE`` at a time, newest first, by keyset on the
revision number (``?before=N``). Each function costs a fixed number of queries whatever
the number of rows behind it (``tests/views/test_query_budget.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import NamedTuple

from django.contrib.contenttypes.models import ContentType
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Count,
    ExpressionWrapper,
    F,
    Func,
    Lookup,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    TextField,
)
from django.db.models.functions import Cast
from guardian.models import GroupObjectPermission

from recovery_client.protocol import thread_run_id

from . import policy, roles
from .dbclock import NOW, db_now
from .exceptions import InvalidPayload, NotFound
from .models import (
    MAX_REVISION,
    ApiToken,
    AuditEvent,
    BulkAction,
    BulkActionItem,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    EffectStateCount,
    ReconcileAttempt,
    ReconcileRequest,
    RecoveryState,
    RetryRequest,
    RetryState,
    Run,
    RunStateCount,
    Tenant,
)
from .permissions import require
from .vocab import BulkOutcome, EffectState

RUN_LIST_FIELDS = (
    "id", "tenant_id", "uuid", "kind", "schema_version", "agent", "model", "workflow",
    "definition_version", "phase_class", "phase_label", "recovery_state", "recovery_reason",
    "state_changed_at", "last_write_at", "created_at", "lease_owner", "lease_expires_at",
    "fencing_token", "unacknowledged_conflicts", "closed_at", "closed_reason",
    "closed_by__username",
)


#: Revisions per page of a checkpoint's or an effect's history (run page, history pages).
HISTORY_PAGE = 50
#: Conflicts the run page lists (the newest; the open ones are counted).
CONFLICT_PAGE = 50


def _uuid_or_404(value, what: str) -> uuid.UUID:
    """``value`` as a UUID; a malformed id is answered like a missing object."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotFound(f"no such {what}") from None


def tenants_for_user(user) -> QuerySet[Tenant]:
    """Tenants where ``user`` holds a role, ordered by slug; none for ``None``, anonymous
    and inactive accounts.

    Like ``permissions.tenant_perms``, only the role groups' object permission
    ``view_runs`` counts: never a global permission, a permission given to the account
    itself, or the superuser/staff flags (CONTRACT.md 4; issue 6, fault 1).
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    tenant_type = ContentType.objects.get_for_model(Tenant)
    granted = (GroupObjectPermission.objects
               .filter(group__user=user, content_type=tenant_type,
                       permission__content_type=tenant_type,
                       permission__codename=roles.VIEW)
               .annotate(tenant_pk=Cast("object_pk", BigIntegerField()))
               .values("tenant_pk"))
    return Tenant.objects.filter(pk__in=granted).order_by("slug")


def tokens_of_account(*, user) -> list[ApiToken]:
    """Every bearer token of ``user`` (live and revoked), newest first, for the operator's
    ``list_tokens``: prefix, created, last used, revoked; the secret is never stored."""
    return list(ApiToken.objects.filter(user=user).order_by("-created_at", "-id"))


def state_counts(*, tenant: Tenant) -> dict[str, int]:
    """``{recovery_state: number of runs}`` for the inbox tabs (every state present).

    One query over the tenant's ``RunStateCount`` rows (at most ``COUNT_SHARDS`` per
    state, kept by triggers in the same transaction as every run change), so it costs
    the same for ten runs and for a million (issue 8)."""
    return _counted(RunStateCount, tenant, RecoveryState.values)


def _counted(model, tenant: Tenant, states) -> dict[str, int]:
    """``{state: n}`` summed over the shards of a state counter table, every one of
    ``states`` present (0 when absent)."""
    counts = dict(model.objects.for_tenant(tenant).order_by().values_list("state")
                  .annotate(total=Sum("n")).values_list("state", "total"))
    return {state: counts.get(state, 0) for state in states}


#: ``q`` longest accepted: the longest column a search reads (``Effect.operation_key``).
SEARCH_MAX = 512
#: The run-side text a search reads, joined by U+001F (which a ``q`` may not hold, so a
#: match never spans two columns): agent, workflow, phase label, lease owner. On
#: PostgreSQL ``run_search_trgm`` (migration 0012) is a trigram GIN index on exactly this
#: expression, so ``ILIKE '%q%'`` over it is an index scan.
SEARCH_COLUMNS = ("agent", "workflow", "phase_label", "lease_owner")
_UUID_TEXT = re.compile(r"^[0-9a-f-]{1,36}\Z")
#: The substring branches of a search (run text, operation keys) need a ``q`` holding at
#: least this many letters or digits in a row. pg_trgm makes its trigrams of letters and
#: digits only, so ``ILIKE '%-%'`` (or ``%ab%``, ``%...%``) extracts none: the trigram
#: indexes cannot narrow it and every run and effect of the tenant is read, once per
#: query of the page (issue 17, item 7: ``?q=-`` took over a second at 6,100 runs).
#: Shorter terms still search the prefix branches (run and checkpoint id: index ranges)
#: and the exact LangGraph thread id (docs/search.md).
SEARCH_SUBSTRING_MIN = 3
_SUBSTRING_TERM = re.compile(rf"[^\W_]{{{SEARCH_SUBSTRING_MIN},}}")
#: The filtered tab counts (and the position of a page) count at most this many matching
#: runs: past it the inbox says "1,000+" rather than count every match of a broad search.
SEARCH_COUNT_CAP = 1000


class RunText(Func):
    """``agent || U+001F || workflow || U+001F || phase_label || U+001F || lease_owner``:
    the expression of the ``run_search_trgm`` index (PostgreSQL). Text, never null (the
    columns are ``NOT NULL``, blank as "")."""

    template = "(%(expressions)s)"
    arg_joiner = " || char(31) || "
    output_field = TextField()

    def __init__(self):
        super().__init__(*SEARCH_COLUMNS)

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, arg_joiner=" || chr(31) || ", **extra)


class Contains(Lookup):
    r"""``lhs`` holds the text ``rhs`` anywhere, case-insensitively: ``ILIKE '%rhs%'`` on
    PostgreSQL (a trigram GIN index serves it), ``LIKE`` on SQLite (case-insensitive for
    ASCII letters only). ``%``, ``_`` and ``\`` in ``rhs`` are matched literally. Used as
    an expression in ``filter()``; never registered on a field."""

    lookup_name = "search_contains"
    prepare_rhs = False

    def get_db_prep_lookup(self, value, connection):
        escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return "%s", [f"%{escaped}%"]

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        operator = "ILIKE" if connection.vendor == "postgresql" else "LIKE"
        return f"{lhs} {operator} {rhs} ESCAPE '\\'", [*lhs_params, *rhs_params]


def uuid_prefix_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """``(lowest, highest)`` UUID starting with ``text`` (hex digits, case-insensitive,
    dashes only where a UUID has them, or none at all), or ``None`` when ``text`` cannot
    start a UUID. A prefix search is then a range of the ``(tenant, uuid)`` unique index,
    on PostgreSQL (``uuid`` type) and SQLite (32 hex digits) alike."""
    text = text.lower()
    if not _UUID_TEXT.match(text):
        return None
    if "-" in text and any((ch == "-") != (i in (8, 13, 18, 23)) for i, ch in enumerate(text)):
        return None
    digits = text.replace("-", "")
    if not digits or len(digits) > 32:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def search_terms(q: str | None) -> str:
    """``q`` as a search reads it: stripped of surrounding white space ("" = no search).
    Raises ``InvalidPayload`` naming ``q`` for a value no column can hold: longer than
    ``SEARCH_MAX``, or holding a control character (U+0000-U+001F, U+007F; the U+001F
    of ``RunText`` among them) or an unpaired surrogate."""
    text = (q or "").strip()
    if len(text) > SEARCH_MAX:
        raise InvalidPayload(f"q: at most {SEARCH_MAX} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 or 0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise InvalidPayload("q: control characters cannot be searched for")
    return text


def search_substring(text: str) -> bool:
    """Whether a search for ``text`` (as ``search_terms`` returns it) reads the substring
    branches: only when it holds ``SEARCH_SUBSTRING_MIN`` letters or digits in a row,
    which gives pg_trgm at least one trigram to look up (``SEARCH_SUBSTRING_MIN``)."""
    return bool(_SUBSTRING_TERM.search(text))


def _search_run_ids(tenant: Tenant, text: str) -> QuerySet:
    """Ids of the tenant's runs a search for ``text`` finds, as one ``UNION ALL``
    subquery (a run may come twice; ``IN`` does not mind):

    - runs whose agent, workflow, phase label or lease owner holds ``text``
      (substring; ``run_search_trgm``), or whose run id starts with it (prefix, the
      ``(tenant, uuid)`` index);
    - runs with an effect whose operation key holds ``text`` (substring;
      ``effect_opkey_trgm``), so an order id is found through ``charge:A-1003``;
    - runs with a checkpoint whose id starts with ``text`` (prefix, ``(tenant, uuid)``);
    - the run of the LangGraph thread whose id is exactly ``text``
      (``recovery_client.protocol.thread_run_id``, issue 10: the run id is derived from it).

    The two substring branches are left out for a ``text`` without
    ``SEARCH_SUBSTRING_MIN`` letters or digits in a row (``search_substring``): no
    trigram index could serve them. Every branch left is then an index lookup or range.

    Payloads are encrypted at rest and never searched: an order id that only a payload
    holds is found through an operation key or not at all (docs/search.md).

    The one builder of the search: the inbox (its rows, tab counts and page position),
    the API's run list, the audit log's ``q`` and a bulk action's "all matching" all
    filter with it (``_filtered_runs``, ``audit_list``), so they find the same runs.
    """
    by_uuid = uuid_prefix_range(text)
    substring = search_substring(text)
    run_match = Q(uuid=thread_run_id(text))
    if substring:
        run_match |= Q(Contains(RunText(), text))
    if by_uuid:
        run_match |= Q(uuid__range=by_uuid)
    ids = Run.objects.for_tenant(tenant).filter(run_match).values("id")
    parts = []
    if substring:
        parts.append(Effect.objects.for_tenant(tenant)
                     .filter(Contains(F("operation_key"), text)).values("run_id"))
    if by_uuid:
        parts.append(Checkpoint.objects.for_tenant(tenant)
                     .filter(uuid__range=by_uuid).values("run_id"))
    return ids.union(*parts, all=True) if parts else ids


@dataclass(frozen=True)
class RunFilters:
    """Inbox and ``GET …/runs`` filters, each optional.

    ``recovery_state``: one state; ``kind``: exact; ``subject``: agent or workflow,
    substring, case-insensitive; ``age_s_min``: only runs whose last write is at least
    this many seconds old (database clock); ``q``: the search (``_search_run_ids``)."""

    recovery_state: str | None = None
    kind: str | None = None
    subject: str | None = None  # agent or workflow name, substring, case-insensitive
    age_s_min: int | None = None
    q: str | None = None

    def without_state(self) -> RunFilters:
        """The same filters over every state (the tab counts)."""
        return replace(self, recovery_state=None)

    @property
    def narrowing(self) -> bool:
        """Whether any filter besides the state is set (then counts need a query)."""
        return bool(self.kind or self.subject or self.age_s_min or search_terms(self.q))

    def fingerprint(self) -> str:
        """12 hex digits naming these filters, kept in a cursor: a cursor made for other
        filters is refused rather than continuing a different list."""
        raw = json.dumps([self.recovery_state or "", self.kind or "", self.subject or "",
                          self.age_s_min or 0, search_terms(self.q)])
        return hashlib.sha256(raw.encode()).hexdigest()[:12]


#: Run list orders: ``sort`` value -> the ``Run.id`` direction. Only keys a write never
#: changes are offered, so a keyset page neither skips nor repeats a run written while
#: someone pages (issue 9): ``-created`` newest run first (the default), ``created``
#: oldest first. ``id`` is the order runs were first recorded in (their first write);
#: "last write" is shown but not a sort: every write moves a run in it, so a run
#: written between two pages would be listed twice or never (docs/search.md).
RUN_SORTS = {"-created": "-id", "created": "id"}
DEFAULT_RUN_SORT = "-created"
_CURSOR_VERSION = 2
_NEXT, _PREVIOUS = "n", "p"


def encode_cursor(*, sort: str, filters: RunFilters, pk: int, direction: str = _NEXT) -> str:
    """Opaque keyset cursor: the page continues after (``direction`` ``n``) or before
    (``p``) the run ``pk`` in the order ``sort``, for these ``filters`` only."""
    raw = json.dumps([_CURSOR_VERSION, sort, filters.fingerprint(), direction, pk])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, *, sort: str, filters: RunFilters) -> tuple[str, int]:
    """``(direction, pk)`` of a cursor made by ``encode_cursor`` for ``sort`` and
    ``filters``. Raises ``InvalidPayload`` naming ``cursor`` for anything else: not
    ours, or made for another sort or other filters (continuing it would list another
    list from a boundary that means nothing there)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        version, made_for, fingerprint, direction, pk = json.loads(
            base64.urlsafe_b64decode(padded.encode()))
        if (version != _CURSOR_VERSION or direction not in (_NEXT, _PREVIOUS)
                or type(pk) is not int or not 1 <= pk <= MAX_REVISION):
            raise ValueError
    except (ValueError, TypeError, json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidPayload("cursor: not a cursor returned by this API") from None
    if made_for != sort or fingerprint != filters.fingerprint():
        raise InvalidPayload("cursor: made for another sort or other filters; "
                             "start again from the first page")
    return direction, pk


class RunPage(NamedTuple):
    """One page of runs: ``rows`` (dicts of ``RUN_LIST_FIELDS``) in the page's order,
    ``next_cursor``/``previous_cursor`` (``None``: no such page)."""

    rows: list[dict]
    next_cursor: str | None
    previous_cursor: str | None


def _filtered_runs(tenant: Tenant, filters: RunFilters) -> QuerySet:
    """The tenant's runs passing ``filters`` (unordered). Raises ``InvalidPayload`` for a
    state that is not one, or a ``q`` no column can hold."""
    if filters.recovery_state and filters.recovery_state not in RecoveryState.values:
        raise InvalidPayload(
            f"recovery_state: must be one of {', '.join(RecoveryState.values)}")
    text = search_terms(filters.q)

    qs = Run.objects.for_tenant(tenant)
    if filters.recovery_state:
        qs = qs.filter(recovery_state=filters.recovery_state)
    if filters.kind:
        qs = qs.filter(kind=filters.kind)
    if filters.subject:
        qs = qs.filter(Q(agent__icontains=filters.subject) | Q(workflow__icontains=filters.subject))
    if filters.age_s_min:
        qs = qs.filter(last_write_at__lte=NOW - timedelta(seconds=filters.age_s_min))
    if text:
        qs = qs.filter(id__in=_search_run_ids(tenant, text))
    return qs


def _sort_or_400(sort: str | None) -> str:
    sort = sort or DEFAULT_RUN_SORT
    if sort not in RUN_SORTS:
        raise InvalidPayload(f"sort: must be one of {', '.join(RUN_SORTS)}")
    return sort

def run_ids_matching(*, user, tenant: Tenant, filters: RunFilters, limit: int) -> list[uuid.UUID]:
    """The public ids of at most ``limit`` runs that ``filters`` select (search ``q``
    included), in the inbox's default order (newest run first): what "all matching"
    means for a bulk action (``services.bulk``, which asks for one more than its maximum
    to tell "too many"). One query, the same index scan as ``run_list``. Raises
    ``NotFound``/``Forbidden``, ``InvalidPayload`` for a bad filter."""
    require(user, tenant, roles.VIEW)
    return list(_filtered_runs(tenant, filters).order_by(RUN_SORTS[DEFAULT_RUN_SORT])
                .values_list("uuid", flat=True)[:max(0, limit)])



def run_list(*, user, tenant: Tenant, filters: RunFilters, sort: str | None = None,
             cursor: str | None = None, limit: int = 50) -> RunPage:
    """One page of the tenant's runs in the order ``sort`` (``RUN_SORTS``, default newest
    run first), and the cursors of the pages after and before it.

    Keyset on ``Run.id``, which no write changes: a run written while someone pages
    keeps its place, so it is listed exactly once and none is skipped (issue 9). The
    previous page is the same keyset read the other way. Raises ``NotFound``/
    ``Forbidden`` via ``permissions.require``, ``InvalidPayload`` naming the field for a
    bad filter, ``sort`` or ``cursor``.

    One query (two when "previous" reaches the first page, which is then read whole): the
    order is that of ``run_inbox_idx`` ``(tenant, recovery_state, -id)`` for a state or
    ``run_all_idx`` ``(tenant, -id)`` for every state, so PostgreSQL reads the index from
    the cursor on and stops after ``limit + 1`` rows at any depth; ``kind``/``subject``/
    ``age_s_min`` filter the rows it reads, ``q`` is a semi-join with the search's
    indexed subquery (``_search_run_ids``).
    """
    require(user, tenant, roles.VIEW)
    sort = _sort_or_400(sort)
    qs = _filtered_runs(tenant, filters)
    limit = max(1, min(limit, 200))
    order = RUN_SORTS[sort]
    descending = order.startswith("-")
    if not cursor:
        return _first_page(qs, sort, filters, limit)
    direction, pk = decode_cursor(cursor, sort=sort, filters=filters)
    after = Q(id__lt=pk) if descending else Q(id__gt=pk)
    if direction == _NEXT:
        rows = list(qs.filter(after).order_by(order).values(*RUN_LIST_FIELDS)[: limit + 1])
        nxt = encode_cursor(sort=sort, filters=filters, pk=rows[limit - 1]["id"]) \
            if len(rows) > limit else None
        rows = rows[:limit]
        prev = encode_cursor(sort=sort, filters=filters, pk=rows[0]["id"],
                             direction=_PREVIOUS) if rows else None
        return RunPage(rows, nxt, prev)
    # The page before ``pk``: the keyset read backwards, then turned round.
    backwards = order[1:] if descending else f"-{order}"
    before = Q(id__gt=pk) if descending else Q(id__lt=pk)
    rows = list(qs.filter(before).order_by(backwards)
                .values(*RUN_LIST_FIELDS)[: limit + 1])
    if len(rows) <= limit:  # reached the top: that is the first page
        return _first_page(qs, sort, filters, limit)
    rows = rows[:limit][::-1]
    return RunPage(rows, encode_cursor(sort=sort, filters=filters, pk=rows[-1]["id"]),
                   encode_cursor(sort=sort, filters=filters, pk=rows[0]["id"],
                                 direction=_PREVIOUS))


def _first_page(qs: QuerySet, sort: str, filters: RunFilters, limit: int) -> RunPage:
    rows = list(qs.order_by(RUN_SORTS[sort]).values(*RUN_LIST_FIELDS)[: limit + 1])
    nxt = encode_cursor(sort=sort, filters=filters, pk=rows[limit - 1]["id"]) \
        if len(rows) > limit else None
    return RunPage(rows[:limit], nxt, None)


def run_position(*, user, tenant: Tenant, filters: RunFilters, sort: str | None,
                 pk: int) -> int | None:
    """How many runs passing ``filters`` come before the run ``pk`` in the order
    ``sort``: the page starting at that run shows "position + 1 - …" (issue 9, "51-100
    of 121"), or ``None`` when a narrowing filter (``RunFilters.narrowing``) puts more
    than ``SEARCH_COUNT_CAP`` runs before it (the count stops there: a broad search is
    not counted whole). One index count of the range before ``pk`` (``run_inbox_idx``/
    ``run_all_idx``); exact at the time of the query, so runs created since the first
    page move the numbers rather than the rows."""
    require(user, tenant, roles.VIEW)
    sort = _sort_or_400(sort)
    before = Q(id__gt=pk) if RUN_SORTS[sort].startswith("-") else Q(id__lt=pk)
    qs = _filtered_runs(tenant, filters).filter(before)
    if not filters.narrowing:
        return qs.count()
    n = qs[:SEARCH_COUNT_CAP + 1].count()
    return None if n > SEARCH_COUNT_CAP else n


class StateCounts(dict):
    """``{recovery_state: runs}``, every state present, and ``capped``: whether more
    than ``SEARCH_COUNT_CAP`` runs pass a narrowing filter, the counts then being those
    of the first ``SEARCH_COUNT_CAP + 1`` found, each a lower bound ("1,000+")."""

    def __init__(self, counts: dict[str, int], capped: bool = False):
        super().__init__(counts)
        self.capped = capped


def run_state_counts(*, user, tenant: Tenant, filters: RunFilters) -> StateCounts:
    """The inbox tabs' counts and the "of n" of a page under ``filters``
    (``StateCounts``). ``filters.recovery_state`` is ignored (each tab counts its own
    state).

    Without a narrowing filter: the tenant-wide counters (``state_counts``, one query
    whatever the tenant's size; exact). With one: one ``GROUP BY recovery_state`` over at
    most ``SEARCH_COUNT_CAP + 1`` filtered runs (a ``LIMIT`` inside, so a search matching
    half the tenant costs a thousand rows, not all of them)."""
    require(user, tenant, roles.VIEW)
    filters = filters.without_state()
    if not filters.narrowing:
        return StateCounts(state_counts(tenant=tenant))
    first = _filtered_runs(tenant, filters).order_by().values("id")[:SEARCH_COUNT_CAP + 1]
    found = Run.objects.for_tenant(tenant).filter(id__in=Subquery(first))
    counts = dict(found.order_by().values_list("recovery_state")
                  .annotate(n=Count("*")).values_list("recovery_state", "n"))
    return StateCounts({state: counts.get(state, 0) for state in RecoveryState.values},
                       sum(counts.values()) > SEARCH_COUNT_CAP)


def run_get(*, user, tenant: Tenant, run_id: uuid.UUID | str) -> Run:
    """The run, or ``NotFound`` (also for a malformed id)."""
    require(user, tenant, roles.VIEW)
    rid = _uuid_or_404(run_id, "run")
    run = Run.objects.for_tenant(tenant).filter(uuid=rid).select_related(
        "latest_checkpoint", "closed_by").first()
    if run is None:
        raise NotFound("no such run")
    return run


@dataclass
class RunDetail:
    """Everything the run page shows (metadata only), each list bounded.

    ``revisions``: checkpoint pk -> its newest ``HISTORY_PAGE`` revisions, newest first;
    ``revisions_older``: checkpoint pk -> the ``before`` of the next older page, or
    ``None`` when the page reaches revision 0. ``effect_history``/``effect_history_older``
    likewise per effect. ``conflicts``: the newest ``CONFLICT_PAGE``; ``open_conflicts``
    counts every unacknowledged one, ``more_conflicts`` says older ones are not listed.
    ``audit``: the newest 200 events.
    """

    run: Run
    checkpoints: list[Checkpoint]
    revisions: dict[int, list[CheckpointRevision]]
    revisions_older: dict[int, int | None]
    effects: list[Effect]
    effect_history: dict[int, list[EffectRevision]]
    effect_history_older: dict[int, int | None]
    conflicts: list[Conflict]
    open_conflicts: int
    more_conflicts: bool
    retry_requests: list[RetryRequest]
    audit: list[AuditEvent]


def _older(latest: int) -> int | None:
    """The ``before`` of the page older than the newest page of a history whose latest
    revision is ``latest`` (revisions are numbered 0, 1, ... without gaps: CAS accepts
    only N+1), or ``None`` when the newest page holds them all."""
    first = latest - HISTORY_PAGE + 1
    return first if first > 0 else None


def _run_checkpoints(run: Run) -> list[Checkpoint]:
    return list(Checkpoint.objects.for_tenant(run.tenant_id)
                .filter(run=run).defer("payload_ciphertext").select_related("written_by")
                .order_by("-received_at", "-id"))


def _run_effects(run: Run) -> list[Effect]:
    effects = list(Effect.objects.for_tenant(run.tenant_id)
                   .filter(run=run).order_by("created_at", "id"))
    for effect in effects:
        effect.run = run  # no lazy query per effect for what the caller already holds
    return effects


def run_detail(*, user, tenant: Tenant, run_id) -> RunDetail:
    """Load a run for its page: its checkpoints with their newest page of revision
    metadata, its effects with their newest page of revisions, its newest conflicts (and
    the number open), its retry requests and its latest 200 audit events.

    Nine queries whatever the run's history: the newest page of every checkpoint is one
    index range on ``(checkpoint, revision)`` per checkpoint (revisions above its latest
    minus ``HISTORY_PAGE``), the same for effects. Older pages: ``checkpoint_history``,
    ``effect_history``. Raises ``NotFound`` (also for a malformed id) and what
    ``permissions.require`` raises.
    """
    run = run_get(user=user, tenant=tenant, run_id=run_id)
    cps = _run_checkpoints(run)
    revisions: dict[int, list[CheckpointRevision]] = {c.pk: [] for c in cps}
    for rev in (CheckpointRevision.objects.for_tenant(run.tenant_id)
                .filter(checkpoint__run=run,
                        revision__gt=F("checkpoint__revision") - HISTORY_PAGE)
                .defer("payload_ciphertext").select_related("written_by")
                .order_by("checkpoint_id", "-revision")):
        revisions.setdefault(rev.checkpoint_id, []).append(rev)
    effects = _run_effects(run)
    history: dict[int, list[EffectRevision]] = {e.pk: [] for e in effects}
    for rev in (EffectRevision.objects.for_tenant(run.tenant_id)
                .filter(effect__run=run, revision__gt=F("effect__revision") - HISTORY_PAGE)
                .defer("receipt_ciphertext").order_by("effect_id", "-revision")):
        history.setdefault(rev.effect_id, []).append(rev)
    conflicts = list(Conflict.objects.for_tenant(run.tenant_id)
                     .filter(run=run).defer("refused_ciphertext")
                     .select_related("acknowledged_by")
                     .order_by("-created_at", "-id")[: CONFLICT_PAGE + 1])
    open_conflicts = (Conflict.objects.for_tenant(run.tenant_id)
                      .filter(run=run, acknowledged_at__isnull=True).count())
    retries = list(RetryRequest.objects.for_tenant(run.tenant_id).filter(run=run)
                   .select_related("requested_by", "decided_by"))
    audit = list(AuditEvent.objects.for_tenant(tenant)
                 .filter(run_uuid=run.uuid).order_by("-seq")[:200])
    return RunDetail(
        run, cps, revisions, {c.pk: _older(c.revision) for c in cps},
        effects, history, {e.pk: _older(e.revision) for e in effects},
        conflicts[:CONFLICT_PAGE], open_conflicts, len(conflicts) > CONFLICT_PAGE,
        retries, audit)


@dataclass
class RunSummary:
    """What ``GET …/runs/{run_id}`` answers (CONTRACT.md 3: the run, its latest
    checkpoints, effects and open review items): no history, no audit."""

    run: Run
    checkpoints: list[Checkpoint]
    effects: list[Effect]
    open_retry: RetryRequest | None
    open_conflicts: list[Conflict]


def run_summary(*, user, tenant: Tenant, run_id) -> RunSummary:
    """The run with its checkpoints' latest revision (metadata), its effects, its open
    retry request and its unacknowledged conflicts, in five queries; nothing it does not
    answer is read (no revision, effect revision or audit event). Raises ``NotFound``
    (also for a malformed id) and what ``permissions.require`` raises."""
    run = run_get(user=user, tenant=tenant, run_id=run_id)
    open_retry = (RetryRequest.objects.for_tenant(run.tenant_id)
                  .filter(run=run, state__in=list(RetryState.OPEN))
                  .select_related("requested_by", "decided_by").first())
    conflicts = list(Conflict.objects.for_tenant(run.tenant_id)
                     .filter(run=run, acknowledged_at__isnull=True)
                     .defer("refused_ciphertext").order_by("-created_at", "-id"))
    return RunSummary(run, _run_checkpoints(run), _run_effects(run), open_retry, conflicts)


def _before(value, what: str) -> int | None:
    """A history page's ``before``: ``None`` (the newest page) or a revision number
    1..2^63-1; else ``InvalidPayload`` naming ``before``."""
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_REVISION:
        raise InvalidPayload(f"before: must be a {what} revision number from 1 to 2^63-1")
    return value


@dataclass
class HistoryPage:
    """One page of a checkpoint's or an effect's history: ``rows`` newest first (at most
    ``HISTORY_PAGE``), ``older`` the ``before`` of the next older page (``None``: this
    page reaches the first revision)."""

    rows: list
    older: int | None


def _history_page(qs: QuerySet, before: int | None) -> HistoryPage:
    if before is not None:
        qs = qs.filter(revision__lt=before)
    rows = list(qs.order_by("-revision")[: HISTORY_PAGE + 1])
    older = rows[HISTORY_PAGE - 1].revision if len(rows) > HISTORY_PAGE else None
    return HistoryPage(rows[:HISTORY_PAGE], older)


def checkpoint_history(*, user, tenant: Tenant, checkpoint: Checkpoint,
                       before: int | None = None) -> HistoryPage:
    """The checkpoint's revisions below ``before`` (``None``: from the latest), newest
    first, one page (metadata, no payload): one index range scan on
    ``(checkpoint, revision)`` read backwards and stopped after ``HISTORY_PAGE + 1``
    rows, at any depth. Raises ``InvalidPayload`` naming ``before`` for a value that is
    not a revision number, and what ``permissions.require`` raises."""
    require(user, tenant, roles.VIEW)
    before = _before(before, "checkpoint")
    return _history_page(CheckpointRevision.objects.for_tenant(tenant)
                         .filter(checkpoint=checkpoint).defer("payload_ciphertext")
                         .select_related("written_by"), before)


def effect_history(*, user, tenant: Tenant, effect: Effect,
                   before: int | None = None) -> HistoryPage:
    """The effect's revisions below ``before``, newest first, one page (metadata: the
    receipt ciphertext is not read); as ``checkpoint_history``."""
    require(user, tenant, roles.VIEW)
    before = _before(before, "effect")
    return _history_page(EffectRevision.objects.for_tenant(tenant).filter(effect=effect)
                         .defer("receipt_ciphertext"), before)


def _attempts_without_evidence(tenant: Tenant) -> QuerySet[ReconcileAttempt]:
    """The tenant's attempts as metadata: the evidence ciphertext stays in the database,
    and ``has_evidence`` says whether there is any to reveal."""
    return (ReconcileAttempt.objects.for_tenant(tenant).defer("evidence_ciphertext")
            .annotate(has_evidence=ExpressionWrapper(~Q(evidence_ciphertext=""),
                                                     output_field=BooleanField()))
            .order_by("number", "id"))


def reconcile_requests(*, user, tenant: Tenant, run: Run,
                       limit: int = 50) -> list[ReconcileRequest]:
    """The run's reconcile requests, newest first, each with its ``effect`` and its
    ``attempt_log`` (oldest look-up first, evidence left out: ``has_evidence`` instead),
    in two queries whatever their number. Like ``reconciliation.requests_for_run`` but
    never reads evidence ciphertext for a page that only lists it."""
    require(user, tenant, roles.VIEW)
    return list(ReconcileRequest.objects.for_tenant(tenant).filter(run=run)
                .select_related("effect").annotate(db_now=NOW)
                .prefetch_related(Prefetch("attempt_log",
                                           queryset=_attempts_without_evidence(tenant)))
                .order_by("-created_at", "-id")[: max(1, min(limit, 200))])


def reconcile_attempt_get(*, user, tenant: Tenant, attempt_id) -> ReconcileAttempt:
    """One look-up of a reconcile request (metadata, with its request, effect and run),
    or ``NotFound``."""
    require(user, tenant, roles.VIEW)
    try:
        pk = int(attempt_id)
    except (TypeError, ValueError):
        raise NotFound("no such reconcile attempt") from None
    attempt = (_attempts_without_evidence(tenant).filter(pk=pk)
               .select_related("request__effect", "request__run").first())
    if attempt is None:
        raise NotFound("no such reconcile attempt")
    return attempt


@dataclass(frozen=True)
class OwnerStatus:
    """Whether the run's owner counts as alive, on the database's clock, by the rule the
    sweep and reconciliation use (``policy.RunFacts.owner_gone``). ``owner`` is the lease
    owner ("" without a lease: then the owner is live while the run wrote recently);
    ``gone_at`` is when it counts as gone (``None``: it already does)."""

    live: bool
    owner: str
    gone_at: datetime | None


def run_owner_status(*, user, tenant: Tenant, run: Run) -> OwnerStatus:
    """Is the run's owner live now? (One query: the database's clock.)"""
    require(user, tenant, roles.VIEW)
    facts = policy.RunFacts.of(run, now=db_now(),
                               ambiguity_threshold_s=tenant.ambiguity_threshold_s)
    return OwnerStatus(live=not facts.owner_gone, owner=run.lease_owner,
                       gone_at=facts.owner_gone_at if not facts.owner_gone else None)


def checkpoint_get(*, user, tenant: Tenant, checkpoint_id) -> Checkpoint:
    """The latest row of a checkpoint, or ``NotFound``."""
    require(user, tenant, roles.VIEW)
    cid = _uuid_or_404(checkpoint_id, "checkpoint")
    cp = Checkpoint.objects.for_tenant(tenant).filter(uuid=cid).select_related("run").first()
    if cp is None:
        raise NotFound("no such checkpoint")
    return cp


def effect_get(*, user, tenant: Tenant, effect_id) -> Effect:
    """The effect ``effect_id`` of the tenant, or ``NotFound`` (also for a malformed id)."""
    require(user, tenant, roles.VIEW)
    eid = _uuid_or_404(effect_id, "effect")
    effect = Effect.objects.for_tenant(tenant).filter(uuid=eid).select_related("run").first()
    if effect is None:
        raise NotFound("no such effect")
    return effect


def effect_find(*, user, tenant: Tenant, service: str | None, operation_key: str | None,
                run_id=None, limit: int = 100) -> list[Effect]:
    """Effects of the tenant filtered by service, operation key and/or run."""
    require(user, tenant, roles.VIEW)
    qs = Effect.objects.for_tenant(tenant).select_related("run")
    if service:
        qs = qs.filter(service=service)
    if operation_key:
        qs = qs.filter(operation_key=operation_key)
    if run_id:
        try:
            qs = qs.filter(run__uuid=uuid.UUID(str(run_id)))
        except ValueError:
            raise InvalidPayload("run: not a UUID") from None
    return list(qs.order_by("-created_at", "-id")[: max(1, min(limit, 500))])


def retry_get(*, user, tenant: Tenant, retry_id) -> RetryRequest:
    """The retry request ``retry_id`` of the tenant, or ``NotFound``."""
    require(user, tenant, roles.VIEW)
    try:
        pk = int(retry_id)
    except (TypeError, ValueError):
        raise NotFound("no such retry request") from None
    retry = (RetryRequest.objects.for_tenant(tenant).filter(pk=pk)
             .select_related("run", "requested_by", "decided_by").first())
    if retry is None:
        raise NotFound("no such retry request")
    return retry


def audit_list(*, user, tenant: Tenant, run_id=None, actor: str | None = None,
               action: str | None = None, before_seq: int | None = None,
               q: str | None = None, limit: int = 100) -> list[AuditEvent]:
    """Audit events of the tenant, newest first, filtered; ``before_seq`` pages backwards
    (``seq`` never changes, so paging never skips). ``q``: only events of the runs the
    inbox search finds (``_search_run_ids``), a semi-join on ``audit_run_idx``
    ``(tenant, run_uuid, -seq)``. Raises ``InvalidPayload`` naming ``run`` or ``q``."""
    require(user, tenant, roles.VIEW)
    qs = AuditEvent.objects.for_tenant(tenant)
    if text := search_terms(q):
        qs = qs.filter(run_uuid__in=Run.objects.for_tenant(tenant)
                       .filter(id__in=_search_run_ids(tenant, text)).values("uuid"))
    if run_id:
        try:
            qs = qs.filter(run_uuid=uuid.UUID(str(run_id)))
        except ValueError:
            raise InvalidPayload("run: not a UUID") from None
    if actor:
        qs = qs.filter(actor_name=actor)
    if action:
        qs = qs.filter(action=action)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return list(qs.order_by("-seq")[: max(1, min(limit, 500))])


def report(*, user, tenant: Tenant) -> dict:
    """Tenant-scoped numbers: runs per state, effects per state, open conflicts, retries.

    Four queries: runs and effects per state from their counter tables (``RunStateCount``,
    ``EffectStateCount``: a few rows per state whatever the tenant's size); retry
    requests with an index-only count of their ``(tenant, state)`` index (a tenant has
    few); open conflicts from the partial ``conflict_open_idx``, which holds only the
    open ones. Effect states with no effect are left out."""
    require(user, tenant, roles.VIEW)
    effects = {state: n for state, n in _counted(EffectStateCount, tenant,
                                                 EffectState.values).items() if n}
    retries = dict(RetryRequest.objects.for_tenant(tenant).values_list("state")
                   .annotate(n=Count("*")).values_list("state", "n"))
    return {
        "runs": state_counts(tenant=tenant),
        "effects": effects,
        "retry_requests": retries,
        "open_conflicts": Conflict.objects.for_tenant(tenant).filter(
            acknowledged_at__isnull=True).count(),
    }


@dataclass
class BulkResult:
    """A bulk action and its per-run results (``bulk_get``): ``bulk`` the row,
    ``items`` its ``BulkActionItem`` rows in selection order, the counts of each outcome
    among them (right while it still runs, when the row's counts are not written yet),
    ``pending`` how many selected runs have no result yet, ``filters`` the inbox filters
    it was asked for (a dict) or ``None`` for runs selected by id, ``client_token`` the
    requester's idempotency key when the reader is the requester, else ``None`` (the key
    is the requester's to resubmit with; the dashboard shows it to nobody, so the API
    shows it only to its owner)."""

    bulk: BulkAction
    items: list[BulkActionItem]
    done: int
    refused: int
    failed: int
    pending: int
    filters: dict | None
    client_token: uuid.UUID | None = None


def bulk_get(*, user, tenant: Tenant, bulk_id) -> BulkResult:
    """One bulk action of the tenant with its per-run results (issue 9, item 3): two
    queries whatever the number of runs. Any role that sees the audit log sees it
    (``view_runs``); a malformed or unknown id, or one of another tenant, is
    ``NotFound``."""
    require(user, tenant, roles.VIEW)
    bid = _uuid_or_404(bulk_id, "bulk action")
    bulk = BulkAction.objects.for_tenant(tenant).filter(uuid=bid).first()
    if bulk is None:
        raise NotFound("no such bulk action")
    items = list(BulkActionItem.objects.for_tenant(tenant).filter(bulk=bulk)
                 .order_by("position"))
    counts = {outcome: 0 for outcome in BulkOutcome.values}
    for item in items:
        counts[item.outcome] += 1
    return BulkResult(bulk=bulk, items=items, done=counts[BulkOutcome.DONE],
                      refused=counts[BulkOutcome.REFUSED], failed=counts[BulkOutcome.FAILED],
                      pending=max(0, bulk.total - len(items)),
                      filters=(bulk.selection or {}).get("filters"),
                      client_token=(bulk.client_token if bulk.requested_by_id == user.pk
                                    else None))
