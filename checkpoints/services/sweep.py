"""System work: the stale-run sweep (beat every 10 s, or the in-process thread).
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q

from .. import heartbeat, locks
from ..audit import (
    audit_record,
)
from ..dbclock import NOW
from ..models import (
    Effect,
    Run,
)
from ..vocab import (
    AuditAction,
    EffectSource,
    EffectState,
    PhaseClass,
    RecoveryState,
    TargetType,
)
from . import bulk_jobs, migration_jobs, reconcile_requests
from .counters import counters_compact
from .effects import KEEP_RECEIPT, _effect_transition
from .runs import run_facts, run_refresh_state

# --------------------------------------------------------------------------------------
# System work: reconciliation results and the stale-run sweep
# --------------------------------------------------------------------------------------

def sweep_stale_runs(*, by: str | None = None) -> dict[str, int]:
    """Move runs whose owner went quiet into ``ambiguous`` (DESIGN.md 4), on the
    database's clock, then re-drive reconcile requests whose worker vanished or whose
    message was lost (``reconcile_requests.redrive``).

    Candidates: open runs with a ``submitted`` effect or an in-flight latest checkpoint
    whose lease is expired or absent. Under each run's lock the rule is judged again
    (``RunFacts.owner_gone``): ``submitted`` effects become ``unresolved`` (audited, actor
    system), then the state is recomputed. Runs are taken in ascending id, one
    transaction each, in the store's lock order (``locks``: the tenant's write gate
    shared, then the run), and only those the rule, judged first without a lock, says to change; a run
    another transaction holds is skipped (``SKIP LOCKED``) and looked at on the next
    pass. Idempotent and safe on many workers at once.
    Returns counts: ``examined``, ``effects_unresolved``, ``runs_ambiguous`` and the
    re-drive's ``reconcile_redriven``, and ``migrations_redriven``: the stored migration
    jobs sent again, or run here without a broker (``migration_jobs_redrive``),
    ``bulk_jobs_redriven``: the same for bulk actions stored as jobs (``bulk_jobs_redrive``,
    here for at most one sweep interval), and ``counters_compacted``: the tenants whose state counter rows were folded
    (``counters.counters_compact``).

    Once done it records the ``sweep`` heartbeat, and ``sweep.<by>`` when ``by`` names who
    ran it (``heartbeat.SOURCES``: ``celery``, ``inprocess``, ``web``), on the database
    clock (issue 17: the dashboard, ``/readyz`` and ``/metrics`` read them).
    """
    beats = _heartbeat_names(by)
    every_run = Run.objects.for_all_tenants(
        reason="the stale-run sweep looks at every tenant's runs; each is then locked and "
               "changed within its own tenant")
    candidates = (
        every_run.filter(Q(effects__state=EffectState.SUBMITTED)
                         | Q(phase_class=PhaseClass.IN_FLIGHT))
        .exclude(recovery_state=RecoveryState.SCHEMA_MISMATCH)
        .filter(closed_at__isnull=True)
        .filter(Q(lease_expires_at__lte=NOW) | Q(lease_owner="")
                | Q(lease_expires_at__isnull=True))
        .values_list("pk", "tenant_id").distinct().order_by("pk")
    )
    stats = {"examined": 0, "effects_unresolved": 0, "runs_ambiguous": 0}
    for pk, tenant_id in list(candidates):
        stats["examined"] += 1
        # Judged once without a lock first, so that the sweep locks only a run it will
        # change.
        seen = (Run.objects.for_tenant(tenant_id).annotate(db_now=NOW)
                .select_related("tenant").filter(pk=pk).first())
        if seen is None or not run_facts(seen, seen.db_now).owner_gone:
            continue
        with transaction.atomic():  # each run committed on its own
            # The store's lock order (``locks``): the tenant's write gate shared, then the
            # run, skipped if another transaction holds it (the next pass looks again).
            run = locks.lock_run_pk(tenant_id, pk, skip_locked=True)
            if run is None:
                continue
            now = run.db_now
            facts = run_facts(run, now)
            if not facts.owner_gone or facts.closed:
                continue
            for effect in Effect.objects.for_tenant(run.tenant_id).filter(
                    run=run, state=EffectState.SUBMITTED).order_by("pk"):
                moved = _effect_transition(effect, expected_revision=effect.revision,
                                           to_state=EffectState.UNRESOLVED, receipt=KEEP_RECEIPT,
                                           by=EffectSource.SWEEP, actor=None, now=now)
                if moved is not None:
                    stats["effects_unresolved"] += 1
                    audit_record(tenant=run.tenant, actor=None, action=AuditAction.EFFECT_UNRESOLVED,
                                 target_type=TargetType.EFFECT, target_id=effect.uuid,
                                 run_id=run.uuid, reason="owner gone (stale-run sweep)",
                                 before={"state": EffectState.SUBMITTED},
                                 after={"state": EffectState.UNRESOLVED}, created_at=now)
            before = run.recovery_state
            ambiguous = RecoveryState.AMBIGUOUS
            if run_refresh_state(run, now) == ambiguous and before != ambiguous:
                stats["runs_ambiguous"] += 1
                audit_record(tenant=run.tenant, actor=None, action=AuditAction.RUN_AMBIGUOUS,
                             target_type=TargetType.RUN, target_id=run.uuid, run_id=run.uuid,
                             reason=run.recovery_reason, before={"recovery_state": before},
                             after={"recovery_state": ambiguous}, created_at=now)
    stats.update(_after_the_runs())
    heartbeat.beat(*beats)
    return stats


def _after_the_runs() -> dict[str, int]:
    """The sweep's other work, once the runs are looked at: the re-drives of stored work
    and the counters' compaction (the counts ``sweep_stale_runs`` returns)."""
    return {"reconcile_redriven": reconcile_requests.redrive(),
            "migrations_redriven": migration_jobs.migration_jobs_redrive(),
            "bulk_jobs_redriven": bulk_jobs.bulk_jobs_redrive(),
            "counters_compacted": counters_compact()}


def _heartbeat_names(by: str | None) -> list[str]:
    if by is not None and by not in heartbeat.SOURCES:
        raise ValueError(f"sweep_stale_runs: by must be one of {heartbeat.SOURCES}")
    return [heartbeat.SWEEP, *([f"sweep.{by}"] if by else [])]


