"""``graph_put``: store one LangGraph checkpoint (issue 10; docs/langgraph.md, "put").

Under the run's lock, then the envelope's: the parent must be the namespace's head (else
``ThreadConflict``, 412, kept as a conflict), the fencing token must hold (``Fenced``);
an accepted put writes one ``GraphCheckpoint`` row and one envelope revision.

On PostgreSQL the common put (the next checkpoint of a namespace that has one, fence
holding) takes two round trips (``_put_sql``, issue 22 item 3): the write path's lock
with the namespace's head and envelope read in the same round trip, then the envelope's
compare-and-swap (``writepath.update_locked``), the ``GraphCheckpoint`` row and
``COMMIT``. Every other case (a first put, a retry, a conflict, a fenced token, a new
run) is decided by the ORM path below, which is the reference.
"""

from __future__ import annotations

import uuid
from functools import lru_cache

from django.db import transaction

from recovery_client import protocol as T

from ... import crypto, kinds, roles, sql
from ...exceptions import DomainError, Fenced, ThreadConflict
from ...jsonparse import loads_any
from ...models import Checkpoint, GraphCheckpoint, Run, Tenant
from ...permissions import require
from ...services import writepath
from ...services.runs import _check_fence, _drop_if_empty, _lock_run
from ...vocab import ConflictReason
from .common import (
    _as_conflict,
    _envelope,
    _envelope_payload,
    _head,
    _lock_envelope,
    _refuse,
    _revise_locked,
    _scoped,
    _summary,
    _write_envelope,
)
from .parse import GraphPut, breakpoint_of

# --------------------------------------------------------------------------------------
# put
# --------------------------------------------------------------------------------------

def graph_put(*, actor, tenant: Tenant, put: GraphPut,
              fencing_token: int | None = None) -> tuple[dict, bool]:
    """Store one LangGraph checkpoint (``POST …/langgraph/checkpoints``).

    Accepted when its parent is the head of its (thread, namespace), or when it has no
    parent (appended after the head, as LangGraph's savers accept it), and its id sorts
    after the head's: one new ``GraphCheckpoint`` and one envelope revision
    (``checkpoint_put``, audited) in one transaction. Returns ``(answer, created)``,
    answer ``{"thread_id", "checkpoint_ns", "checkpoint_id", "run_id", "revision"}``;
    the same id with the same content again answers the first put's body with
    ``created=False`` (a retry after a lost answer) and writes nothing.

    Raises ``ThreadConflict`` (412) for a parent that is not the head, an id taken by
    other content, or an id that does not sort after the head's, ``Fenced`` (409) for
    an old or missing fencing token once the run had an owner: both after committing
    the conflict record (when the run exists). ``Forbidden``/``NotFound`` as
    ``permissions.require``.
    """
    require(actor, tenant, roles.WRITE)
    run_id = T.thread_run_id(put.thread_id)
    envelope_id = T.thread_checkpoint_id(put.thread_id, put.checkpoint_ns)
    checkpoint_ct = crypto.encrypt_text(put.checkpoint_json, tenant=tenant)
    metadata_ct = crypto.encrypt_text(put.metadata_json, tenant=tenant)
    size = len(put.checkpoint_json.encode()) + len(put.metadata_json.encode())
    if sql.available() and not transaction.get_connection().in_atomic_block:
        answer = _put_sql(actor, tenant, put, run_id, envelope_id, fencing_token,
                          checkpoint_ct, metadata_ct, size)
        if answer is not sql.FALLBACK:
            return answer, True
    return _put_orm(actor, tenant, put, run_id, envelope_id, fencing_token, checkpoint_ct,
                    metadata_ct, size)


