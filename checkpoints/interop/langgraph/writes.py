"""``graph_put_writes``: store the pending writes of one LangGraph checkpoint (issue 10;
docs/langgraph.md, "put_writes"); writes on the namespace's head write one envelope
revision, under the same locks as a put.

On PostgreSQL the common case (new writes on the namespace's head, the fence holding) is
two round trips (``_writes_sql``, issue 22 item 3), as the put's: the write path's lock
with the head, its writes so far and the envelope read in the same round trip, then the
envelope's compare-and-swap (``writepath.update_locked``), the writes' rows and
``COMMIT``. Every other case (a retry, a special write replaced, writes on an older
checkpoint, a fenced token, no such checkpoint) is decided by the ORM path, the
reference.
"""

from __future__ import annotations

from functools import lru_cache

from django.db import transaction

from recovery_client import protocol as T

from ... import crypto, roles, sql
from ...audit import audit_record
from ...exceptions import DomainError, Fenced, NotFound
from ...jsonparse import loads_any
from ...models import Checkpoint, GraphCheckpoint, GraphWrite, Run, Tenant
from ...permissions import require
from ...services import writepath
from ...services.runs import _check_fence, _lock_run
from ...vocab import AuditAction, ConflictReason, TargetType
from .common import (
    _as_conflict,
    _envelope_payload,
    _head,
    _is_summary,
    _lock_envelope,
    _refuse,
    _revise_locked,
    _scoped,
    _summary_of_row,
    _write_envelope,
    _write_facts,
    facts_of,
)
from .parse import GraphWrites

# --------------------------------------------------------------------------------------
# put_writes
# --------------------------------------------------------------------------------------

def graph_put_writes(*, actor, tenant: Tenant, body: GraphWrites,
                     fencing_token: int | None = None) -> int:
    """Store a task's pending writes on one checkpoint (``POST …/langgraph/writes``).

    A write whose (task, idx) is stored already is kept when ``idx >= 0`` (a retry) and
    replaced when ``idx < 0`` (LangGraph's special channels), write by write, as
    LangGraph's ``InMemorySaver.put_writes`` (``parse_writes`` keeps the last of a
    special idx the body repeats). Returns how many rows were
    inserted or replaced. When that is not 0: on the namespace's head, one envelope
    revision with the new counts (phase: tasks written, interrupted, errored), audited
    as ``checkpoint.write``; on an older checkpoint, one ``langgraph.writes`` event.
    Raises ``NotFound`` (no such checkpoint), ``Fenced`` (409, after committing its
    conflict record).
    """
    require(actor, tenant, roles.WRITE)
    run_id = T.thread_run_id(body.thread_id)
    envelope_id = T.thread_checkpoint_id(body.thread_id, body.checkpoint_ns)
    sealed = [(w, crypto.encrypt_text(w.value_json, tenant=tenant), len(w.value_json.encode()))
              for w in body.writes]
    if sealed and sql.available() and not transaction.get_connection().in_atomic_block:
        stored = _writes_sql(actor, tenant, body, sealed, run_id, envelope_id, fencing_token)
        if stored is not sql.FALLBACK:
            return stored
    refusal: DomainError | None = None
    stored = 0
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("checkpoint_id: no such checkpoint")
        envelope = _lock_envelope(tenant, envelope_id)
        try:
            _check_fence(run, fencing_token, run.db_now)
        except Fenced as exc:
            current = envelope.revision if envelope else None
            _refuse(tenant, actor, run, envelope_id=envelope_id, expected=current,
                    actual=current, attempted=None, refused=None,
                    reason=ConflictReason.FENCED, token=fencing_token)
            refusal = exc
        else:
            gc = (_scoped(tenant).filter(thread_id=body.thread_id,
                                         checkpoint_ns=body.checkpoint_ns,
                                         checkpoint_id=body.checkpoint_id)
                  .values("pk", "checkpoint_id").first()) if envelope is not None else None
            if gc is None:
                raise NotFound("checkpoint_id: no such checkpoint")
            stored = _store_writes(tenant, gc["pk"], body, sealed, run.db_now)
            if stored:
                refusal = _after_writes(actor, tenant, run, envelope, gc, body, stored,
                                        fencing_token)
    if refusal is not None:
        raise refusal
    return stored


