"""Celery tasks: thin wrappers that take ids and call services; safe to run twice.

``reconcile_effect`` is acknowledged late and given back to the queue if its worker
process dies (settings: ``CELERY_TASK_ACKS_LATE``, ``CELERY_TASK_REJECT_ON_WORKER_LOST``);
whatever still slips through (the whole worker killed, a lost message, a broker outage)
the stored ``ReconcileRequest`` keeps, and the sweep sends it again.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="checkpoints.tasks.reconcile_effect", acks_late=True,
             reject_on_worker_lost=True)
def reconcile_effect(request_pk: int) -> dict:
    """Run one stored reconcile request (``reconciliation.execute``)."""
    from .reconciliation import execute

    return execute(request_pk)


@shared_task(name="checkpoints.tasks.sweep_stale_runs")
def sweep_stale_runs() -> dict:
    """Celery beat entry for ``services.sweep_stale_runs`` (which also re-drives
    reconcile requests left behind)."""
    from .services import sweep_stale_runs as sweep

    return sweep()