def _put_orm(actor, tenant: Tenant, put: GraphPut, run_id: uuid.UUID,
             envelope_id: uuid.UUID, fencing_token: int | None, checkpoint_ct: str,
             metadata_ct: str, size: int) -> tuple[dict, bool]:
    """``graph_put`` through the ORM: every case, decided by ``_decide_put`` (the
    reference; SQLite's only path). Returns and raises as ``graph_put``."""
    refusal: DomainError | None = None
    answer: dict = {}
    created = False
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        new_run = False
        for _attempt in range(2):
            outcome = _decide_put(actor, tenant, run, put, envelope_id, fencing_token,
                                  new_run=new_run)
            if outcome != "create_run":
                break
            new_run = run is None
            run = _lock_run(tenant, run_id, create=True)  # then decide again, locked
        if isinstance(outcome, DomainError):
            refusal = outcome
            if new_run and isinstance(outcome, Fenced):
                # A token this new run never issued: nothing is kept, as the checkpoint
                # API's ``_record_fenced`` keeps nothing for a run new in the write.
                _drop_if_empty(run)
        elif isinstance(outcome, dict):
            answer = outcome
        else:
            envelope, identity = outcome
            summary = _accepted_summary(put, _envelope_payload(envelope), identity)
            written = _write_envelope(actor, tenant, run, put.thread_id, put.checkpoint_ns,
                                      summary, envelope.revision if envelope else None,
                                      fencing_token)
            if isinstance(written, DomainError):
                refusal = _as_conflict(written, tenant, put.thread_id, put.checkpoint_ns)
            else:
                GraphCheckpoint.objects.create(
                    tenant=tenant, run=run, envelope_id=written.pk, thread_id=put.thread_id,
                    checkpoint_ns=put.checkpoint_ns, checkpoint_id=put.checkpoint_id,
                    parent_checkpoint_id=put.parent_checkpoint_id or "",
                    lg_run_id=put.lg_run_id, checkpoint_ciphertext=checkpoint_ct,
                    metadata_ciphertext=metadata_ct, payload_size=size,
                    envelope_revision=written.revision, created_at=run.db_now,
                    written_by=actor)
                answer = _put_answer(put, run_id, written.revision)
                created = True
    if refusal is not None:
        raise refusal
    return answer, created


def _put_sql(actor, tenant: Tenant, put: GraphPut, run_id: uuid.UUID,
             envelope_id: uuid.UUID, token: int | None, checkpoint_ct: str, metadata_ct: str,
             size: int):
    """The common put in two round trips (module docstring): ``_put_answer``'s dict, or
    ``sql.FALLBACK`` with nothing written when the put is not the common case (no run,
    no envelope or no head yet, a parent that is not the head, an id that does not sort
    after the head's, a token the fence refuses). The decisions are ``_decide_put``'s
    accepting row. The write gate and the run are locked first, as there; the envelope
    and the head are then read without the envelope's row lock (its compare-and-swap
    takes it), which is the same because every writer of an envelope or of the
    namespace's LangGraph rows holds the run's lock. Raises ``SecretDetected`` as
    ``checkpoint_put`` (nothing written)."""
    with sql.WriteTransaction() as tx, sql.cursor() as lock, sql.cursor() as facts:
        locked, (envelope_ct, head_id) = writepath.lock_with_facts(  # round trip 1
            lock, facts, tenant=tenant, checkpoint_id=envelope_id, run_id=run_id,
            facts_sql=_facts_sql(), facts_params={
                "tenant": tenant.pk, "envelope": envelope_id, "thread": put.thread_id,
                "ns": put.checkpoint_ns})
        if (locked is None or locked.checkpoint_pk is None or envelope_ct is None
                or head_id is None or put.checkpoint_id <= head_id
                or put.parent_checkpoint_id not in (None, head_id)
                or locked.fence_refuses(token)):
            tx.abandon()
            return sql.FALLBACK
        head = loads_any(crypto.decrypt_text(envelope_ct, tenant=tenant))
        head = head if isinstance(head, dict) else {}
        summary = _accepted_summary(put, head, _identity_of(put, head, locked.run))
        env = _revise_locked(lock, locked, actor=actor, tenant=tenant,
                             thread_id=put.thread_id, ns=put.checkpoint_ns, summary=summary,
                             token=token)
        if env is None:
            tx.abandon()
            return sql.FALLBACK
        lock.execute(_insert_sql(), {
            "tenant": tenant.pk, "run": locked.run.pk, "envelope": locked.checkpoint_pk,
            "thread_id": put.thread_id, "checkpoint_ns": put.checkpoint_ns,
            "checkpoint_id": put.checkpoint_id,
            "parent_checkpoint_id": put.parent_checkpoint_id or "",
            "lg_run_id": put.lg_run_id, "checkpoint_ciphertext": checkpoint_ct,
            "metadata_ciphertext": metadata_ct, "payload_size": size,
            "envelope_revision": env.revision, "created_at": locked.now,
            "written_by": actor.pk if actor is not None else None})
    return _put_answer(put, run_id, env.revision)  # committed: round trip 2


