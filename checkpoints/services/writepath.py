"""The checkpoint write, in both of its dialects side by side (issue 18: one home per
rule). ``services.checkpoint_put`` checks the request and calls ``checkpoint_write``;
this module does the transaction: the run lock, the fence, the compare-and-swap, the
history row, the run's recovery state and the audit event.

Two dialects, one set of rules:

- ``checkpoint_update``, PostgreSQL's path for the common case (an update of an existing
  checkpoint of the same run and kind): one transaction in five round trips (issue 8),
  statements built from ``Model._meta`` (``_sql``), never typed names;
- ``_orm_write``, the reference, for everything else (a create, an id owned by another
  run, a tenant without an audit chain head, SQLite, ``RECOVERY_SQL_WRITE_PATH`` off).

What each writes is decided once, above both: the checkpoint's columns
(``_checkpoint_fields``), the run's columns (``_run_fields``), the audit event's
``before`` and ``after`` (``_write_audit``), the refused body kept with a conflict
(``Envelope.as_json``); the fence (``policy.fence_refuses``) and the recovery facts
(``policy.RunFacts.of``) live in ``policy``. ``tests/services/test_writepath.py`` compares
the rows the two dialects write, column by column.

Lock order is the store's (``checkpoints/locks.py``): the tenant's audit chain head,
the run row, the checkpoint.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from functools import lru_cache

from django.db import IntegrityError, connection, transaction

from .. import audit, declared, locks, policy, sql
from ..audit import audit_record
from ..exceptions import Fenced, InvalidPayload, NotFound, StaleRevision, UsageDecreased
from ..jsonparse import content_sha256, dumps
from ..models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Run,
    RunSubject,
    Tenant,
)
from ..sql import FALLBACK
from ..sql import col as _col
from ..sql import cursor as _cursor
from ..sql import event_params as _event_params
from ..sql import table as _table
from ..vocab import (
    AuditAction,
    ConflictReason,
    EffectState,
    SecretsPolicy,
    TargetType,
)
from .lifecycle import subject_rows, subjects_index
from .runs import (
    _check_fence,
    _drop_if_empty,
    _lock_run,
    _record_conflict,
    conflict_parts,
    effect_labels,
    refuse_tombstoned,
    run_save,
)
from .screening import Screened

_IDENTITY = ("agent", "model", "workflow", "definition_version")


# --------------------------------------------------------------------------------------
# What a checkpoint write writes, decided once for both dialects
# --------------------------------------------------------------------------------------

def _checkpoint_fields(envelope, cls, phase_label: str, ciphertext: str, size: int,
                       now, screened: Screened | None = None) -> dict:
    """The checkpoint's (and its history row's) columns a write sets, ``revision`` and
    ``written_by`` aside (the dialects bind the actor differently); ``screened``: what
    screening found in the payload (``services.screening``; paths, never values)."""
    screened = screened or Screened()
    return {
        "kind": envelope.kind, "schema_version": envelope.schema_version,
        "payload_ciphertext": ciphertext, "payload_size": size,
        "phase_class": cls.phase.phase_class, "phase_label": phase_label,
        "updated_at_ms": envelope.updated_at_ms, "usage": cls.usage, "received_at": now,
        "secret_paths": screened.secret_paths, "large_above": screened.large_above,
    }


def _run_fields(envelope, cls, phase_label: str, now) -> dict:
    """The run's columns a checkpoint write sets besides ``latest_checkpoint`` and the
    recovery state: the latest phase, the write time, and the payload's identity when its
    kind and schema are supported (an unsupported payload's identity is never guessed)."""
    fields = {
        "kind": envelope.kind, "schema_version": envelope.schema_version,
        "phase_class": cls.phase.phase_class, "phase_label": phase_label,
        "last_write_at": now,
    }
    if cls.supported:
        ident = cls.identity
        fields.update(agent=ident.agent, model=ident.model, workflow=ident.workflow,
                      definition_version=ident.definition_version)
    return fields


def _write_audit(envelope, cls, phase_label: str, expected_revision: int | None,
                 reopened: bool, migration: Migrating | None = None,
                 token: int | None = None, screened: Screened | None = None) -> dict:
    """The ``before`` and ``after`` of a checkpoint write's audit event; a migration's
    also names the migration, both versions, the batch and the run's fencing token. A
    payload screening flagged adds ``flagged_paths`` (paths and detector types, never a
    value) and ``large_above``.

    ``after`` names the payload by ``payload_sha256`` (SHA-256 hex of its stored JSON
    text, ``envelope.payload_json``), never by a value: not even the phase label, which a
    declared kind may build from payload fields (issue 20, item 3; ``auditshape``).
    ``phase_label`` is taken for the callers' symmetry and not written."""
    after = {"revision": envelope.revision, "phase_class": cls.phase.phase_class,
             "payload_sha256": content_sha256(envelope.payload_json)}
    if reopened:
        after["reopened"] = True
    if screened is not None and screened.secret_paths:
        after["flagged_paths"] = screened.secret_paths
    if screened is not None and screened.large_above is not None:
        after["large_above"] = screened.large_above
    before = None if expected_revision is None else {"revision": expected_revision}
    if migration is not None:
        before.update(schema_version=migration.from_version, fencing_token=token - 1)
        after.update(schema_version=envelope.schema_version, migration=list(migration.names),
                     batch_id=str(migration.batch_id), fencing_token=token)
    return {"before": before, "after": after}


@dataclass(frozen=True)
class Migrating:
    """A migration's write (``services.migrations``, docs/migrations.md): the operator's,
    not the run's owner's. It takes the ORM dialect, and differs from a runtime's write
    in what it does to the run (``_migration_run_fields``) and in its audit event
    (``checkpoint.migrate``, naming the steps ``names``, ``from_version`` and the batch)."""

    names: tuple[str, ...]
    from_version: int
    batch_id: uuid.UUID


def _migration_run_fields(run, checkpoint, fields: dict) -> dict:
    """What a migration's write sets on the run, from a runtime write's ``fields``: the
    fencing token one up, so the owner that went quiet is fenced (its late write carries
    the old token); the kind, version and phase only when the checkpoint is the run's
    latest (migrating another checkpoint of the run does not make it the latest); never
    the last write time (the owner's quiet time goes on counting) nor a reopening of a
    closed run: a migration is not the owner writing."""
    token = {"fencing_token": run.fencing_token + 1}
    if run.latest_checkpoint_id != checkpoint.pk:
        return token
    return {**{k: v for k, v in fields.items() if k != "last_write_at"}, **token}


def _keep_conflict(*, tenant, run, actor, envelope, expected_revision, actual,
                   reason: str | None = None) -> None:
    """A refused write (stale, taken, or usage going back), kept as a conflict of ``run``
    (CONTRACT.md 3)."""
    _record_conflict(tenant=tenant, run=run, actor=actor, target_type=TargetType.CHECKPOINT,
                     target_id=envelope.checkpoint_id, expected=expected_revision,
                     actual=actual, attempted=envelope.revision,
                     refused=dumps(envelope.as_json()), reason=reason)


def _usage_refusal(cls, stored_usage: dict, stored_revision: int,
                   expected_revision: int | None) -> UsageDecreased | None:
    """The ``UsageDecreased`` a write from ``expected_revision`` earns when the stored
    revision is the one it replaces and a counter would go back (``policy.usage_decrease``;
    CONTRACT.md 8), else ``None``. An unsupported payload (its counters unreadable) is
    stored like any other and not compared: the run becomes ``schema_mismatch``."""
    if expected_revision is None or stored_revision != expected_revision or not cls.supported:
        return None
    decrease = policy.usage_decrease(stored_usage or {}, cls.usage)
    return UsageDecreased(*decrease) if decrease is not None else None


def _kept_usage(cls, stored_usage: dict) -> dict:
    """The usage counters an update stores: the payload's, or for an unsupported payload
    (whose counters cannot be read) the stored ones, so the next write is still compared
    with the last counters known."""
    return cls.usage if cls.supported else (stored_usage or {})


@dataclass(frozen=True)
class DeclaredBy:
    """What classified a checkpoint of a kind not in code: the tenant's declaration of
    (``kind``, ``version``) with ``digest`` (``None``: it had none). ``restate`` gives
    the write's stored form again (``services.checkpoints._stored_form``) when the
    declaration changed before the write took the tenant's audit head."""

    kind: str
    version: int
    digest: str | None
    restate: object  # () -> dict of cls, phase_label, ciphertext, size, declared_by


def checkpoint_write(*, actor, tenant: Tenant, envelope, expected_revision: int | None,
                     fencing_token: int | None, cls, phase_label: str, ciphertext: str,
                     size: int, migration: Migrating | None = None,
                     declared_by: DeclaredBy | None = None, screened: Screened | None = None):
    """The transaction of ``services.checkpoint_put`` (its checks done): create the
    checkpoint at revision 0 (``expected_revision=None``) or update it from
    ``expected_revision`` to ``envelope.revision``, with its history row, the run's
    recovery state and one audit event.

    Returns the ``Checkpoint``, or the ``StaleRevision`` or ``UsageDecreased`` to raise
    once its conflict record has committed. Raises ``SecretDetected`` (the tenant's
    policy refuses what screening found; nothing written), ``Fenced`` (CONTRACT.md 3; the caller records it), ``NotFound``
    (an update of a missing checkpoint), ``InvalidPayload`` (a checkpoint's run or kind
    never changes). On PostgreSQL an update tries ``checkpoint_update`` first; what it
    hands back (``FALLBACK``) the ORM path decides. ``migration``: the write is the
    operator's migration of the checkpoint (``Migrating``; always the ORM path, whose
    run update it shapes).

    ``declared_by``: the payload was classified by the tenant's declared kinds
    (``DeclaredBy``). The tenant's write gate is taken first (shared; a declaration's
    change takes it exclusively: ``services.kind_declare``), and a declaration changed since the
    classification is read again, so a checkpoint is never stored as classified by a
    declaration that is no longer the one its version has.

    ``screened``: what screening found in the payload (``services.screening``), stored
    on the checkpoint and its history row and named in the audit event.
    """
    if declared_by is not None:
        with transaction.atomic():
            locks.share_audit_head(tenant)
            if declared.current_digest(tenant, declared_by.kind,
                                       declared_by.version) != declared_by.digest:
                form = declared_by.restate()
                cls, phase_label = form["cls"], form["phase_label"]
            return checkpoint_write(
                actor=actor, tenant=tenant, envelope=envelope,
                expected_revision=expected_revision, fencing_token=fencing_token, cls=cls,
                phase_label=phase_label, ciphertext=ciphertext, size=size,
                migration=migration, screened=screened)
    if expected_revision is not None and sql.available() and migration is None:
        checkpoint = checkpoint_update(
            actor=actor, tenant=tenant, envelope=envelope, expected_revision=expected_revision,
            fencing_token=fencing_token, cls=cls, phase_label=phase_label,
            ciphertext=ciphertext, size=size, screened=screened)
        if checkpoint is not FALLBACK:
            return checkpoint
    return _orm_write(actor, tenant, envelope, expected_revision, fencing_token, cls,
                      phase_label, ciphertext, size, migration, screened)


# --------------------------------------------------------------------------------------
# The ORM dialect: the reference, and every case the SQL dialect hands back
# --------------------------------------------------------------------------------------

def _orm_write(actor, tenant, envelope, expected_revision, fencing_token, cls, phase_label,
               ciphertext, size, migration=None, screened=None):
    """``checkpoint_write`` through the ORM (same returns and errors)."""
    # Long on purpose: the ORM reference of the checkpoint write (lock, fence, CAS,
    # history, state, audit), step by step beside checkpoint_update below.
    conflict_at: int | None = None
    refusal: UsageDecreased | None = None
    with transaction.atomic():
        existing = (Checkpoint.objects.for_tenant(tenant).filter(uuid=envelope.checkpoint_id)
                    .values("run_id", "run__uuid", "kind").first())
        if expected_revision is not None and existing is None:
            # Retention or erasure deleted the run's checkpoints: say so (409), not 404,
            # from the run row or, once retention's phase 2 deleted it, its tombstone.
            if _lock_run(tenant, envelope.run_id, create=False) is None:
                refuse_tombstoned(tenant, envelope.run_id)
            raise NotFound("no such checkpoint")
        if existing is not None and expected_revision is not None:
            if existing["run__uuid"] != envelope.run_id:
                raise InvalidPayload("run_id: a checkpoint's run_id never changes")
            if existing["kind"] != envelope.kind:
                raise InvalidPayload("kind: a checkpoint's kind never changes")
        # A create that finds the id taken is a conflict of the run that owns the id.
        run_id = existing["run__uuid"] if existing is not None else envelope.run_id
        run = _lock_run(tenant, run_id, create=existing is None, data_policy=True)
        now = run.db_now
        # The tenant's data policy, read with the lock, decides what screening found: a
        # refusal (422) rolls back everything, the run this call may have created included.
        screened = (screened or Screened()).decided(
            run.secrets_policy or SecretsPolicy.WARN, run.payload_flag_bytes)
        _check_fence(run, fencing_token, now)
        fields = {**_checkpoint_fields(envelope, cls, phase_label, ciphertext, size, now,
                                       screened),
                  "written_by": actor}
        if expected_revision is None:
            if existing is not None:
                conflict_at = Checkpoint.objects.for_tenant(tenant).get(
                    uuid=envelope.checkpoint_id).revision
            else:
                try:
                    with transaction.atomic():
                        checkpoint = Checkpoint.objects.create(
                            tenant=tenant, run=run, uuid=envelope.checkpoint_id,
                            revision=0, **fields)
                except IntegrityError:
                    # Lost a create race: the conflict belongs to the winner's run, and the
                    # run this call just made for itself is dropped if nothing else uses it.
                    winner = Checkpoint.objects.for_tenant(tenant).select_related("run").get(
                        uuid=envelope.checkpoint_id)
                    conflict_at = winner.revision
                    if winner.run_id != run.pk:
                        _drop_if_empty(run)
                        run = _lock_run(tenant, winner.run.uuid, create=False)
                        # Judged like a create that finds the id taken: by the owning run.
                        _check_fence(run, fencing_token, run.db_now)
        else:
            # Read under the run's lock, which every write of this checkpoint takes first.
            stored = (Checkpoint.objects.for_tenant(tenant).filter(uuid=envelope.checkpoint_id)
                      .values("revision", "usage").get())
            refusal = _usage_refusal(cls, stored["usage"], stored["revision"],
                                     expected_revision)
            fields["usage"] = _kept_usage(cls, stored["usage"])
            if refusal is None:
                # The compare-and-swap: one conditional UPDATE; 0 rows: a stale revision.
                updated = Checkpoint.objects.for_tenant(tenant).filter(
                    uuid=envelope.checkpoint_id, revision=expected_revision
                ).update(revision=envelope.revision, **fields)
                if updated != 1:
                    conflict_at = Checkpoint.objects.for_tenant(tenant).get(
                        uuid=envelope.checkpoint_id).revision
                else:
                    checkpoint = Checkpoint.objects.for_tenant(tenant).get(
                        uuid=envelope.checkpoint_id)

        if refusal is not None:
            _keep_conflict(tenant=tenant, run=run, actor=actor, envelope=envelope,
                           expected_revision=expected_revision, actual=stored["revision"],
                           reason=ConflictReason.USAGE_DECREASED)
        elif conflict_at is not None:
            _keep_conflict(tenant=tenant, run=run, actor=actor, envelope=envelope,
                           expected_revision=expected_revision, actual=conflict_at)
        else:
            CheckpointRevision.objects.create(
                tenant=tenant, checkpoint=checkpoint, revision=envelope.revision, **fields)
            run_fields = {"latest_checkpoint": checkpoint,
                          **_run_fields(envelope, cls, phase_label, now)}
            if migration is not None:
                run_fields = _migration_run_fields(run, checkpoint, run_fields)
            reopened = run_save(run, now, reopen=migration is None, **run_fields)
            subjects_index(tenant=tenant, run_pk=run.pk, payload=envelope.payload,
                           fields=getattr(run, "subject_fields", None))
            audit_record(
                tenant=tenant, actor=actor,
                action=(AuditAction.CHECKPOINT_WRITE if migration is None
                        else AuditAction.CHECKPOINT_MIGRATE),
                target_type=TargetType.CHECKPOINT, target_id=envelope.checkpoint_id,
                run_id=run.uuid, created_at=now,  # the lock's database time (SQL path too)
                **_write_audit(envelope, cls, phase_label, expected_revision, reopened,
                               migration, run.fencing_token, screened))
    if conflict_at is not None:
        return StaleRevision(conflict_at)
    return refusal if refusal is not None else checkpoint


# --------------------------------------------------------------------------------------
# The SQL dialect (PostgreSQL): an update, or its refusal, in two round trips
# --------------------------------------------------------------------------------------

#: The most parameters the update statement may take: psycopg converts a statement's
#: ``%(name)s`` placeholders once and caches it only up to 50 parameters
#: (``psycopg._queries.MAX_CACHED_STATEMENT_PARAMS``); past that, every write parses its
#: 2.5 KB statement again (about 0.3 ms, measured by ``bench.profile_put``). Held by
#: tests/services/test_writepath.py.
WRITE_PARAMS_MAX = 50


@dataclass(frozen=True)
class _Sql:
    lock: str
    write: dict[bool, str]  # by whether the payload's identity is stored
    refuse: str  # a stale write's conflict, the run's count and state, its audit event


@lru_cache(maxsize=1)
def _sql() -> _Sql:
    r, c, h = Run, Checkpoint, CheckpointRevision
    written = ["kind", "schema_version", "payload_ciphertext", "payload_size", "phase_class",
               "phase_label", "updated_at_ms", "usage", "received_at", "written_by",
               "secret_paths", "large_above"]
    sets = ", ".join(f"{_col(c, f)} = %({f})s" for f in ["revision", *written])
    hist_cols = ", ".join(_col(h, f) for f in ["tenant", "checkpoint", "revision", *written])
    hist_vals = ", ".join(f"%({f})s" for f in ["revision", *written])
    # The event's tenant is the write's (one parameter fewer, see WRITE_PARAMS_MAX).
    ev_fields, ev_vals = sql.EVENT_FIELDS, sql.event_values().replace(
        "%(ev_tenant)s", "%(tenant)s")
    ev = AuditEvent
    run_sets = ["latest_checkpoint", "kind", "schema_version", "phase_class", "phase_label",
                "last_write_at", "updated_at", "recovery_state", "recovery_reason",
                "state_changed_at"]
    # A write reopens a closed run (DESIGN.md 4): constants, not parameters.
    reopen = (f"{_col(r, 'closed_at')} = NULL, {_col(r, 'closed_by')} = NULL, "
              f"{_col(r, 'closed_reason')} = ''")
    write = {}
    for with_identity in (False, True):
        fields = run_sets + (list(_IDENTITY) if with_identity else [])
        run_set = ", ".join([*(f"{_col(r, f)} = %(run_{f})s" for f in fields), reopen])
        write[with_identity] = (
            f"WITH upd AS (UPDATE {_table(c)} SET {sets} "
            f"WHERE {_col(c, 'id')} = %(checkpoint_pk)s AND {_col(c, 'revision')} = %(expected)s "
            f"RETURNING {_col(c, 'id')} AS id), "
            f"hist AS (INSERT INTO {_table(h)} ({hist_cols}) "
            f"SELECT %(tenant)s, upd.id, {hist_vals} FROM upd RETURNING 1), "
            f"ru AS (UPDATE {_table(r)} SET {run_set} WHERE {_col(r, 'id')} = %(run_pk)s "
            f"AND EXISTS (SELECT 1 FROM hist) RETURNING 1), "
            f"ev AS (INSERT INTO {_table(ev)} ({', '.join(_col(ev, f) for f in ev_fields)}) "
            f"SELECT {ev_vals} WHERE EXISTS (SELECT 1 FROM ru) RETURNING 1) "
            # Nothing written (cannot happen under the run lock the first statement
            # took): fail the statement, so the COMMIT sent with it fails and rolls all
            # back instead of committing half a write.
            f"SELECT 1 / (SELECT COUNT(*) FROM ev)::int"
        )
    cf = [f for f in Conflict._meta.concrete_fields if not f.primary_key]
    refused_sets = ", ".join(f"{_col(r, f)} = %(run_{f})s" for f in _REFUSAL_RUN_FIELDS)
    refuse = (
        f"WITH cf AS (INSERT INTO {_table(Conflict)} ({', '.join(sql.q(f.column) for f in cf)}) "
        f"VALUES ({', '.join(f'%(cf_{f.attname})s' for f in cf)}) RETURNING 1), "
        f"ru AS (UPDATE {_table(r)} SET {refused_sets} WHERE {_col(r, 'id')} = %(run_pk)s "
        f"AND EXISTS (SELECT 1 FROM cf) RETURNING 1), "
        f"ev AS (INSERT INTO {_table(ev)} ({', '.join(_col(ev, f) for f in ev_fields)}) "
        f"SELECT {ev_vals} WHERE EXISTS (SELECT 1 FROM ru) RETURNING 1) "
        f"SELECT 1 / (SELECT COUNT(*) FROM ev)::int"
    )
    return _Sql(lock=locks.write_lock_sql(), write=write, refuse=refuse)


#: What a refused write changes on its run (``runs.run_save``'s fields for one conflict
#: more): the count, then the recovery state it gives.
_REFUSAL_RUN_FIELDS = ("unacknowledged_conflicts", "recovery_state", "recovery_reason",
                       "updated_at", "state_changed_at")
#: The run's columns ``checkpoints_write_lock_v2`` returns first, in order (migration
#: 0041: 0039's, then what the run's facts need).
_LOCK_RUN_FIELDS = ("id", "fencing_token", "lease_owner", "lease_expires_at", "closed_at",
                    "recovery_state", "state_changed_at", "unacknowledged_conflicts",
                    "payloads_deleted_at", "phase_class", "phase_label", "last_write_at",
                    "kind", "schema_version", "agent", "model", "workflow",
                    "definition_version")


def checkpoint_update(*, actor, tenant: Tenant, envelope, expected_revision: int,
                      fencing_token: int | None, cls, phase_label: str, ciphertext: str,
                      size: int, screened: Screened | None = None):
    """Update checkpoint ``envelope.checkpoint_id`` from ``expected_revision`` to
    ``envelope.revision`` (already checked to be ``expected_revision + 1``) in one
    transaction of two round trips (issue 22, item 2):

    1. ``BEGIN`` and ``locks.write_lock_sql``: the tenant's write gate shared, the run
       row locked, then (read after the lock, so current) the database time, the
       checkpoint's id, run, kind, revision and usage, the tenant's data policy (which
       decides what screening found: ``SecretDetected``, nothing written) and the facts
       the run's recovery state needs (effect states, open retry);
    2. the compare-and-swap ``UPDATE`` of the checkpoint, its history row, the run's
       new state and the audit event (``audit.new_event``, as every other append) in one
       statement, the run's subject rows when the tenant declared subject fields, and
       ``COMMIT``.

    Outside any transaction (the API's write) the two are ``sql.WriteTransaction``'s;
    inside a caller's (a LangGraph put with its pending writes, a bulk) the same
    statements run in a savepoint, in pipeline mode.

    A refusal (a stale revision, a usage counter going back) takes the same two round
    trips: the second sends its conflict record instead (``_refuse``), and the
    ``StaleRevision`` or ``UsageDecreased`` is returned.

    Returns the updated ``Checkpoint`` (an unsaved instance holding what was written, so
    no re-read), that refusal, or ``FALLBACK`` when nothing was written and the ORM
    path must decide: no such run or checkpoint, the checkpoint belongs to another run
    or has another kind (400s the ORM path words), no write gate row yet. Raises ``Fenced``
    (CONTRACT.md 3) like the ORM path; the caller records it.
    """
    if transaction.get_connection().in_atomic_block:
        with sql.Pipeline() as pipe, transaction.atomic(), _cursor() as cursor:
            checkpoint = _update(cursor, actor=actor, tenant=tenant, envelope=envelope,
                                 expected_revision=expected_revision,
                                 fencing_token=fencing_token, cls=cls,
                                 phase_label=phase_label, ciphertext=ciphertext, size=size,
                                 screened=screened)
            if checkpoint is FALLBACK:
                transaction.set_rollback(True)
                pipe.leave()
            return checkpoint
    with sql.WriteTransaction() as tx, _cursor() as cursor:
        checkpoint = _update(cursor, actor=actor, tenant=tenant, envelope=envelope,
                             expected_revision=expected_revision, fencing_token=fencing_token,
                             cls=cls, phase_label=phase_label, ciphertext=ciphertext,
                             size=size, screened=screened)
        if checkpoint is FALLBACK:
            tx.abandon()
        return checkpoint


def _lock_params(tenant: Tenant, checkpoint_id: uuid.UUID, run_id: uuid.UUID) -> dict:
    """The parameters of ``_sql().lock`` (``locks.write_lock_sql``) for a write of
    checkpoint ``checkpoint_id`` of run ``run_id``."""
    return {"tenant": tenant.pk, "checkpoint": checkpoint_id, "run": run_id}


def lock_with_facts(lock, facts, *, tenant: Tenant, checkpoint_id: uuid.UUID,
                    run_id: uuid.UUID, facts_sql: str, facts_params: dict):
    """Round trip 1 of a write whose caller reads facts of its own under the same lock
    (the LangGraph put and put_writes, ``interop.langgraph``): on two cursors in a
    ``sql.WriteTransaction``, the lock statement, then ``facts_sql`` (a statement of its
    own, so its snapshot is taken after the lock), their results in one round trip.
    Returns ``(locked, facts_row)``, ``locked`` ``None`` when the lock found no gate row
    or no run (``Locked`` else, for ``update_locked``)."""
    lock.execute(_sql().lock, _lock_params(tenant, checkpoint_id, run_id))
    facts.execute(facts_sql, facts_params)
    row = lock.fetchone()  # the sync: both statements' results
    found = facts.fetchone()
    return (None if row is None else Locked.of(row, tenant, run_id)), found


@dataclass
class Locked:
    """What ``checkpoints_write_lock_v2`` read under the run's lock: the run as stored
    (``run``: an unsaved ``Run`` of ``_LOCK_RUN_FIELDS``), the database time, the
    checkpoint's primary key, run, kind, revision and usage (``None`` when there is no
    such checkpoint), the tenant's data policy and the run's effect counts by state and
    open retry state."""

    run: Run
    now: object
    checkpoint_pk: int | None
    checkpoint_run: int | None
    kind: str | None
    revision: int | None
    usage: dict | None
    secrets_policy: str | None
    payload_flag_bytes: int | None
    subject_fields: list | None
    counts: dict
    open_retry: str | None

    @classmethod
    def of(cls, row, tenant: Tenant, run_id: uuid.UUID) -> Locked:
        n = len(_LOCK_RUN_FIELDS)
        run = Run(tenant_id=tenant.pk, uuid=run_id,
                  **dict(zip(_LOCK_RUN_FIELDS, row[:n], strict=True)))
        locked = cls(run, *row[n:])
        if isinstance(locked.usage, str):  # Django reads jsonb as text
            locked.usage = json.loads(locked.usage)
        if isinstance(locked.counts, str):
            locked.counts = json.loads(locked.counts)
        return locked

    def fence_refuses(self, token: int | None) -> bool:
        """Whether ``token`` is refused by the run's fence (``policy.fence_refuses``)."""
        run = self.run
        live = policy.lease_live(run.lease_owner, run.lease_expires_at, self.now)
        return policy.fence_refuses(token, run.fencing_token, live)


def _update(cursor, *, actor, tenant, envelope, expected_revision, fencing_token, cls,
            phase_label, ciphertext, size, screened):
    """``checkpoint_update``'s statements on ``cursor`` (in pipeline mode, no ORM call
    but ``effect_labels``' read): the lock (round trip 1), then ``update_locked``.
    Returns the ``Checkpoint``, a refusal or ``FALLBACK``."""
    cursor.execute(_sql().lock, _lock_params(tenant, envelope.checkpoint_id, envelope.run_id))
    row = cursor.fetchone()
    if row is None:
        return FALLBACK
    return update_locked(cursor, Locked.of(row, tenant, envelope.run_id), actor=actor,
                         tenant=tenant, envelope=envelope,
                         expected_revision=expected_revision, fencing_token=fencing_token,
                         cls=cls, phase_label=phase_label, ciphertext=ciphertext, size=size,
                         screened=screened)


def update_locked(cursor, locked: Locked, *, actor, tenant, envelope, expected_revision,
                  fencing_token, cls, phase_label, ciphertext, size, screened):
    """The rest of ``checkpoint_update`` once its lock statement was read (``locked``),
    on ``cursor`` in a ``sql.WriteTransaction`` or pipeline: the checks in the ORM
    path's order, then the write (or the refusal's record) sent, its result coming with
    ``COMMIT``. Also the LangGraph put's (``interop.langgraph.put``), which reads the
    lock itself with its own facts in the same round trip. Returns the ``Checkpoint``,
    the ``StaleRevision`` or ``UsageDecreased`` to raise once committed, or
    ``FALLBACK`` (nothing sent: roll back, the ORM path decides). Raises ``Fenced`` and
    ``SecretDetected`` as ``checkpoint_update``."""
    # Long on purpose: one transaction of two round trips whose statements share the
    # row read under the lock; _orm_write above mirrors it step by step.
    stmts = _sql()
    checkpoint_id = envelope.checkpoint_id
    # The run as stored (read under its lock), for the fence and a refusal's state.
    stored_run = locked.run
    run_pk, now, checkpoint_pk = stored_run.pk, locked.now, locked.checkpoint_pk
    stored_revision, stored_usage = locked.revision, locked.usage
    counts, open_retry = locked.counts, locked.open_retry
    if (checkpoint_pk is None or locked.checkpoint_run != run_pk
            or locked.kind != envelope.kind or stored_run.payloads_deleted_at is not None):
        # A run whose payloads a purge deleted: the ORM path refuses it (RunDeleted).
        return FALLBACK
    # In the ORM path's order: the tenant's data policy (read with the lock) decides what
    # screening found (422 before any write: the transaction rolls back), then the fence.
    screened = (screened or Screened()).decided(
        locked.secrets_policy or SecretsPolicy.WARN, locked.payload_flag_bytes)
    if locked.fence_refuses(fencing_token):
        raise Fenced(stored_run.fencing_token, run_pk=run_pk)
    refusal = (StaleRevision(stored_revision) if stored_revision != expected_revision
               else _usage_refusal(cls, stored_usage, stored_revision, expected_revision))
    if refusal is not None:
        return _refuse(cursor, refusal, actor=actor, tenant=tenant, envelope=envelope,
                       expected_revision=expected_revision, run=stored_run, now=now,
                       actual=stored_revision, counts=counts, open_retry=open_retry)

    written = {"revision": envelope.revision,
               **_checkpoint_fields(envelope, cls, phase_label, ciphertext, size, now,
                                    screened),
               "usage": _kept_usage(cls, stored_usage)}
    # The run as this write leaves it, for the one RunFacts builder: the new checkpoint's
    # phase, written now, open again (a write reopens a closed run, DESIGN.md 4).
    written_run = Run(phase_class=cls.phase.phase_class, phase_label=phase_label,
                      last_write_at=now, lease_owner=stored_run.lease_owner,
                      lease_expires_at=stored_run.lease_expires_at,
                      unacknowledged_conflicts=stored_run.unacknowledged_conflicts,
                      closed_at=None)
    state, reason = _state(tenant, written_run, run_pk, now, counts, open_retry)
    run_values = {
        "latest_checkpoint": checkpoint_pk, **_run_fields(envelope, cls, phase_label, now),
        "updated_at": now, "recovery_state": state, "recovery_reason": reason[:256],
        "state_changed_at": (now if state != stored_run.recovery_state
                             else stored_run.state_changed_at),
    }
    event = audit.new_event(
        tenant=tenant, created_at=now, actor=actor,
        action=AuditAction.CHECKPOINT_WRITE, target_type=TargetType.CHECKPOINT,
        target_id=checkpoint_id, run_id=envelope.run_id,
        **_write_audit(envelope, cls, phase_label, expected_revision,
                       reopened=stored_run.closed_at is not None, screened=screened))
    params = {f"run_{k}": v for k, v in run_values.items()}
    params.update(_write_event_params(event), **written)
    params.update(run_pk=run_pk, tenant=tenant.pk, usage=json.dumps(written["usage"]),
                  secret_paths=json.dumps(written["secret_paths"]),
                  written_by=actor.pk if actor is not None else None,
                  checkpoint_pk=checkpoint_pk, expected=expected_revision)
    cursor.execute(stmts.write[cls.supported], params)  # its result comes with COMMIT
    subjects = subject_rows(tenant=tenant, run_pk=run_pk, payload=envelope.payload,
                            fields=locked.subject_fields)
    if subjects:  # the tenant declared subject fields that resolve
        cursor.execute(*_subjects_insert(subjects))

    checkpoint = Checkpoint(pk=checkpoint_pk, tenant=tenant, run_id=run_pk, uuid=checkpoint_id,
                            **written)
    checkpoint.written_by = actor
    return checkpoint


def _write_event_params(event: AuditEvent) -> dict:
    """``sql.event_params`` of ``event`` for ``_sql``'s statements, whose event takes the
    write's ``%(tenant)s`` (one parameter fewer: ``WRITE_PARAMS_MAX``)."""
    params = _event_params(event)
    del params["ev_tenant"]
    return params


def _state(tenant, run: Run, run_pk: int, now, counts: dict, open_retry) -> tuple[str, str]:
    """The recovery state and reason of ``run`` (as a write leaves it) at ``now``, from
    the facts ``checkpoints_write_lock_v2`` read (``policy.RunFacts.of``, the one
    builder; the labels of effects in doubt read only when there are some)."""
    facts = policy.RunFacts.of(
        run, now=now, ambiguity_threshold_s=tenant.ambiguity_threshold_s,
        effect_states=counts, open_retry_state=open_retry or "",
        effect_labels=(effect_labels(tenant.pk, run_pk)
                       if any(counts.get(s) for s in EffectState.DOUBTFUL) else {}))
    return policy.recovery_state(facts)


def _refuse(cursor, refusal: StaleRevision | UsageDecreased, *, actor, tenant, envelope,
            expected_revision: int, run: Run, now, actual: int, counts: dict,
            open_retry) -> StaleRevision | UsageDecreased:
    """An update refused in its second round trip, a stale revision or a usage counter
    going back (issue 22: "contended at least 0.15x, every refusal recorded"): what
    ``_keep_conflict`` does through the ORM, in one statement sent with ``COMMIT``: the
    conflict row (``runs.conflict_parts``, the one builder), the run's count of
    unacknowledged conflicts and the recovery state that count gives (not reopened: a
    refusal is no write), and the audit event. ``run`` is the run as read under its
    lock. Returns ``refusal``, to raise once its record committed."""
    reason = (ConflictReason.USAGE_DECREASED if isinstance(refusal, UsageDecreased)
              else None)  # None: stale_revision (conflict_parts)
    conflict, event = conflict_parts(
        tenant=tenant, run=run, actor=actor, target_type=TargetType.CHECKPOINT,
        target_id=envelope.checkpoint_id, expected=expected_revision, actual=actual,
        attempted=envelope.revision, refused=dumps(envelope.as_json()), now=now,
        reason=reason)
    old_state = run.recovery_state
    run.unacknowledged_conflicts += 1
    state, reason = _state(tenant, run, run.pk, now, counts, open_retry)
    params = {f"cf_{f.attname}": f.get_db_prep_save(f.pre_save(conflict, True), connection)
              for f in Conflict._meta.concrete_fields if not f.primary_key}
    params.update({"run_unacknowledged_conflicts": run.unacknowledged_conflicts,
                   "run_recovery_state": state, "run_recovery_reason": reason[:256],
                   "run_updated_at": now,
                   "run_state_changed_at": now if state != old_state else run.state_changed_at},
                  **_write_event_params(audit.new_event(created_at=now, **event)))
    params.update(tenant=tenant.pk, run_pk=run.pk)
    cursor.execute(_sql().refuse, params)  # its result comes with COMMIT
    return refusal


def _subjects_insert(rows: list[RunSubject]) -> tuple[str, list]:
    """The ``INSERT … ON CONFLICT DO NOTHING`` of ``rows`` (``lifecycle.subject_rows``),
    what ``lifecycle.subjects_index`` does through the ORM."""
    cols = ("tenant", "run", "field", "digest")
    sql_text = (f"INSERT INTO {_table(RunSubject)} ({', '.join(_col(RunSubject, c) for c in cols)}) "
                f"VALUES {', '.join(['(%s, %s, %s, %s)'] * len(rows))} ON CONFLICT DO NOTHING")
    return sql_text, [v for r in rows for v in (r.tenant_id, r.run_id, r.field, r.digest)]
