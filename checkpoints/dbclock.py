"""One clock: the database's (CONTRACT.md 3, "Lease expiry, quiet time and every other
time comparison use the database's clock, never a process's").

A web node or worker whose wall clock runs ahead or behind must not grant a second lease,
call a live owner gone, or settle a look-up early. So every time that is later compared
(``lease_expires_at``, ``last_write_at``, ``submitted_at``, ``next_attempt_at``,
``claimed_until``) is written from the database's clock and compared with it:

- ``NOW`` is the SQL expression (``STATEMENT_TIMESTAMP()`` on PostgreSQL, SQLite's
  ``'now'``) for filters and stamps;
- ``LOCKED_NOW`` (``CLOCK_TIMESTAMP()``) annotates the row a service locks, so the lock
  and the time arrive in one round trip, the time taken after any wait for the lock
  (``services._lock_run`` sets ``run.db_now``);
- ``db_now()`` asks for it in a query of its own where no row is locked;
- ``page_now()`` is the time one request shows relative times against ("3 min ago",
  "in 10 min"): read once per request, when first needed, or taken from a selector that
  read it with its rows (``seed_page_now``, which moves it forward to the latest such
  time, never back); ``PageClockMiddleware`` scopes it.

On the embedded SQLite default the database lives in the process, but its ``'now'`` is
read by SQLite's C code from the operating system, not through Python's ``time`` or
``django.utils.timezone``, so a patched process clock changes nothing there either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

from django.db import connection
from django.db.models.functions import Now

NOW = Now()


class _LockedNow(Now):
    """``Now`` for the time a locking ``SELECT`` reads with its row: ``CLOCK_TIMESTAMP()``
    on PostgreSQL (SQLite: ``Now``'s, its writer waits before the statement starts)."""

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="CLOCK_TIMESTAMP()", **extra_context)


#: The database time for a row lock's ``SELECT ... FOR NO KEY UPDATE`` (``locks.lock_run``
#: and the others that annotate ``db_now`` on a row they lock). ``NOW``
#: (``STATEMENT_TIMESTAMP()``) is the statement's start, before any wait for the lock:
#: a write that waited half a second for its run stamped its history and audit event
#: half a second before the write it waited for (measured; issue 22). PostgreSQL
#: computes a locking statement's columns before it waits, and again once the lock is
#: taken when the row it waited for was changed (its re-check of the row, "EvalPlanQual"),
#: so ``CLOCK_TIMESTAMP()`` there is the time after the wait whenever the writer it waited
#: for changed the row (every committed write of a run changes its row). Left: a holder
#: that changed nothing of the row (a rolled-back or read-only holder) leaves the time of
#: the statement's start, earlier by the wait. tests/transactional/test_lock_order.py.
LOCKED_NOW = _LockedNow()


def db_now() -> datetime:
    """The database's current time as an aware UTC datetime (one query)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT CLOCK_TIMESTAMP()")
            value = cursor.fetchone()[0]
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


#: The current request's page clock: ``None`` outside a request (``page_now`` then asks
#: every time), else a list holding the database time once it was read or seeded.
_PAGE_NOW: ContextVar[list | None] = ContextVar("recovery_page_now", default=None)


@contextmanager
def page_clock() -> Iterator[None]:
    """Scope one page clock (one request: ``PageClockMiddleware``); nothing is read
    until ``page_now`` or ``seed_page_now`` is called."""
    token = _PAGE_NOW.set([])
    try:
        yield
    finally:
        _PAGE_NOW.reset(token)


def page_now() -> datetime:
    """The database time a request shows its relative times against (aware UTC): the one
    seeded or read earlier in the request, else one query (then kept for the request).
    Outside a request, a query each call. A web node whose clock is off writes "50 min
    ago" beside a lease the page calls live otherwise (the attack's finding)."""
    held = _PAGE_NOW.get()
    if held is None:
        return db_now()
    if not held:
        held.append(db_now())
    return held[0]


def seed_page_now(now: datetime | None) -> None:
    """Give the request's page clock the database time a selector read with its rows
    (``run_get``'s ``db_now``), so the page asks no more; ignored outside a request and
    for ``None``. A later time than the one held moves the clock forward to it, an
    earlier one is ignored: the page's "now" is the latest database time the request
    read. An action's page reads its run before the write and again after it; held at
    the first read, the page called the time the write stamped in between "in 0 s"
    (the recon newcomer's finding: "in this state since in 0 s" after End the lease)."""
    held = _PAGE_NOW.get()
    if held is None or now is None:
        return
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    if not held:
        held.append(now)
    elif now > held[0]:
        held[0] = now


class PageClockMiddleware:
    """Scopes ``page_now`` to each request (every template rendered within it)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with page_clock():
            return self.get_response(request)
