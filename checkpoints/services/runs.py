"""Runs: the run lock, fencing, recovery facts and state, conflict records and resume
decisions (CONTRACT.md 3, DESIGN.md 4). Leases, taken and ended: ``services.leases``.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, IntegerField, Value, Window
from django.db.models.functions import RowNumber

from .. import crypto, locks, policy, roles
from ..audit import (
    audit_record,
)
from ..dbclock import NOW, db_now
from ..exceptions import (
    Fenced,
    NotFound,
    OwnerLive,
    RunDeleted,
)
from ..metrics import count_resume_decision
from ..models import (
    Checkpoint,
    Conflict,
    Effect,
    ResumeDecision,
    RetryRequest,
    Run,
    Tenant,
    Tombstone,
)
from ..permissions import require
from ..vocab import (
    AuditAction,
    ConflictReason,
    EffectState,
    ResumeReason,
    RetryOutcome,
    RetryState,
    TargetType,
)
from .common import _actor_name

# --------------------------------------------------------------------------------------
# Runs: locking, fencing, recovery state
# --------------------------------------------------------------------------------------

def _lock_run(tenant: Tenant, run_id: uuid.UUID, *, create: bool,
              data_policy: bool = False, deleted_ok: bool = False) -> Run | None:
    """The run row, locked in the store's lock order (``locks.lock_run``: the tenant's
    audit head, then the run); created (race-safe) when ``create``.

    The same query reads the database's clock into ``run.db_now`` (``dbclock``): every
    time this write stores or compares is that one, never the process's clock.
    ``data_policy``: also read the tenant's data policy columns a checkpoint write needs
    (``locks.lock_run``: subject fields, secrets policy, size flag).

    A run whose payloads retention or erasure deleted takes no more writes: raises
    ``RunDeleted`` (409) unless ``deleted_ok`` (a deletion of what is left, which finds
    nothing). Judged under the lock, so a write racing the purge either commits first
    (and the purge sees it) or is refused; it never recreates the run's checkpoint. Nor
    its run: with ``create``, an id whose run row retention's phase 2 deleted is refused
    the same way by its tombstone (``refuse_tombstoned``) before any row is written.
    """
    run = locks.lock_run(tenant, run_id, data_policy=data_policy)  # tenant set
    if run is None and create:
        # Only here, where a row is about to be created: an existing run's writes never
        # read the tombstones (its own row says whether its payloads were deleted).
        refuse_tombstoned(tenant, run_id)
        try:
            with transaction.atomic():
                Run.objects.create(tenant=tenant, uuid=run_id, last_write_at=db_now())
        except IntegrityError:
            pass  # a concurrent writer created it first; lock theirs (judged below)
        run = locks.lock_run(tenant, run_id, data_policy=data_policy)
        if run is None:  # cannot happen: it was created, or a concurrent writer's committed
            raise Run.DoesNotExist(run_id)
    if run is not None and run.payloads_deleted_at is not None and not deleted_ok:
        raise_deleted(run)
    return run


def run_deleted(run_id: uuid.UUID, deleted_at: datetime) -> RunDeleted:
    """The ``RunDeleted`` (409 ``run_deleted``) of run ``run_id``, whose payloads were
    deleted at ``deleted_at``: the one wording of the refusal, for a run row that says so
    (``raise_deleted``), a run id only a tombstone remembers (``refuse_tombstoned``), and
    the runifold import's lines (``interop.runifold.imports._check_deleted``)."""
    return RunDeleted(f"run_id: the payloads of run {run_id} were deleted on "
                      f"{deleted_at.date().isoformat()} (retention or erasure; "
                      "see its tombstone); it takes no more writes, start a new run")


def raise_deleted(run: Run) -> None:
    """Raise ``RunDeleted`` for ``run``, whose payloads were deleted (its tombstone says
    when and why: docs/security/retention.md)."""
    raise run_deleted(run.uuid, run.payloads_deleted_at)


