"""Bulk actions run as stored jobs (issue 22, item 6; docs/bulk.md "As a stored job"),
the services' side of handing them to a worker: ``bulk_job_dispatch`` (one Celery
message per job, by task name) and ``bulk_jobs_redrive`` (run by the sweep: sends again
what a lost message, a dead worker or a broker outage left behind, and, without a
broker, runs due jobs in the in-process worker). The same machinery as stored migration
jobs (``migration_jobs``): a job row is the truth, a message is only a nudge.

The job itself (claim, the walk over the selected runs in batches, each run its own
transaction with its result row and the job's counts, abort, retry, give up) is
``checkpoints.jobs.bulk``, a layer above: these services hand it work by name only.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils.module_loading import import_string

from ..dbclock import NOW
from ..heartbeat import broker_configured
from ..models import BulkAction
from ..vocab import BulkState
from .migration_jobs import Sent, stored_jobs_send

log = logging.getLogger(__name__)

#: The job that runs one stored bulk action, by dotted path (the sweep runs it in this
#: process when there is no broker).
EXECUTE = "checkpoints.jobs.bulk.execute"
#: Celery's name of the task that runs it (``checkpoints.jobs.tasks``).
TASK = "checkpoints.tasks.bulk_job"
_DISPATCH = ("dispatch marks, by primary key, the bulk jobs it was handed (created scoped "
             "by the reviewer's request, or found by the sweep's re-drive)")
_REDRIVE = "the sweep re-drives every tenant's stale or due bulk jobs"


def bulk_job_dispatch(job_pks: list[int], *, countdown: float | None = None) -> Sent:
    """Hand stored bulk jobs to a worker. With a broker: one ``TASK`` message each
    (``stored_jobs_send``); a publish error leaves the jobs not sent yet ``queued`` with
    ``last_error`` saying so, and the sweep sends them later (``bulk_jobs_redrive``). Without a broker: nothing now (the
    in-process worker's sweep runs due jobs, within ``RECOVERY_SWEEP_INTERVAL_S``)."""
    if not job_pks:
        return Sent(True, "nothing to do")
    return stored_jobs_send(BulkAction.objects.for_all_tenants(reason=_DISPATCH), job_pks,
                            task=TASK, queued=BulkState.QUEUED, countdown=countdown)


def inprocess_slice_s() -> float:
    """How long the in-process worker's sweep round spends on bulk jobs (seconds): one
    sweep interval, so a 50,000-run job never holds back the stale-run sweep by more than
    that; the job goes back to ``queued`` between slices and the next round goes on."""
    return float(settings.RECOVERY_SWEEP_INTERVAL_S)


def bulk_jobs_redrive(limit: int = 20) -> int:
    """Send again (with a broker) or run here (without one: the in-process worker, for at
    most ``inprocess_slice_s`` in all) the bulk jobs that are due: ``queued`` ones whose
    next attempt has come (a grace of ``RECOVERY_RECONCILE_REDRIVE_GRACE_S`` with a
    broker, for the message already on its way), and ``running`` ones whose worker
    vanished (``claimed_until`` passed, database clock), which go back to ``queued``
    first and resume where they were (each run's result row is its unique key: a run
    already done is not acted on again). Run by the sweep. Returns how many were sent or
    run. Takes no row lock: the claim (``jobs.bulk``) decides who runs."""
    every = BulkAction.objects.for_all_tenants(reason=_REDRIVE)
    stale = Q(background=True, state=BulkState.RUNNING, claimed_until__lt=NOW)
    reclaimed = list(every.filter(stale).values_list("pk", flat=True)[:limit])
    if reclaimed:
        every.filter(stale, pk__in=reclaimed).update(
            state=BulkState.QUEUED, next_attempt_at=NOW, claimed_until=None, updated_at=NOW,
            last_error="the worker vanished mid-way; going on from where it was")
    grace = settings.RECOVERY_RECONCILE_REDRIVE_GRACE_S if broker_configured() else 0
    due = Q(background=True, state=BulkState.QUEUED,
            next_attempt_at__lte=NOW - timedelta(seconds=grace) if grace else NOW)
    due |= Q(state=BulkState.QUEUED, pk__in=reclaimed)
    pks = list(every.filter(due).order_by("next_attempt_at", "pk")
               .values_list("pk", flat=True)[:limit])
    if not pks:
        return 0
    if broker_configured():
        bulk_job_dispatch(pks)
        return len(pks)
    deadline = time.monotonic() + inprocess_slice_s()
    ran = 0
    for pk in pks:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ran += 1
        try:
            import_string(EXECUTE)(pk, budget_s=left)
        except Exception:  # noqa: BLE001 - stored: the job records its own failure
            log.exception("bulk job %s failed in this process; it is retried", pk)
    return ran
