"""The store's own SQL on PostgreSQL, below every service: table and column names read
from ``Model._meta`` (never typed), a server-side binding cursor and ``COPY`` inserts.
``services.writepath`` builds the checkpoint update's statements on these helpers.

Each helper falls back to the ORM, or says so (``FALLBACK``), where the SQL does not
apply: SQLite, or ``RECOVERY_SQL_WRITE_PATH`` off.
"""

from __future__ import annotations

import json

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, NotSupportedError, connection, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models.query import RawQuerySet
from django.db.models.sql import RawQuery

from .models import AuditEvent

#: Returned when the fast path does not apply; nothing was written, the caller takes the
#: ORM path.
FALLBACK = object()


def available() -> bool:
    """Whether the SQL paths may be used (``services.writepath``'s checkpoint update): PostgreSQL (their statements use data-modifying ``WITH``),
    unless ``RECOVERY_SQL_WRITE_PATH`` is off."""
    return connection.vendor == "postgresql" and settings.RECOVERY_SQL_WRITE_PATH


def q(name: str) -> str:
    """``name`` quoted as an SQL identifier for this connection."""
    return connection.ops.quote_name(name)


def table(model) -> str:
    """``model``'s table name, quoted."""
    return q(model._meta.db_table)


def col(model, field: str) -> str:
    """The column of ``model``'s field ``field``, quoted."""
    return q(model._meta.get_field(field).column)


#: The audit event's columns the SQL appends write, in their order (``event_params``).
EVENT_FIELDS = ["tenant", "seq", "created_at", "actor", "actor_name", "action",
                "target_type", "target_ref", "run_uuid", "reason", "before", "after",
                "prev_hash", "hash", "hash_scheme", "key_id", "incident_ref"]


def event_values() -> str:
    """The ``VALUES`` list of an audit event's insert, as named parameters ``%(ev_…)s``
    (``event_params`` fills them)."""
    return ", ".join(f"%(ev_{f})s::jsonb" if f in ("before", "after") else f"%(ev_{f})s"
                     for f in EVENT_FIELDS)


def event_params(event: AuditEvent) -> dict:
    """The ``%(ev_…)s`` parameters of ``event`` for ``event_values``' insert."""
    return {
        "ev_tenant": event.tenant_id, "ev_seq": event.seq, "ev_created_at": event.created_at,
        "ev_actor": event.actor_id, "ev_actor_name": event.actor_name,
        "ev_action": event.action, "ev_target_type": event.target_type,
        "ev_target_ref": event.target_ref, "ev_run_uuid": event.run_uuid,
        "ev_reason": event.reason,
        "ev_before": None if event.before is None else json.dumps(event.before),
        "ev_after": None if event.after is None else json.dumps(event.after),
        "ev_prev_hash": event.prev_hash, "ev_hash": event.hash,
        "ev_hash_scheme": event.hash_scheme, "ev_key_id": event.key_id,
        "ev_incident_ref": event.incident_ref,
    }


def cursor():
    """A cursor for these statements: psycopg's server-side binding cursor (the default
    Django cursor binds on the client). A statement run often is prepared on the server
    (psycopg's ``prepare_threshold``, set in settings), except with ``RECOVERY_PGBOUNCER``,
    which turns it off (PgBouncer before 1.21 in transaction mode loses prepared
    statements between transactions; issue 22, docs/scaling.md). Wrapped like Django's own cursors, so query
    logging (``CaptureQueriesContext``), ``execute_wrapper`` hooks and error translation
    still apply."""
    _checked_connection()
    raw = psycopg.Cursor(connection.connection)
    wrapper = _DebugWrapper if connection.queries_logged else CursorWrapper
    return wrapper(raw, connection)


