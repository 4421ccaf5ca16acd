"""Deleting, pruning and copying LangGraph threads (issue 10; docs/langgraph.md,
"Deleting"): ``graph_thread_delete``, ``graph_threads_prune``, ``graph_runs_delete`` and
``graph_thread_copy``; a deleted thread's run is closed or settled as review requires.
"""

from __future__ import annotations

import itertools

from django.db import transaction
from django.db.models import OuterRef, Subquery

from recovery_client import protocol as T

from ... import roles
from ...audit import audit_record
from ...exceptions import DomainError, InvalidPayload, ThreadConflict
from ...models import (
    Checkpoint,
    Conflict,
    Effect,
    GraphCheckpoint,
    GraphWrite,
    ReconcileRequest,
    RetryRequest,
    Run,
    Tenant,
)
from ...permissions import require
from ...services.review import awaits_review, close_locked
from ...services.runs import _lock_run, run_save
from ...vocab import AuditAction, ConflictReason, TargetType
from .common import (
    _envelope_payload,
    _head,
    _is_summary,
    _lock_envelope,
    _refuse,
    _scoped,
    _summary_of_row,
    _write_envelope,
)
from .reads import _SCAN_BATCH, _ordered_rows

CLOSED_REASON = "thread deleted"


# --------------------------------------------------------------------------------------
# Deleting, pruning, copying
# --------------------------------------------------------------------------------------

def _referenced(tenant, run: Run) -> bool:
    """Whether anything but checkpoints refers to the run: effects (the evidence of side
    effects), conflicts, retry or reconcile requests."""
    return (Effect.objects.for_tenant(tenant).filter(run=run).exists()
            or Conflict.objects.for_tenant(tenant).filter(run=run).exists()
            or RetryRequest.objects.for_tenant(tenant).filter(run=run).exists()
            or ReconcileRequest.objects.for_tenant(tenant).filter(run=run).exists())


def _delete_in_namespace(actor, tenant, run: Run, thread_id: str, ns: str,
                         pks: list[int]) -> int:
    """Delete the graph checkpoints ``pks`` (and their writes) of one namespace, under
    the run's lock. A namespace whose head went gets an envelope revision describing the
    newest remaining checkpoint; one left empty loses its envelope and its revision
    history. Deletions are not fenced: LangGraph calls them outside any invocation
    (docs/langgraph.md). Returns how many checkpoints went."""
    envelope = _lock_envelope(tenant, T.thread_checkpoint_id(thread_id, ns))
    head_before = _head(tenant, thread_id, ns)
    GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint_id__in=pks).delete()
    deleted = _scoped(tenant).filter(pk__in=pks).delete()[1].get(GraphCheckpoint._meta.label, 0)
    head = _head(tenant, thread_id, ns)
    if envelope is None:
        return deleted
    if head is None:
        Checkpoint.objects.for_tenant(tenant).filter(pk=envelope.pk).delete()
    elif head_before is None or head["pk"] != head_before["pk"]:
        identity = _envelope_payload(envelope).get("identity") or {}
        summary = _summary_of_row(tenant, head, thread_id, ns, identity)
        current = _lock_run(tenant, run.uuid, create=False)  # fresh: an earlier write moved it
        result = _write_envelope(actor, tenant, current, thread_id, ns, summary,
                                 envelope.revision, current.fencing_token)
        if isinstance(result, DomainError):  # cannot happen under the locks held
            raise RuntimeError(f"langgraph: deleting moved no envelope ({result.error})")
    return deleted


