"""Bulk review actions and their per-run items."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..exceptions import NotFound
from ..vocab import (
    BulkActionKind,
    BulkOutcome,
    BulkState,
)
from .audit import AuditEvent
from .tenancy import Tenant, TenantOwned

#: The most runs one bulk action may act on (issue 9, item 3): the dashboard says so next
#: to "all matching", and a bigger selection is refused (400 naming the field) before
#: anything is written. Inline in the request, 500 runs take a few seconds (docs/bulk.md).
BULK_MAX_RUNS = 500
#: The most runs one bulk action run as a stored job may act on (issue 22, item 6): a
#: selection above ``BULK_MAX_RUNS`` is not acted on in the request but stored and run by
#: a worker in batches (``jobs.bulk``; docs/bulk.md "As a stored job"). Run ids sent one
#: by one also meet the API's body limit (``RECOVERY_MAX_BODY_BYTES``: about 25,000 ids
#: at the default 1 MiB); "every run matching the filters" reaches this maximum.
BULK_JOB_MAX_RUNS = 50_000


class BulkAction(TenantOwned):
    """One bulk request of a reviewer (issue 9, item 3): the same review action on many
    runs, each run acted on by the action's own service in its own transaction
    (``services.bulk``), with one ``BulkActionItem`` per run.

    ``client_token`` is the submitter's idempotency key (the form's hidden UUID, the
    API's ``Idempotency-Key``): unique per (tenant, requester), so a resubmission finds
    this row and is answered with its results instead of acting again. ``fingerprint``
    (SHA-256 of the canonical JSON of action, reason and selection) tells a resubmission
    from a different request that reuses the token. ``selection`` is what was asked:
    ``{"run_ids": [...]}`` or ``{"filters": {...}}`` (the inbox filters, resolved once to
    at most ``BULK_MAX_RUNS`` runs). Counts are written when the last run has its result.

    Above ``BULK_MAX_RUNS`` (up to ``BULK_JOB_MAX_RUNS``) it is a stored job
    (``background``; issue 22, item 6), run like a ``MigrationJob``: ``queued``, claimed
    by a worker with a conditional UPDATE (``attempts + 1``, ``claimed_until`` on the
    database clock, moved on with each run done), re-driven by the sweep when its message
    was lost or its worker vanished, retried with back-off after an unexpected error,
    ``failed`` with ``last_error`` after ``jobs.bulk.MAX_FAILURES`` in a row. Its counts
    move on in each run's own transaction (always equal to its items'), and a reviewer may
    abort it (``aborted``, with who and why). ``targets`` is the runs a filter selection
    resolved to at submission (in order; None when ``selection`` lists them).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, uuid) starts with it
    uuid = models.UUIDField(help_text="the bulk action's public id (``id`` on the wire)")
    client_token = models.UUIDField(help_text="the submitter's idempotency key")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                     related_name="+")
    requested_by_name = models.CharField(max_length=150)
    incident_ref = models.CharField(
        max_length=AuditEvent._meta.get_field("incident_ref").max_length, null=True,
        blank=True,
        help_text="the incident the requester was working on (AuditEvent.incident_ref), "
                  "carried by every event a stored job causes as by the request's own")
    action = models.CharField(max_length=24, choices=BulkActionKind.choices)
    reason = models.TextField()
    selection = models.JSONField()
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=BulkState.choices,
                             default=BulkState.RUNNING)
    total = models.PositiveIntegerField(help_text="runs selected")
    done = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    # The stored job (issue 22, item 6); inline bulk actions keep the defaults.
    background = models.BooleanField(default=False,
                                      help_text="run by a worker (more than BULK_MAX_RUNS)")
    targets = models.JSONField(null=True, blank=True,
                               help_text="the run ids a filter selection resolved to")
    attempts = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    claimed_until = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(db_default=Now())
    aborted_by_name = models.CharField(max_length=150, blank=True)
    abort_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="bulk_job_due_idx"),
                   # The list (``selectors.bulk_list``): a tenant's newest first, one index
                   # scan stopped by the page's LIMIT.
                   models.Index(fields=["tenant", "-id"], name="bulk_tenant_newest_idx")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="bulk_unique_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "requested_by", "client_token"],
                                    name="bulk_one_per_client_token"),
            models.CheckConstraint(condition=Q(state__in=BulkState.values),
                                   name="bulk_state_valid"),
        ]

    def __str__(self) -> str:
        return f"bulk action {self.uuid} ({self.action}, {self.state})"

    @property
    def run_ids(self) -> list[str]:
        """The selected runs in order (the job's work list): ``targets`` or the ids of
        ``selection``."""
        if self.targets is not None:
            return self.targets
        return (self.selection or {}).get("run_ids") or []


class BulkActionItem(TenantOwned):
    """One run's result in a bulk action, written in the same transaction as the run's
    action when it is ``done`` (so "done" here means the action and its audit event
    committed), else right after the refusal. Unique per (bulk, run): no run is acted
    on twice by one bulk action. ``error`` is the refusal's code (``owner_live``,
    ``invalid_transition``, ``not_found``, ...), ``detail`` its plain words."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    # No index of its own: (bulk, run_uuid) starts with it.
    bulk = models.ForeignKey(BulkAction, on_delete=models.PROTECT, related_name="items",
                             db_index=False)
    position = models.PositiveIntegerField(help_text="the run's place in the selection")
    run_uuid = models.UUIDField(help_text="the run as selected (``run_id`` on the wire)")
    outcome = models.CharField(max_length=16, choices=BulkOutcome.choices)
    error = models.CharField(max_length=64, blank=True)
    detail = models.TextField(blank=True)
    # A reconcile's stored requests (``ReconcileRequest`` pks, one per in-doubt effect,
    # an effect's open request reused): the result page follows them to each run's
    # outcome (issue 21, item 8). None for the other actions and for refusals.
    reconcile_requests = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["bulk_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["bulk", "run_uuid"], name="bulk_item_once_per_run"),
        ]

    @property
    def found(self) -> bool:
        """Whether the run was found in the bulk's tenant (the result page links it)."""
        return self.error != NotFound.error