def tombstone_dates(tenant: Tenant | int, run_ids) -> dict[uuid.UUID, datetime]:
    """``{run id: deleted_at}`` of those of ``run_ids`` (UUIDs) the tenant holds a
    ``Tombstone`` for (the newest one's, should an id have several); ``{}`` without a
    query for no ids. One query on ``tombstone_run_idx`` (tenant, run_uuid).

    A tombstone outlives its run row (retention's phase 2 deletes the row, never the
    tombstone: docs/security/retention.md), so this, not the run row, is what says that
    an id was deleted once the row is gone. Only a four-eyes ``TombstonePurge`` deletes a
    tombstone; after it the id is free again."""
    ids = set(run_ids)
    if not ids:
        return {}
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return dict(Tombstone.objects.for_tenant(tenant_id).filter(run_uuid__in=ids)
                .order_by("run_uuid", "deleted_at", "id").values_list("run_uuid", "deleted_at"))


def refuse_tombstoned(tenant: Tenant, run_id: uuid.UUID) -> None:
    """Raise ``RunDeleted`` (409 ``run_deleted``, ``run_deleted``'s words with the
    tombstone's ``deleted_at``) if ``tenant`` holds a tombstone of ``run_id``: a run id
    retention or erasure deleted takes no more writes, before retention's phase 2 deleted
    its run row (the row refuses, ``_lock_run``) and after (this refuses). Call it only
    where a run row is about to be created, after ``locks.lock_run`` found none
    (``_lock_run(create=True)``; the runifold import decides its lines of new runs with
    ``tombstone_dates``, the same lookup).

    Why a creation racing phase 2 cannot slip between the two: phase 2
    (``retention._expire_one``) deletes only a run whose ``payloads_deleted_at`` is set,
    and that column is set in the same transaction that wrote the tombstone
    (``lifecycle.purge_run_payloads``), committed before phase 2 could read it. So by the
    time a run row is gone, its tombstone is committed. The caller's lock read
    (``locks.lock_run``, ``FOR NO KEY UPDATE``) either returned the row (refused as a
    deleted run) or found it gone, having waited for phase 2's commit if phase 2 held
    it; this query is a later statement, and PostgreSQL's READ COMMITTED takes a new
    snapshot for it, which holds every transaction committed before, the tombstone's
    included. SQLite runs one write transaction at a time (``IMMEDIATE``), so there
    nothing commits between the two reads. (``tests/lifecycle/test_retention_races.py``
    races a checkpoint create against phase 2's delete on PostgreSQL.)"""
    deleted_at = tombstone_dates(tenant, [run_id]).get(run_id)
    if deleted_at is not None:
        raise run_deleted(run_id, deleted_at)


def _drop_if_empty(run: Run) -> None:
    """Delete a run that owns nothing (made by a writer that then lost a create race)."""
    if not (Checkpoint.objects.for_tenant(run.tenant_id).filter(run=run).exists()
            or Effect.objects.for_tenant(run.tenant_id).filter(run=run).exists()
            or Conflict.objects.for_tenant(run.tenant_id).filter(run=run).exists()
            or RetryRequest.objects.for_tenant(run.tenant_id).filter(run=run).exists()):
        Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).delete()


def _check_fence(run: Run, token: int | None, now: datetime) -> None:
    """Raise ``Fenced`` if ``policy.fence_refuses`` the write's ``token`` on ``run``
    (CONTRACT.md 3), judged at the database time ``now``."""
    live = policy.lease_live(run.lease_owner, run.lease_expires_at, now)
    if policy.fence_refuses(token, run.fencing_token, live):
        raise Fenced(run.fencing_token, run_pk=run.pk)