def _settle_run(tenant, run: Run) -> str:
    """After deletions: the run's latest checkpoint is its newest remaining envelope
    (``"kept"``). With none left: deleted when nothing else refers to it
    (``"deleted"``); kept open, its recovery state recomputed without a checkpoint,
    while something awaits a reviewer (``review.awaits_review``: an effect in doubt or
    of unknown outcome, an open retry or reconcile request), so a writer's deletion
    never takes a run out of the inbox (``"awaiting_review"``); else closed as a
    reviewer's close does (``review.close_locked``, reason "thread deleted",
    ``"closed"``)."""
    run = _lock_run(tenant, run.uuid, create=False)  # fresh, under the lock held
    now = run.db_now
    latest = (Checkpoint.objects.for_tenant(tenant).filter(run=run)
              .order_by("-received_at", "-pk").first())
    if latest is not None:
        run_save(run, now, latest_checkpoint=latest, kind=latest.kind,
                 schema_version=latest.schema_version, phase_class=latest.phase_class,
                 phase_label=latest.phase_label)
        return "kept"
    if not _referenced(tenant, run):
        Run.objects.for_tenant(tenant).filter(pk=run.pk).delete()
        return "deleted"
    # No checkpoint: no phase (resume answers no_checkpoint, nothing is "in flight").
    run_save(run, now, latest_checkpoint=None, phase_class="", phase_label="")
    if run.closed_at is not None:  # a reviewer's own close stays as they left it
        return "closed"
    if awaits_review(run):
        return "awaiting_review"
    close_locked(run, now, closed_by=None, reason=CLOSED_REASON)
    return "closed"


def _delete_from_thread(actor, tenant, thread_id: str, rows_qs, action: str,
                        after: dict) -> int:
    """One thread's deletion in one transaction, under its run's lock: the graph
    checkpoints ``rows_qs`` selects (a queryset of this thread's rows, read after the
    lock), namespace by namespace, then the run settled and one ``action`` audit event
    (``after`` plus ``deleted`` and what became of the run) when anything went."""
    with transaction.atomic():
        run = _lock_run(tenant, T.thread_run_id(thread_id), create=False,
                        deleted_ok=True)  # a deleted run has no graph rows left: 0
        if run is None:
            return 0
        by_ns: dict[str, list[int]] = {}
        for pk, ns in rows_qs.filter(thread_id=thread_id).values_list("pk", "checkpoint_ns"):
            by_ns.setdefault(ns, []).append(pk)
        deleted = sum(_delete_in_namespace(actor, tenant, run, thread_id, ns, pks)
                      for ns, pks in sorted(by_ns.items()))
        if not deleted:
            return 0
        outcome = _settle_run(tenant, run)
        audit_record(tenant=tenant, actor=actor, action=action, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid,
                     after={**after, "thread_id": thread_id, "deleted": deleted,
                            "run": outcome}, created_at=run.db_now)
    return deleted


def graph_thread_delete(*, actor, tenant: Tenant, thread_id: str) -> int:
    """Delete every checkpoint and pending write of a LangGraph thread (``POST
    …/langgraph/threads/delete``), every namespace's envelope with its revision history,
    and the thread's run unless something else refers to it (then it is closed, reason
    "thread deleted"). Effects are never deleted. One ``langgraph.thread_delete`` audit
    event in the same transaction. Returns how many checkpoints went (0 for an unknown
    thread: nothing written, nothing audited)."""
    require(actor, tenant, roles.WRITE)
    return _delete_from_thread(actor, tenant, thread_id, _scoped(tenant),
                               AuditAction.LANGGRAPH_THREAD_DELETE, {})


PRUNE_STRATEGIES = ("keep_latest", "delete")


def graph_threads_prune(*, actor, tenant: Tenant, thread_ids: list[str],
                        strategy: str) -> int:
    """LangGraph's ``prune`` (``POST …/langgraph/threads/prune``): ``keep_latest`` keeps
    the head of each namespace and its writes, ``delete`` deletes the threads as
    ``graph_thread_delete``. Each thread in its own transaction with one
    ``langgraph.thread_prune`` event when something went. Returns the checkpoints
    deleted. Raises ``InvalidPayload`` for another strategy."""
    require(actor, tenant, roles.WRITE)
    if strategy not in PRUNE_STRATEGIES:
        raise InvalidPayload("strategy: must be keep_latest or delete")
    total = 0
    for thread_id in sorted(set(thread_ids)):
        rows = _scoped(tenant)
        if strategy == "keep_latest":
            heads = (_scoped(tenant).filter(thread_id=thread_id,
                                            checkpoint_ns=OuterRef("checkpoint_ns"))
                     .order_by("-checkpoint_id").values("pk")[:1])
            rows = rows.exclude(pk=Subquery(heads))
        total += _delete_from_thread(actor, tenant, thread_id, rows,
                                     AuditAction.LANGGRAPH_THREAD_PRUNE,
                                     {"strategy": strategy})
    return total


