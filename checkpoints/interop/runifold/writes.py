"""The writes of one checked runifold import batch (issue 10, item 4;
``docs/runifold.md``): the runs it names, created race-safe and locked in id order, the
checkpoint and effect rows and revisions, the subject index of the written payloads
(``lifecycle.subject_rows``, as an API write), the runs' recovery state
(``runs.run_save_many``) and one audit event per written line.
"""

from __future__ import annotations

import uuid
from typing import Any

from ... import locks, policy, sql
from ...jsonparse import content_sha256
from ...models import (
    Checkpoint,
    CheckpointRevision,
    Effect,
    EffectRevision,
    Run,
    RunSubject,
    Tenant,
)
from ...services.common import _actor_name
from ...services.lifecycle import policy_for, subject_rows
from ...services.runs import run_save_many
from ...vocab import AuditAction, EffectSource, TargetType
from .lines import STARTED, CheckpointLine

# --------------------------------------------------------------------------------------
# Writing a batch
# --------------------------------------------------------------------------------------

class _Redo(Exception):
    """The batch met a row another writer changed meanwhile: roll it back, write its
    lines again one per transaction."""


def _lock_runs(tenant: Tenant, run_ids: set) -> dict[uuid.UUID, Run]:
    if not run_ids:
        return {}
    return {run.uuid: run for run in locks.lock_runs(tenant, run_ids)}


def _run_of(line, checkpoints: dict, effects: dict) -> uuid.UUID:
    if isinstance(line, CheckpointLine):
        return checkpoints[line.envelope.checkpoint_id].run_uuid
    return effects[line.effect_id].run_uuid


def _create_runs(tenant, ops, checkpoints, effects, runs, now) -> None:
    """Create (race-safe) and lock the runs the written lines name that do not exist
    yet; ``_Redo`` if one that appeared meanwhile has had an owner or had its payloads
    deleted (the lines are then decided again, one per transaction, and refused)."""
    new = sorted({_run_of(x, checkpoints, effects) for x in ops} - set(runs))
    if not new:
        return
    Run.objects.bulk_create([Run(tenant=tenant, uuid=u, last_write_at=now) for u in new],
                            ignore_conflicts=True)
    found = _lock_runs(tenant, set(new))
    for run in found.values():
        if run.payloads_deleted_at is not None:
            raise _Redo()
        live = policy.lease_live(run.lease_owner, run.lease_expires_at, now)
        if policy.fence_refuses(None, run.fencing_token, live):
            raise _Redo()
    runs.update(found)


def _checkpoint_fields(line: CheckpointLine, actor, now) -> dict:
    """The columns a checkpoint and its revision row share, by attname."""
    env = line.envelope
    return dict(kind=env.kind, schema_version=env.schema_version,
                payload_ciphertext=line.ciphertext, payload_size=line.size,
                phase_class=line.cls.phase.phase_class, phase_label=line.phase_label,
                updated_at_ms=env.updated_at_ms, usage=line.usage, received_at=now,
                written_by_id=actor.pk if actor is not None else None,
                secret_paths=line.secret_paths, large_above=line.large_above)


def _insert_created(model, tenant: Tenant, created: list[dict], holders: dict) -> None:
    """Insert the ``created`` rows of ``model`` (``Checkpoint`` or ``Effect``) in one
    statement, then give each holder (``holders[uuid]``) its new primary key, which the
    history rows that follow refer to."""
    if not created:
        return
    sql.insert_rows(model, created)
    pks = dict(model.objects.for_tenant(tenant)
               .filter(uuid__in=[row["uuid"] for row in created]).values_list("uuid", "pk"))
    for row in created:
        holders[row["uuid"]].pk = pks[row["uuid"]]


def _write_checkpoints(actor, tenant, checkpoints: dict, runs: dict, now) -> None:
    """New checkpoints at their last revision in the batch, stored ones advanced by a
    conditional UPDATE from the revision read under the run's lock (``_Redo`` if it
    moved), and one history row per written line."""
    created = []
    for cid, cp in checkpoints.items():
        if not cp.written:
            continue
        final = cp.written[-1]
        fields = _checkpoint_fields(final, actor, now)
        if cp.start is None:
            created.append(dict(tenant_id=tenant.pk, run_id=runs[cp.run_uuid].pk, uuid=cid,
                                revision=final.envelope.revision, **fields))
        else:
            updated = (Checkpoint.objects.for_tenant(tenant)
                       .filter(pk=cp.pk, revision=cp.start)
                       .update(revision=final.envelope.revision, **fields))
            if updated != 1:
                raise _Redo()
    _insert_created(Checkpoint, tenant, created, checkpoints)
    sql.insert_rows(CheckpointRevision, [
        dict(tenant_id=tenant.pk, checkpoint_id=cp.pk, revision=line.envelope.revision,
             **_checkpoint_fields(line, actor, now))
        for cp in checkpoints.values() for line in cp.written])