@lru_cache(maxsize=1)
def _facts_sql() -> str:
    """What ``_put_sql`` reads besides the lock, in its own statement (so after the lock
    and current: a statement's snapshot is taken when it starts): the envelope's
    ciphertext and the namespace's head id, each ``NULL`` when there is none."""
    g, c = GraphCheckpoint, Checkpoint
    return (f"SELECT (SELECT {sql.col(c, 'payload_ciphertext')} FROM {sql.table(c)} "
            f"WHERE {sql.col(c, 'tenant')} = %(tenant)s AND {sql.col(c, 'uuid')} = "
            f"%(envelope)s), (SELECT {sql.col(g, 'checkpoint_id')} FROM {sql.table(g)} "
            f"WHERE {sql.col(g, 'tenant')} = %(tenant)s AND {sql.col(g, 'thread_id')} = "
            f"%(thread)s AND {sql.col(g, 'checkpoint_ns')} = %(ns)s "
            f"ORDER BY {sql.col(g, 'checkpoint_id')} DESC LIMIT 1)")


@lru_cache(maxsize=1)
def _insert_sql() -> str:
    """The ``INSERT`` of one ``GraphCheckpoint``, every column but the key, as named
    parameters (the fields' names)."""
    fields = [f for f in GraphCheckpoint._meta.concrete_fields if not f.primary_key]
    return (f"INSERT INTO {sql.table(GraphCheckpoint)} "
            f"({', '.join(sql.q(f.column) for f in fields)}) "
            f"VALUES ({', '.join(f'%({f.name})s' for f in fields)})")


def _identity_of(put: GraphPut, head: dict, run: Run | None) -> dict:
    """The identity an accepted put's summary carries: the put's own, else the
    namespace's previous one (``head``: the envelope's payload, ``{}`` for none), else
    the run's (a new subgraph; ``run`` None: no run yet), else ``{}``."""
    identity = put.identity
    if identity is None:
        identity = head.get("identity")
        if identity is None and run is not None:
            identity = {name: getattr(run, name) for name in kinds.IDENTITY_LIMITS
                        if getattr(run, name)}
        identity = identity or {}
    return identity


def _accepted_summary(put: GraphPut, head: dict, identity: dict) -> dict:
    """The envelope summary an accepted put writes (``common._summary``), with the static
    breakpoint it pauses at (``breakpoint_of``: the tasks that just ran are the parent's
    next, read from ``head``, the envelope's payload before the put, when the parent is
    its checkpoint)."""
    parent_next = head.get("next") if (
        put.parent_checkpoint_id is not None
        and head.get("checkpoint_id") == put.parent_checkpoint_id) else None
    return _summary(thread_id=put.thread_id, ns=put.checkpoint_ns,
                    checkpoint_id=put.checkpoint_id, parent=put.parent_checkpoint_id,
                    metadata=put.metadata, nxt=put.next, tasks=put.tasks, written=0,
                    interrupted=False, errored=False, identity=identity,
                    breakpoint=breakpoint_of(put.checkpoint, put.next, parent_next,
                                             put.interrupt_before, put.interrupt_after))


def _put_answer(put: GraphPut, run_id: uuid.UUID, revision: int) -> dict:
    return {"thread_id": put.thread_id, "checkpoint_ns": put.checkpoint_ns,
            "checkpoint_id": put.checkpoint_id, "run_id": str(run_id), "revision": revision}


