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
other append. The SQL helpers (names from ``_meta``, the binding cursor) and the audit
append's own statements live below, in ``sql``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from django.db import transaction

from . import audit, locks, policy, sql
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

# The helpers the checkpoint update shares with the audit append; ``FALLBACK`` and
# ``available`` stay importable from here for the service that chooses this path.
from .sql import FALLBACK, available  # noqa: F401
from .sql import col as _col
from .sql import cursor as _cursor
from .sql import event_params as _event_params
from .sql import table as _table
from .vocab import AuditAction, EffectState, RetryState, TargetType

_IDENTITY = ("agent", "model", "workflow", "definition_version")


@dataclass(frozen=True)
class _Sql:
    lock: str
    cas: str
    finish: dict[bool, str]  # by whether the payload's identity is stored


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
    ev_fields, ev_vals = sql.EVENT_FIELDS, sql.event_values()
    ev = AuditEvent
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
    return _Sql(lock=lock, cas=cas, finish=finish)


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
    # Long on purpose: one transaction of a few round trips whose statements share the
    # row read under the lock; the ORM path (services.checkpoints._checkpoint_cas)
    # mirrors it step by step.
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
            # Imported late: ``services.checkpoints`` imports this module (the knot of
            # docs/architecture.md).
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

        # Imported late, as above: the services import this module.
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
