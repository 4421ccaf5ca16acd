"""Celery tasks: thin wrappers that take ids and call services; safe to run twice."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="checkpoints.tasks.reconcile_run")
def reconcile_run(run_pk: int) -> dict:
    """Look up each in-doubt effect of the run by operation key and record the answer.

    The network lookup runs outside any transaction; the result is applied by
    compare-and-swap (``services.effect_apply_reconciliation``), so a repeat is a no-op.
    Returns ``{effect_id: outcome}``.
    """
    from .models import Effect
    from .reconcile import reconciler_for
    from .services import effect_apply_reconciliation

    results: dict[str, str] = {}
    for effect in Effect.objects.filter(run_id=run_pk, state__in=["submitted", "unresolved"]):
        found = reconciler_for(effect.service).lookup(effect.operation_key)
        if found.outcome == "error":
            results[str(effect.effect_id)] = f"error: {found.detail}"
            continue
        applied = effect_apply_reconciliation(
            effect_pk=effect.pk, expected_revision=effect.revision, outcome=found.outcome,
            receipt=found.receipt, detail=found.detail,
        )
        results[str(effect.effect_id)] = found.outcome if applied else "skipped (moved on)"
    return results


@shared_task(name="checkpoints.tasks.sweep_stale_runs")
def sweep_stale_runs() -> dict:
    """Celery beat entry for ``services.sweep_stale_runs``."""
    from .services import sweep_stale_runs as sweep

    return sweep()
