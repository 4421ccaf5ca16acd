"""Stored migration jobs (issue 19, item 2; CONTRACT.md 8 ``POST …/kinds/{kind}/
migrations``; docs/migrations.md), the services' side: a tenant admin's request
(``migration_job_submit``), handing a stored job to a worker (``migration_job_dispatch``)
and sending again what a lost message, a dead worker or a broker outage left behind
(``migration_jobs_redrive``, run by the sweep).

The job itself (claim, the walk of ``checkpoints_migrate`` recording each checkpoint's
item as it goes, retry, give up) is ``checkpoints.jobs.migrations``, a layer above: these
services hand it work by name only, exactly as ``reconcile_requests`` hands reconcile
requests to ``jobs.reconciliation`` (Celery's task name with a broker). Without a broker
the job is not run inside the request that submitted it (a migration of thousands of
checkpoints takes minutes, docs/migrations.md "Speed"): it stays ``queued``, and the
in-process worker's next sweep round runs it (``migration_jobs_redrive``), within
``RECOVERY_SWEEP_INTERVAL_S``.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils.module_loading import import_string

from .. import roles
from ..audit import audit_record, incident_now
from ..dbclock import NOW
from ..exceptions import InvalidPayload
from ..heartbeat import broker_configured
from ..jsonparse import dumps
from ..models import MIGRATION_MAX_RUNS, MigrationJob, Tenant
from ..permissions import require
from ..selectors.migrations import outcome_counts
from ..vocab import AuditAction, MigrationJobState, MigrationOutcome, TargetType
from .common import _actor_name, _client_token_check, _resubmitted, _run_ids_check
from .migrations import checkpoints_migrate, migration_target_check
from .stored_send import send_stored

log = logging.getLogger(__name__)

#: The job that runs one stored migration, by dotted path (the sweep runs it in this
#: process when there is no broker).
EXECUTE = "checkpoints.jobs.migrations.execute"
#: Celery's name of the task that runs it (``checkpoints.jobs.tasks``).
TASK = "checkpoints.tasks.migrate_checkpoints_job"
_DISPATCH = ("dispatch marks, by primary key, the migration jobs it was handed (created "
             "scoped by the admin's request, or found by the sweep's re-drive)")
_REDRIVE = "the sweep re-drives every tenant's stale or due migration jobs"


@dataclass(frozen=True)
class Sent:
    """What ``migration_job_dispatch`` did: ``ok`` (handed to a worker, or left for the
    in-process worker) and its words for people."""

    ok: bool
    detail: str


def migration_runs_check(values) -> list[str] | None:
    """``runs`` of a migration request: None (every run of the kind), or a non-empty list
    of at most ``MIGRATION_MAX_RUNS`` run ids (UUIDs or UUID strings), duplicates dropped,
    order kept, as strings. Raises ``InvalidPayload`` naming ``runs``."""
    if values is None:
        return None
    return [str(rid) for rid in _run_ids_check(
        values, field="runs", most=MIGRATION_MAX_RUNS,
        what="per migration (leave it out for every run of the kind)",
        empty="name at least one run, or leave it out for every run")]


def _existing(tenant: Tenant, actor, token: uuid.UUID, fingerprint: str) -> MigrationJob | None:
    return _resubmitted(MigrationJob, tenant=tenant, actor=actor, token=token,
                       fingerprint=fingerprint,
                       what="migration (another kind, version, direction or runs)")


def migration_job_submit(*, actor, tenant: Tenant, kind: str, to_version: int,
                         client_token, run_ids=None, reverse: bool = False,
                         ) -> tuple[MigrationJob, bool]:
    """A tenant admin asks to migrate ``tenant``'s checkpoints of ``kind`` to
    ``to_version`` (``reverse``: down steps only; ``run_ids``: only those runs, else every
    run), as a stored job run in the background. Returns ``(job, created)``: ``created``
    is false when ``client_token`` was already used by this account for the same request
    (nothing new is stored; ``job`` is that first one, in whatever state it is now).

    Writes the ``MigrationJob`` (``queued``) and one ``migration.submit`` audit event in
    one transaction, then hands the job to a worker after commit
    (``migration_job_dispatch``). Raises, before writing anything: ``NotFound`` /
    ``Forbidden`` (``roles.MANAGE``: the tenant's admin only), ``InvalidPayload`` naming
    the field (``kind``, ``to_version``: ``migration_target_check``; ``reverse`` not a
    boolean; ``runs`` not a list of run ids, empty or over ``MIGRATION_MAX_RUNS``;
    ``client_token`` not a UUID, or used for a different request). Which checkpoints are
    refused and why is the job's items, never raised here.
    """
    require(actor, tenant, roles.MANAGE)
    migration_target_check(tenant, kind, to_version)
    if type(reverse) is not bool:
        raise InvalidPayload("reverse: must be true or false")
    runs = migration_runs_check(run_ids)
    token = _client_token_check(client_token)
    selection = {} if runs is None else {"runs": runs}
    fingerprint = hashlib.sha256(dumps({"kind": kind, "to_version": to_version,
                                        "reverse": reverse, "selection": selection})
                                 .encode()).hexdigest()
    job = _existing(tenant, actor, token, fingerprint)
    if job is not None:
        return job, False
    try:
        with transaction.atomic():
            job = MigrationJob.objects.create(
                tenant=tenant, uuid=uuid.uuid4(), client_token=token, requested_by=actor,
                requested_by_name=_actor_name(actor),
                # The job's events carry the request's incident, as its own event does.
                incident_ref=incident_now() or None, kind=kind, to_version=to_version,
                reverse=reverse, selection=selection, fingerprint=fingerprint)
            audit_record(tenant=tenant, actor=actor, action=AuditAction.MIGRATION_SUBMIT,
                         target_type=TargetType.MIGRATION_JOB, target_id=job.uuid,
                         after={"kind": kind, "to_version": to_version, "reverse": reverse,
                                "runs": len(runs) if runs is not None else None})
            pk = job.pk
            transaction.on_commit(lambda: migration_job_dispatch([pk]))
    except IntegrityError:
        # The same token at the same moment: ours waited for theirs to commit.
        job = _existing(tenant, actor, token, fingerprint)
        if job is None:
            raise
        return job, False
    return job, True


def migration_job_dispatch(job_pks: list[int], *, countdown: float | None = None) -> Sent:
    """Hand stored jobs to a worker. With a broker: one ``TASK`` message each (by name:
    services never import the job layer, ``stored_jobs_send``); a publish error leaves
    the jobs not sent yet ``queued`` with ``last_error`` saying so, and the sweep sends
    them later. Without a broker: nothing
    now (the in-process worker's sweep runs due jobs, ``migration_jobs_redrive``)."""
    if not job_pks:
        return Sent(True, "nothing to migrate")
    return stored_jobs_send(MigrationJob.objects.for_all_tenants(reason=_DISPATCH), job_pks,
                            task=TASK, queued=MigrationJobState.QUEUED, countdown=countdown)


def stored_jobs_send(every, job_pks: list[int], *, task: str, queued: str,
                     countdown: float | None = None) -> Sent:
    """The one dispatch of stored jobs (migration jobs, bulk jobs: issue 22, item 6).
    ``every``: the job model's rows (all tenants); ``job_pks`` (non-empty) are sent as
    one Celery ``task`` message each (by name) through ``stored_send.send_stored``: each
    job the broker took is marked ``dispatched_at`` (database clock); on a publish error
    the jobs not sent yet stay in state ``queued`` with ``last_error`` saying so (the
    sweep sends them again), the ones sent before it keep no error. Without a broker
    nothing is sent (the in-process worker's sweep runs due jobs). Returns what to tell
    the requester (``Sent``: ``ok`` false when any job was not sent)."""
    if not broker_configured():
        return Sent(True, "queued for the in-process worker (it runs within "
                          f"{settings.RECOVERY_SWEEP_INTERVAL_S} s)")
    published = send_stored(every, job_pks, task=task, queued=queued, countdown=countdown)
    return Sent(published.ok, published.detail)


class _NotHeld(Exception):
    """The job is no longer the failing attempt's: its ``*.fail`` event rolls back."""


def stored_job_fail(job, held, *, action: str, target_type: str, running: str, failed: str,
                    last_error: str, reason: str, progress: Callable[[], dict | None],
                    failures: int | None = None) -> bool:
    """The one failing end of a stored job (migration and bulk jobs; the worker's
    ``jobs.migrations`` and ``jobs.bulk`` give up): in one transaction, the job's
    ``*.fail`` audit event (``action``), then the job ``failed`` (``finished_at`` on the
    database clock, claim released, ``last_error``, and ``failures`` when given),
    provided ``held`` (the job's row while the failing attempt holds it: ``running``,
    its ``attempts``) still matches; else nothing is written (aborted meanwhile, or taken
    over after the claim passed: that other end, or attempt, is the job's), so a job is
    failed, and its failure audited, at most once whatever re-delivers or re-drives it.

    The event is by the system (``actor=None``: a worker, like the reconciliation's
    ``reconcile.gave_up``) about the job (``target_type``, its ``uuid``): ``reason`` says
    why, ``before`` ``{"state": running}``, ``after`` ``{"state": failed, **progress(),
    "attempts", "failures"}`` (how far it got: ``progress`` is called inside the
    transaction and returns the counts, or None when the job is no longer held). Returns
    whether the job was failed here."""
    changes = {"state": failed, "finished_at": NOW, "claimed_until": None,
               "updated_at": NOW, "last_error": last_error[:1000]}
    if failures is not None:
        changes["failures"] = failures
    try:
        with transaction.atomic():
            counts = progress()
            if counts is None:
                raise _NotHeld
            audit_record(tenant=job.tenant, actor=None, action=action,
                         target_type=target_type, target_id=job.uuid, reason=reason[:4000],
                         before={"state": running},
                         after={"state": failed, **counts, "attempts": job.attempts,
                                "failures": job.failures if failures is None else failures})
            if held.update(**changes) != 1:
                raise _NotHeld
    except _NotHeld:
        return False
    return True


def migration_job_fail(job: MigrationJob, *, last_error: str, reason: str,
                       failures: int | None = None) -> bool:
    """Give up a claimed migration job (``job``: its row as claimed, with ``attempts``):
    ``failed`` with ``last_error`` (the words its page and API show) and one
    ``migration.fail`` event by the system saying why (``reason``) and how far it got
    (its kind and target version, its items per ``MigrationOutcome`` over every attempt:
    ``selectors.migrations.outcome_counts``), one transaction (``stored_job_fail``).
    Returns False, writing nothing, when the job is no longer this attempt's."""
    jobs = MigrationJob.objects.for_tenant(job.tenant)
    held = jobs.filter(pk=job.pk, state=MigrationJobState.RUNNING, attempts=job.attempts)
    return stored_job_fail(
        job, held, action=AuditAction.MIGRATION_FAIL, target_type=TargetType.MIGRATION_JOB,
        running=MigrationJobState.RUNNING, failed=MigrationJobState.FAILED,
        last_error=last_error, reason=reason, failures=failures,
        progress=lambda: {"kind": job.kind, "to_version": job.to_version,
                          **outcome_counts(job.tenant, job)})


def migration_jobs_redrive(limit: int = 20) -> int:
    """Send again (with a broker) or run here (without one: the in-process worker) the
    migration jobs that are due: ``queued`` ones whose next attempt has come (a grace of
    ``RECOVERY_RECONCILE_REDRIVE_GRACE_S`` with a broker, for the message already on its
    way), and ``running`` ones whose worker vanished (``claimed_until`` passed, database
    clock), which go back to ``queued`` first. Run by the sweep. Returns how many were
    sent or run. Takes no row lock: the claim (``jobs.migrations``) decides who runs."""
    every = MigrationJob.objects.for_all_tenants(reason=_REDRIVE)
    stale = Q(state=MigrationJobState.RUNNING, claimed_until__lt=NOW)
    reclaimed = list(every.filter(stale).values_list("pk", flat=True)[:limit])
    if reclaimed:
        every.filter(stale, pk__in=reclaimed).update(
            state=MigrationJobState.QUEUED, next_attempt_at=NOW, claimed_until=None,
            last_error="the worker vanished during the migration; going on from where it was")
    grace = settings.RECOVERY_RECONCILE_REDRIVE_GRACE_S if broker_configured() else 0
    due = Q(state=MigrationJobState.QUEUED,
            next_attempt_at__lte=NOW - timedelta(seconds=grace) if grace else NOW)
    due |= Q(state=MigrationJobState.QUEUED, pk__in=reclaimed)
    pks = list(every.filter(due).order_by("next_attempt_at", "pk")
               .values_list("pk", flat=True)[:limit])
    if not pks:
        return 0
    if broker_configured():
        migration_job_dispatch(pks)
        return len(pks)
    for pk in pks:
        try:
            import_string(EXECUTE)(pk)
        except Exception:  # noqa: BLE001 - stored: the job records its own failure
            log.exception("migration job %s failed in this process; it is retried", pk)
    return len(pks)


#: The most refused or conflicting checkpoints a preview lists one by one (all are counted).
PREVIEW_LISTED = 200


@dataclass(frozen=True)
class MigrationPreview:
    """What a migration would do, written nothing (``migration_preview``): ``counts`` per
    ``MigrationOutcome`` (``migrated`` = would be migrated), ``refusals`` per reason,
    ``examples`` (one per distinct change: key paths only, ``MigrationReport.examples``),
    ``refused`` (the first ``PREVIEW_LISTED`` checkpoints that would be refused, each a
    ``MigrationItem``: run, reason, words) and ``checkpoints`` (how many were looked at)."""

    kind: str
    to_version: int
    reverse: bool
    runs: list[str] | None
    counts: dict[str, int]
    refusals: dict[str, int]
    examples: list[dict]
    refused: list
    checkpoints: int

    @property
    def dry_run(self) -> bool:
        """Always true: nothing was written."""
        return True


def migration_preview(*, actor, tenant: Tenant, kind: str, to_version: int, run_ids=None,
                      reverse: bool = False) -> MigrationPreview:
    """The dry run of a migration job (CONTRACT.md 8, ``"dry_run": true``; the dashboard's
    preview page): ``checkpoints_migrate(dry_run=True)`` with the same checks as
    ``migration_job_submit`` (tenant admin only, ``kind``/``to_version``/``reverse``/
    ``runs`` named on error). Takes no lock and writes nothing, not even an audit event
    (a preview, like ``GET …/resume``). Raises ``NotFound``/``Forbidden``,
    ``InvalidPayload``."""
    require(actor, tenant, roles.MANAGE)
    migration_target_check(tenant, kind, to_version)
    if type(reverse) is not bool:
        raise InvalidPayload("reverse: must be true or false")
    runs = migration_runs_check(run_ids)
    refused = []

    def keep(item) -> None:
        if item.outcome in (MigrationOutcome.REFUSED, MigrationOutcome.CONFLICT) \
                and len(refused) < PREVIEW_LISTED:
            refused.append(item)

    report = checkpoints_migrate(actor=actor, tenant=tenant, kind=kind, to_version=to_version,
                                 run_ids=runs, dry_run=True, reverse=reverse, on_item=keep)
    counts = report.counts
    return MigrationPreview(kind, to_version, reverse, runs, counts, report.refusals,
                            report.examples, refused, sum(counts.values()))
