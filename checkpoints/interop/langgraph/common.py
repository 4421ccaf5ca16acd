"""What the LangGraph writes share (issue 10; docs/langgraph.md): a namespace's head
(its checkpoint with the greatest id), the envelope's lock, payload and summary, the
envelope revision written through ``checkpoint_put``, and a refused write kept as a
conflict (``_refuse``) or turned into the LangGraph 412 (``_as_conflict``).
"""

from __future__ import annotations

import uuid
from typing import Any

from recovery_client import protocol as T

from ... import crypto, kinds, locks
from ...exceptions import DomainError, Fenced, StaleRevision, ThreadConflict
from ...jsonparse import dumps, loads_any
from ...models import Checkpoint, GraphCheckpoint, GraphWrite, Run
from ...services import writepath
from ...services.checkpoints import Envelope, _stored_form, checkpoint_put
from ...services.runs import _record_conflict
from ...vocab import TargetType
from .parse import _I63, ERROR, INTERRUPT, NULL_TASK_ID, _task_count, next_nodes

# --------------------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------------------

def _scoped(tenant) -> Any:
    return GraphCheckpoint.objects.for_tenant(tenant)


def _head(tenant, thread_id: str, ns: str) -> dict | None:
    """The namespace's head: its checkpoint with the greatest id, or ``None``."""
    return (_scoped(tenant).filter(thread_id=thread_id, checkpoint_ns=ns)
            .order_by("-checkpoint_id")
            .values("pk", "checkpoint_id", "parent_checkpoint_id", "envelope_revision").first())


def _lock_envelope(tenant, envelope_id: uuid.UUID) -> Checkpoint | None:
    return (locks.lock_rows(Checkpoint.objects.for_tenant(tenant))
            .filter(uuid=envelope_id).first())


def _envelope_payload(envelope: Checkpoint | None) -> dict:
    if envelope is None:
        return {}
    payload = loads_any(crypto.decrypt_text(envelope.payload_ciphertext,
                                                 tenant=envelope.tenant_id))
    return payload if isinstance(payload, dict) else {}


def _write_facts(tenant, gc_pk: int) -> tuple[int, bool, bool]:
    """``(written_tasks, interrupted, errored)`` of one checkpoint's pending writes
    (``facts_of``). One query."""
    pairs = set(GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint_id=gc_pk)
                .values_list("task_id", "channel").distinct())
    return facts_of({task for task, _ in pairs}, {channel for _, channel in pairs})


def facts_of(tasks: set[str], channels: set[str]) -> tuple[int, bool, bool]:
    """``(written_tasks, interrupted, errored)`` of a checkpoint whose pending writes
    come from ``tasks`` on ``channels``: the distinct tasks that wrote (LangGraph's null
    task left out), and whether any wrote ``__interrupt__`` / ``__error__``."""
    return len(tasks - {NULL_TASK_ID}), INTERRUPT in channels, ERROR in channels


def _summary(*, thread_id: str, ns: str, checkpoint_id: str, parent: str | None,
             metadata: dict, nxt: list[str], tasks: int, written: int, interrupted: bool,
             errored: bool, identity: dict, breakpoint: dict | None = None) -> dict:
    """The envelope payload of kind ``langgraph.checkpoint`` v1 (``kinds``): no channel
    value, no metadata value but ``step`` and ``source``; ``breakpoint`` only when the
    graph is paused at a static one (``breakpoint_of``)."""
    step = metadata.get("step")
    source = metadata.get("source")
    extra = {"breakpoint": breakpoint} if breakpoint else {}
    return {
        "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent,
        "step": step if type(step) is int and -_I63 <= step < _I63 else None,
        "source": source if isinstance(source, str) and len(source) <= 64 else "",
        "next": nxt, "tasks": tasks, "written_tasks": written, "interrupted": interrupted,
        "errored": errored, "identity": identity, **extra,
    }


