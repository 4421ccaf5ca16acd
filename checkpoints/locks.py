"""The one lock order of the store (issue 17, item 10), and the only place that takes a
row lock: every ``select_for_update`` and every ``FOR … UPDATE`` clause of the SQL write
path is here (``tests/test_lock_order_lint.py`` fails on one anywhere else).

Why an order: with many clients PostgreSQL's deadlock detector killed API writes and
sweep passes. Besides the rows a service locks by name, a write takes locks nobody
writes down: at ``COMMIT`` (Django's foreign keys are deferred), a ``FOR KEY SHARE`` of
every parent row of a row it inserted (the tenant, the acting account, the run). Until
issue 22 a write also moved its tenant's audit chain head and upserted the state counter
rows; neither is a lock any more: an audit event is one INSERT (the sequencer chains it
afterwards, ``audit.audit_record``) and a counter change inserts a delta (migration 0038).

The order (``ORDER``), outermost first; a transaction takes what it needs in this order
and never goes back up:

1. ``account``: the account's row and its tokens (account commands, which then append
   to the audit trail of every tenant the account holds a role in).
2. ``audit_head``: the tenant's write gate (its ``AuditChainHead`` row), **before
   anything of the tenant**, in one of two modes. A write of one run (or of a few runs,
   ``lock_runs``) takes it shared (``share_audit_head``, ``FOR SHARE``): writes of one
   tenant never wait for each other here, so a tenant's writers run side by side (issue
   22). A tenant-wide operation (a legal hold, an erasure decision, the data policy, a
   kind declaration, a key rotation or shred, a notification endpoint or reconciler
   change, an account command) takes it exclusively (``lock_audit_head``), so it
   overlaps no write of the tenant; it takes it first and once, never after a shared
   hold (an upgrade would deadlock against another upgrader). Several tenants
   (account commands): ascending tenant id.
3. ``tenant``: the tenant's own row (its settings).
4. ``run``: the run row; several runs in ascending run id (``uuid``).
5. ``run_object``: rows that belong to a locked run (its checkpoint envelope, retry
   request, reconcile requests, effects), ascending primary key.

Two writes of one tenant share the gate, so what keeps them apart is the run: each
locks its run(s) in ascending id, then only rows that belong to them; the rows they both
touch (the state counters, the report's rollups, the audit table, the notification
outbox) they only INSERT into, and an insert waits for nobody's row lock (two inserts of
one unique key wait for each other, the later one failing: the create race).

Every row lock is ``FOR NO KEY UPDATE`` (what PostgreSQL's own ``UPDATE`` takes): it
excludes other lockers and writers as ``FOR UPDATE`` does, but not the ``FOR KEY SHARE``
a foreign-key check takes, so an insert that names a locked row (an audit event naming
its tenant and account) never waits for it. Only a row's ``DELETE`` takes ``FOR UPDATE``,
under the head and the run.

A row deleted with the rows that name it (a cascade the ORM collects: a notification
endpoint with its messages) is locked ``FOR UPDATE`` *before* the collecting
(``lock_rows_to_delete``), and a transaction that only inserts rows naming it holds it
``FOR KEY SHARE`` first (``share_rows``; one that changes it holds it with ``lock_rows``).
Otherwise an insert committed between the collecting and the ``DELETE`` slips past the
cascade (its foreign-key check's ``FOR KEY SHARE`` does not wait for ``FOR NO KEY
UPDATE``) and the delete fails at ``COMMIT`` (stop 34's attack). Either lock conflicts with the
delete's: the writer comes first (the delete waits, then collects what it wrote) or it
waits for the delete and finds the row gone (it is left out; the writer skips it).

Rows naming a run are the exception: a run's delete (retention's second phase,
``retention._expire_one``; the LangGraph thread delete, ``_settle_run``) holds the run
``FOR NO KEY UPDATE`` only (``lock_run``, ``lock_run_pk``), yet no row inserted meanwhile
slips past its cascade, because every writer of a row naming a run is kept apart
otherwise:

- a write of the run (a checkpoint, an effect, a transition, a state change's outbox
  row, ``notify_emit``) holds the run's own lock, which the delete's excludes;
- the dispatcher's drain writes rows naming a run (its incident runs, its messages) only
  for a run named by an outbox row it claimed (``lock_rows``, ``SKIP LOCKED``), and the
  run's cascade deletes its outbox rows *first* (the ORM deletes the rows naming a run in
  their models' declaration order, ``NotificationOutbox`` before
  ``NotificationIncidentRun`` and ``NotificationAgingMark``, then sets the messages' run
  to null). A delete that reaches them after the claim waits for the drain and then
  deletes what it wrote; a claim after the delete's skips the rows and tells nobody of
  the run. That declaration order is load-bearing: moved, a drain committed while the
  delete waits for the claimed row fails the delete's ``COMMIT`` (an ``IntegrityError``
  on ``checkpoints_notificationincidentrun``), and
  ``tests/transactional/test_notify_run_delete_races.py`` fails;
- the dispatcher's aging step names only runs of unknown outcome (an effect of unknown
  outcome, not closed), which neither delete takes: the LangGraph delete takes a run with
  no effect, and retention one ended (no effect in doubt) longer ago than its window, so
  no run it read can be deleted before it commits.

Outside the order, holding one row and waiting for nothing else: a reconcile worker's
claim of its request (``lock_rows`` on one request), the sweep's re-drive (stale
requests, ascending id, ``SKIP LOCKED``), the token's ``last_used_at`` touch (one
``UPDATE`` in autocommit). Key rotation (``services.keys``) rewrites ciphertexts in
batches, each in ascending id within one table, without run locks, then appends to the
tenants' chains in ascending tenant id.

Also outside the order, holding nothing of the order: the notification dispatcher
(``services.notify_dispatch``) claims outbox rows (ascending id, ``SKIP LOCKED``), then
locks the endpoints of the tenants they name (ascending id; its incident flush skips an
endpoint another transaction holds; its digest holds the endpoints it writes to ``FOR KEY
SHARE``, ascending id), and takes no run or audit-head lock. Every endpoint lock goes
through ``services.notify_endpoints.hold_endpoints``.

Also outside the order, and not row locks: ``lock_transaction_key`` (a PostgreSQL
advisory lock held to the end of the transaction: the tenant registry's numbering, taken
by tenant creation before anything else of the new tenant), and ``try_session_lock`` (a PostgreSQL session
advisory lock, tried without waiting, holding nothing else): one web process at a time
runs the catch-up sweep (``inprocess.catch_up``), which then takes the order above.

The sweep takes the same order per run (the gate shared, then the run with ``SKIP LOCKED``, so a
sweep pass never queues behind a run some other transaction holds: that run is looked at
again on the next pass), in ascending run id.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator

import psycopg
from django.conf import settings
from django.db import connection
from django.db.models import Subquery

from .dbclock import LOCKED_NOW
from .models import AuditChainHead, DataPolicy, Run, Tenant
from .vocab import EffectState, RetryState

#: The lock levels, outermost first (module docstring).
ORDER = ("account", "audit_head", "tenant", "run", "run_object")

#: The SQL form of every row lock here (``select_for_update(no_key=True)``).
ROW_LOCK = "FOR NO KEY UPDATE"
#: The lock of a row about to be deleted with what names it (``lock_rows_to_delete``).
DELETE_LOCK = "FOR UPDATE"
#: The lock of a row that a transaction only names in rows it inserts (``share_rows``):
#: what a foreign-key check takes, taken before the insert instead of at ``COMMIT``.
KEY_SHARE_LOCK = "FOR KEY SHARE"


def lock_rows(queryset, *, skip_locked: bool = False):
    """``queryset`` with its own rows locked (``FOR NO KEY UPDATE OF`` its table only,
    never a ``select_related`` table) when it is evaluated, in ascending primary key
    unless it is ordered already. For the ``account`` and ``run_object`` levels (and the
    reconcile claim and re-drive, outside the order): the caller holds the locks above.
    ``skip_locked``: rows another transaction holds are left out instead of waited for."""
    if not queryset.ordered:
        queryset = queryset.order_by("pk")
    return queryset.select_for_update(no_key=True, of=("self",), skip_locked=skip_locked)


def lock_rows_to_delete(queryset):
    """``queryset`` with its own rows locked ``DELETE_LOCK`` (``FOR UPDATE OF`` its table,
    ascending primary key unless ordered) when evaluated: for a delete of rows that other
    rows name (module docstring), taken before the ORM collects those, under the same
    locks a change of the row would hold (``lock_rows``). It waits for, and makes wait,
    every other lock of the rows, ``share_rows``' ``FOR KEY SHARE`` (a writer of rows
    naming them) included. Raises nothing of its own."""
    if not queryset.ordered:
        queryset = queryset.order_by("pk")
    return queryset.select_for_update(of=("self",))


def share_rows(queryset, *, skip_locked: bool = False) -> list:
    """The rows of ``queryset`` held ``KEY_SHARE_LOCK`` (``FOR KEY SHARE OF`` its table)
    to the end of the caller's transaction, in ascending primary key, as read once held
    (a second query: the queryset's filters applied to their values then); a row deleted
    meanwhile is left out. For a transaction that inserts rows naming them and changes
    nothing of them (module docstring): it waits only for a delete
    (``lock_rows_to_delete``) or a change of a key, never for ``lock_rows``. The queryset
    selects plain rows (no ``DISTINCT``, aggregate or ``LIMIT``). ``skip_locked``: rows
    being deleted are left out instead of waited for. On SQLite (writes are serial) the
    rows, unlocked."""
    queryset = queryset.order_by("pk")
    if connection.vendor != "postgresql":
        return list(queryset)
    sql, params = queryset.values_list("pk", flat=True).query.sql_with_params()
    table = connection.ops.quote_name(queryset.model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} {KEY_SHARE_LOCK} OF {table}"
                       + (" SKIP LOCKED" if skip_locked else ""), params)
        held = [row[0] for row in cursor.fetchall()]
    return list(queryset.filter(pk__in=held)) if held else []


def lock_audit_head(tenant: Tenant | int) -> AuditChainHead:
    """Take ``tenant``'s write gate (its ``AuditChainHead`` row, ``audit_head`` level)
    exclusively, created if missing: a tenant-wide operation (a legal hold, an erasure,
    a retention pass, a key rotation, a kind declaration ...) that no write of the tenant
    may overlap. Writes of single runs share the gate (``share_audit_head``), so they
    run side by side and wait only for such an operation. Returns the row as locked."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    head, _ = (AuditChainHead.objects.for_tenant(tenant_id)
               .select_for_update(no_key=True).get_or_create(tenant_id=tenant_id))
    return head


