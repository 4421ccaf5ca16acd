"""Data lifecycle (issue 20; DESIGN.md 3a; docs/security/retention.md): a tenant's data
policy, legal holds, erasure requests, the tombstones every deletion leaves, and the
four-eyes purge of tombstones.

A deletion (retention, erasure) removes a run's payloads and history in one transaction
with its ``Tombstone`` and its audit event (``services.lifecycle.purge_run_payloads``); a
legal hold stops every deletion of what it covers. Subjects (a customer id, ...) are never
stored in clear: ``RunSubject`` keeps a keyed digest of each declared identity value.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..vocab import (
    DeletionCause,
    ErasureOutcome,
    ErasureState,
    HoldScope,
    PurgeState,
    SecretsPolicy,
)
from .runs import Run
from .tenancy import Tenant, TenantOwned

#: Bounds of the policy's numbers (a value must fit its column and mean something).
RETENTION_DAYS_MAX = 36_500          # 100 years
RESTART_INTERVAL_S_MAX = 366 * 86_400
PAYLOAD_FLAG_BYTES_MAX = 2**31 - 1
#: The most runs one hold or erasure request may name (the bulk actions' bound).
LIFECYCLE_MAX_RUNS = 500
#: The most subject fields a tenant may declare, and a field name's length.
SUBJECT_FIELDS_MAX = 16
REASON_MAX = 1024  # bytes, as runifold's legal hold
#: The most tombstones one purge freezes (RUNIFOLD.md 5, tombstone governance).
TOMBSTONE_PURGE_MAX = 1000


class DataPolicy(TenantOwned):
    """A tenant's data policy (``GET``/``PUT …/data-policy``; the Data page): how long the
    payloads and history of ended runs are kept (``payload_retention_days``; ``None``:
    forever), how long effect records and their operation keys are kept
    (``effect_retention_days``; never shorter than ``restart_interval_s``, the idempotency
    window), how long tombstones are kept (``tombstone_retention_days``; ``None``: forever,
    and their purge is off), what a credential found in a payload does
    (``secrets_policy``), above which size a payload is flagged (``payload_flag_bytes``),
    and which payload fields identify a subject (``subject_fields``: name -> JSON
    pointer). A tenant without a row has the defaults (nothing deleted, secrets warned)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, primary_key=True,
                                  related_name="+")
    payload_retention_days = models.PositiveIntegerField(null=True, blank=True)
    effect_retention_days = models.PositiveIntegerField(null=True, blank=True)
    restart_interval_s = models.PositiveIntegerField(default=86_400)
    tombstone_retention_days = models.PositiveIntegerField(null=True, blank=True)
    secrets_policy = models.CharField(max_length=8, choices=SecretsPolicy.choices,
                                      default=SecretsPolicy.WARN)
    payload_flag_bytes = models.PositiveIntegerField(null=True, blank=True)
    subject_fields = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(db_default=Now())
    updated_by_name = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(effect_retention_days__isnull=True)
                | Q(effect_retention_days__gte=1),
                name="data_policy_effect_retention_positive"),
            models.CheckConstraint(condition=Q(secrets_policy__in=SecretsPolicy.values),
                                   name="data_policy_secrets_policy_valid"),
        ]

    def __str__(self) -> str:
        return f"data policy of tenant {self.tenant_id}"


class RunSubject(TenantOwned):
    """A declared identity value found in one of a run's payloads: the field's name and a
    keyed digest of its value (``services.lifecycle.subject_digest``), never the value,
    so an erasure or a hold "for every run of customer c-42" finds its runs."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    field = models.CharField(max_length=64)
    digest = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "field", "digest", "run"],
                                               name="run_subject_unique")]


class LegalHold(TenantOwned):
    """A legal hold on runs (``run_uuids``), on a subject (``subject_field`` and its
    value's ``subject_digest``) or on the whole tenant (``scope``), placed and released
    by a tenant admin with a reason; the row is kept on release. While active (no
    ``released_at``), neither retention nor erasure touches what it covers."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    uuid = models.UUIDField(help_text="the hold's public id")
    scope = models.CharField(max_length=8, choices=HoldScope.choices)
    run_uuids = models.JSONField(default=list, blank=True)
    subject_field = models.CharField(max_length=64, blank=True)
    subject_digest = models.CharField(max_length=64, blank=True)
    reason = models.TextField()
    placed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                  related_name="+")
    placed_by_name = models.CharField(max_length=150)
    placed_at = models.DateTimeField(db_default=Now())
    released_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.PROTECT, related_name="+")
    released_by_name = models.CharField(max_length=150, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-placed_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="legal_hold_unique"),
            models.CheckConstraint(condition=Q(scope__in=HoldScope.values),
                                   name="legal_hold_scope_valid"),
        ]
        indexes = [models.Index(fields=["tenant", "released_at"], name="legal_hold_active_idx")]

    @property
    def active(self) -> bool:
        """Whether the hold still stops deletions (not released)."""
        return self.released_at is None

    @property
    def runs_held(self) -> int | None:
        """How many runs the hold names or finds now: a runs hold its list's length; a
        subject hold the count its selector read (``subject_runs``, annotated by
        ``selectors.lifecycle_requests``; ``None`` when the row was read without it);
        a tenant hold ``None`` (every run of the tenant, now and later)."""
        if self.scope == HoldScope.RUNS:
            return len(self.run_uuids)
        if self.scope == HoldScope.SUBJECT:
            return getattr(self, "subject_runs", None)
        return None


