"""``runifold_import``: a runifold JSON Lines file into one tenant (issue 10, item 4;
``docs/runifold.md``, "Import"), in batches, each in one transaction: what is stored is
read under the runs' locks, each line is decided against it (created, advanced by the
exact next revision, skipped when identical, else an error), and the batch is written
(``writes``); a batch the database refuses is written again one line per transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from ... import crypto, policy, roles, services
from ...audit import audit_record_many
from ...dbclock import db_now
from ...exceptions import InvalidPayload, RunDeleted
from ...jsonparse import dumps, loads_any
from ...models import Checkpoint, CheckpointRevision, Effect, EffectRevision, Tenant
from ...permissions import require
from ...services.runs import raise_deleted, run_deleted, tombstone_dates
from .lines import (
    DEFAULT_BATCH,
    IMPORT_MAY_MOVE,
    MOVES,
    CheckpointLine,
    EffectLine,
    LineError,
    RawLine,
    _max_line_bytes,
    parse_line,
    runifold_status,
    status_out,
)
from .writes import (
    _create_runs,
    _events,
    _index_subjects,
    _lock_runs,
    _Redo,
    _save_runs,
    _write_checkpoints,
    _write_effects,
)

# --------------------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------------------

@dataclass
class ImportReport:
    """What an import did: lines ``imported`` (written), ``skipped`` (already stored,
    identical), ``failed`` (each reported once through ``on_error``); ``lines`` is how
    many non-blank lines were read."""

    lines: int = 0
    imported: int = 0
    skipped: int = 0
    failed: int = 0


@dataclass
class _Checkpoint:
    """A checkpoint as one batch sees it: stored (``pk``) or created by the batch."""

    pk: int | None
    run_uuid: uuid.UUID
    kind: str
    revision: int
    start: int | None  # the stored revision before the batch; None: new in this batch
    ciphertext: str = ""  # of the stored current revision (not decrypted unless needed)
    stored: tuple | None = None  # content of the stored current revision (once decrypted)
    meta: tuple = ()  # stored (kind, schema_version, updated_at_ms) of the current revision
    usage: dict = field(default_factory=dict)  # usage counters of the current revision
    written: list[CheckpointLine] = field(default_factory=list)


@dataclass
class _Effect:
    pk: int | None
    run_uuid: uuid.UUID
    revision: int
    state: str
    start: int | None
    start_state: str = ""
    receipt_ciphertext: str = ""
    request_ciphertext: str = ""
    request_json: str | None = None  # decrypted lazily
    attempt: int = 1
    written: list[EffectLine] = field(default_factory=list)


def runifold_import(*, actor, tenant: Tenant, lines: Iterable[RawLine],
                    batch_size: int = DEFAULT_BATCH,
                    on_error: Callable[[int, str], None] | None = None,
                    on_progress: Callable[[int], None] | None = None) -> ImportReport:
    """Import a runifold JSON Lines file into ``tenant`` (issue 10, item 4; module doc
    and ``docs/runifold.md``). ``lines`` comes from ``jsonl_lines``; it is read once,
    ``batch_size`` lines at a time (1..10000).

    ``actor`` needs ``write_runs`` in the tenant, or is ``None`` for the operator's
    command line (audited as ``system``). Each bad line is reported once, as
    ``on_error(line number, "field: rule")``, and left out; the others are written.
    ``on_progress(bytes)`` is called after each batch with the bytes it read. Returns the
    counts. Raises ``NotFound``/``Forbidden`` for an actor without the right,
    ``InvalidPayload`` for a bad ``batch_size``; a database outage is raised as is (the
    batches before it are committed; importing the file again skips them).
    """
    if actor is not None:
        require(actor, tenant, roles.WRITE)
    if type(batch_size) is not int or not 1 <= batch_size <= 10_000:
        raise InvalidPayload("batch_size: must be an integer in 1..10000")
    report = ImportReport()
    batch: list[CheckpointLine | EffectLine] = []
    errors: list[tuple[int, str]] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if batch:
            _import_lines(actor, tenant, batch, report, errors)
        for number, detail in sorted(errors):
            report.failed += 1
            if on_error is not None:
                on_error(number, detail)
        if on_progress is not None and size:
            on_progress(size)
        batch.clear()
        errors.clear()
        size = 0

    # The tenant's data policy, read once per file: each line is screened as an API
    # write is (a credential refused or flagged by path).
    data_policy = services.policy_for(tenant)
    for raw in lines:
        size += raw.size
        try:
            if raw.data is None:
                raise LineError(f"record: longer than {_max_line_bytes()} bytes "
                                "(RECOVERY_MAX_BODY_BYTES)")
            parsed = parse_line(raw.data, raw.number, tenant=tenant, policy=data_policy)
        except LineError as exc:
            report.lines += 1
            errors.append((raw.number, exc.detail))
            parsed = None
        if parsed is not None:
            report.lines += 1
            batch.append(parsed)
        if len(batch) >= batch_size or len(errors) >= batch_size:
            flush()
    flush()
    return report


def _import_lines(actor, tenant, batch, report: ImportReport, errors: list) -> None:
    """Write ``batch`` in one transaction; if the database refuses it, write its lines
    again one per transaction, so that each refusal is its own line's error."""
    try:
        imported, skipped, bad = _import_batch(actor, tenant, batch)
    except (IntegrityError, _Redo):
        if len(batch) == 1:
            errors.append((batch[0].number, "id: another writer wrote this id or key while "
                                            "the import ran; import the file again to "
                                            "compare"))
            return
        for line in batch:
            _import_lines(actor, tenant, [line], report, errors)
        return
    report.imported += imported
    report.skipped += skipped
    errors.extend(bad)