#: The shared lock a write of one run takes on its tenant's write gate: conflicts with
#: ``ROW_LOCK`` (a tenant-wide operation), not with another write's.
SHARE_LOCK = "FOR SHARE"


def share_audit_head(tenant: Tenant | int) -> None:
    """Take ``tenant``'s write gate shared (``SHARE_LOCK``): the first lock of every
    write of one run (``lock_run`` and friends, the SQL write path's ``write_lock_sql``).
    Writes of the tenant do not wait for each other here (issue 22, item 1), only for a
    tenant-wide operation holding the gate (``lock_audit_head``). A tenant without a row
    yet gets one (exclusively, the first time)."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {AuditChainHead._meta.db_table} WHERE "
                       f"{AuditChainHead._meta.get_field('tenant').column} = %s"
                       + (f" {SHARE_LOCK}" if connection.vendor == "postgresql" else ""),
                       [tenant_id])
        found = cursor.fetchone() is not None
    if not found:
        lock_audit_head(tenant_id)


def lock_audit_heads(tenants: Iterable[Tenant]) -> list[Tenant]:
    """Lock the audit heads of several tenants in ascending tenant id, for a command
    that appends to each; returns the tenants in that order (append in it too)."""
    ordered = sorted(set(tenants), key=lambda t: t.pk)
    for tenant in ordered:
        lock_audit_head(tenant)
    return ordered


def lock_tenant(tenant: Tenant) -> Tenant:
    """Lock the tenant's row (its settings), after taking its write gate exclusively."""
    lock_audit_head(tenant)
    return Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)