def _writes_sql(actor, tenant: Tenant, body: GraphWrites, sealed, run_id, envelope_id,
                token: int | None):
    """The common ``put_writes`` in two round trips (module docstring): how many writes
    were stored (all of them), or ``sql.FALLBACK`` with nothing written when it is not
    the common case: no run, envelope or head, writes on a checkpoint that is not the
    head, a (task, idx) stored already (a retry, or a special write to replace), an
    envelope that does not summarise the head, a token the fence refuses. The decisions
    are the ORM path's accepting row (``graph_put_writes``, ``_store_writes``,
    ``_after_writes``); the head, its writes and the envelope are read under the run's
    lock, which every writer of them holds. Raises ``SecretDetected`` as
    ``checkpoint_put`` (nothing written)."""
    with sql.WriteTransaction() as tx, sql.cursor() as lock, sql.cursor() as facts:
        locked, found = writepath.lock_with_facts(  # round trip 1
            lock, facts, tenant=tenant, checkpoint_id=envelope_id, run_id=run_id,
            facts_sql=_writes_facts_sql(), facts_params={
                "tenant": tenant.pk, "envelope": envelope_id, "thread": body.thread_id,
                "ns": body.checkpoint_ns, "task": body.task_id,
                "idxs": [w.idx for w, _, _ in sealed]})
        envelope_ct, head_pk, head_id, taken, tasks, channels = found
        if (locked is None or locked.checkpoint_pk is None or envelope_ct is None
                or head_id != body.checkpoint_id or taken or locked.fence_refuses(token)):
            tx.abandon()
            return sql.FALLBACK
        payload = loads_any(crypto.decrypt_text(envelope_ct, tenant=tenant))
        if (not isinstance(payload, dict) or payload.get("checkpoint_id") != head_id
                or not _is_summary(payload)):
            tx.abandon()
            return sql.FALLBACK
        written, interrupted, errored = facts_of(
            set(tasks or ()) | {body.task_id},
            set(channels or ()) | {w.channel for w, _, _ in sealed})
        summary = dict(payload, written_tasks=written, interrupted=interrupted,
                       errored=errored)
        if _revise_locked(lock, locked, actor=actor, tenant=tenant,
                          thread_id=body.thread_id, ns=body.checkpoint_ns, summary=summary,
                          token=token) is None:
            tx.abandon()
            return sql.FALLBACK
        lock.execute(*_writes_insert(tenant, head_pk, body, sealed, locked.now))
    return len(sealed)  # committed: round trip 2


@lru_cache(maxsize=1)
def _writes_facts_sql() -> str:
    """What ``_writes_sql`` reads besides the lock, in a statement of its own (after the
    lock, so current): the envelope's ciphertext; the namespace's head (pk, id); how many
    of the body's (task, idx) the head holds already; the tasks and the channels that
    wrote on it so far (``NULL`` arrays when none)."""
    g, c, w = GraphCheckpoint, Checkpoint, GraphWrite
    on_head = (f"FROM {sql.table(w)} WHERE {sql.col(w, 'tenant')} = %(tenant)s "
               f"AND {sql.col(w, 'graph_checkpoint')} = h.id")
    return (f"SELECT (SELECT {sql.col(c, 'payload_ciphertext')} FROM {sql.table(c)} "
            f"WHERE {sql.col(c, 'tenant')} = %(tenant)s AND {sql.col(c, 'uuid')} = "
            f"%(envelope)s), h.id, h.checkpoint_id, "
            f"(SELECT COUNT(*) {on_head} AND {sql.col(w, 'task_id')} = %(task)s "
            f"AND {sql.col(w, 'idx')} = ANY(%(idxs)s)), "
            f"(SELECT array_agg(DISTINCT {sql.col(w, 'task_id')}) {on_head}), "
            f"(SELECT array_agg(DISTINCT {sql.col(w, 'channel')}) {on_head}) "
            f"FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT {sql.col(g, 'id')} AS id, "
            f"{sql.col(g, 'checkpoint_id')} AS checkpoint_id FROM {sql.table(g)} "
            f"WHERE {sql.col(g, 'tenant')} = %(tenant)s AND {sql.col(g, 'thread_id')} = "
            f"%(thread)s AND {sql.col(g, 'checkpoint_ns')} = %(ns)s "
            f"ORDER BY {sql.col(g, 'checkpoint_id')} DESC LIMIT 1) AS h ON TRUE")


