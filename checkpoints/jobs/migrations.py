"""Stored migration jobs as durable jobs (issue 19, item 2; docs/migrations.md), run like
reconcile requests (``jobs.reconciliation``): a worker runs ``execute`` for a job id,
sent by ``services.migration_job_dispatch`` (Celery, by task name) or run by the sweep's
``migration_jobs_redrive`` (the in-process worker without a broker; and the re-drive of a
lost message or a vanished worker with one).

1. **claim** (one short transaction): a ``queued`` job that is due, or a ``running`` one
   whose worker vanished (``claimed_until`` passed), becomes ``running`` with
   ``attempts + 1`` and a claim of ``CLAIM_S`` on the database clock. A second delivery
   finds it running and does nothing.
2. **walk**: ``services.checkpoints_migrate`` with the job's kind, version, direction,
   runs and its id as ``batch_id``, ``BATCH`` checkpoints at a time. Before the walk and
   before each batch the requester is read again from the database (``requester_now``,
   the one rule of stored jobs: ``permissions.account_now``, then the tenant admin's
   right, ``roles.MANAGE``, as ``migration_job_submit`` checks it); deactivated, or the
   right lost: the job ``failed`` with ``last_error`` saying which and how many
   checkpoints it migrated, nothing more migrated. The batch is written as that fresh
   reading. An ``on_item``, inside each checkpoint's own transaction, checks the claim
   still holds (else it stops: another worker has the job), moves the claim on, and
   writes the checkpoint's ``MigrationJobItem``. A kill leaves the checkpoints done
   committed with their items; the next attempt's walk does not even read them (they are
   at the target version), and looks again at the ones refused before (their item is
   replaced).
3. **finish**: ``done``; or, after an unexpected error (a bug in a step, an outage),
   ``queued`` again after a back-off (``RECOVERY_RECONCILE_BACKOFF_S`` doubling, capped),
   ``failed`` after ``MAX_FAILURES`` in a row or at once for a refusal of the request
   itself (``RequesterLost``; a ``DomainError``: the kind is no longer registered), with
   ``last_error`` shown on the job page and in the API, and one ``migration.fail`` audit
   event by the system in the same transaction (``services.migration_job_fail``: why,
   and the items per outcome so far). ``done`` writes no event of its own.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from .. import audit, roles, services
from ..dbclock import NOW
from ..exceptions import DomainError, Forbidden, NotFound
from ..models import MigrationJob, MigrationJobItem
from ..permissions import account_now, require
from ..services.migrations import MigrationItem
from ..vocab import MigrationJobState, MigrationOutcome

log = logging.getLogger(__name__)

#: How long a claim lasts without progress; every checkpoint done moves it on.
CLAIM_S = 300
#: Unexpected failures in a row before a job is ``failed``.
MAX_FAILURES = 3
#: Checkpoints between two checks of the requester's right (``checkpoints_migrate``'s
#: ``batch_size``).
BATCH = 100


class LostClaim(Exception):
    """The job's claim is no longer this worker's (it was re-driven after its claim
    passed, or finished meanwhile): stop, rolling back the checkpoint in progress."""


class RequesterLost(Exception):
    """A stored job's requester may no longer act (``requester_now``): the job is
    ``failed`` with these words as its ``last_error``; retrying cannot help."""


def requester_now(job, codename: str, right: str, stopped) -> object:
    """The one check of a stored job's requester (migration and bulk jobs: before the
    walk and before each batch; docs/bulk.md and docs/migrations.md, "Walk"). ``job``:
    a ``MigrationJob`` or ``BulkAction`` (``requested_by``, ``requested_by_name``,
    ``tenant``); ``codename``: the right the job's submit checked (``roles.MANAGE``,
    ``roles.REVIEW``), ``right`` its name in the words; ``stopped()``: the words saying
    how far the job got and what to do, called only when the requester is lost.

    Returns the requester as the database has them now (``permissions.account_now``: a
    new user object, ``is_active`` and the tenant grants read now, never the rights an
    earlier object kept since the claim; rights from tenant grants only,
    ``permissions.tenant_perms``), on which ``codename`` was just checked: the batch is
    acted on as that reading, so each checkpoint's or run's service checks the same
    answer. Raises ``RequesterLost`` with the ``last_error`` words otherwise (the account
    gone or deactivated; no role left in the tenant, or one without ``codename``)."""
    user = account_now(job.requested_by)
    name = job.requested_by_name
    if user is None or not user.is_active:
        raise RequesterLost(f"{name}'s account was deactivated; {stopped()}")
    try:
        require(user, job.tenant, codename)
    except (NotFound, Forbidden) as exc:
        raise RequesterLost(f"{name} no longer holds the {right} in this tenant "
                            f"({exc.error}); {stopped()}") from None
    return user


def _jobs(reason: str):
    return MigrationJob.objects.for_all_tenants(reason=reason)


def _claim(job_pk: int) -> MigrationJob | None:
    """Claim job ``job_pk`` for this worker: one conditional UPDATE whose row count says
    who won (the pattern of ``reconciliation._claim``). Returns the claimed job, or None
    (not due, claimed by another worker, finished, gone)."""
    jobs = _jobs("a worker claims the migration job it was handed, by primary key")
    due = Q(state=MigrationJobState.QUEUED, next_attempt_at__lte=NOW + timedelta(seconds=1))
    vanished = Q(state=MigrationJobState.RUNNING, claimed_until__lt=NOW)
    with transaction.atomic():
        won = jobs.filter(due | vanished, pk=job_pk).update(
            state=MigrationJobState.RUNNING, attempts=F("attempts") + 1,
            claimed_until=NOW + timedelta(seconds=CLAIM_S), updated_at=NOW)
        if won != 1:
            return None
        return jobs.select_related("tenant", "requested_by").get(pk=job_pk)


def _recorder(job: MigrationJob):
    """The ``on_item`` of one attempt: inside the checkpoint's transaction, hold the claim
    (one conditional UPDATE, which also moves it on) and write the item."""
    items = MigrationJobItem.objects.for_tenant(job.tenant)
    jobs = MigrationJob.objects.for_tenant(job.tenant)

    def record(item: MigrationItem) -> None:
        held = jobs.filter(pk=job.pk, state=MigrationJobState.RUNNING,
                           attempts=job.attempts).update(
            claimed_until=NOW + timedelta(seconds=CLAIM_S), updated_at=NOW)
        if held != 1:
            raise LostClaim(f"migration job {job.uuid}: claim lost")
        items.update_or_create(
            job=job, checkpoint_uuid=item.checkpoint_id,
            defaults={"tenant": job.tenant, "run_uuid": item.run_id, "outcome": item.outcome,
                      "reason": item.reason, "detail": item.detail[:4000],
                      "from_version": item.from_version, "revision": item.revision,
                      "attempt": job.attempts})

    return record


def _requester(job: MigrationJob):
    """The job's requester as read now, still the tenant's admin (``requester_now`` with
    ``roles.MANAGE``, the right ``migration_job_submit`` checks). Raises
    ``RequesterLost``, its words saying how many of the tenant's checkpoints this job
    migrated (every attempt: its ``migrated`` items), which stay migrated."""

    def stopped() -> str:
        migrated = (MigrationJobItem.objects.for_tenant(job.tenant)
                    .filter(job=job, outcome=MigrationOutcome.MIGRATED).count())
        return (f"stopped after {migrated} checkpoints migrated; an admin may submit the "
                "migration again (it skips those already migrated)")

    return requester_now(job, roles.MANAGE, "admin right", stopped)


def _end(job: MigrationJob, **changes) -> int:
    """Move the job out of ``running`` if this attempt still holds it; returns 1 or 0."""
    return (MigrationJob.objects.for_tenant(job.tenant)
            .filter(pk=job.pk, state=MigrationJobState.RUNNING, attempts=job.attempts)
            .update(claimed_until=None, updated_at=NOW, **changes))


def attempt_failed(job, exc: Exception, end, fail, *, queued: str) -> dict:
    """What a stored job's failed attempt leaves (migration and bulk jobs, issue 22):
    its ``failures`` counted and ``last_error`` kept; after ``MAX_FAILURES`` in a row the
    job is given up by ``fail`` (``services.migration_job_fail``, ``bulk_job_fail``:
    ``failed``, with its ``*.fail`` audit event), else ``queued`` again after an
    exponential back-off (``RECOVERY_RECONCILE_BACKOFF_S`` doubling, at most ``…_MAX_S``),
    on the database clock. ``end(job, **changes)`` moves the job if this attempt still
    holds it. The event's reason names the exception's type and the attempt, not its
    message (which may quote stored data, and an audit event is never erased: it stays
    in ``last_error``). Returns the task's ``{"job", "result": "failed" | "retry"}``."""
    failures = job.failures + 1
    why = f"attempt {job.attempts}: {type(exc).__name__}: {str(exc)[:500]}"
    if failures >= MAX_FAILURES:
        fail(job, last_error=why, failures=failures,
             reason=(f"gave up after {failures} failed attempts in a row; the last (attempt "
                     f"{job.attempts}) raised {type(exc).__name__} (its message: the job's "
                     "last error)"))
        return {"job": job.pk, "result": "failed"}
    base = settings.RECOVERY_RECONCILE_BACKOFF_S
    delay = min(settings.RECOVERY_RECONCILE_BACKOFF_MAX_S, base * 2 ** (failures - 1))
    end(job, state=queued, failures=failures, last_error=why,
        next_attempt_at=NOW + timedelta(seconds=delay))
    return {"job": job.pk, "result": "retry"}