def _import_batch(actor, tenant: Tenant, batch) -> tuple[int, int, list[tuple[int, str]]]:
    """One transaction for ``batch`` (module doc): returns (written, skipped, errors).
    Raises ``IntegrityError``/``_Redo`` when another writer got in the way (rolled
    back)."""
    cp_lines = [x for x in batch if isinstance(x, CheckpointLine)]
    ef_lines = [x for x in batch if isinstance(x, EffectLine)]
    with transaction.atomic():
        # 1. Which runs the batch may touch. A checkpoint's or an effect's run never
        # changes, so this is read before any lock.
        cp_ids = {x.envelope.checkpoint_id for x in cp_lines} | {
            x.execution_id for x in ef_lines if x.execution_id is not None}
        ef_ids = {x.effect_id for x in ef_lines}
        cp_runs = dict(Checkpoint.objects.for_tenant(tenant).filter(uuid__in=cp_ids)
                       .values_list("uuid", "run__uuid")) if cp_ids else {}
        ef_runs = dict(Effect.objects.for_tenant(tenant).filter(uuid__in=ef_ids)
                       .values_list("uuid", "run__uuid")) if ef_ids else {}
        candidates = ({x.envelope.run_id for x in cp_lines} | set(cp_runs.values())
                      | set(ef_runs.values()) | {x.run_id for x in ef_lines if x.run_id})
        # 2. Lock them (the store's lock order, ``locks.lock_runs``: the tenant's audit
        # head, then the runs in ascending id),
        # then read what the batch needs under the locks.
        runs = _lock_runs(tenant, candidates)
        # The ids of the runs the batch would create whose run row retention deleted
        # (phase 2) but whose tombstone remains: their lines are refused as a deleted
        # run's (``_check_deleted``). Read only for ids with no run row (an import of
        # stored runs reads no tombstone). A tombstone cannot appear for such an id
        # before the batch commits without its run row appearing too (a run is created,
        # ended and erased meanwhile): ``_create_runs`` then finds that row and redoes
        # the batch line by line; phase 2 deletes a row only days after its run ended.
        gone = tombstone_dates(tenant, candidates - runs.keys())
        # The database time once the locks are taken (after any wait for them), for the
        # rows and the audit events alike, as a run's other writes (``dbclock.LOCKED_NOW``).
        now = db_now()
        checkpoints = _stored_checkpoints(tenant, cp_ids)
        effects = _stored_effects(tenant, ef_ids)
        keys = _stored_keys(tenant, ef_lines)
        # 3. Decide each line, in file order, against the store and the lines before it.
        ops: list[CheckpointLine | EffectLine] = []
        errors: list[tuple[int, str]] = []
        skipped = 0
        for line in batch:
            try:
                if isinstance(line, CheckpointLine):
                    write = _decide_checkpoint(tenant, line, checkpoints, runs, gone, now)
                else:
                    write = _decide_effect(tenant, line, effects, checkpoints, keys, runs,
                                           gone, now)
            except LineError as exc:
                errors.append((line.number, exc.detail))
                continue
            if write:
                ops.append(line)
            else:
                skipped += 1
        if not ops:
            return 0, skipped, errors
        # 4. Write: the runs that are new, the checkpoints, their subject index, the
        # effects, their history, each touched run's state, one audit event per written
        # line.
        _create_runs(tenant, ops, checkpoints, effects, runs, now)
        _write_checkpoints(actor, tenant, checkpoints, runs, now)
        _index_subjects(tenant, checkpoints, runs)
        _write_effects(actor, tenant, effects, runs, now)
        reopened = _save_runs(tenant, ops, checkpoints, effects, runs, now)
        audit_record_many(tenant=tenant, actor=actor,
                          events=_events(ops, checkpoints, effects, reopened),
                          created_at=now)
    return len(ops), skipped, errors