class HeldRun(TenantOwned):
    """One run named by a run-scoped ``LegalHold`` (so "is this run held" is an indexed
    lookup, not a scan of every hold's list)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    hold = models.ForeignKey(LegalHold, on_delete=models.PROTECT, related_name="runs")
    run_uuid = models.UUIDField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "run_uuid", "hold"],
                                               name="held_run_unique")]


class ErasureRequest(TenantOwned):
    """A request to erase the payloads of runs (``run_uuids``) or of every run of a subject
    (``subject_field`` / ``subject_digest``), filed by a reviewer or admin with a reason,
    approved or rejected by an approver who is not the requester (a database check too),
    then executed: each run not held and ended is purged with a tombstone
    (``DeletionCause.ERASURE``); ``counts`` says how many were erased, held, skipped."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    uuid = models.UUIDField(help_text="the request's public id")
    run_uuids = models.JSONField(default=list, blank=True)
    subject_field = models.CharField(max_length=64, blank=True)
    subject_digest = models.CharField(max_length=64, blank=True)
    reason = models.TextField()
    state = models.CharField(max_length=16, choices=ErasureState.choices,
                             default=ErasureState.REQUESTED)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                     related_name="+")
    requested_by_name = models.CharField(max_length=150)
    requested_at = models.DateTimeField(db_default=Now())
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.PROTECT, related_name="+")
    decided_by_name = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    executed_at = models.DateTimeField(null=True, blank=True)
    counts = models.JSONField(default=dict, blank=True)

    #: What approving it now would do (``services.erasure_preview``'s counts), set by the
    #: reader that asked for it (the API's ``preview``, the dashboard's queue); not stored.
    preview: dict | None = None

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="erasure_request_unique"),
            models.CheckConstraint(condition=Q(state__in=ErasureState.values),
                                   name="erasure_request_state_valid"),
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=models.F("requested_by")),
                name="erasure_decider_not_requester"),
        ]

    @property
    def executed_counts(self) -> dict | None:
        """``counts`` once executed, else ``None`` (the API's ``counts``)."""
        return self.counts or None

    @property
    def outcome(self) -> str | None:
        """What the executed request did (``ErasureOutcome``, the API's ``outcome``), from
        its ``counts``: ``matched_nothing`` (no run covered), ``nothing_erased`` (every
        covered run blocked: a legal hold, not ended, an effect in doubt, already
        deleted), ``partly_erased`` or ``erased``; ``None`` before it was executed and
        for a rejected request."""
        counts = self.executed_counts
        if self.state != ErasureState.EXECUTED or counts is None:
            return None
        if not counts.get("runs"):
            return ErasureOutcome.MATCHED_NOTHING
        if not counts.get("erased"):
            return ErasureOutcome.NOTHING_ERASED
        return ErasureOutcome.PARTLY_ERASED if counts.get("blocked") else ErasureOutcome.ERASED


