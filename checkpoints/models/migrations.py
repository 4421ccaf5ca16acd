"""Stored migration jobs (issue 19, item 2; docs/migrations.md): a tenant admin's request
to migrate a kind's checkpoints, run in the background, with one item per checkpoint."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..vocab import MigrationJobState, MigrationOutcome
from .audit import AuditEvent
from .tenancy import Tenant, TenantOwned

#: The most runs one migration job may name in ``runs`` (the bulk actions' bound).
MIGRATION_MAX_RUNS = 500


class MigrationJob(TenantOwned):
    """One migration of ``kind``'s checkpoints to ``to_version`` (``reverse``: down steps
    only), of the runs ``selection["runs"]`` or of every run (``selection == {}``),
    submitted by a tenant admin (``services.migration_job_submit``, with a
    ``migration.submit`` audit event in the same transaction) and run by a worker
    (``checkpoints.jobs.migrations.execute``), exactly as a ``ReconcileRequest``: claimed
    by a conditional UPDATE (``attempts + 1``, ``claimed_until`` on the database clock,
    moved on as each checkpoint is done), sent again by the sweep when its message was lost
    or its worker vanished, retried with back-off after an unexpected error, ``failed``
    with ``last_error`` after ``jobs.migrations.MAX_FAILURES`` in a row (a refusal of
    the request itself, e.g. the requester no longer an admin, fails it at once).

    Its ``uuid`` is the ``batch_id`` of every ``checkpoint.migrate`` event it writes, on
    every attempt. ``client_token`` is the submitter's idempotency key (the API's
    ``Idempotency-Key``, the confirm form's hidden UUID), unique per (tenant, requester);
    ``fingerprint`` (SHA-256 of kind, version, direction and runs) tells a resubmission
    from a different request reusing the token."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, uuid) starts with it
    uuid = models.UUIDField(help_text="the job's public id (``id`` on the wire)")
    client_token = models.UUIDField(help_text="the submitter's idempotency key")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                     related_name="+")
    requested_by_name = models.CharField(max_length=150)
    incident_ref = models.CharField(
        max_length=AuditEvent._meta.get_field("incident_ref").max_length, null=True,
        blank=True,
        help_text="the incident the requester was working on (AuditEvent.incident_ref), "
                  "carried by every event the stored job records, the system's included")
    kind = models.CharField(max_length=200)
    to_version = models.PositiveBigIntegerField()  # schema versions: 0..2^32-1
    reverse = models.BooleanField(default=False)
    selection = models.JSONField(help_text='``{"runs": [run ids]}``, or ``{}``: every run')
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=MigrationJobState.choices,
                             default=MigrationJobState.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    claimed_until = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"],
                                    name="migration_job_unique_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "requested_by", "client_token"],
                                    name="migration_job_one_per_client_token"),
            models.CheckConstraint(condition=Q(state__in=MigrationJobState.values),
                                   name="migration_job_state_valid"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"],
                                name="migration_job_due_idx")]

    def __str__(self) -> str:
        return f"migration job {self.uuid} ({self.kind} to v{self.to_version}, {self.state})"


class MigrationJobItem(TenantOwned):
    """One checkpoint's result in a migration job, written in the same transaction as its
    migration (so ``migrated`` here means the new revision and its audit event
    committed). Unique per (job, checkpoint): a checkpoint looked at again by a later
    attempt (refused before, e.g. its owner was live) has its item replaced; a migrated
    one is never looked at again (it is at the target version)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    job = models.ForeignKey(MigrationJob, on_delete=models.PROTECT, related_name="items",
                            db_index=False)  # (job, checkpoint_uuid) starts with it
    checkpoint_uuid = models.UUIDField()
    run_uuid = models.UUIDField()
    outcome = models.CharField(max_length=16, choices=MigrationOutcome.choices)
    reason = models.CharField(max_length=32, blank=True)
    detail = models.TextField(blank=True)
    from_version = models.PositiveBigIntegerField(null=True, blank=True)
    revision = models.BigIntegerField(null=True, blank=True,
                                      help_text="the revision read (the one a migration "
                                                "replaced)")
    attempt = models.PositiveIntegerField(help_text="the job's attempt that wrote it")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["job_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "checkpoint_uuid"],
                                    name="migration_item_once_per_checkpoint"),
        ]