def _record_fenced(exc: Fenced, *, tenant, actor, target_type: str, target_id, expected,
                   attempted: int, token: int | None, refused: str) -> None:
    """Keep a fenced write as a conflict of the leased run, in its own transaction (the
    write's transaction has rolled back), so a zombie owner shows in the inbox."""
    with transaction.atomic():
        run = locks.lock_run_pk(tenant.pk, exc.run_pk)
        if run is None:  # the run was new in the rolled-back write: nothing to attach to
            return
        model = Checkpoint if target_type == TargetType.CHECKPOINT else Effect
        actual = (model.objects.for_tenant(tenant).filter(uuid=target_id)
                  .values_list("revision", flat=True).first())
        _record_conflict(tenant=tenant, run=run, actor=actor, target_type=target_type,
                         target_id=target_id, expected=expected, actual=actual,
                         attempted=attempted, refused=refused, reason=ConflictReason.FENCED,
                         token_sent=token)


def _now_for(run: Run) -> datetime:
    """The database time read with the run's row (``_lock_run``), else a fresh one."""
    return getattr(run, "db_now", None) or db_now()


def effect_labels(tenant_id: int, run_pk: int) -> dict[str, list[str]]:
    """State -> up to three ``"service operation_key"`` labels of the run's oldest effects
    in doubt (``EffectState.DOUBTFUL``, not covered by a consumed retry), so a recovery
    reason can say which side effect it means. One query."""
    return _labels(
        Effect.objects.for_tenant(tenant_id).filter(run_id=run_pk, state__in=EffectState.DOUBTFUL,
                                                    retry_authorized_by__isnull=True)
        .order_by("created_at", "id").values_list("state", "service", "operation_key")[:20])


def effect_label(service: str, key: str) -> str:
    """How a recovery reason names an effect: ``"service operation_key"``, a key longer
    than 80 characters cut to 79 and ``…``."""
    return f"{service} {key if len(key) <= 80 else key[:79] + '…'}"


def _labels(rows) -> dict[str, list[str]]:
    """``effect_labels`` of one run's first 20 doubtful ``(state, service, key)`` rows."""
    labels: dict[str, list[str]] = {}
    for state, service, key in rows:
        group = labels.setdefault(state, [])
        if len(group) < 3:
            group.append(effect_label(service, key))
    return labels


def run_facts(run: Run, now: datetime | None = None) -> policy.RunFacts:
    """Read the facts the policy needs for ``run`` (call under the run's lock to act on
    them). ``now`` defaults to the database time read with the run (``dbclock``)."""
    now = now or _now_for(run)
    # One round trip: the effect counts per state, and the open retry request (n = -1).
    rows = (
        Effect.objects.for_tenant(run.tenant_id).filter(run=run)
        .exclude(state__in=EffectState.NEEDS_RETRY, retry_authorized_by__isnull=False)
        .order_by().values_list("state").annotate(n=Count("pk")).values_list("state", "n")
        .union(RetryRequest.objects.for_tenant(run.tenant_id)
               .filter(run=run, state__in=RetryState.OPEN).order_by()
               .annotate(n=Value(-1, output_field=IntegerField())).values_list("state", "n"),
               all=True)
    )
    counts, open_retry = {}, None
    for state, n in rows:
        if n == -1:
            open_retry = state
        else:
            counts[state] = n
    labels = (effect_labels(run.tenant_id, run.pk)
              if any(counts.get(state) for state in EffectState.DOUBTFUL) else {})
    return policy.RunFacts.of(run, now=now, ambiguity_threshold_s=run.tenant.ambiguity_threshold_s,
                              effect_states=counts, open_retry_state=open_retry or "",
                              effect_labels=labels)


