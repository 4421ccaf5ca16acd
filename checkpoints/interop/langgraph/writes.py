"""``graph_put_writes``: store the pending writes of one LangGraph checkpoint (issue 10;
docs/langgraph.md, "put_writes"); writes on the namespace's head write one envelope
revision, under the same locks as a put.
"""

from __future__ import annotations

from django.db import transaction

from recovery_client import protocol as T

from ... import crypto, roles
from ...audit import audit_record
from ...exceptions import DomainError, Fenced, NotFound
from ...models import Checkpoint, GraphWrite, Run, Tenant
from ...permissions import require
from ...services.runs import _check_fence, _lock_run
from ...vocab import AuditAction, ConflictReason, TargetType
from .common import (
    _as_conflict,
    _envelope_payload,
    _head,
    _is_summary,
    _lock_envelope,
    _refuse,
    _scoped,
    _summary_of_row,
    _write_envelope,
    _write_facts,
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
                            "stored": stored})
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