def _stored_checkpoints(tenant: Tenant, ids: set) -> dict[uuid.UUID, _Checkpoint]:
    if not ids:
        return {}
    rows = (Checkpoint.objects.for_tenant(tenant).filter(uuid__in=ids)
            .values_list("pk", "uuid", "run__uuid", "kind", "revision", "payload_ciphertext",
                         "schema_version", "updated_at_ms", "usage"))
    return {cid: _Checkpoint(pk, run_uuid, kind, rev, rev, ciphertext,
                             meta=(kind, schema_version, updated_at_ms), usage=usage)
            for pk, cid, run_uuid, kind, rev, ciphertext, schema_version, updated_at_ms, usage
            in rows}


def _stored_effects(tenant: Tenant, ids: set) -> dict[uuid.UUID, _Effect]:
    if not ids:
        return {}
    rows = (Effect.objects.for_tenant(tenant).filter(uuid__in=ids)
            .values_list("pk", "uuid", "run__uuid", "revision", "state", "receipt_ciphertext",
                         "request_ciphertext", "attempt"))
    return {eid: _Effect(pk, run_uuid, rev, state, rev, state, receipt, request, attempt=attempt)
            for pk, eid, run_uuid, rev, state, receipt, request, attempt in rows}


def _stored_keys(tenant: Tenant, lines: list[EffectLine]) -> dict[tuple[str, str], uuid.UUID]:
    """(service, operation_key) -> effect id, for the keys the batch's effects use."""
    if not lines:
        return {}
    services = {x.service for x in lines}
    keys = {x.operation_key for x in lines}
    rows = (Effect.objects.for_tenant(tenant).filter(service__in=services,
                                                     operation_key__in=keys)
            .values_list("service", "operation_key", "uuid"))
    wanted = {(x.service, x.operation_key) for x in lines}
    return {(s, k): eid for s, k, eid in rows if (s, k) in wanted}


def _check_fence(runs: dict, run_uuid: uuid.UUID, now) -> None:
    """An import carries no fencing token: it may not write a run that has had an owner
    here (CONTRACT.md 3, ``policy.fence_refuses``)."""
    run = runs.get(run_uuid)
    if run is None:
        return
    live = policy.lease_live(run.lease_owner, run.lease_expires_at, now)
    if policy.fence_refuses(None, run.fencing_token, live):
        raise LineError(f"run_id: run {run_uuid} has had an owner in this store (fencing "
                        f"token {run.fencing_token}); an import carries no fencing token, "
                        f"so it does not write that run")


def _check_deleted(runs: dict, gone: dict, run_uuid: uuid.UUID | None) -> None:
    """A run whose payloads retention or erasure deleted takes no more writes
    (docs/security/retention.md, "A deleted run": "Writes are refused ... The run's
    checkpoint is never recreated"): the API's rule (``runs.raise_deleted``, the
    ``RunDeleted`` a ``PUT`` answers 409 ``run_deleted``), judged on the run read under
    the batch's lock, raised as this line's ``LineError`` with the API's detail
    (``run_id: the payloads of run ... were deleted on ...``). Nothing is compared
    against such a run: what is left of it (blanked effect records) is not a stored line.
    Once retention's phase 2 deleted the run row, its tombstone says it (``gone``:
    ``runs.tombstone_dates`` of the ids without a run row, as ``runs.refuse_tombstoned``
    for the API): the id is refused with the same words, never created again."""
    if run_uuid is None:
        return
    run = runs.get(run_uuid)
    if run is None:
        deleted_at = gone.get(run_uuid)
        if deleted_at is not None:
            raise LineError(run_deleted(run_uuid, deleted_at).detail)
        return
    if run.payloads_deleted_at is None:
        return
    try:
        raise_deleted(run)
    except RunDeleted as exc:
        raise LineError(exc.detail) from None