def _checked_connection() -> None:
    """Connect if needed, after Django's per-request health check (``CONN_HEALTH_CHECKS``),
    which runs in Django's own ``cursor()`` and so not for the statements here: a
    statement of this module that is the request's first (the token read) or the task's
    first (a write) then finds a connection the server closed replaced. Called before
    pipeline mode is entered (the check's ``SELECT 1`` must not join a pipeline); once
    per request, then a no-op."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()


class _DebugWrapper(CursorDebugWrapper):
    """Django's query-logging wrapper (``connection.queries``, ``CaptureQueriesContext``)
    for ``cursor()``: it logs each statement composed with its parameters, as Django does
    for server-side binding (``compose_sql``). Django's own would read psycopg's
    client-side query text, which a prepared statement does not have (it logged None)."""

    def debug_sql(self, sql=None, params=None, use_last_executed_query=False, many=False):
        if use_last_executed_query and not many:
            try:
                sql = self.db.ops.compose_sql(sql, params)
            except Exception:  # noqa: BLE001 - the log keeps the statement's own text
                pass
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


class _ServerBoundRawQuery(RawQuery):
    """Django's raw query, run on PostgreSQL through ``cursor()`` (server-side binding,
    so prepared once it runs often); elsewhere exactly Django's."""

    def _execute_query(self):
        conn = connections[self.using]
        if conn.vendor != "postgresql":
            return super()._execute_query()
        params = tuple(conn.ops.adapt_unknown_value(v) for v in self.params)
        self.cursor = cursor()
        try:
            self.cursor.execute(self.sql, params)
        except NotSupportedError as exc:
            # "cached plan must not change result type": a migration run by another
            # process changed the type of a column this prepared statement returns, which
            # PostgreSQL cannot replan. Outside a transaction, run it again on a fresh
            # connection, which has prepared nothing (an attack's finding: every bearer
            # request was a 500 until the connection aged out).
            if conn.in_atomic_block or getattr(exc.__cause__, "sqlstate", None) != "0A000":
                raise
            conn.close()
            self.cursor = cursor()
            self.cursor.execute(self.sql, params)
        return None


def raw(model, sql_text: str, params: list) -> RawQuerySet:
    """``model.objects.raw(sql_text, params)`` on the default database, whose statement
    PostgreSQL prepares once a connection has run it five times (``cursor()``): for a
    statement on every request whose planning costs more than its execution (the API's
    token, tenant and role read: about 0.5 ms of planning, 0.07 ms of execution; issue
    22, item 3). ``params``: positional, ``%s`` placeholders. The rows are model
    instances carrying the other columns as attributes, as with ``raw``."""
    using = DEFAULT_DB_ALIAS
    return RawQuerySet(sql_text, model=model, params=params, using=using,
                       query=_ServerBoundRawQuery(sql_text, using, params))


