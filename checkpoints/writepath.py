"""The checkpoint update's SQL: one compare-and-swap in as few round trips as it needs
(issue 8). Used by ``services.checkpoint_put`` on PostgreSQL for the common case, an
update of an existing checkpoint by the run that owns it; everything else (a create, a
refused or fenced write, an id that belongs to another run, SQLite) takes the ORM path
in ``services.checkpoints``, which stays the reference: both write the same rows, and
``tests/services/test_writepath.py`` compares them column by column.

The ORM models are the schema's source of truth: every table and column name below is
read from ``Model._meta``, never typed. One transaction, five round trips:

1. ``BEGIN``;
2. lock the tenant's audit chain head, then the run row (``locks.run_lock_sql``), with
   the database time, the checkpoint's id, run and kind in the same statement;
3. the conditional ``UPDATE`` of the checkpoint, the history row, the audit chain head's
   lock and next position, and the facts the run's recovery state needs (effect states,
   open retry), in one statement whose parts see one snapshot taken after the lock;
4. the run's new state, the audit event and the chain head's new hash, in one statement;
5. ``COMMIT``.

Lock order is the store's (``checkpoints/locks.py``): the tenant's audit chain head,
the run row, the checkpoint. The audit event is built by ``audit.new_event``, as every
other append.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import psycopg
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from . import audit, locks, policy
from .exceptions import Fenced, StaleRevision
from .jsonparse import dumps
from .models import (
    AuditChainHead,
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Effect,
    RetryRequest,
    Run,
    Tenant,
)
from .vocab import AuditAction, EffectState, RetryState, TargetType

#: Returned when the fast path does not apply; nothing was written, the caller takes the
#: ORM path.
FALLBACK = object()

_IDENTITY = ("agent", "model", "workflow", "definition_version")


def available() -> bool:
    """Whether ``checkpoint_update`` may be used: PostgreSQL (its statements use
    data-modifying ``WITH``), unless ``RECOVERY_SQL_WRITE_PATH`` is off."""
    return connection.vendor == "postgresql" and settings.RECOVERY_SQL_WRITE_PATH


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _table(model) -> str:
    return _q(model._meta.db_table)


def _col(model, field: str) -> str:
    return _q(model._meta.get_field(field).column)


@dataclass(frozen=True)
class _Sql:
    lock: str
    cas: str
    finish: dict[bool, str]  # by whether the payload's identity is stored
    head_next: str
    append: str


@lru_cache(maxsize=1)
def _sql() -> _Sql:
    r, c, h, e = Run, Checkpoint, CheckpointRevision, Effect
    run_cols = ["id", "fencing_token", "lease_owner", "lease_expires_at", "closed_at",
                "recovery_state", "state_changed_at", "unacknowledged_conflicts"]
    head_t = _table(AuditChainHead)
    head_tenant = _col(AuditChainHead, "tenant")
    # The store's lock order (``locks.lock_run``): the tenant's audit head, then the run.
    head_first, run_lock = locks.run_lock_sql(run_alias="r", head_table=head_t,
                                              head_tenant=head_tenant,
                                              tenant_param="%(tenant)s")
    lock = (
        f"SELECT {', '.join('r.' + _col(r, f) for f in run_cols)}, STATEMENT_TIMESTAMP(), "
        f"c.{_col(c, 'id')}, c.{_col(c, 'run')}, c.{_col(c, 'kind')} "
        f"FROM {_table(r)} r LEFT JOIN {_table(c)} c "
        f"ON c.{_col(c, 'tenant')} = %(tenant)s AND c.{_col(c, 'uuid')} = %(checkpoint)s "
        f"WHERE r.{_col(r, 'tenant')} = %(tenant)s AND r.{_col(r, 'uuid')} = %(run)s "
        f"AND {head_first} {run_lock}"
    )
    written = ["kind", "schema_version", "payload_ciphertext", "payload_size", "phase_class",
               "phase_label", "updated_at_ms", "received_at", "written_by"]
    sets = ", ".join(f"{_col(c, f)} = %({f})s" for f in ["revision", *written])
    hist_cols = ", ".join(_col(h, f) for f in ["tenant", "checkpoint", "revision", *written])
    hist_vals = ", ".join(f"%({f})s" for f in ["revision", *written])
    head_seq, head_hash = _col(AuditChainHead, "seq"), _col(AuditChainHead, "last_hash")
    ets, erun = _col(e, "tenant"), _col(e, "run")
    rr = RetryRequest
    cas = (
        f"WITH upd AS (UPDATE {_table(c)} SET {sets} "
        f"WHERE {_col(c, 'id')} = %(checkpoint_pk)s AND {_col(c, 'revision')} = %(expected)s "
        f"RETURNING {_col(c, 'id')} AS id), "
        f"hist AS (INSERT INTO {_table(h)} ({hist_cols}) "
        f"SELECT %(tenant)s, upd.id, {hist_vals} FROM upd RETURNING 1), "
        f"head AS (UPDATE {head_t} SET {head_seq} = {head_seq} + 1 "
        f"WHERE {head_tenant} = %(tenant)s AND EXISTS (SELECT 1 FROM upd) "
        f"RETURNING {head_seq} AS seq, {head_hash} AS last_hash) "
        f"SELECT (SELECT COUNT(*) FROM hist), "
        f"(SELECT {_col(c, 'revision')} FROM {_table(c)} WHERE {_col(c, 'id')} = %(checkpoint_pk)s), "
        f"(SELECT seq FROM head), (SELECT last_hash FROM head), "
        f"(SELECT COALESCE(json_object_agg(s.state, s.n), '{{}}') FROM "
        f"(SELECT {_col(e, 'state')} AS state, COUNT(*) AS n FROM {_table(e)} "
        f"WHERE {ets} = %(tenant)s AND {erun} = %(run_pk)s AND NOT "
        f"({_col(e, 'state')} = ANY(%(needs_retry)s) AND {_col(e, 'retry_authorized_by')} IS NOT NULL) "
        f"GROUP BY {_col(e, 'state')}) s), "
        f"(SELECT {_col(rr, 'state')} FROM {_table(rr)} WHERE {_col(rr, 'tenant')} = %(tenant)s "
        f"AND {_col(rr, 'run')} = %(run_pk)s AND {_col(rr, 'state')} = ANY(%(open_retry)s) LIMIT 1)"
    )
    ev = AuditEvent
    ev_fields = ["tenant", "seq", "created_at", "actor", "actor_name", "action", "target_type",
                 "target_ref", "run_uuid", "reason", "before", "after", "prev_hash", "hash",
                 "hash_scheme", "key_id"]
    ev_vals = ", ".join(f"%(ev_{f})s::jsonb" if f in ("before", "after") else f"%(ev_{f})s"
                        for f in ev_fields)
    run_sets = ["latest_checkpoint", "kind", "schema_version", "phase_class", "phase_label",
                "last_write_at", "updated_at", "closed_at", "closed_by", "closed_reason",
                "recovery_state", "recovery_reason", "state_changed_at"]
    finish = {}
    for with_identity in (False, True):
        fields = run_sets + (list(_IDENTITY) if with_identity else [])
        run_set = ", ".join(f"{_col(r, f)} = %(run_{f})s" for f in fields)
        finish[with_identity] = (
            f"WITH ru AS (UPDATE {_table(r)} SET {run_set} WHERE {_col(r, 'id')} = %(run_pk)s "
            f"RETURNING 1), "
            f"ev AS (INSERT INTO {_table(ev)} ({', '.join(_col(ev, f) for f in ev_fields)}) "
            f"VALUES ({ev_vals}) RETURNING 1) "
            f"UPDATE {head_t} SET {head_hash} = %(ev_hash)s WHERE {head_tenant} = %(tenant)s "
            f"AND EXISTS (SELECT 1 FROM ru) AND EXISTS (SELECT 1 FROM ev)"
        )
    head_next = (f"UPDATE {head_t} SET {head_seq} = {head_seq} + 1 WHERE {head_tenant} = %(tenant)s "
                 f"RETURNING {head_seq}, {head_hash}")
    append = (f"WITH ev AS (INSERT INTO {_table(ev)} ({', '.join(_col(ev, f) for f in ev_fields)}) "
              f"VALUES ({ev_vals}) RETURNING {_col(ev, 'id')} AS id) "
              f"UPDATE {head_t} SET {head_hash} = %(ev_hash)s WHERE {head_tenant} = %(tenant)s "
              f"RETURNING (SELECT id FROM ev)")
    return _Sql(lock=lock, cas=cas, finish=finish, head_next=head_next, append=append)


def _event_params(event: AuditEvent) -> dict:
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
    }


def _cursor():
    """A cursor for these statements: psycopg's server-side binding cursor (the default
    Django cursor binds on the client), so psycopg prepares each statement on its fifth
    use on a connection and PostgreSQL stops re-planning it, about a third of the write's
    time in ``make bench``. Wrapped like Django's own cursors, so query logging
    (``CaptureQueriesContext``), ``execute_wrapper`` hooks and error translation still
    apply. (Behind pgbouncer in transaction mode this needs pgbouncer 1.21 or later with
    ``max_prepared_statements`` set: docs/scaling.md.)"""
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
    sql = _sql()
    with _cursor() as cursor:
        cursor.execute(sql.head_next, {"tenant": tenant.pk})
        row = cursor.fetchone()
        if row is None:
            return FALLBACK
        event = build(row[0], row[1])
        cursor.execute(sql.append, {**_event_params(event), "tenant": tenant.pk})
        event.pk = cursor.fetchone()[0]
    return event


def checkpoint_update(*, actor, tenant: Tenant, envelope, expected_revision: int,
                      fencing_token: int | None, cls, phase_label: str, ciphertext: str,
                      size: int):
    """Update checkpoint ``envelope.checkpoint_id`` from ``expected_revision`` to
    ``envelope.revision`` (already checked to be ``expected_revision + 1``), in one
    transaction with its history row, the run's recovery state and one audit event.

    Returns the updated ``Checkpoint`` (unsaved instance holding what was written, so no
    re-read); for a stale revision the ``StaleRevision`` to raise once its conflict record
    (``runs._record_conflict``, same transaction) has committed; or ``FALLBACK`` when
    nothing was written and the ORM path must decide: no such run or checkpoint, the
    checkpoint belongs to another run or has another kind (400s the ORM path words), no
    audit chain head yet. Raises ``Fenced`` (CONTRACT.md 3) like the ORM path; the
    caller records it.
    """
    sql = _sql()
    checkpoint_id = envelope.checkpoint_id
    with transaction.atomic(), _cursor() as cursor:
        cursor.execute(sql.lock, {"tenant": tenant.pk, "checkpoint": checkpoint_id,
                                  "run": envelope.run_id})
        row = cursor.fetchone()
        if row is None:
            return FALLBACK
        (run_pk, token, lease_owner, lease_expires_at, closed_at, old_state, state_changed_at,
         unacknowledged, now, checkpoint_pk, checkpoint_run, kind) = row
        if checkpoint_pk is None or checkpoint_run != run_pk or kind != envelope.kind:
            return FALLBACK
        live = policy.lease_live(lease_owner, lease_expires_at, now)
        if policy.fence_refuses(fencing_token, token, live):
            raise Fenced(token, run_pk=run_pk)

        written = {
            "revision": envelope.revision, "kind": envelope.kind,
            "schema_version": envelope.schema_version, "payload_ciphertext": ciphertext,
            "payload_size": size, "phase_class": cls.phase.phase_class,
            "phase_label": phase_label, "updated_at_ms": envelope.updated_at_ms,
            "received_at": now, "written_by": actor.pk if actor is not None else None,
        }
        cursor.execute(sql.cas, {
            **written, "tenant": tenant.pk, "checkpoint_pk": checkpoint_pk,
            "expected": expected_revision, "run_pk": run_pk,
            "needs_retry": list(EffectState.NEEDS_RETRY), "open_retry": list(RetryState.OPEN),
        })
        updated, current, seq, prev_hash, counts, open_retry = cursor.fetchone()
        if not updated:  # a stale revision: kept as a conflict of the run, and refused
            from .services.checkpoints import _envelope_json
            from .services.runs import _record_conflict

            run = Run.objects.for_tenant(tenant).get(pk=run_pk)  # locked above
            run.tenant, run.db_now = tenant, now
            _record_conflict(tenant=tenant, run=run, actor=actor,
                             target_type=TargetType.CHECKPOINT, target_id=checkpoint_id,
                             expected=expected_revision, actual=current,
                             attempted=envelope.revision, refused=dumps(_envelope_json(envelope)))
            return StaleRevision(current)
        if seq is None:  # no audit chain head yet: the ORM path creates it
            transaction.set_rollback(True)
            return FALLBACK
        if isinstance(counts, str):
            counts = json.loads(counts)

        from .services.runs import effect_labels

        # The run as this write leaves it, for the one RunFacts builder: the new
        # checkpoint's phase, written now, open again (a write reopens a closed run,
        # DESIGN.md 4).
        written_run = Run(phase_class=cls.phase.phase_class, phase_label=phase_label,
                          last_write_at=now, lease_owner=lease_owner,
                          lease_expires_at=lease_expires_at,
                          unacknowledged_conflicts=unacknowledged, closed_at=None)
        facts = policy.RunFacts.of(
            written_run, now=now, ambiguity_threshold_s=tenant.ambiguity_threshold_s,
            effect_states=counts, open_retry_state=open_retry or "",
            effect_labels=(effect_labels(tenant.pk, run_pk)
                           if any(counts.get(s) for s in EffectState.DOUBTFUL) else {}))
        state, reason = policy.recovery_state(facts)
        run_values = {
            "latest_checkpoint": checkpoint_pk, "kind": envelope.kind,
            "schema_version": envelope.schema_version, "phase_class": cls.phase.phase_class,
            "phase_label": phase_label, "last_write_at": now, "updated_at": now,
            "closed_at": None, "closed_by": None, "closed_reason": "",
            "recovery_state": state, "recovery_reason": reason[:256],
            "state_changed_at": now if state != old_state else state_changed_at,
        }
        if cls.supported:
            ident = cls.identity
            run_values.update(agent=ident.agent, model=ident.model, workflow=ident.workflow,
                              definition_version=ident.definition_version)
        after = {"revision": envelope.revision, "phase": phase_label,
                 "phase_class": cls.phase.phase_class}
        if closed_at is not None:
            after["reopened"] = True
        event = audit.new_event(
            tenant=tenant, seq=seq, prev_hash=prev_hash, created_at=now, actor=actor,
            action=AuditAction.CHECKPOINT_WRITE, target_type=TargetType.CHECKPOINT,
            target_id=checkpoint_id, run_id=envelope.run_id,
            before={"revision": expected_revision}, after=after)
        params = {f"run_{k}": v for k, v in run_values.items()}
        params.update(_event_params(event), run_pk=run_pk, tenant=tenant.pk)
        cursor.execute(sql.finish[cls.supported], params)
        if cursor.rowcount != 1:  # cannot happen under the locks held; never half-write
            raise RuntimeError("checkpoint write: the run or audit head row vanished")

    checkpoint = Checkpoint(pk=checkpoint_pk, tenant=tenant, run_id=run_pk, uuid=checkpoint_id,
                            **{k: v for k, v in written.items() if k != "written_by"})
    checkpoint.written_by = actor
    return checkpoint


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
    columns = ", ".join(_q(f.column) for f in fields)
    # The connection itself, not the ``connection`` proxy: one lookup instead of one per
    # value converted.
    conn = connections[connection.alias]
    prep = [(f.attname, f.get_db_prep_save) for f in fields]
    conn.ensure_connection()
    with conn.wrap_database_errors, psycopg.Cursor(conn.connection) as cursor:
        with cursor.copy(f"COPY {_table(model)} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([save(row[name], conn) for name, save in prep])