def run_facts_many(runs: list[Run], now: datetime) -> dict[int, policy.RunFacts]:
    """``run_facts`` of many runs of one tenant, ``{run pk: facts}``, in three queries
    instead of two or three per run (a service that writes many runs in one transaction:
    the runifold import, issue 10): the effect counts per run and state, the open retry
    requests, and the labels of the doubtful effects (the first 20 per run, as
    ``effect_labels``). The same facts as ``run_facts`` (``tests/test_runifold_io.py``
    compares them). Call under the runs' locks to act on them."""
    if not runs:
        return {}
    tenant_id = runs[0].tenant_id
    if any(run.tenant_id != tenant_id for run in runs):
        raise ValueError("run_facts_many: runs of one tenant")
    pks = [run.pk for run in runs]
    counts: dict[int, dict[str, int]] = {pk: {} for pk in pks}
    for run_pk, state, n in (
        Effect.objects.for_tenant(tenant_id).filter(run_id__in=pks)
        .exclude(state__in=EffectState.NEEDS_RETRY, retry_authorized_by__isnull=False)
        .order_by().values_list("run_id", "state").annotate(n=Count("pk"))
        .values_list("run_id", "state", "n")
    ):
        counts[run_pk][state] = n
    open_retry = dict(RetryRequest.objects.for_tenant(tenant_id)
                      .filter(run_id__in=pks, state__in=RetryState.OPEN)
                      .values_list("run_id", "state"))
    doubtful = [pk for pk in pks if any(counts[pk].get(s) for s in EffectState.DOUBTFUL)]
    rows: dict[int, list] = {}
    if doubtful:
        for run_pk, state, service, key in (
            Effect.objects.for_tenant(tenant_id)
            .filter(run_id__in=doubtful, state__in=EffectState.DOUBTFUL,
                    retry_authorized_by__isnull=True)
            .annotate(place=Window(RowNumber(), partition_by=[F("run_id")],
                                   order_by=[F("created_at").asc(), F("id").asc()]))
            .filter(place__lte=20).order_by("run_id", "created_at", "id")
            .values_list("run_id", "state", "service", "operation_key")
        ):
            rows.setdefault(run_pk, []).append((state, service, key))
    out = {}
    for run in runs:
        out[run.pk] = policy.RunFacts.of(
            run, now=now, ambiguity_threshold_s=run.tenant.ambiguity_threshold_s,
            effect_states=counts[run.pk], open_retry_state=open_retry.get(run.pk) or "",
            effect_labels=_labels(rows.get(run.pk, [])))
    return out


def require_owner_gone(run: Run, facts: policy.RunFacts, doing: str) -> None:
    """Refuse ``doing`` while the run's owner is live (CONTRACT.md 3 ``owner_live``): the
    sweep's rule (``RunFacts.owner_gone``) on the database clock, under the run's lock.
    Reconciling, declaring an outcome unknown or retrying over a live owner could call a
    call still on the wire "not executed", or fence a worker in the middle of it.
    Raises ``OwnerLive`` (409) with when the owner will count as gone."""
    if facts.owner_gone:
        return
    gone_at = facts.owner_gone_at
    owner = run.lease_owner or "(no lease; it wrote recently)"
    # A lease a reviewer can end: say how (the stop-38 newcomer's 409 gave no way out).
    way_out = ("; if you know it is gone, end its lease (POST …/runs/{id}/lease/revoke, "
               "or End the lease on the run page)"
               if run.lease_owner and facts.lease_live else "")
    raise OwnerLive(
        f"run: its owner {owner} is live until "
        f"{gone_at.isoformat() if gone_at else 'now'}; {doing} only after it is gone"
        f"{way_out}",
        gone_at.isoformat() if gone_at else None)


def run_refresh_state(run: Run, now: datetime | None = None) -> str:
    """Recompute and save the run's recovery state (caller holds the run's lock); ``now``
    defaults to the database time read with the run."""
    now = now or _now_for(run)
    state, reason = policy.recovery_state(run_facts(run, now))
    fields = {"recovery_state": state, "recovery_reason": reason[:256]}
    if state != run.recovery_state:
        fields["state_changed_at"] = now
    for key, value in fields.items():
        setattr(run, key, value)
    Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(**fields)
    return state


def run_save(run: Run, now: datetime, *, reopen: bool = False, **fields) -> bool:
    """Write ``fields`` to the run (caller holds its lock), with ``reopen`` clear a
    reviewer's ``closed`` mark (any new write by the runtime reopens the run, DESIGN.md 4),
    and store the recovery state the run now has: one ``UPDATE``. ``now`` is the
    database time read with the run. Returns whether the run was reopened."""
    reopened = reopen and run.closed_at is not None
    if reopened:
        fields.update(closed_at=None, closed_by=None, closed_reason="")
    for key, value in fields.items():
        setattr(run, key, value)
    state, reason = policy.recovery_state(run_facts(run, now))
    fields.update(recovery_state=state, recovery_reason=reason[:256], updated_at=now)
    if state != run.recovery_state:
        fields["state_changed_at"] = now
    for key, value in fields.items():
        setattr(run, key, value)
    Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(**fields)
    return reopened