#: The data policy's columns a checkpoint write reads with its run lock (``lock_run``).
WRITE_POLICY = ("subject_fields", "secrets_policy", "payload_flag_bytes")


def _runs(tenant_id: int, *, data_policy: bool = False):
    runs = lock_rows(Run.objects.for_tenant(tenant_id)).annotate(db_now=LOCKED_NOW)
    if data_policy:
        policy = DataPolicy.objects.for_tenant(tenant_id)
        runs = runs.annotate(**{name: Subquery(policy.values(name)[:1])
                                for name in WRITE_POLICY})
    return runs


def lock_run(tenant: Tenant, run_id: uuid.UUID, *, data_policy: bool = False) -> Run | None:
    """Take the tenant's write gate shared, then lock its run ``run_id`` (``None``: no
    such run; the gate stays held). The same query reads the database clock into ``run.db_now`` and,
    with ``data_policy``, the tenant's ``WRITE_POLICY`` columns as attributes of the run
    (``run.subject_fields``, ``run.secrets_policy``, ``run.payload_flag_bytes``; ``None``:
    no data policy), so a checkpoint write's screening decision and subject index cost
    no extra query."""
    share_audit_head(tenant)
    run = _runs(tenant.pk, data_policy=data_policy).filter(uuid=run_id).first()
    if run is not None:
        run.tenant = tenant
    return run


