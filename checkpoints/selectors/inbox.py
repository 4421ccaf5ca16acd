"""The inbox: filters, sorts, keyset cursors, a page of runs, a run's position in the list,
and the tab counts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import NamedTuple

from django.db.models import (
    Q,
    QuerySet,
    Sum,
)

from .. import roles
from ..dbclock import NOW
from ..exceptions import InvalidPayload
from ..models import (
    MAX_REVISION,
    RecoveryState,
    Run,
    RunStateCount,
    Tenant,
)
from ..permissions import require
from .common import LEASE_LIVE, RUN_LIST_FIELDS, lease_state_of
from .search import search_match, search_terms


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


#: The filtered tab counts (and the position of a page) count at most this many matching
#: runs: past it the inbox says "1,000+" rather than count every match of a broad search.
SEARCH_COUNT_CAP = 1000


#: The run columns each text filter of ``RunFilters`` is matched against.
FILTER_COLUMNS = {"kind": ("kind",), "subject": ("agent", "workflow")}


def filter_limit(name: str) -> int:
    """The most characters the text filter ``name`` (``kind``, ``subject``) of
    ``RunFilters`` may have: the longest run column it is matched against
    (``FILTER_COLUMNS``; ``Run.kind`` 200, ``Run.agent``/``Run.workflow`` 256), read
    from the model's ``_meta``, so a filter never drifts from its column: ``GET …/runs``,
    a bulk body's ``filters`` (its schema and its check). The search's is ``SEARCH_MAX``.
    Raises ``KeyError`` for another name."""
    return max(Run._meta.get_field(column).max_length for column in FILTER_COLUMNS[name])


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

    qs = Run.objects.for_tenant(tenant).annotate(lease_live=LEASE_LIVE)
    if filters.recovery_state:
        qs = qs.filter(recovery_state=filters.recovery_state)
    if filters.kind:
        qs = qs.filter(kind=filters.kind)
    if filters.subject:
        qs = qs.filter(Q(agent__icontains=filters.subject) | Q(workflow__icontains=filters.subject))
    if filters.age_s_min:
        qs = qs.filter(last_write_at__lte=NOW - timedelta(seconds=filters.age_s_min))
    if text:
        qs = qs.filter(search_match(tenant, text))
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

    Each row also has ``lease_state`` (``common.lease_state_of``: live, expired, ended or
    "", read from the row: no query), as the inbox and the API's run say it.
    """
    require(user, tenant, roles.VIEW)
    page = _run_page(tenant, filters, _sort_or_400(sort), cursor, limit)
    for row in page.rows:
        row["lease_state"] = lease_state_of(row)
    return page


def _run_page(tenant: Tenant, filters: RunFilters, sort: str, cursor: str | None,
              limit: int) -> RunPage:
    """``run_list``'s page (its keyset read), without the words it adds."""
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
    whatever the tenant's size; exact). With one: the states of at
    most ``SEARCH_COUNT_CAP + 1`` filtered runs (their states read with a ``LIMIT`` and
    counted in Python, so a search matching half the tenant costs a thousand rows, not
    all of them)."""
    require(user, tenant, roles.VIEW)
    filters = filters.without_state()
    if not filters.narrowing:
        return StateCounts(state_counts(tenant=tenant))
    # The states of the first runs found, counted here: a GROUP BY over an
    # ``id IN (... LIMIT)`` made PostgreSQL hash-join every run of the tenant against
    # the thousand found (20 ms at 100,000 runs); this reads the thousand and stops.
    counts = Counter(_filtered_runs(tenant, filters).order_by()
                     .values_list("recovery_state", flat=True)[:SEARCH_COUNT_CAP + 1])
    return StateCounts({state: counts.get(state, 0) for state in RecoveryState.values},
                       sum(counts.values()) > SEARCH_COUNT_CAP)