def run_save_many(changes: list[tuple[Run, dict]], now: datetime, *,
                  reopen: bool = False) -> set[int]:
    """``run_save`` for many runs of one tenant (caller holds their locks): each run's
    ``fields``, then the recovery state the run now has (``run_facts_many``, so three
    queries for all), in one ``UPDATE`` per set of changed columns. Returns the pks of
    the runs that were
    reopened. For a service that writes many runs in one transaction (the runifold
    import, issue 10)."""
    reopened = set()
    for run, fields in changes:
        if reopen and run.closed_at is not None:
            fields.update(closed_at=None, closed_by=None, closed_reason="")
            reopened.add(run.pk)
        for key, value in fields.items():
            setattr(run, key, value)
    facts = run_facts_many([run for run, _ in changes], now)
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run, fields in changes:
        state, reason = policy.recovery_state(facts[run.pk])
        fields.update(recovery_state=state, recovery_reason=reason[:256], updated_at=now)
        if state != run.recovery_state:
            fields["state_changed_at"] = now
        for key, value in fields.items():
            setattr(run, key, value)
        groups.setdefault(tuple(sorted(fields)), []).append(run)
    # One UPDATE statement per set of changed columns, sent for all its runs at once
    # (``executemany``: psycopg pipelines it), each run with its own values.
    q = connection.ops.quote_name
    meta = Run._meta
    with connection.cursor() as cursor:
        for names, rows in groups.items():
            fields = [meta.get_field(name) for name in names]
            sql = (f"UPDATE {q(meta.db_table)} SET "
                   + ", ".join(f"{q(f.column)} = %s" for f in fields)
                   + f" WHERE {q(meta.pk.column)} = %s"
                   f" AND {q(meta.get_field('tenant').column)} = %s")
            cursor.executemany(sql, [
                [f.get_db_prep_save(getattr(run, f.attname), connection) for f in fields]
                + [run.pk, run.tenant_id] for run in rows])
    return reopened


def conflict_parts(*, tenant, run: Run, actor, target_type: str, target_id, expected,
                   actual: int | None, attempted: int | None, refused: str, now: datetime,
                   reason: str | None = None,
                   token_sent: int | None = None) -> tuple[Conflict, dict]:
    """The unsaved ``Conflict`` row of a refused write and the keyword arguments of its
    audit event (``audit_record``/``audit.new_event``): the one builder of both, for
    ``_record_conflict`` (the ORM) and the SQL write path (``services.writepath``), so
    the two record a refusal alike. ``run``: the run (its ``pk``, ``uuid`` and
    ``fencing_token`` are read); ``now``: the database time read with its lock;
    ``refused``: the refused body's JSON text (stored encrypted; "" for none)."""
    if reason is None:
        reason = ConflictReason.ID_EXISTS if expected is None else ConflictReason.STALE_REVISION
    conflict = Conflict(
        tenant=tenant, run_id=run.pk, target_type=target_type, target_uuid=target_id,
        reason=reason, expected_revision=expected, actual_revision=actual,
        attempted_revision=attempted, fencing_token_sent=token_sent,
        fencing_token_current=run.fencing_token if reason == ConflictReason.FENCED else None,
        writer=actor, writer_name=_actor_name(actor),
        refused_ciphertext=crypto.encrypt_text(refused, tenant=tenant) if refused else "",
        created_at=now,
    )
    event = {"tenant": tenant, "actor": actor, "action": AuditAction.CONFLICT[target_type],
             "target_type": target_type, "target_id": target_id, "run_id": run.uuid,
             "before": {"current_revision": actual},
             "after": {"reason": reason, "expected_revision": expected,
                       "attempted_revision": attempted, "fencing_token": token_sent}}
    return conflict, event


