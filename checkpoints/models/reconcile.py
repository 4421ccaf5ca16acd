"""Reconciliation: durable reconcile requests, their attempts, and each tenant's reconciler
settings.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q

from ..vocab import (
    ReconcileState,
)
from .audit import AuditEvent
from .effects import Effect
from .runs import Run
from .tenancy import Tenant, TenantOwned, TimestampedModel


class ReconcileRequest(TenantOwned, TimestampedModel):
    """A durable job: reconcile one in-doubt effect through its service, by operation key.

    Written in the same transaction as the reviewer's audit event (or the sweep's), then
    driven by a Celery worker (acks late, re-driven by the sweep when its worker vanished)
    or, without a broker, by the web process's in-process worker. Every time is the
    database's clock. ``attempts`` counts look-ups; ``failures`` counts look-ups in a row
    that could not tell (after ``RECOVERY_RECONCILE_MAX_FAILURES`` the request gives up
    and the effect waits for a human, with ``last_error`` shown). ``outcome`` is the effect
    state reconciliation settled (confirmed/failed/not_executed/unknown), or ``moved_on``
    when the effect had settled by other means. At most one open request per effect.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="reconcile_requests")
    effect = models.ForeignKey(Effect, on_delete=models.PROTECT,
                               related_name="reconcile_requests")
    task_uuid = models.UUIDField(help_text="the id the reviewer was given (one per action; ``task_id`` on the wire)")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+")
    requested_by_name = models.CharField(max_length=150)
    reason = models.TextField(blank=True)
    incident_ref = models.CharField(
        max_length=AuditEvent._meta.get_field("incident_ref").max_length, null=True,
        blank=True,
        help_text="the incident the requester was working on (AuditEvent.incident_ref), "
                  "carried by every event the request's job records, the system's answer "
                  "included")
    state = models.CharField(max_length=16, choices=ReconcileState.choices,
                             default=ReconcileState.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    outcome = models.CharField(max_length=16, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["effect"], condition=Q(state__in=list(ReconcileState.OPEN)),
                name="reconcile_one_open_request_per_effect"),
            models.CheckConstraint(condition=Q(state__in=ReconcileState.values),
                                   name="reconcile_state_valid"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="reconcile_due_idx"),
                   # The report's reconciliation outcomes: requests finished in a range.
                   models.Index(fields=["tenant", "finished_at"],
                                name="reconcile_tenant_done_idx")]

    def __str__(self) -> str:
        return f"reconcile request {self.pk} ({self.state})"

    @property
    def waiting_for_worker_since(self):
        """Since when this open request waits for a worker that is not coming (issue 17,
        item 6), or None: ``running`` past its claim (its worker died: the next sweep
        sends it again), or ``queued`` and due for longer than a sweep interval (no
        worker took it). Judged on the database time the request was read with
        (``db_now``, annotated by the selectors); None when it was read without it. The
        run page and the API show the same value."""
        now = getattr(self, "db_now", None)
        if now is None:
            return None
        if self.state == ReconcileState.RUNNING:
            if self.claimed_until is not None and self.claimed_until < now:
                return self.claimed_until
            return None
        if self.state == ReconcileState.QUEUED and self.next_attempt_at is not None:
            if self.next_attempt_at < now - timedelta(seconds=settings.RECOVERY_SWEEP_INTERVAL_S):
                return self.next_attempt_at
        return None


class ReconcileAttempt(TenantOwned):
    """One look-up made for a reconcile request: what the service answered, and the
    evidence (its answer, encrypted like a receipt; shown only to roles that may reveal).

    ``answer``: ``found`` (the operation happened: receipt), ``failed`` (the service
    refused it), ``not_executed`` (never saw the key), ``cannot_tell`` (error, timeout or a
    bad answer: ``detail`` says which), ``no_lookup`` (the service offers none), or
    ``owner_live``/``settling`` (not asked yet: the owner is alive, or the settle delay has
    not passed since ``submitted``). ``applied`` is the effect state it led to, if any.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    request = models.ForeignKey(ReconcileRequest, on_delete=models.CASCADE,
                                related_name="attempt_log")
    number = models.PositiveIntegerField()
    reconciler = models.CharField(max_length=64)
    answer = models.CharField(max_length=16)
    detail = models.TextField(blank=True)
    evidence_ciphertext = models.TextField(blank=True)
    applied = models.CharField(max_length=16, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["request_id", "number"]
        # The report's look-up answers: attempts finished in a range.
        indexes = [models.Index(fields=["tenant", "finished_at"],
                                name="reconcile_attempt_done_idx")]


class ReconcilerConfig(TenantOwned, TimestampedModel):
    """Which reconciler answers for one service in one tenant (``reconcile.REGISTRY`` name
    or a dotted path to a class), with its options. Without a row, the
    ``RECOVERY_RECONCILERS`` environment default applies (HTTP status look-up), else none.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    service = models.CharField(max_length=200)
    plugin = models.CharField(max_length=200)
    url = models.CharField(max_length=2000, blank=True)
    timeout_s = models.PositiveIntegerField(default=5)
    settle_delay_s = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "service"],
                                    name="reconciler_one_per_service"),
        ]
