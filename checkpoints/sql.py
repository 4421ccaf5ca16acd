"""The store's own SQL on PostgreSQL, below every service: table and column names read
from ``Model._meta`` (never typed), a server-side binding cursor, ``COPY`` inserts, and
the audit append in two statements (``audit.audit_record``). ``services.writepath`` builds the
checkpoint update's statements on the same helpers.

Each helper falls back to the ORM, or says so (``FALLBACK``), where the SQL does not
apply: SQLite, or ``RECOVERY_SQL_WRITE_PATH`` off.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache

import psycopg
from django.conf import settings
from django.db import connection, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from .models import AuditChainHead, AuditEvent, Tenant

#: Returned when the fast path does not apply; nothing was written, the caller takes the
#: ORM path.
FALLBACK = object()


def available() -> bool:
    """Whether the SQL paths may be used (this module's audit append, ``services.writepath``'s
    checkpoint update): PostgreSQL (their statements use data-modifying ``WITH``),
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


@lru_cache(maxsize=1)
def _audit_sql() -> tuple[str, str]:
    """``(head_next, append)``: move the tenant's chain head one position (locking it),
    and insert the event then store its hash as the head's."""
    head_t, head_tenant = table(AuditChainHead), col(AuditChainHead, "tenant")
    head_seq, head_hash = col(AuditChainHead, "seq"), col(AuditChainHead, "last_hash")
    ev = AuditEvent
    head_next = (f"UPDATE {head_t} SET {head_seq} = {head_seq} + 1 "
                 f"WHERE {head_tenant} = %(tenant)s RETURNING {head_seq}, {head_hash}")
    columns = ", ".join(col(ev, f) for f in EVENT_FIELDS)
    append = (f"WITH ev AS (INSERT INTO {table(ev)} ({columns}) "
              f"VALUES ({event_values()}) RETURNING {col(ev, 'id')} AS id) "
              f"UPDATE {head_t} SET {head_hash} = %(ev_hash)s WHERE {head_tenant} = %(tenant)s "
              f"RETURNING (SELECT id FROM ev)")
    return head_next, append


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
    Django cursor binds on the client). It prepares nothing: Django connects with
    psycopg's ``prepare_threshold`` off, and ``RECOVERY_PGBOUNCER`` keeps it off
    (PgBouncer before 1.21 in transaction mode loses prepared statements between
    transactions; issue 22, docs/scaling.md). Wrapped like Django's own cursors, so query
    logging (``CaptureQueriesContext``), ``execute_wrapper`` hooks and error translation
    still apply."""
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    return wrapper(raw, connection)


def audit_append(*, tenant: Tenant, build: Callable[[int, str], AuditEvent]):
    """Append one event to ``tenant``'s audit chain in two statements (``audit_record``
    on PostgreSQL, inside the caller's transaction): move the chain head one position
    and lock it (``UPDATE … RETURNING`` its position and last hash), then insert the
    event ``build(seq, prev_hash)`` returns and store its hash as the head's, in one
    statement. Returns the saved event, or ``FALLBACK`` (nothing written) when the
    tenant has no chain head yet."""
    head_next, append = _audit_sql()
    with cursor() as cur:
        cur.execute(head_next, {"tenant": tenant.pk})
        row = cur.fetchone()
        if row is None:
            return FALLBACK
        event = build(row[0], row[1])
        cur.execute(append, {**event_params(event), "tenant": tenant.pk})
        event.pk = cur.fetchone()[0]
    return event


def insert_rows(model, rows: list[dict]) -> None:
    """Insert ``rows`` (each ``{attname: value}``, every column but the primary key, auto
    timestamps included) into ``model``'s table, in the caller's transaction: on
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
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
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
