"""The streaming read replica (issue 22, item 4; docs/scaling.md "Read replica").

With ``RECOVERY_REPLICA_URL`` set, ``settings.DATABASES["replica"]`` is a hot standby of
the primary, and a few read-only views (the inbox and its polls, the report page, the API's
run list and report) read from it. The mechanism is narrow and explicit:

- a view asks for it: ``@replica_reads`` on a dashboard view (innermost, under
  ``@tenant_page``, so the tenant and the caller's grants are still resolved on the
  primary: a revoked grant is refused at once, whatever the replica's lag), or
  ``with replica_reads():`` around the reads of an API view, after its access check;
- ``ReplicaRouter`` sends the ORM's reads to the replica only while such a block is
  active, and never while the primary's connection is inside ``transaction.atomic`` (an
  action's service, anything under a lock, a read that must see what this request
  wrote): writes, services, the run page, and everything else stay on the primary;
- raw SQL through ``django.db.connection`` is the primary's, always (``db_now`` too).

A replica is used only while it is healthy by ``/readyz``'s own check
(``replica_check``: it answers, it is a streaming standby, its lag is within
``RECOVERY_REPLICA_MAX_LAG_S``), checked when a block starts at most every ``DOWN_S``
seconds per process: one that fails it is not used, the block reads from the primary,
and the replica is not tried again for ``DOWN_S`` seconds (logged). So a replica that
fell behind or stopped streaming is not shown as current data, the same rule that fails
``/readyz``; ``/metrics`` serves its lag (``replica_families``). Without
``RECOVERY_REPLICA_URL`` nothing here changes anything: every read is the primary's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db import connections

from .dbclock import db_now

log = logging.getLogger(__name__)

#: The alias of the replica in ``settings.DATABASES`` (present only when configured).
ALIAS = "replica"
#: Seconds a replica that failed to answer is left alone before it is tried again.
DOWN_S = 5.0

_reading: contextvars.ContextVar[bool] = contextvars.ContextVar("replica_reads", default=False)
#: Monotonic time until which the replica is left alone (it failed ``replica_check``).
_down_until = [0.0]
#: Monotonic time until which the replica's last good ``replica_check`` holds.
_good_until = [0.0]


def configured() -> bool:
    """Whether a replica is configured (``RECOVERY_REPLICA_URL``)."""
    return ALIAS in settings.DATABASES


def read_alias() -> str:
    """The alias the ORM reads from now: ``"replica"`` inside a ``replica_reads`` block
    when one is configured, reachable lately, and the primary's connection is not inside
    an atomic block; else ``"default"``."""
    if (not _reading.get() or not configured()
            or connections["default"].in_atomic_block or time.monotonic() < _down_until[0]):
        return "default"
    return ALIAS


@contextlib.contextmanager
def _block() -> Iterator[None]:
    token = _reading.set(True)
    try:
        if read_alias() == ALIAS and time.monotonic() >= _good_until[0]:
            _recheck()
        yield
    finally:
        _reading.reset(token)


def _recheck() -> None:
    """``replica_check`` now: passed, the replica is used for ``DOWN_S`` seconds without
    asking again; failed (it does not answer, does not stream, or lags too far), it is
    left alone for ``DOWN_S`` seconds and the reads go to the primary (logged). Failed
    means any exception, as ``/readyz`` judges it (``ops.health.readiness``): Django's
    ``InterfaceError`` (a closed connection) is not a ``DatabaseError``, and letting it
    through made every replica read fail while the primary answered."""
    try:
        replica_check()
    except Exception as exc:  # noqa: BLE001 - any failure: not usable, as /readyz says
        _down_until[0] = time.monotonic() + DOWN_S
        log.warning("the read replica is not usable (%s: %s): reading from the primary for "
                    "%s s", type(exc).__name__, exc, DOWN_S)
    else:
        _good_until[0] = time.monotonic() + DOWN_S


def replica_reads(view: Callable | None = None):
    """``@replica_reads`` on a view (function or method), or ``with replica_reads():``:
    the ORM reads inside may come from the replica (``read_alias``). Reads only: a write
    inside goes to the primary anyway (``ReplicaRouter.db_for_write``)."""
    if view is None:
        return _block()

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        with _block():
            return view(*args, **kwargs)

    return wrapper


class ReplicaRouter:
    """The database router (``settings.DATABASE_ROUTERS``): reads follow ``read_alias``,
    writes and migrations are the primary's."""

    def db_for_read(self, model, **hints) -> str:
        """``read_alias()``: the replica only inside a ``replica_reads`` block."""
        return read_alias()

    def db_for_write(self, model, **hints) -> str:
        """Always the primary."""
        return "default"

    def allow_relation(self, obj1, obj2, **hints) -> bool:
        """The replica holds the primary's rows: any two objects may relate."""
        return True

    def allow_migrate(self, db, app_label, model_name=None, **hints) -> bool:
        """Only the primary is migrated (the replica replays it)."""
        return db == "default"


class ReplicaBroken(Exception):
    """The replica is not a streaming standby of the primary."""


def lag_s() -> float:
    """The replica's lag in seconds: how far its last replayed transaction's commit time
    is behind the primary's clock, or 0 when it has replayed everything the primary sent
    (receive LSN = replay LSN: an idle primary is not a lagging replica). Raises
    ``DatabaseError`` when either database cannot answer, and when the
    replica is not a standby (``pg_is_in_recovery()`` false) or not streaming
    (``ReplicaBroken``: whatever it shows then stays as old as the break)."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn(),"
            " pg_last_xact_replay_timestamp(),"
            " EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming')")
        standby, caught_up, replayed_at, streaming = cursor.fetchone()
    if not standby:
        raise ReplicaBroken("the replica is not in recovery (not a standby)")
    if not streaming:
        raise ReplicaBroken("the replica is not streaming from the primary")
    if caught_up or replayed_at is None:
        return 0.0
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT CLOCK_TIMESTAMP()")
        now = cursor.fetchone()[0]
    return max(0.0, (now - replayed_at).total_seconds())


class ReplicaLagging(Exception):
    """The replica's lag exceeds ``RECOVERY_REPLICA_MAX_LAG_S``."""


def replica_check() -> None:
    """``/readyz``'s ``replica`` check (only probed when a replica is configured): returns
    (ok) when the replica answers, streams and lags at most ``RECOVERY_REPLICA_MAX_LAG_S``
    seconds; raises ``DatabaseError``, ``ReplicaBroken`` or ``ReplicaLagging`` else."""
    lag = lag_s()
    if lag > settings.RECOVERY_REPLICA_MAX_LAG_S:
        raise ReplicaLagging(f"lag {lag:.1f} s > {settings.RECOVERY_REPLICA_MAX_LAG_S} s")


def snapshot_now():
    """The time of what ``read_alias()`` shows now (an aware datetime), on the primary's
    clock (one clock: ``dbclock``): the primary's ``db_now()``, or, on a replica that has
    not yet replayed everything it received, the primary's commit time of the last
    transaction it replayed (what it shows is as of then; the inbox's "new runs" poll
    counts from it)."""
    alias = read_alias()
    if alias != "default":
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT CASE WHEN pg_last_wal_receive_lsn() <> "
                           "pg_last_wal_replay_lsn() THEN pg_last_xact_replay_timestamp() END")
            replayed_at = cursor.fetchone()[0]
        if replayed_at is not None:
            return replayed_at
    return db_now()
