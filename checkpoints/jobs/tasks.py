"""Celery tasks: thin wrappers that take ids and call services; safe to run twice.

Tasks import services; services never import tasks (they send work by task name,
``services.reconcile_requests.dispatch``), so there is no import cycle between the two.

``reconcile_effect`` is acknowledged late and given back to the queue if its worker
process dies (settings: ``CELERY_TASK_ACKS_LATE``, ``CELERY_TASK_REJECT_ON_WORKER_LOST``);
whatever still slips through (the whole worker killed, a lost message, a broker outage)
the stored ``ReconcileRequest`` keeps, and the sweep sends it again.
"""

from __future__ import annotations

import logging

from celery import shared_task

from .. import heartbeat
from ..services import audit_integrate_all, retention_purge_all
from ..services import sweep_stale_runs as sweep
from . import bulk, migrations
from .notify import notify_round
from .reconciliation import execute

log = logging.getLogger(__name__)


@shared_task(name="checkpoints.tasks.reconcile_effect", acks_late=True,
             reject_on_worker_lost=True)
def reconcile_effect(request_pk: int) -> dict:
    """Run one stored reconcile request (``reconciliation.execute``). Logs its result at
    INFO with the request id of the request that sent it (django-guid, settings.LOGGING),
    and records the ``job`` heartbeat (``checkpoints.heartbeat``)."""
    result = execute(request_pk)
    heartbeat.beat(heartbeat.JOB)
    log.info("reconcile request %s: %s", request_pk, result.get("result"),
             extra={"reconcile_request": request_pk, "result": result.get("result")})
    return result


@shared_task(name="checkpoints.tasks.sweep_stale_runs")
def sweep_stale_runs() -> dict:
    """Celery beat entry for ``services.sweep_stale_runs`` (which also re-drives
    reconcile requests left behind); its heartbeat is ``sweep.celery``."""
    return sweep(by="celery")


@shared_task(name="checkpoints.tasks.migrate_checkpoints_job", acks_late=True,
             reject_on_worker_lost=True)
def migrate_checkpoints_job(job_pk: int) -> dict:
    """Run one stored migration job (``jobs.migrations.execute``; issue 19, item 2), and
    record the ``job`` heartbeat. A worker killed mid-way leaves the job ``running``
    until its claim passes; the sweep sends it again and it goes on from there."""
    result = migrations.execute(job_pk)
    heartbeat.beat(heartbeat.JOB)
    log.info("migration job %s: %s", job_pk, result.get("result"),
             extra={"migration_job": job_pk, "result": result.get("result")})
    return result


@shared_task(name="checkpoints.tasks.bulk_job", acks_late=True, reject_on_worker_lost=True)
def bulk_job(job_pk: int) -> dict:
    """Run one stored bulk action (``jobs.bulk.execute``; issue 22, item 6), and record
    the ``job`` heartbeat. A worker killed mid-way leaves the job ``running`` until its
    claim passes; the sweep sends it again and it goes on from the first run without a
    result."""
    result = bulk.execute(job_pk)
    heartbeat.beat(heartbeat.JOB)
    log.info("bulk job %s: %s", job_pk, result.get("result"),
             extra={"bulk_job": job_pk, "result": result.get("result")})
    return result


@shared_task(name="checkpoints.tasks.retention_purge")
def retention_purge() -> dict:
    """Celery beat entry (every ``RECOVERY_RETENTION_INTERVAL_S``) for
    ``services.retention_purge_all``: every tenant's data policy applied, under each
    tenant's fenced cleanup lease (a second worker running it at once finds the lease
    held and leaves the tenant to the first). Records the ``retention`` heartbeat."""
    result = retention_purge_all()
    log.info("retention purge: %s run(s) purged, %s expired", result["purged"],
             result["expired"], extra={"purged": result["purged"],
                                       "expired": result["expired"]})
    return {"purged": result["purged"], "expired": result["expired"]}


@shared_task(name="checkpoints.tasks.notify")
def notify() -> dict:
    """Celery beat entry (every ``RECOVERY_NOTIFY_INTERVAL_S``) for
    ``jobs.notify.notify_round``: the notification outbox dispatched, due messages sent
    (issue 21). Records the ``notify`` heartbeat. Safe on several workers at once."""
    return notify_round()


@shared_task(name="checkpoints.tasks.audit_integrate")
def audit_integrate() -> dict:
    """Celery beat entry (every ``RECOVERY_AUDIT_INTEGRATE_INTERVAL_S``, 1 s) for
    ``services.audit_integrate_all``: every tenant's queued audit events integrated into
    its Merkle tree, a signed head per batch (issue 22, item 1). Records the
    ``audit.integrate`` heartbeat. Safe on several workers at once (a per-tenant lease)."""
    return {"integrated": audit_integrate_all()}