def lock_run_pk(tenant_id: int, pk: int, *, skip_locked: bool = False) -> Run | None:
    """Take the tenant's write gate shared, then lock the run with primary key ``pk`` (its tenant
    loaded, not locked; ``db_now`` read). ``None``: no such run, or with ``skip_locked``
    another transaction holds it (the sweep: looked at again on its next pass)."""
    share_audit_head(tenant_id)
    return (lock_rows(Run.objects.for_tenant(tenant_id), skip_locked=skip_locked)
            .annotate(db_now=LOCKED_NOW).select_related("tenant").filter(pk=pk).first())


def lock_runs(tenant: Tenant, run_ids: Iterable[uuid.UUID]) -> list[Run]:
    """Take the tenant's write gate shared, then lock its runs ``run_ids`` that exist, in ascending
    run id; returns them in that order (each with ``db_now``)."""
    share_audit_head(tenant)
    runs = list(_runs(tenant.pk).filter(uuid__in=list(run_ids)).order_by("uuid"))
    for run in runs:
        run.tenant = tenant
    return runs


def write_lock_sql() -> str:
    """The first statement of the SQL write path (``services.writepath.checkpoint_update``):
    a call of the database function ``checkpoints_write_lock_v2`` (migrations 0039 and
    0041: also the run's phase, last write, kind and identity), which
    takes the tenant's write gate shared (``SHARE_LOCK``), then the run row
    (``ROW_LOCK``), as ``lock_run`` does, and only then reads the checkpoint, the data
    policy and the run's facts, so they are current. Named parameters: ``tenant``,
    ``checkpoint``, ``run`` (uuids). The function's two state lists (effect states that
    need a retry, open retry states: ``vocab``) are constants in the statement, not
    parameters: psycopg's list adapter cost about 3 % of a write's time (issue 22).
    Returns one row, or none when the tenant has no gate row or the run does not
    exist."""
    return ("SELECT * FROM checkpoints_write_lock_v2(%(tenant)s, %(checkpoint)s, %(run)s, "
            f"{_text_array(EffectState.NEEDS_RETRY)}, {_text_array(RetryState.OPEN)})")


def _text_array(values: Iterable[str]) -> str:
    """A ``text[]`` literal of ``values`` (sorted, each quoted as a SQL string)."""
    quoted = ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(values))
    return f"ARRAY[{quoted}]::text[]"


@contextlib.contextmanager
def try_session_lock(key: int) -> Iterator[bool]:
    """Try PostgreSQL's session advisory lock ``key`` (a bigint) without waiting; yield
    whether this session holds it, and release it on exit. On SQLite (the embedded
    default: one process) it yields True. Takes no row lock (module docstring: outside
    the order); used for "one process at a time" work such as the catch-up sweep.

    Behind PgBouncer in transaction pooling (``RECOVERY_PGBOUNCER``, issue 22) a session
    lock would stay on whichever server connection took it (the unlock may run on
    another): the lock is then ``pg_try_advisory_xact_lock`` in a transaction held open,
    for the block's duration, on a connection of its own (PgBouncer keeps one server
    connection for a client while its transaction is open), rolled back and closed on
    exit or when this process dies. It costs one more server connection per process while
    a block runs (size PgBouncer's pool for it: docs/scaling.md)."""
    if connection.vendor != "postgresql":
        yield True
        return
    if settings.RECOVERY_PGBOUNCER:
        with _side_transaction_lock(key) as mine:
            yield mine
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        mine = cursor.fetchone()[0]
    try:
        yield mine
    finally:
        if mine:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


@contextlib.contextmanager
def _side_transaction_lock(key: int) -> Iterator[bool]:
    """``try_session_lock`` behind PgBouncer: a new connection with the default
    connection's parameters (prepared statements off), a transaction on it holding
    ``pg_try_advisory_xact_lock(key)``, ended (and the connection closed) on exit."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as side:  # a transaction opens with the first statement
        try:
            mine = side.execute("SELECT pg_try_advisory_xact_lock(%s)", [key]).fetchone()[0]
            yield mine
        finally:
            side.rollback()


def lock_transaction_key(key: int) -> None:
    """Wait for PostgreSQL's transaction advisory lock ``key`` (a bigint), held until the
    caller's transaction ends (module docstring: outside the order; the tenant registry
    serialises its numbering with it). A no-op on SQLite, whose writes are serial."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def try_transaction_key(key: int, sub: int) -> bool:
    """Try PostgreSQL's transaction advisory lock (``key``, ``sub``: two int4) without
    waiting; True when this transaction holds it (until it ends). Outside the order,
    holding nothing of it: "one at a time per tenant" system work (the state counters'
    compaction, the audit sequencer). Transaction-level, so it works behind a
    transaction-pooling PgBouncer. SQLite (writes are serial): always True."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [key, sub])
        return bool(cursor.fetchone()[0])