def _decide_put(actor, tenant, run: Run | None, put: GraphPut, envelope_id: uuid.UUID,
                token: int | None, *, new_run: bool = False):
    """Under the run's lock (``run`` None: no run yet): a refusal (``DomainError``,
    its conflict recorded), the retry's answer (a dict), ``"create_run"`` (accept, but
    create and lock the run first, then decide again), or ``(envelope, identity)``:
    accept, the envelope locked (None: the first checkpoint of the namespace).
    ``new_run``: this write has just created ``run``; a fenced refusal of it records no
    conflict (the caller drops the run, CONTRACT.md 3 as ``runs._record_fenced``)."""
    # Long on purpose: LangGraph's put rules (head, parent, fork, id order, fence) as
    # one decision table read top to bottom, in docs/langgraph.md's order.
    envelope = head = None
    if run is not None:
        try:
            _check_fence(run, token, run.db_now)
        except Fenced as exc:
            if new_run:
                return exc
            envelope = _lock_envelope(tenant, envelope_id)
            current = envelope.revision if envelope else None
            _refuse(tenant, actor, run, envelope_id=envelope_id, expected=current,
                    actual=current, attempted=None if current is None else current + 1,
                    refused=None, reason=ConflictReason.FENCED, token=token)
            return exc
        envelope = _lock_envelope(tenant, envelope_id)
        head = _head(tenant, put.thread_id, put.checkpoint_ns)
    current = envelope.revision if envelope is not None else None
    head_id = head["checkpoint_id"] if head else None
    existing = None
    if head_id is not None and put.checkpoint_id <= head_id:  # else it cannot be stored
        existing = (_scoped(tenant).filter(thread_id=put.thread_id,
                                           checkpoint_ns=put.checkpoint_ns,
                                           checkpoint_id=put.checkpoint_id)
                    .values("checkpoint_ciphertext", "metadata_ciphertext",
                            "parent_checkpoint_id", "envelope_revision").first())
    if existing is not None:
        same = (existing["parent_checkpoint_id"] == (put.parent_checkpoint_id or "")
                and crypto.decrypt_text(existing["checkpoint_ciphertext"], tenant=tenant)
                == put.checkpoint_json
                and crypto.decrypt_text(existing["metadata_ciphertext"], tenant=tenant)
                == put.metadata_json)
        if same:
            return _put_answer(put, run.uuid, existing["envelope_revision"])
        _refuse(tenant, actor, run, envelope_id=envelope_id, expected=None, actual=current,
                attempted=None, refused=None, reason=ConflictReason.ID_EXISTS)
        return ThreadConflict(current, head_id, "checkpoint.id: this thread's namespace "
                                                "holds that id with other content")
    identity = _identity_of(put, _envelope_payload(envelope), run)
    if put.parent_checkpoint_id is not None and put.parent_checkpoint_id != head_id:
        detail = (f"parent_checkpoint_id: not the head of the thread's namespace (the head "
                  f"is {head_id})" if head_id else
                  "parent_checkpoint_id: the thread's namespace has no checkpoint")
        if run is None or envelope is None:
            if run is not None:
                _refuse(tenant, actor, run, envelope_id=envelope_id, expected=None,
                        actual=None, attempted=None, refused=None,
                        reason=ConflictReason.STALE_REVISION)
            return ThreadConflict(current, head_id, detail)
        refused = _envelope(run, put.thread_id, put.checkpoint_ns, _summary(
            thread_id=put.thread_id, ns=put.checkpoint_ns, checkpoint_id=put.checkpoint_id,
            parent=put.parent_checkpoint_id, metadata=put.metadata, nxt=put.next,
            tasks=put.tasks, written=0, interrupted=False, errored=False, identity=identity),
            current + 1)
        parent = (_scoped(tenant).filter(thread_id=put.thread_id,
                                         checkpoint_ns=put.checkpoint_ns,
                                         checkpoint_id=put.parent_checkpoint_id)
                  .values_list("envelope_revision", flat=True).first())
        if parent is not None and parent < current:
            # The writer continues from the revision its parent was written at: the
            # compare-and-swap from there is refused and kept by checkpoint_put itself.
            stale = _write_envelope(actor, tenant, run, put.thread_id, put.checkpoint_ns,
                                    refused.payload, parent, token)
            if isinstance(stale, DomainError):
                return ThreadConflict(current, head_id, detail)
            raise AssertionError("a stale compare-and-swap was accepted under the lock")
        _refuse(tenant, actor, run, envelope_id=envelope_id, expected=None, actual=current,
                attempted=current + 1, refused=refused, reason=ConflictReason.STALE_REVISION)
        return ThreadConflict(current, head_id, detail)
    if head_id is not None and put.checkpoint_id <= head_id:
        _refuse(tenant, actor, run, envelope_id=envelope_id, expected=current, actual=current,
                attempted=current + 1, refused=None, reason=ConflictReason.STALE_REVISION)
        return ThreadConflict(current, head_id, f"checkpoint.id: must sort after the head's "
                                                f"id {head_id} (LangGraph's ids grow)")
    if run is None:
        return "create_run"
    return envelope, identity