class Tombstone(TenantOwned):
    """What remains of a run whose payloads were deleted (RUNIFOLD.md 5, retention): ids,
    kind and version, final state, times, the policy or request that deleted it, and how
    many rows went; never a payload value. Written in the same transaction as the
    deletion; immutable (PostgreSQL refuses UPDATE; only a four-eyes ``TombstonePurge``
    deletes it). ``id`` is the cursor exports and purges count by."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    run_uuid = models.UUIDField()
    kind = models.CharField(max_length=200, blank=True)
    schema_version = models.PositiveBigIntegerField(null=True, blank=True)
    final_state = models.CharField(max_length=24)
    cause = models.CharField(max_length=16, choices=DeletionCause.choices)
    run_created_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField()
    policy = models.JSONField(default=dict, help_text="the retention policy or erasure "
                              "request that deleted it (numbers and ids only)")
    counts = models.JSONField(default=dict, help_text="rows deleted or blanked, per table")
    erasure = models.ForeignKey(ErasureRequest, null=True, blank=True,
                                on_delete=models.PROTECT, related_name="tombstones")
    subjects = models.JSONField(default=list, blank=True, help_text="[[field, digest]] of "
                                "the run's subject index when retention deleted it, so a "
                                "subject's legal hold keeps its tombstones; empty after an "
                                "erasure, which unlinks the subject")

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["tenant", "run_uuid"], name="tombstone_run_idx"),
                   models.Index(fields=["tenant", "id"], name="tombstone_cursor_idx")]
        constraints = [models.CheckConstraint(condition=Q(cause__in=DeletionCause.values),
                                              name="tombstone_cause_valid")]


class AuditExport(TenantOwned):
    """An export of a tenant's audit events and tombstones up to a watermark
    (``export_audit``: JSON Lines plus a signed manifest), kept so a tombstone purge can
    require that what it deletes was exported first. Watermarks only move forward.
    Since migration 0040 an export covers the leaves 0..``through_tree_size``-1 of the
    tenant's Merkle tree (a signed head's size); before, events by seq."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    through_seq = models.BigIntegerField(help_text="the highest audit event seq exported")
    through_tree_size = models.BigIntegerField(
        default=0, help_text="the size of the signed tree head exported: the export holds "
                             "the events of leaves 0..through_tree_size-1 (0: an export by "
                             "seq, before migration 0040)")
    through_tombstone = models.BigIntegerField(help_text="the last tombstone id exported")
    manifest_sha256 = models.CharField(max_length=64)
    exported_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-through_tombstone", "-id"]


class TombstonePurge(TenantOwned):
    """A four-eyes purge of tombstones (RUNIFOLD.md 5, tombstone governance): prepared
    (frozen cursor range and ``fingerprint``, an approval deadline), approved or rejected
    by someone else, then executed; the row is the purge's evidence (who prepared,
    approved, executed, counts, cursors, export watermark, fingerprint)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    uuid = models.UUIDField()
    state = models.CharField(max_length=16, choices=PurgeState.choices,
                             default=PurgeState.PREPARED)
    first_cursor = models.BigIntegerField()
    last_cursor = models.BigIntegerField()
    tombstone_count = models.PositiveIntegerField()
    export_through = models.BigIntegerField()
    tombstone_ids = models.JSONField(default=list, help_text="the frozen tombstones' ids, "
                                     "ascending (at most TOMBSTONE_PURGE_MAX)")
    fingerprint = models.CharField(max_length=64)
    deadline = models.DateTimeField()
    prepared_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                    related_name="+")
    prepared_at = models.DateTimeField(db_default=Now())
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.PROTECT, related_name="+")
    approved_at = models.DateTimeField(null=True, blank=True)
    rejected_reason = models.TextField(blank=True)
    executed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.PROTECT, related_name="+")
    executed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-prepared_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="tombstone_purge_unique"),
            models.CheckConstraint(condition=Q(state__in=PurgeState.values),
                                   name="tombstone_purge_state_valid"),
            models.CheckConstraint(
                condition=Q(approved_by__isnull=True) | ~Q(approved_by=models.F("prepared_by")),
                name="tombstone_purge_approver_not_preparer"),
        ]


class CleanupLease(TenantOwned):
    """The fenced cleanup lease of a tenant's retention purge (RUNIFOLD.md 5: "per-tenant
    fenced cleanup lease"; ``services.retention``): one row per tenant, held by
    ``holder`` until ``expires_at`` (database time). A purger takes it when it is free or
    expired, bumping ``token``; each of its deletions first renews it with a conditional
    ``UPDATE`` naming its token, so a purger that lost the lease (it stalled past the
    expiry and another took over) deletes nothing more. Works alike on SQLite and
    PostgreSQL (a row, not an advisory lock)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, primary_key=True,
                                  related_name="+")
    holder = models.CharField(max_length=64, blank=True)
    token = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"cleanup lease of tenant {self.tenant_id} (token {self.token})"
