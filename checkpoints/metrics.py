"""Prometheus metrics of the service's own domain (issue 9, item 7; README "Production").

Two kinds:

- **Counted as they happen** (``prometheus_client`` objects in this process):
  ``RESUME_DECISIONS``, incremented by ``services.runs`` after a resume answer was given
  (``recovery_resume_decisions_total{tenant, action, mode}``, ``mode`` = ``preview`` for
  ``GET …/resume``, ``claim`` for ``POST …/resume``, counted once its transaction
  committed). Under gunicorn with several worker processes, set
  ``PROMETHEUS_MULTIPROC_DIR`` (an empty directory, wiped at start by gunicorn.conf.py) so
  that every worker's counts are summed in one scrape; without it each worker answers
  with its own counts only. A counter starts at 0 when the service starts (Prometheus'
  ``rate()``/``increase()`` handle the reset).
- **Read at scrape time** (``DomainCollector``): a handful of aggregate queries over
  every tenant, none per row, so a scrape costs the same at 100 or 100,000 runs:

  | metric | labels | from |
  | --- | --- | --- |
  | ``recovery_runs`` | tenant, state | the run state counters (``RunStateCount``, migration 0011) |
  | ``recovery_effects`` | tenant, state | the effect state counters (``EffectStateCount``) |
  | ``recovery_open_conflicts`` | tenant | unacknowledged ``Conflict`` rows (partial index) |
  | ``recovery_reconcile_requests`` | tenant, state | ``ReconcileRequest`` in ``queued``, ``running`` (the queue) or ``gave_up`` |
  | ``recovery_reconcile_failing`` | tenant | open requests whose last look-ups could not tell (``failures`` > 0) |
  | ``recovery_audit_events`` | tenant | the audit trail's length: the newest signed tree head's size plus the events queued for the sequencer (issue 22) |
  | ``recovery_audit_pending`` | tenant | audit events queued for the sequencer, not yet under a signed tree head (``AuditPending``; issue 22) |
  | ``recovery_audit_integration_lag_seconds`` | tenant | age of the oldest queued audit event (its ``queued_at`` against the database clock, both the database's; 0 when none queued) |
  | ``recovery_migration_jobs`` | tenant, state | ``MigrationJob`` in ``queued``, ``running`` (the queue) or ``failed`` (gave up) |
  | ``recovery_bulk_jobs`` | tenant, state | bulk actions run as stored jobs (issue 22, item 6) in ``queued``, ``running`` or ``failed`` (gave up) |
  | ``recovery_bulk_jobs_stalled`` | tenant | bulk jobs ``running`` whose claim passed (the worker vanished; the sweep resumes them), database clock |
  | ``recovery_notification_messages`` | tenant, state | notification messages per delivery state (issue 21) |
  | ``recovery_notification_endpoints_disabled`` | tenant | endpoints disabled (by an admin or after days of failure) |
  | ``recovery_notification_oldest_pending_seconds`` | tenant | age of the oldest pending message (since created, database clock; 0 when none) |

  | ``recovery_heartbeat_age_seconds`` | name | seconds since background work last finished (``checkpoints.heartbeat``: ``sweep``, ``sweep.celery``, ``sweep.inprocess``, ``sweep.web``, ``job``; ``retention.round``/``retention``: a purge round finished / finished for every tenant; ``audit.verify``/``audit.intact``: ``verify_audit_chain`` over every tenant finished / found every chain intact), database clock |
  | ``recovery_heartbeat_timestamp_seconds`` | name | when it last finished (Unix time, database clock) |

  Alert on ``recovery_heartbeat_age_seconds{name="sweep.celery"}`` (or ``sweep.inprocess``)
  above a few sweep intervals: the worker is dead or silent (issue 17, item 11); a name
  appears once its work first finished. A round heartbeat newer than its success
  heartbeat (``audit.verify`` after ``audit.intact``, ``retention.round`` after
  ``retention``) means the last round failed. The shipped alerting rules:
  ``deploy/prometheus/recovery-rules.yml`` (docs/operations/alerts.md).

  ``recovery_domain_scrape_ok`` is 1 when these were read, 0 when the database could not
  answer (the scrape then still serves the process's own metrics: 200, never a 500).
  Every tenant gets every state (0 when none), so a series does not vanish when its
  count drops to 0. ``tenant`` is the tenant's slug. Finished reconcile requests
  (``done``, ``cancelled``) are history, not a queue: they are not counted.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.db.models import Count, Max, Min, Q, Sum
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from . import heartbeat, replica
from .dbclock import NOW
from .models import (
    AuditPending,
    AuditTreeHead,
    BulkAction,
    Conflict,
    EffectStateCount,
    MigrationJob,
    NotificationEndpoint,
    NotificationMessage,
    ReconcileRequest,
    RunStateCount,
    Tenant,
)
from .vocab import (
    BulkState,
    DeliveryState,
    EffectState,
    MigrationJobState,
    ReconcileState,
    RecoveryState,
)

logger = logging.getLogger(__name__)

RESUME_DECISIONS = Counter(
    "recovery_resume_decisions",
    "Resume decisions given to runtimes (CONTRACT.md 3), by action; mode preview (GET) "
    "or claim (POST, counted after its transaction committed).",
    ["tenant", "action", "mode"],
)

#: The reconcile request states counted as the queue (and the failures a human must see).
RECONCILE_COUNTED = (*ReconcileState.OPEN, ReconcileState.GAVE_UP)
#: The migration job states counted: the queue and the jobs that gave up.
MIGRATION_COUNTED = (MigrationJobState.QUEUED, MigrationJobState.RUNNING,
                     MigrationJobState.FAILED)
#: The bulk job states counted: the queue and the jobs that gave up (issue 22, item 6).
BULK_COUNTED = (BulkState.QUEUED, BulkState.RUNNING, BulkState.FAILED)

_WHY = ("the operator's /metrics scrape counts every tenant's rows in aggregate (no row is "
        "returned, only per-tenant totals)")


def count_resume_decision(*, tenant: Tenant, action: str, mode: str) -> None:
    """Count one resume answer (``mode``: ``preview`` or ``claim``)."""
    RESUME_DECISIONS.labels(tenant=tenant.slug, action=action, mode=mode).inc()


def domain_figures() -> dict[str, dict[tuple[str, ...], float]]:
    """The scrape-time figures: ``{metric name: {label values: value}}`` with the label
    values in the order of ``DomainCollector.LABELS`` (tenant slug first). Ten queries
    whatever the number of runs (one per figure, plus the tenant list; two for the
    notification gauges; the audit queue's length, pending count and lag in one).
    Counts are ints, ages (``recovery_audit_integration_lag_seconds``) float seconds.
    Reads only."""
    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    figures: dict[str, dict[tuple[str, ...], float]] = {
        "recovery_runs": {(s, st): 0 for s in slugs.values() for st in RecoveryState.values},
        "recovery_effects": {(s, st): 0 for s in slugs.values() for st in EffectState.values},
        "recovery_open_conflicts": {(s,): 0 for s in slugs.values()},
        "recovery_reconcile_requests": {(s, st): 0 for s in slugs.values()
                                        for st in RECONCILE_COUNTED},
        "recovery_reconcile_failing": {(s,): 0 for s in slugs.values()},
        "recovery_audit_events": {(s,): 0 for s in slugs.values()},
        "recovery_audit_pending": {(s,): 0 for s in slugs.values()},
        "recovery_audit_integration_lag_seconds": {(s,): 0 for s in slugs.values()},
        "recovery_migration_jobs": {(s, st): 0 for s in slugs.values()
                                    for st in MIGRATION_COUNTED},
        "recovery_bulk_jobs": {(s, st): 0 for s in slugs.values() for st in BULK_COUNTED},
        "recovery_bulk_jobs_stalled": {(s,): 0 for s in slugs.values()},
        "recovery_notification_messages": {(s, st): 0 for s in slugs.values()
                                           for st in DeliveryState.values},
        "recovery_notification_endpoints_disabled": {(s,): 0 for s in slugs.values()},
        "recovery_notification_oldest_pending_seconds": {(s,): 0 for s in slugs.values()},
    }

    def put(name: str, tenant_id: int, *labels: str, value: float | None) -> None:
        slug = slugs.get(tenant_id)
        if slug is not None:  # a tenant created after the list was read: next scrape
            figures[name][(slug, *labels)] = (value if isinstance(value, float)
                                              else int(value or 0))

    for row in (RunStateCount.objects.for_all_tenants(reason=_WHY)
                .values("tenant_id", "state").annotate(total=Sum("n"))):
        put("recovery_runs", row["tenant_id"], row["state"], value=row["total"])
    for row in (EffectStateCount.objects.for_all_tenants(reason=_WHY)
                .values("tenant_id", "state").annotate(total=Sum("n"))):
        put("recovery_effects", row["tenant_id"], row["state"], value=row["total"])
    for row in (Conflict.objects.for_all_tenants(reason=_WHY)
                .filter(acknowledged_at__isnull=True)
                .values("tenant_id").annotate(total=Count("id"))):
        put("recovery_open_conflicts", row["tenant_id"], value=row["total"])
    for row in (ReconcileRequest.objects.for_all_tenants(reason=_WHY)
                .filter(state__in=RECONCILE_COUNTED)
                .values("tenant_id", "state")
                .annotate(total=Count("id"),
                          failing=Count("id", filter=Q(state__in=ReconcileState.OPEN,
                                                       failures__gt=0)))):
        put("recovery_reconcile_requests", row["tenant_id"], row["state"], value=row["total"])
        if row["state"] in ReconcileState.OPEN:
            key = (slugs.get(row["tenant_id"]),)
            if key[0] is not None:
                figures["recovery_reconcile_failing"][key] += row["failing"]
    # The trail's length (issue 22): the newest signed head's size plus the queued events.
    audit_events: dict[int, int] = {}
    for tenant_id, size in (AuditTreeHead.objects.for_all_tenants(reason=_WHY)
                            .values("tenant_id").annotate(size=Max("tree_size"))
                            .values_list("tenant_id", "size")):
        audit_events[tenant_id] = size or 0
    # The sequencer's queue: its length and its oldest row's age, one clock (the
    # database's, queued_at a column default), in the same aggregate.
    for tenant_id, queued, first, now in (
            AuditPending.objects.for_all_tenants(reason=_WHY).values("tenant_id")
            .annotate(n=Count("event_id"), first=Min("queued_at"), db_now=NOW)
            .values_list("tenant_id", "n", "first", "db_now")):
        audit_events[tenant_id] = audit_events.get(tenant_id, 0) + queued
        put("recovery_audit_pending", tenant_id, value=queued)
        put("recovery_audit_integration_lag_seconds", tenant_id,
            value=max(0.0, (now - first).total_seconds()) if first is not None else 0.0)
    for tenant_id, n in audit_events.items():
        put("recovery_audit_events", tenant_id, value=n)
    for row in (MigrationJob.objects.for_all_tenants(reason=_WHY)
                .filter(state__in=MIGRATION_COUNTED)
                .values("tenant_id", "state").annotate(total=Count("id"))):
        put("recovery_migration_jobs", row["tenant_id"], row["state"], value=row["total"])
    _bulk_job_figures(put)
    _notification_figures(put)
    return figures


def _bulk_job_figures(put) -> None:
    """The bulk job gauges (issue 22, item 6): one aggregate query (jobs per tenant and
    state, with how many running ones lost their worker: claim passed, database clock)."""
    for row in (BulkAction.objects.for_all_tenants(reason=_WHY)
                .filter(background=True, state__in=BULK_COUNTED)
                .values("tenant_id", "state")
                .annotate(total=Count("id"),
                          stalled=Count("id", filter=Q(state=BulkState.RUNNING,
                                                       claimed_until__lt=NOW)))):
        put("recovery_bulk_jobs", row["tenant_id"], row["state"], value=row["total"])
        if row["state"] == BulkState.RUNNING:
            put("recovery_bulk_jobs_stalled", row["tenant_id"], value=row["stalled"])


def _notification_figures(put) -> None:
    """The notification gauges (issue 21): two aggregate queries (messages per tenant
    and state, with the oldest's creation and the database clock; disabled endpoints)."""
    messages = (NotificationMessage.objects.for_all_tenants(reason=_WHY)
                .values("tenant_id", "state")
                .annotate(total=Count("id"), first=Min("created_at"), db_now=NOW))
    for row in messages:
        put("recovery_notification_messages", row["tenant_id"], row["state"],
            value=row["total"])
        if row["state"] == DeliveryState.PENDING and row["first"] is not None:
            put("recovery_notification_oldest_pending_seconds", row["tenant_id"],
                value=max(0, int((row["db_now"] - row["first"]).total_seconds())))
    for row in (NotificationEndpoint.objects.for_all_tenants(reason=_WHY)
                .filter(enabled=False).values("tenant_id").annotate(total=Count("id"))):
        put("recovery_notification_endpoints_disabled", row["tenant_id"], value=row["total"])


class DomainCollector:
    """A ``prometheus_client`` collector that runs ``domain_figures`` on every scrape
    (register it on a scrape's own ``CollectorRegistry``, never on the global one, so
    nothing else runs its queries)."""

    HELP = {
        "recovery_runs": "Runs per recovery state (the state counters).",
        "recovery_effects": "Effects per state (the state counters).",
        "recovery_open_conflicts": "Refused writes not yet acknowledged by a reviewer.",
        "recovery_reconcile_requests": "Reconcile requests queued, running (the queue) or "
                                       "given up (waiting for a human).",
        "recovery_reconcile_failing": "Open reconcile requests whose last look-ups could "
                                      "not tell (retrying with back-off).",
        "recovery_audit_events": "The length of the tenant's audit chain (events).",
        "recovery_audit_pending": "Audit events queued for the sequencer, not yet under a "
                                  "signed tree head.",
        "recovery_audit_integration_lag_seconds": "Age of the oldest audit event queued for "
                                                  "the sequencer (seconds, database clock; "
                                                  "0 when none).",
        "recovery_migration_jobs": "Migration jobs queued, running (the queue) or failed "
                                   "(gave up: a human must look).",
        "recovery_bulk_jobs": "Bulk actions run as stored jobs, queued, running or failed "
                              "(gave up: a reviewer must look).",
        "recovery_bulk_jobs_stalled": "Bulk jobs running whose worker vanished (claim "
                                      "passed; the sweep resumes them).",
        "recovery_notification_messages": "Notification messages per delivery state "
                                          "(pending, delivered, failed).",
        "recovery_notification_endpoints_disabled": "Notification endpoints disabled (by "
                                                    "an admin, or after days of failure).",
        "recovery_notification_oldest_pending_seconds": "Age of the oldest pending "
                                                        "notification message (seconds, "
                                                        "database clock; 0 when none).",
    }
    LABELS = {
        "recovery_runs": ["tenant", "state"],
        "recovery_effects": ["tenant", "state"],
        "recovery_open_conflicts": ["tenant"],
        "recovery_reconcile_requests": ["tenant", "state"],
        "recovery_reconcile_failing": ["tenant"],
        "recovery_audit_events": ["tenant"],
        "recovery_audit_pending": ["tenant"],
        "recovery_audit_integration_lag_seconds": ["tenant"],
        "recovery_migration_jobs": ["tenant", "state"],
        "recovery_bulk_jobs": ["tenant", "state"],
        "recovery_bulk_jobs_stalled": ["tenant"],
        "recovery_notification_messages": ["tenant", "state"],
        "recovery_notification_endpoints_disabled": ["tenant"],
        "recovery_notification_oldest_pending_seconds": ["tenant"],
    }

    def collect(self):
        """Yield one ``GaugeMetricFamily`` per figure (``prometheus_client`` protocol),
        then ``recovery_domain_scrape_ok`` (1, or 0 when the database could not answer:
        then no domain figure is yielded, and the process's own metrics, which a scrape
        during an outage needs most, are still served)."""
        try:
            figures = domain_figures()
        except DatabaseError:
            logger.warning("metrics: the database did not answer; domain gauges skipped",
                           exc_info=True)
            figures = None
        ok = GaugeMetricFamily("recovery_domain_scrape_ok",
                               "1 when this scrape read the domain figures from the "
                               "database, 0 when the database could not answer.")
        ok.add_metric([], 0 if figures is None else 1)
        yield ok
        for name, values in (figures or {}).items():
            family = GaugeMetricFamily(name, self.HELP[name], labels=self.LABELS[name])
            for labels, value in sorted(values.items()):
                family.add_metric(list(labels), value)
            yield family
        if figures is not None:
            yield from heartbeat_families()
        yield from replica_families()


def replica_families() -> list[GaugeMetricFamily]:
    """With a read replica configured (issue 22; none else): ``recovery_replica_up`` (1
    when it answers and streams, else 0) and ``recovery_replica_lag_seconds`` (its lag
    behind the primary's clock, ``replica.lag_s``; absent when it cannot be read)."""
    if not replica.configured():
        return []
    up = GaugeMetricFamily("recovery_replica_up",
                           "1 when the read replica answers and streams from the primary.")
    lag = GaugeMetricFamily("recovery_replica_lag_seconds",
                            "How far the read replica's last replayed commit is behind the "
                            "primary's clock (seconds; 0 when it replayed all it received).")
    try:
        lag.add_metric([], replica.lag_s())
        up.add_metric([], 1)
    except Exception:  # noqa: BLE001 - any failure: the replica is not serving
        logger.warning("metrics: the replica's lag could not be read", exc_info=True)
        up.add_metric([], 0)
        return [up]
    return [up, lag]


def heartbeat_families() -> list[GaugeMetricFamily]:
    """The heartbeat gauges (one query; an empty list when the database cannot answer)."""
    try:
        beats = heartbeat.read()
    except DatabaseError:
        logger.warning("metrics: the heartbeats could not be read", exc_info=True)
        return []
    age = GaugeMetricFamily("recovery_heartbeat_age_seconds",
                            "Seconds since background work last finished (database clock).",
                            labels=["name"])
    at = GaugeMetricFamily("recovery_heartbeat_timestamp_seconds",
                           "When background work last finished (Unix time, database clock).",
                           labels=["name"])
    for name, beat in sorted(beats.items()):
        age.add_metric([name], beat.age_s)
        at.add_metric([name], beat.at.timestamp())
    return [age, at]