def _writes_insert(tenant, gc_pk: int, body: GraphWrites, sealed, now) -> tuple[str, list]:
    """The ``INSERT`` of the writes' rows (what ``_store_writes`` creates for new ones)."""
    fields = [f for f in GraphWrite._meta.concrete_fields if not f.primary_key]
    one = f"({', '.join(['%s'] * len(fields))})"
    rows = [{"tenant": tenant.pk, "graph_checkpoint": gc_pk, "task_id": body.task_id,
             "task_path": body.task_path, "idx": write.idx, "channel": write.channel,
             "value_ciphertext": ciphertext, "value_size": size, "created_at": now}
            for write, ciphertext, size in sealed]
    return (f"INSERT INTO {sql.table(GraphWrite)} "
            f"({', '.join(sql.q(f.column) for f in fields)}) VALUES "
            f"{', '.join([one] * len(rows))}",
            [r[f.name] for r in rows for f in fields])


def _store_writes(tenant, gc_pk: int, body: GraphWrites, sealed, now) -> int:
    writes = GraphWrite.objects.for_tenant(tenant)
    existing = dict(writes.filter(graph_checkpoint_id=gc_pk, task_id=body.task_id,
                                  idx__in=[w.idx for w, _, _ in sealed])
                    .values_list("idx", "pk"))
    new, replaced = [], 0
    for write, ciphertext, size in sealed:
        if write.idx in existing:
            if write.idx < 0:
                replaced += writes.filter(pk=existing[write.idx]).update(
                    channel=write.channel, value_ciphertext=ciphertext, value_size=size,
                    task_path=body.task_path, created_at=now)
            continue
        new.append(GraphWrite(tenant=tenant, graph_checkpoint_id=gc_pk, task_id=body.task_id,
                              task_path=body.task_path, idx=write.idx, channel=write.channel,
                              value_ciphertext=ciphertext, value_size=size, created_at=now))
    GraphWrite.objects.bulk_create(new)
    return len(new) + replaced


def _after_writes(actor, tenant, run: Run, envelope: Checkpoint, gc: dict, body: GraphWrites,
                  stored: int, token: int | None) -> DomainError | None:
    head = _head(tenant, body.thread_id, body.checkpoint_ns)
    if head is None or head["pk"] != gc["pk"]:
        audit_record(tenant=tenant, actor=actor, action=AuditAction.LANGGRAPH_WRITES,
                     target_type=TargetType.CHECKPOINT, target_id=envelope.uuid,
                     run_id=run.uuid,
                     after={"checkpoint_id": body.checkpoint_id, "task_id": body.task_id,
                            "stored": stored},
                     created_at=run.db_now)  # the lock's database time, not the process's
        return None
    payload = _envelope_payload(envelope)
    identity = payload.get("identity") or {}
    if payload.get("checkpoint_id") == gc["checkpoint_id"] and _is_summary(payload):
        written, interrupted, errored = _write_facts(tenant, gc["pk"])
        summary = dict(payload, written_tasks=written, interrupted=interrupted,
                       errored=errored)
    else:
        summary = _summary_of_row(tenant, head, body.thread_id, body.checkpoint_ns, identity)
    result = _write_envelope(actor, tenant, run, body.thread_id, body.checkpoint_ns, summary,
                             envelope.revision, token)
    if isinstance(result, DomainError):
        return _as_conflict(result, tenant, body.thread_id, body.checkpoint_ns)
    return None