def _summary_of_row(tenant, row: dict, thread_id: str, ns: str, identity: dict) -> dict:
    """The summary of a stored checkpoint (``row``: pk, checkpoint_id,
    parent_checkpoint_id), read back: decrypts it and its metadata, counts its writes."""
    stored = (_scoped(tenant).filter(pk=row["pk"])
              .values("checkpoint_ciphertext", "metadata_ciphertext").get())
    cp = loads_any(crypto.decrypt_text(stored["checkpoint_ciphertext"], tenant=tenant))
    md = loads_any(crypto.decrypt_text(stored["metadata_ciphertext"], tenant=tenant))
    nxt = next_nodes(cp)
    written, interrupted, errored = _write_facts(tenant, row["pk"])
    return _summary(thread_id=thread_id, ns=ns, checkpoint_id=row["checkpoint_id"],
                    parent=row["parent_checkpoint_id"] or None, metadata=md, nxt=nxt,
                    tasks=_task_count(cp, nxt), written=written, interrupted=interrupted,
                    errored=errored, identity=identity)


def _envelope(run: Run, thread_id: str, ns: str, summary: dict, revision: int) -> Envelope:
    return Envelope(checkpoint_id=T.thread_checkpoint_id(thread_id, ns), run_id=run.uuid,
                    revision=revision, kind=T.KIND, schema_version=T.SCHEMA_VERSION,
                    payload=summary, payload_json=dumps(summary),
                    updated_at_ms=int(run.db_now.timestamp() * 1000))


def _write_envelope(actor, tenant, run: Run, thread_id: str, ns: str, summary: dict,
                    expected: int | None, token: int | None) -> Checkpoint | DomainError:
    """One envelope revision through ``checkpoint_put`` (the caller holds the run's and
    the envelope's locks). A refusal (``StaleRevision``, ``Fenced``) is returned, not
    raised: its conflict record stays in the caller's transaction, which commits it."""
    env = _envelope(run, thread_id, ns, summary, 0 if expected is None else expected + 1)
    try:
        checkpoint, _ = checkpoint_put(actor=actor, tenant=tenant, envelope=env,
                                       expected_revision=expected, fencing_token=token)
    except (StaleRevision, Fenced) as exc:
        return exc
    return checkpoint


def _revise_locked(cursor, locked: writepath.Locked, *, actor, tenant, thread_id: str,
                   ns: str, summary: dict, token: int | None) -> Envelope | None:
    """The envelope's next revision, ``summary``, on the write path's SQL dialect
    (``writepath.update_locked``) in the caller's ``sql.WriteTransaction``, whose lock
    statement read ``locked``: the ``Envelope`` whose write was sent (its result comes
    with ``COMMIT``), or ``None`` when the write path hands it back (the caller
    abandons the transaction and the ORM path decides). Raises ``SecretDetected`` as
    ``checkpoint_put``."""
    run = locked.run
    run.db_now = locked.now
    env = _envelope(run, thread_id, ns, summary, locked.revision + 1)
    form = _stored_form(env, tenant)
    del form["declared_by"]  # None: langgraph.checkpoint is a kind in code
    written = writepath.update_locked(cursor, locked, actor=actor, tenant=tenant,
                                      envelope=env, expected_revision=locked.revision,
                                      fencing_token=token, **form)
    return env if isinstance(written, Checkpoint) else None  # else FALLBACK or a refusal


def _refuse(tenant, actor, run: Run, *, envelope_id, expected, actual, attempted,
            refused: Envelope | None, reason: str, token: int | None = None) -> None:
    """Keep a refused LangGraph write as a conflict of ``run`` (locked, read with the
    database time), in the caller's transaction (``runs._record_conflict``)."""
    _record_conflict(tenant=tenant, run=run, actor=actor, target_type=TargetType.CHECKPOINT,
                     target_id=envelope_id, expected=expected, actual=actual,
                     attempted=attempted, reason=reason, token_sent=token,
                     refused=dumps(refused.as_json()) if refused is not None else "")


def _as_conflict(exc: DomainError, tenant, thread_id: str, ns: str) -> DomainError:
    """A ``StaleRevision`` from ``checkpoint_put`` (the envelope moved under a write
    that did not come through here) as the LangGraph 412; ``Fenced`` as it is."""
    if isinstance(exc, StaleRevision) and not isinstance(exc, ThreadConflict):
        head = _head(tenant, thread_id, ns)
        return ThreadConflict(exc.current_revision, head["checkpoint_id"] if head else None,
                              "checkpoint: the namespace's envelope moved meanwhile")
    return exc


def _is_summary(payload: dict) -> bool:
    return kinds.classify(T.KIND, T.SCHEMA_VERSION, payload).supported
