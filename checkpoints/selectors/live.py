"""Pages that move by themselves (issue 21, item 8): what each polled fragment reads, in
a fixed, small number of queries whatever the tenant's size (``tests/views/
test_live_pages.py`` pins them): whether a run has something pending and a marker
that changes when its page would, the runs that entered an inbox tab since the page was
read, a bulk reconcile's outcome per run, and one consistent read for the inbox (its
tab counts and its list from the same snapshot). Reads only: a poll writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, connections, transaction
from django.db.models import (
    Count,
    Exists,
    IntegerField,
    Max,
    OuterRef,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce

from .. import replica, roles
from ..dbclock import NOW, seed_page_now
from ..exceptions import NotFound
from ..models import BulkActionItem, MigrationJob, ReconcileRequest, RetryRequest, Run, Tenant
from ..permissions import require
from ..vocab import (
    BulkOutcome,
    MigrationJobState,
    ReconcileState,
    RecoveryState,
    RetryState,
)
from .common import LEASE_LIVE, _uuid_or_404
from .inbox import RunFilters, _filtered_runs
from .nextstep import approved_retry_waits_for

#: The run states a page waits on: a person's decision or the runtime's resume.
WAITING_STATES = frozenset({RecoveryState.AWAITING_APPROVAL, RecoveryState.RETRY_APPROVED})
#: The inbox's "n new runs" counts at most this many (then "100+").
NEW_RUNS_CAP = 100


@contextmanager
def consistent_read() -> Iterator[None]:
    """Every query inside reads one snapshot of the database: on PostgreSQL a
    ``REPEATABLE READ READ ONLY`` transaction (its first query fixes the snapshot), on
    SQLite a deferred transaction (a reader keeps its snapshot until it ends, and takes
    no write lock). Reads only: a write inside is not supported. Used where two
    reads must agree, e.g. the inbox's tab counts (the trigger-kept counters) and its
    list (the runs): read apart, a run that moved between them shows "ambiguous 2" above
    one row. Inside a transaction already (tests, an action's answer) it reads in that
    one, as it is. Inside ``replica_reads`` (issue 22) the snapshot is the replica's
    (``replica.read_alias``)."""
    if connection.in_atomic_block:
        yield
        return
    alias = replica.read_alias()
    db = connections[alias]
    if db.vendor == "sqlite":
        # A deferred transaction: its first read fixes the snapshot (WAL) and it takes no
        # lock, where Django's atomic() is BEGIN IMMEDIATE here (the write lock, so a
        # page view held every writer out until it was read: the stop-38 attack).
        db.ensure_connection()
        with db.cursor() as cursor:
            cursor.execute("BEGIN DEFERRED")
        try:
            yield
        finally:
            with db.cursor() as cursor:
                cursor.execute("COMMIT")
        return
    with transaction.atomic(using=alias):
        if db.vendor == "postgresql":
            with db.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def to_micros(when: datetime) -> int:
    """A database time as whole microseconds since the epoch (what a page carries)."""
    return round(when.timestamp() * 1_000_000)


#: The last microsecond a datetime can hold (9999-12-31T23:59:59.999999Z) as
#: ``to_micros`` writes it: the most a page's ``since`` may say.
MICROS_MAX = 253_402_300_799_999_999


def from_micros(value: int) -> datetime:
    """The inverse of ``to_micros``: an aware UTC datetime. ``value``: 0..``MICROS_MAX``
    (past it ``OverflowError``: a form checks the bound first)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value)


@dataclass(frozen=True)
class RunLive:
    """What the run page's live fragment needs: ``state``, ``changed_at`` (when it
    entered it, database clock), ``db_now``, ``waiting`` (the pending things, in
    words: ``[]`` when nothing is), and ``marker``, 12 hex digits that change whenever
    the run page would show something else for them (state, retry requests, reconcile
    requests and their look-ups, an open migration job of its kind, the run's row)."""

    state: str
    changed_at: datetime | None
    db_now: datetime
    waiting: list[str]
    marker: str

    @property
    def pending(self) -> bool:
        """Whether the page keeps polling."""
        return bool(self.waiting)

    @property
    def ended_s(self) -> int | None:
        """Seconds since the run completed (database clock), or None when it has not."""
        if self.state != RecoveryState.COMPLETED or self.changed_at is None:
            return None
        return max(0, int((self.db_now - self.changed_at).total_seconds()))