def graph_runs_delete(*, actor, tenant: Tenant, run_ids: list[str]) -> int:
    """LangGraph's ``delete_for_runs`` (``POST …/langgraph/runs/delete``): delete the
    checkpoints whose ``metadata["run_id"]`` is one of ``run_ids`` (LangGraph run ids,
    not recovery runs), with their writes, in every thread and namespace. Each thread
    in its own transaction with one ``langgraph.runs_delete`` event. Returns the
    checkpoints deleted."""
    require(actor, tenant, roles.WRITE)
    ids = sorted(set(run_ids))
    if not ids:
        return 0
    selected = _scoped(tenant).filter(lg_run_id__in=ids)
    threads = sorted(set(selected.values_list("thread_id", flat=True)))
    return sum(_delete_from_thread(actor, tenant, thread_id, selected,
                                   AuditAction.LANGGRAPH_RUNS_DELETE,
                                   {"run_ids": ids[:20], "run_ids_given": len(ids)})
               for thread_id in threads)


def graph_thread_copy(*, actor, tenant: Tenant, source_thread_id: str,
                      target_thread_id: str) -> int:
    """LangGraph's ``copy_thread`` (``POST …/langgraph/threads/copy``): every checkpoint
    and pending write of the source thread, in every namespace, onto the target thread
    (same checkpoint ids, parents and metadata), each target namespace getting its
    envelope (revision 0, the source head's summary). Both runs are locked, in run-id
    order. Returns how many checkpoints were copied (0 for an unknown source: nothing
    written). Raises ``InvalidPayload`` when source and target are the same thread,
    ``ThreadConflict`` (412, kept as a conflict of the target's run) when the target has
    checkpoints. One ``langgraph.thread_copy`` event on the target run."""
    require(actor, tenant, roles.WRITE)
    if source_thread_id == target_thread_id:
        raise InvalidPayload("target_thread_id: must differ from source_thread_id")
    source_run_id = T.thread_run_id(source_thread_id)
    target_run_id = T.thread_run_id(target_thread_id)
    if not _scoped(tenant).filter(thread_id=source_thread_id).exists():
        return 0
    refusal = None
    copied = 0
    with transaction.atomic():
        runs = {}
        for run_id in sorted((source_run_id, target_run_id), key=str):
            runs[run_id] = _lock_run(tenant, run_id, create=run_id == target_run_id)
        source, target = runs[source_run_id], runs[target_run_id]
        taken = (_scoped(tenant).filter(thread_id=target_thread_id).order_by("checkpoint_ns")
                 .values("checkpoint_ns").first())
        if source is None or not _scoped(tenant).filter(thread_id=source_thread_id).exists():
            _drop_empty_run(tenant, target)
        elif taken is not None:
            envelope = _lock_envelope(tenant, T.thread_checkpoint_id(target_thread_id,
                                                                     taken["checkpoint_ns"]))
            head = _head(tenant, target_thread_id, taken["checkpoint_ns"])
            _refuse(tenant, actor, target, envelope_id=envelope.uuid, expected=None,
                    actual=envelope.revision, attempted=None, refused=None,
                    reason=ConflictReason.ID_EXISTS)
            refusal = ThreadConflict(envelope.revision, head["checkpoint_id"] if head else None,
                                     "target_thread_id: the target thread has checkpoints")
        else:
            namespaces = sorted(set(_scoped(tenant).filter(thread_id=source_thread_id)
                                    .values_list("checkpoint_ns", flat=True)))
            for ns in namespaces:
                copied += _copy_namespace(actor, tenant, source_thread_id, target_thread_id,
                                          ns)
            target = _lock_run(tenant, target_run_id, create=False)
            audit_record(tenant=tenant, actor=actor, action=AuditAction.LANGGRAPH_THREAD_COPY,
                         target_type=TargetType.RUN, target_id=target.uuid, run_id=target.uuid,
                         after={"source_thread_id": source_thread_id,
                                "target_thread_id": target_thread_id,
                                "source_run_id": str(source_run_id), "copied": copied,
                                "namespaces": len(namespaces)}, created_at=target.db_now)
    if refusal is not None:
        raise refusal
    return copied