def _record_conflict(*, tenant, run: Run, actor, target_type: str, target_id, expected,
                     actual: int | None, attempted: int | None, refused: str,
                     reason: str | None = None, token_sent: int | None = None) -> None:
    """Keep a refused write (CONTRACT.md 3: "refused writes are conflicts, kept and
    shown"): the conflict row with the refused body encrypted, the run's count of
    unacknowledged conflicts and its recovery state, and one audit event, in the caller's
    transaction, which holds ``run``'s lock (read with the database time)."""
    now = _now_for(run)
    conflict, event = conflict_parts(
        tenant=tenant, run=run, actor=actor, target_type=target_type, target_id=target_id,
        expected=expected, actual=actual, attempted=attempted, refused=refused, now=now,
        reason=reason, token_sent=token_sent)
    conflict.save(force_insert=True)
    # The caller holds the run's lock, so the count read with it is current.
    run_save(run, now, unacknowledged_conflicts=run.unacknowledged_conflicts + 1)
    audit_record(**event, created_at=now)  # the lock's database time, as the SQL path


# --------------------------------------------------------------------------------------
# Resume decisions (leases: ``services.leases``)
# --------------------------------------------------------------------------------------

def _resume_answer(run: Run, decision: policy.Decision, tenant: Tenant) -> dict:
    """The resume answer's dict: ``{action, reason, checkpoint_id, revision,
    fencing_token}``, plus ``detail`` (the command that migrates the run,
    ``policy.migration_required_detail``) when the reason is ``migration_required``."""
    checkpoint = run.latest_checkpoint
    answer = {
        "action": decision.action,
        "reason": decision.reason,
        "checkpoint_id": str(checkpoint.uuid) if checkpoint else None,
        "revision": checkpoint.revision if checkpoint else None,
        "fencing_token": run.fencing_token,
    }
    if decision.reason == ResumeReason.MIGRATION_REQUIRED:
        answer["detail"] = policy.migration_required_detail(
            run.kind, run.schema_version, tenant=tenant.slug, run_id=str(run.uuid))
    return answer


def resume_preview(*, actor, tenant: Tenant, run_id: uuid.UUID, asked: dict[str, str]) -> dict:
    """What a restarting runtime would be told (CONTRACT.md 3, ``GET …/resume``): a
    preview that changes nothing: it consumes no approval, bumps no token, takes no lock
    and writes no audit event. An approved retry shows as ``retry``/``retry_approved``;
    only ``resume_claim`` consumes it.

    Returns ``{action, reason, checkpoint_id, revision, fencing_token}`` (the run's
    current token), plus ``detail`` for ``migration_required`` (``_resume_answer``). Raises ``NotFound`` for an unknown run, ``Forbidden`` without
    ``write_runs``.
    """
    require(actor, tenant, roles.WRITE)
    run = (Run.objects.for_tenant(tenant).annotate(db_now=NOW)
           .select_related("latest_checkpoint").filter(uuid=run_id).first())
    if run is None:
        raise NotFound("no such run")
    if run.payloads_deleted_at is not None:
        raise_deleted(run)
    run.tenant = tenant
    answer = _resume_answer(run, policy.resume_decision(run_facts(run), asked), tenant)
    count_resume_decision(tenant=tenant, action=answer["action"], mode="preview")
    return answer


