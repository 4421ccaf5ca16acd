"""When background work last finished, on the database clock (issue 17, items 6 and 11).

One ``Heartbeat`` row per name, its ``at`` written from the database's clock
(``dbclock.NOW``) when the work finishes:

- ``sweep``: any stale-run sweep (``services.sweep_stale_runs``), whoever ran it;
- ``sweep.celery`` / ``sweep.inprocess`` / ``sweep.web``: a sweep run by a Celery worker
  (beat's schedule), by the embedded in-process worker, or by a web process catching up
  because the sweep was late (``inprocess.catch_up``);
- ``job``: a reconcile job a worker finished (``tasks.reconcile_effect``);
- ``retention.round`` / ``retention``: a purge round over every tenant finished / finished
  for every tenant without a failure (``services.retention_purge_all``);
- ``audit.integrate``: an audit sequencer round over every tenant with queued events
  (``audittree.audit_integrate_all``: Celery beat's ``tasks.audit_integrate`` or the
  in-process worker, every ``RECOVERY_AUDIT_INTEGRATE_INTERVAL_S``);
- ``audit.verify`` / ``audit.intact``: ``manage.py verify_audit_chain`` over every tenant
  (no tenant named) finished / found every chain, registry and exported head intact.
  ``audit.verify`` newer than ``audit.intact`` means the last verification found a break
  (the alert ``RecoveryAuditChainBroken``, deploy/prometheus/recovery-rules.yml).
- ``notify``: a notification round (``jobs.notify.notify_round``: outbox dispatched, due
  messages sent), whoever ran it.

Read by the dashboard's banner ("background work is not running since ...") and by
``/readyz`` (``worker``) through one rule (``jobs.workerstatus.worker_status``), by the
web process's catch-up sweep and by ``/metrics``. Ages are
computed by the database (``NOW - at``), never by a process's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction

from .dbclock import NOW
from .models import Heartbeat

#: What a reconcile request's ``last_error`` starts with when the task queue refused it
#: (``services.run_reconcile``): the request waits, queued, for the worker to come back.
BROKER_DOWN = "broker unavailable"

SWEEP = "sweep"
JOB = "job"
#: ``verify_audit_chain`` over every tenant finished / found everything intact.
AUDIT_VERIFY = "audit.verify"
AUDIT_INTACT = "audit.intact"
NOTIFY = "notify"
#: The sources a sweep may name (``sweep_stale_runs(by=...)``).
SOURCES = ("celery", "inprocess", "web")


@dataclass(frozen=True)
class Beat:
    """One heartbeat as read: ``at`` (database time it was written) and ``age_s``
    (seconds between ``at`` and the database's time of the read)."""

    name: str
    at: datetime
    age_s: float


def beat(*names: str) -> None:
    """Record that the work ``names`` finished now (database time): one ``UPDATE`` per
    name, an ``INSERT`` the first time. Safe on many processes at once."""
    for name in names:
        if Heartbeat.objects.filter(name=name).update(at=NOW):
            continue
        try:
            with transaction.atomic():
                Heartbeat.objects.create(name=name, at=NOW)
        except IntegrityError:  # another process inserted it first
            Heartbeat.objects.filter(name=name).update(at=NOW)


def read() -> dict[str, Beat]:
    """Every heartbeat, ``{name: Beat}``, in one query (ages on the database clock)."""
    rows = Heartbeat.objects.annotate(db_now=NOW).values_list("name", "at", "db_now")
    return {name: Beat(name, at, max(0.0, (now - at).total_seconds()))
            for name, at, now in rows}


def broker_configured() -> bool:
    """Whether Celery work goes to a broker (``CELERY_BROKER_URL`` set: tasks are not run
    eagerly in this process). The one reading of that setting: reconciliation's
    ``dispatch``, the dashboard's banner and this module ask here."""
    return not settings.CELERY_TASK_ALWAYS_EAGER


def background_source() -> str:
    """The heartbeat that shows the deployment's own background worker runs:
    ``sweep.celery`` with a broker (beat and a worker), ``sweep.inprocess`` with the
    embedded in-process worker, else ``sweep`` (whatever runs the sweep: tests, a cron'd
    command)."""
    if broker_configured():
        return "sweep.celery"
    if settings.RECOVERY_INPROCESS_WORKER:
        return "sweep.inprocess"
    return SWEEP


def late_after_s() -> int:
    """Seconds after which a sweep by anyone is late, so a web process sweeps itself
    (``sweep_late``): two sweep intervals (``RECOVERY_SWEEP_INTERVAL_S``). Whether the
    deployment's worker is late is another rule (``jobs.workerstatus``)."""
    return 2 * settings.RECOVERY_SWEEP_INTERVAL_S


def sweep_late(beats: dict[str, Beat] | None = None) -> bool:
    """Whether no sweep at all (any source) finished in the last two intervals (or none
    ever did): what makes a web process run the sweep itself (``inprocess.catch_up``)."""
    beats = read() if beats is None else beats
    found = beats.get(SWEEP)
    return found is None or found.age_s > late_after_s()