def _checkpoint_content(tenant: Tenant, cp: _Checkpoint, revision: int) -> tuple | None:
    """The content (``CheckpointLine.content``) of revision ``revision`` of ``cp``: one
    written earlier in the batch, the stored current one, or a stored older one
    (``None`` if the store never held it)."""
    for line in reversed(cp.written):
        if line.envelope.revision == revision:
            return line.content
    if cp.pk is None:
        return None
    if revision == cp.start:
        if cp.stored is None:
            kind, schema_version, updated_at_ms = cp.meta
            cp.stored = (cp.run_uuid, kind, schema_version, updated_at_ms,
                         crypto.decrypt_text(cp.ciphertext, tenant=tenant))
        return cp.stored
    row = (CheckpointRevision.objects.for_tenant(tenant)
           .filter(checkpoint_id=cp.pk, revision=revision)
           .values_list("kind", "schema_version", "updated_at_ms", "payload_ciphertext").first())
    if row is None:
        return None
    return (cp.run_uuid, row[0], row[1], row[2], crypto.decrypt_text(row[3], tenant=tenant))


def _is_next(what: str, revision: int, stored_revision: int, stored_content, content) -> bool:
    """Whether a line at ``revision`` of ``what`` (``"checkpoint <id>"``, ``"effect <id>"``),
    whose store holds ``stored_revision``, is the next one to write (``True``) or one
    already stored with the same content (``False``: skipped, idempotent re-import).
    ``stored_content()`` gives the stored content of ``revision`` (``None``: older than
    what is kept). Raises ``LineError`` for other content under a stored revision (a
    conflict: the stored one is kept), a revision older than what is kept, or a gap."""
    if revision <= stored_revision:
        stored = stored_content()
        if stored is None:
            raise LineError(f"revision: {revision} is older than the first revision stored "
                            f"for {what}; import its lines oldest first")
        if stored != content:
            raise LineError(f"revision: revision {revision} of {what} is stored with other "
                            f"content (a conflict: the stored revision is kept)")
        return False
    if revision != stored_revision + 1:
        raise LineError(f"revision: the store holds revision {stored_revision} of {what}; "
                        f"the next line for it must be revision {stored_revision + 1}")
    return True


def _decide_checkpoint(tenant: Tenant, line: CheckpointLine, checkpoints: dict, runs: dict,
                       gone: dict, now) -> bool:
    """Whether ``line`` is written (``True``) or already stored (``False``); raises
    ``LineError`` (also for a run whose payloads were deleted, ``_check_deleted``).
    Updates ``checkpoints`` as if it were written."""
    env = line.envelope
    _check_deleted(runs, gone, env.run_id)
    cp = checkpoints.get(env.checkpoint_id)
    if cp is not None:
        if cp.run_uuid != env.run_id:
            raise LineError(f"run_id: checkpoint {env.checkpoint_id} belongs to run "
                            f"{cp.run_uuid}; a checkpoint's run_id never changes")
        if cp.kind != env.kind:
            raise LineError(f"kind: checkpoint {env.checkpoint_id} is {cp.kind}; a "
                            f"checkpoint's kind never changes")
        if not _is_next(f"checkpoint {env.checkpoint_id}", env.revision, cp.revision,
                        lambda: _checkpoint_content(tenant, cp, env.revision), line.content):
            return False
        if line.cls.supported:  # the rule of every checkpoint write (CONTRACT.md 8)
            decrease = policy.usage_decrease(cp.usage, line.cls.usage)
            if decrease is not None:
                counter, before, sent = decrease
                raise LineError(f"usage.{counter}: {sent} is below the {before} of revision "
                                f"{cp.revision} of checkpoint {env.checkpoint_id}; usage "
                                f"counters never decrease")
    _check_fence(runs, env.run_id, now)
    if cp is None:
        cp = checkpoints[env.checkpoint_id] = _Checkpoint(None, env.run_id, env.kind,
                                                          env.revision, None)
    cp.revision = env.revision
    if line.cls.supported:
        cp.usage = line.cls.usage
    line.usage = cp.usage
    cp.written.append(line)
    return True