def execute(job_pk: int) -> dict:
    """Run one stored migration job (the Celery task's body; safe to run twice, at once or
    later). Returns ``{"job": pk, "result": ...}``: ``skipped`` (not due, or claimed
    elsewhere), ``done`` (with ``counts``), ``lost_claim``, ``retry`` or ``failed``."""
    job = _claim(job_pk)
    if job is None:
        return {"job": job_pk, "result": "skipped"}
    # Its events carry the request's incident, as the request's own did, the system's
    # (``migration.fail``) too.
    with audit.working_on(job.incident_ref or "", system=True):
        return _execute(job, job_pk)


def _execute(job: MigrationJob, job_pk: int) -> dict:
    try:
        report = services.checkpoints_migrate(
            actor=_requester(job), tenant=job.tenant, kind=job.kind,
            to_version=job.to_version, run_ids=job.selection.get("runs"),
            reverse=job.reverse, batch_id=job.uuid, batch_size=BATCH,
            before_batch=lambda: _requester(job), on_item=_recorder(job))
    except LostClaim:
        return {"job": job_pk, "result": "lost_claim"}
    except RequesterLost as exc:
        services.migration_job_fail(job, last_error=str(exc), reason=str(exc))
        return {"job": job_pk, "result": "failed"}
    except DomainError as exc:
        # The request itself is refused now (the kind is no longer registered, or no
        # longer has that version): retrying cannot help. The requester's rights were
        # checked just before, by ``_requester``. The service's own words (naming the
        # field, never a stored value) are both the job's error and the event's reason.
        words = f"{exc.error}: {exc.detail}"
        services.migration_job_fail(job, last_error=words, reason=words)
        return {"job": job_pk, "result": "failed"}
    except Exception as exc:  # noqa: BLE001 - a step's bug or an outage: stored, retried
        log.exception("migration job %s failed (attempt %s)", job.uuid, job.attempts)
        return attempt_failed(job, exc, _end, services.migration_job_fail,
                              queued=MigrationJobState.QUEUED)
    if not _end(job, state=MigrationJobState.DONE, finished_at=NOW, failures=0,
                last_error=""):
        return {"job": job_pk, "result": "lost_claim"}
    return {"job": job_pk, "result": "done", "counts": report.counts}