def _index_subjects(tenant: Tenant, checkpoints: dict, runs: dict) -> int:
    """Index every checkpoint line the batch writes by the tenant's declared subject
    fields (docs/security/erasure.md, "Subjects": "On every checkpoint write, each
    declared pointer ... adds a RunSubject row"): the rows ``lifecycle.subject_rows``
    builds for an API write of the same payload to the same run, upserted in one
    statement (already indexed ones kept, as ``lifecycle.subjects_index`` does), in the
    batch's transaction. The fields are read under the batch's write gate (shared, taken
    with its run locks), so a policy change waits for the batch or is seen by it, as an
    API write reads them with its run's lock. Returns how many rows were offered (0: no
    checkpoint written, no field declared, or none resolves). No query without a
    checkpoint line to write, else one for the policy and one for the rows."""
    written = [(runs[cp.run_uuid].pk, line)
               for cp in checkpoints.values() for line in cp.written]
    if not written:
        return 0
    fields = policy_for(tenant).subject_fields
    if not fields:
        return 0
    rows: dict[tuple, RunSubject] = {}
    for run_pk, line in written:
        for row in subject_rows(tenant=tenant, run_pk=run_pk, payload=line.envelope.payload,
                                fields=fields):
            rows.setdefault((row.run_id, row.field, row.digest), row)
    if rows:
        RunSubject.objects.bulk_create(list(rows.values()), ignore_conflicts=True)
    return len(rows)


def _write_effects(actor, tenant, effects: dict, runs: dict, now) -> None:
    """As ``_write_checkpoints``, for effects: the request, fingerprint and identity on
    creation; state, receipt and times on every write; one history row per line."""
    created = []
    for eid, effect in effects.items():
        if not effect.written:
            continue
        final = effect.written[-1]
        started = any(x.status == STARTED for x in effect.written)
        fields = dict(revision=final.revision, state=final.state,
                      receipt_ciphertext=final.receipt_ciphertext, state_changed_at=now,
                      updated_at=now, secret_paths=final.secret_paths)
        if effect.start is None:
            created.append(dict(
                tenant_id=tenant.pk, run_id=runs[effect.run_uuid].pk, uuid=eid,
                operation_key=final.operation_key, service=final.service,
                effect_class=final.effect_class, request_fingerprint=final.fingerprint,
                request_ciphertext=final.request_ciphertext, attempt=1,
                submitted_at=now if started else None, retry_authorized_by_id=None,
                created_at=now, **fields))
        else:
            if started:
                fields["submitted_at"] = now
            updated = (Effect.objects.for_tenant(tenant)
                       .filter(pk=effect.pk, revision=effect.start).update(**fields))
            if updated != 1:
                raise _Redo()
    _insert_created(Effect, tenant, created, effects)
    name = _actor_name(actor)
    sql.insert_rows(EffectRevision, [
        dict(tenant_id=tenant.pk, effect_id=effect.pk, revision=line.revision, state=line.state,
             receipt_ciphertext=line.receipt_ciphertext, attempt=effect.attempt, actor_name=name,
             source=EffectSource.IMPORT, created_at=now)
        for effect in effects.values() for line in effect.written])


def _save_runs(tenant, ops, checkpoints, effects, runs, now) -> set[uuid.UUID]:
    """Each touched run's new facts and recovery state (``runs.run_save_many``: what
    ``run_save`` does on every write, for all the batch's runs at once); returns the runs
    a write reopened (a reviewer had closed them)."""
    latest: dict[uuid.UUID, CheckpointLine | None] = {}
    for line in ops:
        run_uuid = _run_of(line, checkpoints, effects)
        if isinstance(line, CheckpointLine):
            latest[run_uuid] = line
        else:
            latest.setdefault(run_uuid, None)
    changes = []
    for run_uuid in sorted(latest):
        fields: dict[str, Any] = {"last_write_at": now}
        line = latest[run_uuid]
        if line is not None:
            env, ident = line.envelope, line.cls.identity
            fields.update(
                latest_checkpoint=Checkpoint(pk=checkpoints[env.checkpoint_id].pk),
                kind=env.kind, schema_version=env.schema_version,
                phase_class=line.cls.phase.phase_class, phase_label=line.phase_label,
                agent=ident.agent, model=ident.model, workflow=ident.workflow,
                definition_version=ident.definition_version)
        changes.append((runs[run_uuid], fields))
    reopened = run_save_many(changes, now, reopen=True)
    return {run.uuid for run, _ in changes if run.pk in reopened}


def _events(ops, checkpoints, effects, reopened: set) -> list[dict]:
    """One audit event per written line, in file order."""
    events, previous = [], {}
    for line in ops:
        if isinstance(line, CheckpointLine):
            env = line.envelope
            cp = checkpoints[env.checkpoint_id]
            before = previous.get(env.checkpoint_id, None if cp.start is None
                                  else {"revision": cp.start})
            # The payload by its hash, never a value (not even its phase label).
            after = {"revision": env.revision, "phase_class": line.cls.phase.phase_class,
                     "payload_sha256": content_sha256(env.payload_json)}
            previous[env.checkpoint_id] = {"revision": env.revision}
            target, target_type, run_uuid = env.checkpoint_id, TargetType.CHECKPOINT, cp.run_uuid
            action = AuditAction.CHECKPOINT_IMPORT
        else:
            effect = effects[line.effect_id]
            before = previous.get(line.effect_id, None if effect.start is None else
                                  {"revision": effect.start, "state": effect.start_state})
            after = {"revision": line.revision, "state": line.state,
                     "runifold_state": line.status, "operation_key": line.operation_key,
                     "service": line.service}
            if line.receipt_sha256:
                after["receipt_sha256"] = line.receipt_sha256
            previous[line.effect_id] = {"revision": line.revision, "state": line.state}
            target, target_type, run_uuid = line.effect_id, TargetType.EFFECT, effect.run_uuid
            action = AuditAction.EFFECT_IMPORT
        if run_uuid in reopened:
            after["reopened"] = True
            reopened.discard(run_uuid)
        events.append(dict(action=action, target_type=target_type, target_id=target,
                           run_id=run_uuid, before=before, after=after))
    return events