def _effect_request(tenant: Tenant, effect: _Effect) -> str:
    if effect.request_json is None:
        effect.request_json = (crypto.decrypt_text(effect.request_ciphertext, tenant=tenant)
                               if effect.request_ciphertext else "")
    return effect.request_json


def _effect_status(tenant: Tenant, state: str, receipt_ciphertext: str, revision: int) -> str:
    receipt = (loads_any(crypto.decrypt_text(receipt_ciphertext, tenant=tenant))
               if receipt_ciphertext else None)
    return dumps(status_out(state, receipt, revision))


def _effect_content(tenant: Tenant, effect: _Effect, revision: int) -> tuple | None:
    for line in reversed(effect.written):
        if line.revision == revision:
            return line.content
    if effect.pk is None:
        return None
    if revision == effect.start:
        state, receipt = effect.start_state, effect.receipt_ciphertext
    else:
        row = (EffectRevision.objects.for_tenant(tenant)
               .filter(effect_id=effect.pk, revision=revision)
               .values_list("state", "receipt_ciphertext").first())
        if row is None:
            return None
        state, receipt = row
    return (_effect_request(tenant, effect), _effect_status(tenant, state, receipt, revision))


def _decide_effect(tenant: Tenant, line: EffectLine, effects: dict, checkpoints: dict,
                   keys: dict, runs: dict, gone: dict, now) -> bool:
    """As ``_decide_checkpoint``, for an effect record: its run (``run_id``, else the
    checkpoint its agent key names), then create, advance (a move runifold makes, out of
    a state an import may leave), skip, or ``LineError`` (first of all for a run whose
    payloads were deleted: the stored effect's, or the one the line names)."""
    effect = effects.get(line.effect_id)
    if effect is not None:
        _check_deleted(runs, gone, effect.run_uuid)
    run_uuid = line.run_id
    if run_uuid is None and line.execution_id is not None:
        cp = checkpoints.get(line.execution_id)
        run_uuid = cp.run_uuid if cp is not None else None
    _check_deleted(runs, gone, run_uuid)
    if run_uuid is None:
        raise LineError("run_id: required: runifold keeps no run id on an effect record, and "
                        "this record's idempotency key does not start with the id of a "
                        "checkpoint known in this tenant ({execution_id}:agent:...); add "
                        "\"run_id\" to the line, or import its checkpoint first")
    if effect is not None:
        if effect.run_uuid != run_uuid:
            raise LineError(f"run_id: effect {line.effect_id} belongs to run "
                            f"{effect.run_uuid}; an effect's run never changes")
        if not _is_next(f"effect {line.effect_id}", line.revision, effect.revision,
                        lambda: _effect_content(tenant, effect, line.revision), line.content):
            return False
        if _effect_request(tenant, effect) != line.request_json:
            raise LineError(f"request: differs from the request stored for effect "
                            f"{line.effect_id}; an effect's request never changes")
        if effect.state not in IMPORT_MAY_MOVE:
            raise LineError(f"status.state: effect {line.effect_id} is {effect.state} in this "
                            f"store; an import moves an effect only out of planned, "
                            f"submitted or unresolved")
        theirs = runifold_status(effect.state, effect.revision)
        if (theirs, line.status) not in MOVES:
            raise LineError(f"status.state: runifold does not move a record from "
                            f"{theirs} to {line.status}")
    else:
        owner = keys.get((line.service, line.operation_key))
        if owner is not None and owner != line.effect_id:
            raise LineError(f"request.idempotency_key: already used by effect {owner} "
                            f"(service {line.service}); runifold keeps one record per "
                            f"capability and idempotency key")
    _check_fence(runs, run_uuid, now)
    if effect is None:
        effect = effects[line.effect_id] = _Effect(None, run_uuid, line.revision, line.state,
                                                   None)
        effect.request_json = line.request_json
        keys[(line.service, line.operation_key)] = line.effect_id
    effect.revision = line.revision
    effect.state = line.state
    effect.written.append(line)
    return True