def _drop_empty_run(tenant, run: Run | None) -> None:
    if run is not None and not (
            Checkpoint.objects.for_tenant(tenant).filter(run=run).exists()
            or _referenced(tenant, run)):
        Run.objects.for_tenant(tenant).filter(pk=run.pk).delete()


def _copy_namespace(actor, tenant, source_thread: str, target_thread: str, ns: str) -> int:
    """Copy one namespace (the caller holds both runs' locks): the target envelope
    first (revision 0), then the rows in batches, ciphertexts as they are (one tenant,
    one key ring), writes mapped onto the new rows."""
    source_envelope = _lock_envelope(tenant, T.thread_checkpoint_id(source_thread, ns))
    head = _head(tenant, source_thread, ns)
    payload = _envelope_payload(source_envelope)
    identity = payload.get("identity") or {}
    if payload.get("checkpoint_id") == head["checkpoint_id"] and _is_summary(payload):
        summary = dict(payload, thread_id=target_thread)
    else:
        summary = _summary_of_row(tenant, head, target_thread, ns, identity)
    run = _lock_run(tenant, T.thread_run_id(target_thread), create=False)
    envelope = _write_envelope(actor, tenant, run, target_thread, ns, summary, None,
                               run.fencing_token)
    if isinstance(envelope, DomainError):  # cannot happen: the target namespace is empty
        raise RuntimeError(f"langgraph: copying made no envelope ({envelope.error})")
    copied = 0
    rows = _ordered_rows(_scoped(tenant).filter(thread_id=source_thread, checkpoint_ns=ns),
                         ("pk", "thread_id", "checkpoint_ns", "checkpoint_id",
                          "parent_checkpoint_id", "lg_run_id", "checkpoint_ciphertext",
                          "metadata_ciphertext", "payload_size"))
    while batch := list(itertools.islice(rows, _SCAN_BATCH)):
        GraphCheckpoint.objects.bulk_create([GraphCheckpoint(
            tenant=tenant, run=run, envelope_id=envelope.pk, thread_id=target_thread,
            checkpoint_ns=ns, checkpoint_id=r["checkpoint_id"],
            parent_checkpoint_id=r["parent_checkpoint_id"], lg_run_id=r["lg_run_id"],
            checkpoint_ciphertext=r["checkpoint_ciphertext"],
            metadata_ciphertext=r["metadata_ciphertext"], payload_size=r["payload_size"],
            envelope_revision=envelope.revision, created_at=run.db_now, written_by=actor)
            for r in batch])
        new_pk = dict(_scoped(tenant).filter(
            thread_id=target_thread, checkpoint_ns=ns,
            checkpoint_id__in=[r["checkpoint_id"] for r in batch])
            .values_list("checkpoint_id", "pk"))
        old = {r["pk"]: new_pk[r["checkpoint_id"]] for r in batch}
        GraphWrite.objects.bulk_create([GraphWrite(
            tenant=tenant, graph_checkpoint_id=old[w["graph_checkpoint_id"]],
            task_id=w["task_id"], task_path=w["task_path"], idx=w["idx"],
            channel=w["channel"], value_ciphertext=w["value_ciphertext"],
            value_size=w["value_size"], created_at=run.db_now)
            for w in GraphWrite.objects.for_tenant(tenant)
            .filter(graph_checkpoint_id__in=list(old))
            .values("graph_checkpoint_id", "task_id", "task_path", "idx", "channel",
                    "value_ciphertext", "value_size")])
        copied += len(batch)
    return copied