def run_live(*, user, tenant: Tenant, run_id) -> RunLive:
    """The run's ``RunLive`` in one query (the run row with its retry, reconcile and
    migration facts as subqueries, and the database's clock). ``NotFound`` for a run
    not in the tenant (or a malformed id); ``NotFound``/``Forbidden`` for the role."""
    require(user, tenant, roles.VIEW)
    rid = _uuid_or_404(run_id, "run")
    reconciles = ReconcileRequest.objects.for_tenant(tenant).filter(run=OuterRef("pk"))
    retries = RetryRequest.objects.for_tenant(tenant).filter(run=OuterRef("pk"))
    jobs = MigrationJob.objects.for_tenant(tenant).filter(
        kind=OuterRef("kind"), state__in=MigrationJobState.OPEN)

    def one(qs, expr):
        return Subquery(qs.order_by().values("run").annotate(v=expr).values("v")[:1],
                        output_field=IntegerField())

    row = (Run.objects.for_tenant(tenant).filter(uuid=rid)
           .annotate(db_now=NOW,
                     open_reconciles=Coalesce(one(reconciles.filter(
                         state__in=ReconcileState.OPEN), Count("id")), 0),
                     reconcile_count=Coalesce(one(reconciles, Count("id")), 0),
                     reconcile_looks=Coalesce(one(reconciles, Sum("attempts")), 0),
                     reconcile_last=Coalesce(one(reconciles, Max("id")), 0),
                     retry_last=Coalesce(one(retries, Max("id")), 0),
                     retry_open=Coalesce(one(retries.filter(
                         state__in=RetryState.OPEN), Max("id")), 0),
                     migrating=Exists(jobs),
                     # A runtime holding a live lease (an approved retry being resumed,
                     # or a run at work): its end is near, the page waits for it.
                     lease_live=LEASE_LIVE)
           .values("recovery_state", "state_changed_at", "last_write_at", "closed_at",
                   "kind", "schema_version",
                   "unacknowledged_conflicts", "fencing_token", "db_now", "open_reconciles",
                   "reconcile_count", "reconcile_looks", "reconcile_last",
                   "retry_last", "retry_open", "migrating", "lease_live")
           .first())
    if row is None:
        raise NotFound("no such run")
    waiting = []
    if row["recovery_state"] == RecoveryState.AWAITING_APPROVAL:
        waiting.append("a retry awaits an approver")
    elif row["recovery_state"] == RecoveryState.RETRY_APPROVED:
        waiting.append("an approved retry waits for "
                       + approved_retry_waits_for(row["kind"], row["schema_version"]))
    if row["open_reconciles"]:
        waiting.append("a reconciliation is under way")
    if row["migrating"]:
        waiting.append("a migration of its kind is under way")
    if row["lease_live"] and row["recovery_state"] == RecoveryState.HEALTHY:
        waiting.append("its runtime holds it (a live lease)")
    now = row.pop("db_now")
    if now.tzinfo is None:  # SQLite answers its 'now' without a zone
        now = now.replace(tzinfo=UTC)
    seed_page_now(now)
    raw = "|".join(str(row[k]) for k in sorted(row))
    return RunLive(state=row["recovery_state"], changed_at=row["state_changed_at"],
                   db_now=now, waiting=waiting,
                   marker=hashlib.sha256(raw.encode()).hexdigest()[:12])


def new_runs(*, user, tenant: Tenant, filters: RunFilters, since: datetime) -> int:
    """How many runs passing ``filters`` (their tab's state included, none: every state)
    entered their state after ``since`` (the database time the inbox page was read at),
    at most ``NEW_RUNS_CAP + 1``: the inbox's "2 new runs · show". One query; the
    ``run_state_changed_idx`` range after ``since`` is what it reads (the runs that
    moved since the page was read, a few), whatever the tab's size. Raises
    ``InvalidPayload`` for a bad filter, ``NotFound``/``Forbidden`` for the role."""
    require(user, tenant, roles.VIEW)
    qs = _filtered_runs(tenant, filters).filter(state_changed_at__gt=since)
    return qs.order_by()[:NEW_RUNS_CAP + 1].count()


@dataclass(frozen=True)
class RunOutcome:
    """What a bulk action's run came to (issue 21, item 8): ``word`` (a state word for
    ``label``/``badge_class``: the effect states a reconciliation settled, ``queued`` or
    ``running`` while a request is open, ``gave_up``, ``cancelled``; ``refused`` and
    ``failed`` for the bulk's own refusals; ``done`` for the other actions), ``words``
    (each effect's, for a run with several) and ``pending`` (a request still open)."""

    word: str
    words: tuple[str, ...] = ()
    pending: bool = False


def _settled_word(state: str, outcome: str) -> str:
    if state == ReconcileState.DONE and outcome:
        return outcome
    return state


def bulk_outcomes(*, user, tenant: Tenant, items: list[BulkActionItem]) -> dict[int, RunOutcome]:
    """``{item pk: RunOutcome}`` for a bulk action's result rows: a reconcile's runs
    followed to their stored requests (``BulkActionItem.reconcile_requests``) in one
    query whatever their number (none when no row has requests). An open request makes
    the run ``pending`` (the page keeps polling) and its word ``queued`` or
    ``running``: "requested", not "done"."""
    require(user, tenant, roles.VIEW)
    pks = {pk for item in items for pk in (item.reconcile_requests or [])}
    requests = {}
    if pks:
        requests = {r["pk"]: r for r in ReconcileRequest.objects.for_tenant(tenant)
                    .filter(pk__in=pks).values("pk", "state", "outcome")}
    out = {}
    for item in items:
        if item.outcome != BulkOutcome.DONE or item.reconcile_requests is None:
            out[item.pk] = RunOutcome(item.outcome)
            continue
        found = [requests[pk] for pk in item.reconcile_requests if pk in requests]
        open_ = [r for r in found if r["state"] in ReconcileState.OPEN]
        if open_:
            running = any(r["state"] == ReconcileState.RUNNING for r in open_)
            word = ReconcileState.RUNNING if running else ReconcileState.QUEUED
            out[item.pk] = RunOutcome(word, pending=True)
            continue
        words = tuple(dict.fromkeys(_settled_word(r["state"], r["outcome"]) for r in found))
        out[item.pk] = RunOutcome(words[0] if words else item.outcome, words)
    return out