def resume_claim(*, actor, tenant: Tenant, run_id: uuid.UUID, asked: dict[str, str],
                 usage: dict[str, int] | None = None) -> dict:
    """The resume decision, claimed (CONTRACT.md 3, ``POST …/resume``, writer only).

    When the answer is ``retry`` the approved retry is consumed in the same transaction:
    the request becomes ``consumed``, the fencing token is bumped and the lease dropped
    (so the old owner is fenced), the run is reopened if a reviewer had closed it, its
    ``unknown``/``not_executed`` effects are authorised to go back to ``planned``, and one
    audit event is written. Any other answer changes nothing of the run. Every claim,
    whatever its answer, leaves one ``ResumeDecision`` row (action, reason, the latest
    checkpoint's age in ms at the database time) in the same transaction, for the
    report's resume age (issue 9, item 6): a record of the runtime's question, not of a
    change, so it has no audit event of its own. ``usage``, the runtime's counters when it
    sent them, is compared with the latest checkpoint's (``policy.resume_decision``:
    ``reject``/``usage_mismatch`` unless it suits the decision; an approved retry is then
    not consumed). Returns ``{action, reason, checkpoint_id, revision, fencing_token}``,
    plus ``detail`` for ``migration_required`` (``_resume_answer``). Raises ``NotFound`` for an unknown run.
    """
    require(actor, tenant, roles.WRITE)
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("no such run")
        now = run.db_now
        facts = run_facts(run, now)
        if usage is not None and run.latest_checkpoint is not None:
            facts = dataclasses.replace(facts, usage=run.latest_checkpoint.usage)
        decision = policy.resume_decision(facts, asked, usage)
        if decision.consume_retry:
            retry = locks.lock_rows(RetryRequest.objects.for_tenant(run.tenant_id)).get(
                run=run, state=RetryState.APPROVED)
            run.fencing_token += 1
            run.lease_owner = ""
            run.lease_expires_at = None
            # The retrying runtime gets a fresh ambiguity window to lease and write in,
            # so the sweep does not call the run abandoned the moment it is handed over.
            run.last_write_at = now
            run.save(update_fields=["fencing_token", "lease_owner", "lease_expires_at",
                                    "last_write_at", "updated_at"])
            burnt = policy.usage_burnt(facts.usage, usage) if usage is not None else {}
            RetryRequest.objects.for_tenant(retry.tenant_id).filter(pk=retry.pk).update(
                state=RetryState.CONSUMED, consumed_at=now, consumed_fencing_token=run.fencing_token,
                usage_burnt=burnt)
            # Only what the approver accepted: the effects its preview showed as sent again.
            # One that became unknown/not_executed after the approval (a zombie owner sent
            # it meanwhile) waits for a new retry whose preview names it: no duplicate that
            # nobody accepted. (An approval recorded without a preview authorises all.)
            again = (Effect.objects.for_tenant(run.tenant_id)
                     .filter(run=run, state__in=EffectState.NEEDS_RETRY))
            if retry.approved_preview is not None:
                again = again.filter(uuid__in=[
                    row["effect_id"] for row in retry.approved_preview
                    if row.get("outcome") in RetryOutcome.SENT_AGAIN])
            again.update(retry_authorized_by=retry)
            run_refresh_state(run, now)
            audit_record(tenant=tenant, actor=actor, action=AuditAction.RETRY_CONSUME,
                         target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                         before={"state": RetryState.APPROVED},
                         after={"state": RetryState.CONSUMED, "fencing_token": run.fencing_token,
                                **({"usage_burnt": burnt} if burnt else {})}, created_at=run.db_now)
        answer = _resume_answer(run, decision, tenant)
        _record_resume(run, decision, now)
    # Counted once the claim committed (metrics.RESUME_DECISIONS); a failed one is not.
    count_resume_decision(tenant=tenant, action=answer["action"], mode="claim")
    return answer


def _record_resume(run: Run, decision: policy.Decision, now: datetime) -> None:
    """The ``ResumeDecision`` row of one claim (caller's transaction; ``now`` is the
    database time read with the run's lock): ``checkpoint_age_ms`` is ``now`` minus the
    latest checkpoint's ``received_at`` (null without a checkpoint, never negative)."""
    checkpoint = run.latest_checkpoint
    age_ms = None
    if checkpoint is not None:
        age_ms = max(0, int((now - checkpoint.received_at).total_seconds() * 1000))
    ResumeDecision.objects.create(tenant_id=run.tenant_id, run=run, action=decision.action,
                                  reason=decision.reason, checkpoint_age_ms=age_ms, at=now)