def insert_rows(model, rows: list[dict]) -> None:
    """Insert ``rows`` (each ``{attname: value}``, every column but the primary key, auto
    timestamps included; a column with a database default may be left out of every row)
    into ``model``'s table, in the caller's transaction: on
    PostgreSQL with one ``COPY`` (about a third of ``bulk_create``'s time per row, for
    the runifold import's batches, issue 10), elsewhere with ``bulk_create``. Values are
    converted by each field (``get_db_prep_save``), as the ORM does; database errors come
    out as Django's (``IntegrityError`` for a taken unique key). Row triggers fire for
    ``COPY`` as for ``INSERT``. Returns nothing: a caller that needs the new primary keys
    reads them by a unique key."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**row) for row in rows])
        return
    # A column with a database default (``db_default``: ``created_at``, migration 0042)
    # that no row gives is left to the database, as ``bulk_create`` leaves it; COPY has
    # no ``DEFAULT`` for a single row, so one row giving it means every row must.
    fields = [f for f in model._meta.concrete_fields if not f.primary_key
              and not (f.has_db_default() and not any(f.attname in row for row in rows))]
    for f in fields:
        if f.has_db_default() and not all(f.attname in row for row in rows):
            raise ValueError(f"insert_rows: {f.attname} is given in some rows only")
    columns = ", ".join(q(f.column) for f in fields)
    # The connection itself, not the ``connection`` proxy: one lookup instead of one per
    # value converted.
    conn = connections[connection.alias]
    # A column the rows leave out takes the field's default, as ``bulk_create`` does
    # (a column added later, e.g. screening's ``secret_paths``, never breaks a caller).
    prep = [(f.attname, f.get_db_prep_save, f.get_default()) for f in fields]
    conn.ensure_connection()
    with conn.wrap_database_errors, psycopg.Cursor(conn.connection) as cursor:
        with cursor.copy(f"COPY {table(model)} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([save(row.get(name, default), conn)
                                for name, save, default in prep])


class Pipeline:
    """psycopg's pipeline mode on Django's connection, for one write (issue 22, item 2):
    statements are sent without waiting, and a round trip is paid only where a result
    is read (a ``fetch``), at ``COMMIT`` and when leaving. Enter it before
    ``transaction.atomic()``: ``BEGIN`` then goes out with the first statement and
    ``COMMIT`` with the last.

    In pipeline mode a cursor's ``rowcount`` is unknown (-1) until the pipeline syncs,
    and Django's ORM relies on it (``save``, ``update``): ``leave()`` before handing the
    transaction to ORM code (one round trip). Elsewhere than PostgreSQL, or with
    ``RECOVERY_SQL_WRITE_PATH`` off, it does nothing."""

    def __init__(self):
        self._mode = None

    def __enter__(self) -> Pipeline:
        if available():
            _checked_connection()
            self._mode = connection.connection.pipeline()
            self._mode.__enter__()
        return self

    def leave(self) -> None:
        """Leave pipeline mode now (waits for every result sent so far)."""
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def __exit__(self, exc_type, exc, tb) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(exc_type, exc, tb)


class WriteTransaction:
    """One transaction of the SQL write path in two round trips (issue 22, item 2), for
    a caller outside any ``transaction.atomic()`` (Django's connection in autocommit):
    ``BEGIN`` is sent by hand in psycopg's pipeline mode together with the first
    statement, whose result the caller reads (round trip 1); ``COMMIT`` goes with the
    last statements when the block ends, and the pipeline's closing sync brings their
    results (round trip 2). Django's own ``atomic`` would cost three more waits here
    (psycopg syncs when autocommit changes, after ``BEGIN`` and after ``COMMIT`` in
    pipeline mode).

    Inside the block only statements through ``cursor()`` may run: no ORM call (it
    would read ``rowcount``, unknown in pipeline mode, or open an ``atomic`` of its
    own). ``abandon()`` rolls back and leaves, for a caller that hands the write to the
    ORM instead. An exception rolls back and is re-raised; so does a failed statement
    (raised when the block ends). Nothing of the block is ever left half-written or the
    session left inside a transaction."""

    def __enter__(self) -> WriteTransaction:
        assert available() and not connection.in_atomic_block, "WriteTransaction: autocommit only"
        _checked_connection()
        self._conn = connection.connection
        self._mode = self._conn.pipeline()
        self._mode.__enter__()
        self._conn.execute("BEGIN")
        return self

    def abandon(self) -> None:
        """Roll back and leave pipeline mode now (one round trip)."""
        mode, self._mode = self._mode, None
        if mode is not None:
            try:
                self._conn.execute("ROLLBACK")
            finally:
                mode.__exit__(None, None, None)

    def __exit__(self, exc_type, exc, tb) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        try:
            # Django's wrapper: a failed statement comes out as Django's error
            # (``IntegrityError``, ``OperationalError``), as from any other statement.
            with connection.wrap_database_errors:
                try:
                    self._conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")
                except BaseException as refused:  # an interrupt too: never left open
                    # The pipeline refused the end: a failed statement's answer came
                    # before it (a loaded machine). Leave pipeline mode all the same
                    # (psycopg's exit always does; with an error in hand it raises none
                    # of its own), then raise the block's error, else this one: never
                    # a session left in pipeline mode for the thread's next request.
                    if exc_type is not None:
                        mode.__exit__(exc_type, exc, tb)
                        return
                    mode.__exit__(type(refused), refused, refused.__traceback__)
                    raise
                mode.__exit__(exc_type, exc, tb)  # the sync: raises a failed statement's error
        finally:
            # After an error the server may still hold the aborted transaction (its
            # COMMIT was skipped): end it, so autocommit statements are not run inside it.
            if self._conn.pgconn.transaction_status in (
                    psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR):
                self._conn.execute("ROLLBACK")
