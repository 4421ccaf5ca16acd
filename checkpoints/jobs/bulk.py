"""Bulk actions of more than ``BULK_MAX_RUNS`` runs as durable jobs (issue 22, item 6;
docs/bulk.md "As a stored job"), run like stored migration jobs (``jobs.migrations``): a
worker runs ``execute`` for a job id, sent by ``services.bulk_job_dispatch`` (Celery, by
task name) or run by the sweep's ``bulk_jobs_redrive`` (the in-process worker without a
broker, a slice at a time; and the re-drive of a lost message or a vanished worker).

1. **claim** (one short transaction): a ``queued`` job that is due, or a ``running`` one
   whose worker vanished (``claimed_until`` passed, database clock), becomes ``running``
   with ``attempts + 1`` and a claim of ``CLAIM_S``. A second delivery finds it running
   and does nothing.
2. **walk**, ``BATCH`` runs at a time: before each batch the requester is read again
   from the database and their review right checked (``migrations.requester_now``, the
   one rule of stored jobs: ``permissions.account_now``, ``is_active`` and the tenant
   grants as they are now, never the rights an earlier object kept; deactivated, or the
   right lost: the job ``failed`` with ``last_error`` saying which, nothing more acted
   on); the batch's runs are acted on as that fresh reading, so each run's service
   checks the same answer. Each run not yet done (no
   result row: the row is the per-run unique key, so a re-drive skips what an earlier
   attempt did) is acted on by ``services.bulk_job_act`` in its own transaction, which
   also moves the job's counts and claim on, and stops the walk when a reviewer aborted
   the job (``bulk_abort``) or another worker took it over.
3. **finish**: ``services.bulk_job_finish`` (``finished``, audited ``bulk.finish``); or,
   after an unexpected error outside a run (an outage), ``queued`` again after a back-off
   (``RECOVERY_RECONCILE_BACKOFF_S`` doubling, capped), ``failed`` after ``MAX_FAILURES``
   in a row, with ``last_error`` on the result page and in the API. Every ``failed``
   (these, and a requester lost before a batch) is ``services.bulk_job_fail``: one
   ``bulk.fail`` audit event by the system in the same transaction (why, and the
   counts so far), written once. With ``budget_s``
   (the in-process worker's slice) an unfinished job goes back to ``queued`` between
   batches once the budget is spent, due at once, and the next sweep round goes on.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q

from .. import audit, roles, services
from ..dbclock import NOW
from ..models import BulkAction, BulkActionItem
from ..services.bulk import BulkJobLost
from ..vocab import BulkState
from .migrations import (
    MAX_FAILURES,  # noqa: F401 - tests read it here
    RequesterLost,
    attempt_failed,
    requester_now,
)

log = logging.getLogger(__name__)

#: How long a claim lasts without progress (seconds); every run done moves it on.
CLAIM_S = 120
#: Runs between two checks of the requester's right (and of the in-process budget).
BATCH = 100


def _jobs(reason: str):
    return BulkAction.objects.for_all_tenants(reason=reason)


def _claim(job_pk: int) -> BulkAction | None:
    """Claim bulk job ``job_pk`` for this worker: one conditional UPDATE whose row count
    says who won. Returns the claimed job, or None (not due, claimed by another worker,
    ended, gone)."""
    jobs = _jobs("a worker claims the bulk job it was handed, by primary key")
    due = Q(state=BulkState.QUEUED, next_attempt_at__lte=NOW + timedelta(seconds=1))
    vanished = Q(state=BulkState.RUNNING, claimed_until__lt=NOW)
    with transaction.atomic():
        won = jobs.filter(due | vanished, pk=job_pk, background=True).update(
            state=BulkState.RUNNING, attempts=F("attempts") + 1,
            claimed_until=NOW + timedelta(seconds=CLAIM_S), updated_at=NOW)
        if won != 1:
            return None
        return jobs.select_related("tenant", "requested_by").get(pk=job_pk)


def _end(job: BulkAction, **changes) -> int:
    """Move the job out of ``running`` if this attempt still holds it; returns 1 or 0."""
    return (BulkAction.objects.for_tenant(job.tenant)
            .filter(pk=job.pk, state=BulkState.RUNNING, attempts=job.attempts)
            .update(claimed_until=None, updated_at=NOW, **changes))


def _requester(job: BulkAction, acted: int):
    """The job's requester as read now, provided they may still act: an active account
    holding ``roles.REVIEW`` in the job's tenant (``migrations.requester_now``, the one
    rule of stored jobs; docs/bulk.md, "Walk"). ``acted``: runs with a result so far, for
    the words. Raises ``RequesterLost`` with the ``last_error`` words otherwise (the
    account gone or deactivated; no role left in the tenant, or one without the review
    right)."""
    return requester_now(job, roles.REVIEW, "review right",
                         lambda: (f"stopped after {acted} of {job.total} runs; a reviewer "
                                  "may submit the rest again"))


def _walk(job: BulkAction, budget_s: float | None) -> bool:
    """Act on every run of the job without a result yet, in order; returns False when
    the budget ran out first (the job is then back to ``queued``). Raises
    ``RequesterLost`` before a batch whose requester may no longer act."""
    done = {str(u) for u in BulkActionItem.objects.for_tenant(job.tenant)
            .filter(bulk=job).values_list("run_uuid", flat=True)}
    todo = [(pos, rid) for pos, rid in enumerate(job.run_ids) if rid not in done]
    deadline = None if budget_s is None else time.monotonic() + budget_s
    for start in range(0, len(todo), BATCH):
        if deadline is not None and start and time.monotonic() >= deadline:
            _end(job, state=BulkState.QUEUED, next_attempt_at=NOW)
            return False
        actor = _requester(job, len(done) + start)
        for position, run_id in todo[start:start + BATCH]:
            services.bulk_job_act(job, position, run_id, actor=actor, claim_s=CLAIM_S)
    return True


def execute(job_pk: int, *, budget_s: float | None = None) -> dict:
    """Run one stored bulk job (the Celery task's body; safe to run twice, at once or
    later). ``budget_s``: stop between batches after that many seconds (the in-process
    worker's slice; None: to the end). Returns ``{"job": pk, "result": ...}``:
    ``skipped`` (not due, or claimed elsewhere), ``finished`` (with ``counts``),
    ``paused`` (budget spent, queued again), ``lost`` (aborted, or taken over),
    ``retry`` or ``failed``."""
    job = _claim(job_pk)
    if job is None:
        return {"job": job_pk, "result": "skipped"}
    # Its events carry the request's incident, as the request's own did, the system's
    # (``bulk.fail``) too.
    with audit.working_on(job.incident_ref or "", system=True):
        return _execute(job, job_pk, budget_s)


def _execute(job: BulkAction, job_pk: int, budget_s: float | None) -> dict:
    try:
        if not _walk(job, budget_s):
            return {"job": job_pk, "result": "paused"}
        counts = services.bulk_job_finish(job)
    except BulkJobLost:
        return {"job": job_pk, "result": "lost"}
    except RequesterLost as exc:
        services.bulk_job_fail(job, last_error=str(exc), reason=str(exc))
        return {"job": job_pk, "result": "failed"}
    except Exception as exc:  # noqa: BLE001 - an outage or a bug: stored, retried
        log.exception("bulk job %s failed (attempt %s)", job.uuid, job.attempts)
        return attempt_failed(job, exc, _end, services.bulk_job_fail, queued=BulkState.QUEUED)
    return {"job": job_pk, "result": "finished", "counts": counts}
