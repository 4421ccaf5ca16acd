"""Runs, their checkpoints with revision history, refused writes (conflicts), resume
decisions, state transitions and the per-tenant state counters.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..vocab import (
    ConflictReason,
    PhaseClass,
    RecoveryState,
)
from .tenancy import Tenant, TenantOwned, TimestampedModel

MAX_REVISION = 2**63 - 1


class Run(TenantOwned, TimestampedModel):
    """One execution of an agent or workflow; owns checkpoints and effects.

    ``recovery_state`` is materialised in the same transaction as every write that changes
    it (``services.run_refresh_state``), so inbox lists are an indexed filter.
    ``last_write_at`` is never null (a run is created by its first write; the database
    clock is the default). Lists page by keyset on ``id`` (the order runs were first
    recorded), which no write changes, so a run written while someone pages is listed
    exactly once (issue 9).
    Identity columns (agent, model, workflow, definition_version) come from the kind
    registry reading the latest checkpoint.
    """

    # No index of its own: (tenant, uuid) and the inbox indexes start with it (issue 8).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runs",
                               db_index=False)
    uuid = models.UUIDField(help_text="the run's public id (``run_id`` on the wire)")
    kind = models.CharField(max_length=200, blank=True)
    # 64-bit like ``Checkpoint.schema_version``: the API takes 0..2^32-1
    # (``intranges.SCHEMA_VERSION``), which a 32-bit signed column cannot hold (issue 17).
    schema_version = models.PositiveBigIntegerField(null=True, blank=True)
    agent = models.CharField(max_length=256, blank=True)
    model = models.CharField(max_length=256, blank=True, help_text="provider/name")
    workflow = models.CharField(max_length=256, blank=True)
    definition_version = models.CharField(max_length=64, blank=True)
    phase_class = models.CharField(max_length=16, choices=PhaseClass.choices, blank=True)
    phase_label = models.CharField(max_length=256, blank=True)
    latest_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    recovery_state = models.CharField(
        max_length=24, choices=RecoveryState.choices, default=RecoveryState.HEALTHY
    )
    recovery_reason = models.CharField(max_length=256, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    last_write_at = models.DateTimeField(db_default=Now())
    lease_owner = models.CharField(max_length=256, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)
    # A reviewer ended the lease (``services.lease_revoke``): when (the expiry it set),
    # who (the username, as ``AuditEvent.actor_name``) and why; null again when a runtime
    # takes the lease again (``lease_acquire``). ``policy.lease_state`` reads them.
    # Nullable, so adding them rebuilds no table on SQLite (migration 0049).
    lease_ended_at = models.DateTimeField(null=True, blank=True)
    lease_ended_by = models.CharField(max_length=150, null=True, blank=True)
    lease_ended_reason = models.TextField(null=True, blank=True)
    unacknowledged_conflicts = models.PositiveIntegerField(default=0)
    # A reviewer closed the run (handled outside the system); cleared by its next write.
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    closed_reason = models.TextField(blank=True)
    payloads_deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="when retention or erasure deleted its payloads "
        "and history (its ``Tombstone`` says why); a deleted run takes no more writes")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="run_unique_per_tenant"),
            models.CheckConstraint(condition=Q(fencing_token__gte=0), name="run_fencing_token_gte_0"),
        ]
        indexes = [
            # Each inbox tab and ``GET …/runs?recovery_state=`` (``selectors.run_list``:
            # an index scan in the keyset's order, either way, stopped by its LIMIT), and
            # the filtered tab counts and page positions (``run_state_counts``,
            # ``run_position``). The key is ``id``, which no write changes (issue 9:
            # paging never skips); ``last_write_at`` would move a run on every write.
            models.Index(fields=["tenant", "recovery_state", "-id"], name="run_inbox_idx"),
            # The "all" tab and ``GET …/runs`` without a state.
            models.Index(fields=["tenant", "-id"], name="run_all_idx"),
            # The inbox's "2 new runs · show" poll (issue 21, item 8): the runs whose
            # state changed since the page was read, a short range at the index's end.
            models.Index(fields=["tenant", "state_changed_at"], name="run_state_changed_idx"),
        ]

    def __str__(self) -> str:
        return f"run {self.uuid}"


class Checkpoint(TenantOwned):
    """The latest accepted revision of one checkpoint envelope (runifold-core format).

    ``payload_ciphertext`` is the exact JSON text of the payload, encrypted. History lives
    in ``CheckpointRevision``, one row per accepted revision including this one.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, uuid) starts with it
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="checkpoints")
    uuid = models.UUIDField(help_text="the checkpoint's public id (``id`` on the wire)")
    revision = models.BigIntegerField()
    kind = models.CharField(max_length=200)
    schema_version = models.BigIntegerField()
    payload_ciphertext = models.TextField()
    payload_size = models.PositiveIntegerField(help_text="bytes of the payload's JSON text")
    phase_class = models.CharField(max_length=16, choices=PhaseClass.choices)
    phase_label = models.CharField(max_length=256, blank=True)
    updated_at_ms = models.BigIntegerField(help_text="writer's clock, ms since the epoch")
    usage = models.JSONField(
        default=dict, blank=True,
        help_text="the usage counters the payload's kind declares ({counter: int}, "
                  "kinds.VersionSpec.usage); {} when it declares none or is unsupported")
    received_at = models.DateTimeField(help_text="server receive time")
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    secret_paths = models.JSONField(
        default=list, db_default=models.Value([], models.JSONField()), blank=True,
        help_text="credential-like values found in the payload when written: "
                  "[{path: JSON pointer, type: word}] (checkpoints.secrets_scan; never a value)")
    large_above = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="the tenant's payload_flag_bytes the payload was above when written")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"],
                                    name="checkpoint_unique_per_tenant"),
            models.CheckConstraint(condition=Q(revision__gte=0), name="checkpoint_revision_gte_0"),
        ]
        # The report's flagged counts (``selectors.flagged_counts``): partial, so they
        # hold only the flagged checkpoints and the count reads those, not every
        # checkpoint of the tenant (issue 22, item 5: 105 ms at 100,000 runs).
        indexes = [
            models.Index(fields=["tenant", "run"], condition=~Q(secret_paths=[]),
                         name="checkpoint_secret_idx"),
            models.Index(fields=["tenant"], condition=Q(large_above__isnull=False),
                         name="checkpoint_large_idx"),
        ]

    def __str__(self) -> str:
        return f"checkpoint {self.uuid}@{self.revision}"


class CheckpointRevision(TenantOwned):
    """One accepted revision of a checkpoint, kept for the timeline and diffs."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    # No index of its own: (checkpoint, revision) starts with it, and a history page is a
    # range of that index (a second index on checkpoint alone misled the planner).
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="revisions",
                                   db_index=False)
    revision = models.BigIntegerField()
    kind = models.CharField(max_length=200)
    schema_version = models.BigIntegerField()
    payload_ciphertext = models.TextField()
    payload_size = models.PositiveIntegerField()
    phase_class = models.CharField(max_length=16, choices=PhaseClass.choices)
    phase_label = models.CharField(max_length=256, blank=True)
    updated_at_ms = models.BigIntegerField()
    usage = models.JSONField(default=dict, blank=True,
                             help_text="this revision's usage counters (as Checkpoint.usage)")
    received_at = models.DateTimeField()
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    secret_paths = models.JSONField(default=list, db_default=models.Value([], models.JSONField()),
                                    blank=True,
                                    help_text="as Checkpoint.secret_paths, for this revision")
    large_above = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["checkpoint_id", "revision"]
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "revision"],
                                    name="checkpoint_revision_unique"),
            models.CheckConstraint(condition=Q(revision__gte=0),
                                   name="checkpoint_revision_row_gte_0"),
        ]
        # The report's checkpoint sizes per kind: the revisions received in a range
        # (on PostgreSQL covering kind and payload_size, migration 0013).
        indexes = [models.Index(fields=["tenant", "received_at"],
                                name="checkpoint_revision_recv_idx")]


class CheckpointSizeRollup(TenantOwned):
    """How many revisions of ``kind`` a tenant wrote in a UTC hour (``hours = 1``) or day
    (``hours = 24``) starting at ``start``, with a payload size in ``bucket``
    (``reports.sizes.BOUNDS``), and the smallest and largest of those sizes: the report's
    checkpoint sizes read these instead of every revision (issue 22, item 5).

    Kept by a database trigger on the revision table (migration 0036), in the same
    transaction as every revision inserted, whichever code inserts it (services, the SQL
    write path, ``generate_load``). ``shard`` spreads concurrent writers of one tenant
    over ``ROLLUP_SHARDS`` rows (``pg_backend_pid()`` modulo it on PostgreSQL; 0 on
    SQLite, which has one writer), so the rollup adds no per-tenant hot row. A count of
    writes that happened, like a metric: deleting revisions (a purge, retention) does not
    take them out (docs/reports.md, "Retention").
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # the unique constraint starts with it
    hours = models.PositiveSmallIntegerField()
    start = models.DateTimeField()
    kind = models.CharField(max_length=200)
    bucket = models.PositiveSmallIntegerField()
    shard = models.PositiveSmallIntegerField()
    n = models.BigIntegerField()
    smallest = models.PositiveIntegerField()
    largest = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "hours", "start", "kind", "bucket", "shard"],
                name="checkpoint_size_rollup_unique"),
        ]


#: Rows per (tenant, hour or day, kind, bucket) of ``CheckpointSizeRollup`` and per
#: (tenant, hour or day, series, key) of ``ReportCount``.
ROLLUP_SHARDS = 8


class ReportCount(TenantOwned):
    """How many ``series`` rows with ``key`` a tenant had in a UTC hour (``hours = 1``) or
    day (``hours = 24``) starting at ``start``: ``runs_entering`` (key: the state
    entered, one per ``RunTransition``) and ``conflicts`` (key: the reason, one per
    ``Conflict``). The report's series read these instead of every row (issue 22,
    item 5).

    Kept by database triggers on the transition and conflict tables (migration 0036) in
    the same transaction as every insert, sharded like ``CheckpointSizeRollup``. Counts
    of what happened: a deleted run's transitions stay counted.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # the unique constraint starts with it
    series = models.CharField(max_length=16)
    hours = models.PositiveSmallIntegerField()
    start = models.DateTimeField()
    key = models.CharField(max_length=24)
    shard = models.PositiveSmallIntegerField()
    n = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "series", "hours", "start", "key", "shard"],
                name="report_count_unique"),
        ]


class Conflict(TenantOwned):
    """A write the store refused: kept and shown until a reviewer acknowledges it.

    ``reason``: ``stale_revision`` (the writer's expected revision was not the current
    one), ``id_exists`` (a create found the id taken) or ``fenced`` (the writer's fencing
    token was not the run's current one: a zombie owner). ``expected_revision`` is what the
    writer claimed (null on a create), ``actual_revision`` what the store held (null when
    a fenced create found nothing). The refused body is kept encrypted for inspection.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="conflicts",
                            db_index=False)  # (run, acknowledged_at) starts with it
    target_type = models.CharField(max_length=16)  # TargetType.WRITABLE
    target_uuid = models.UUIDField(help_text="the checkpoint's or effect's public id")
    reason = models.CharField(max_length=16, choices=ConflictReason.choices,
                              default=ConflictReason.STALE_REVISION)
    expected_revision = models.BigIntegerField(null=True, blank=True)
    actual_revision = models.BigIntegerField(null=True, blank=True)
    attempted_revision = models.BigIntegerField(null=True, blank=True)
    fencing_token_sent = models.BigIntegerField(null=True, blank=True)
    fencing_token_current = models.BigIntegerField(null=True, blank=True)
    writer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    writer_name = models.CharField(max_length=150)
    refused_ciphertext = models.TextField(blank=True)
    # The refused write's time on the database clock (read with the run's lock), never the
    # process clock: the report buckets conflicts by it within a database-clock window.
    created_at = models.DateTimeField()
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["run", "acknowledged_at"], name="conflict_run_ack_idx"),
            # The run page's newest conflicts (``selectors.run_detail``).
            models.Index(fields=["run", "-created_at", "-id"], name="conflict_run_new_idx"),
            # The report's open conflicts: only the open ones are in it.
            models.Index(fields=["tenant"], condition=Q(acknowledged_at__isnull=True),
                         name="conflict_open_idx"),
            # The report's conflicts over time: the tenant's conflicts made in a range.
            models.Index(fields=["tenant", "created_at"], name="conflict_tenant_new_idx"),
        ]


#: Kept for the rows written before migration 0038 (``id % COUNT_SHARDS``); since then a
#: counter row is a delta (shard 0) or a compacted sum, and nothing waits on one.
COUNT_SHARDS = 8


class StateCounter(TenantOwned):
    """Abstract base of the state counters: rows of ``tenant`` in a state is the SUM of
    ``n`` over its rows. Since migration 0038 the triggers only INSERT (a delta of +1 or
    -1 per change: ``n``), so concurrent writers of one tenant never wait on a counter
    row (issue 22, item 1), and ``counters_compact`` folds a tenant's rows into one per
    state now and then. ``shard``: the counted row's ``id % COUNT_SHARDS`` before 0038,
    0 since. Subclasses add ``state``."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, state) starts with it
    shard = models.PositiveSmallIntegerField()
    n = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class RunStateCount(StateCounter):
    """How many of a tenant's runs are in ``state``: the sum of ``n`` over its shards.

    Kept by database triggers (migrations 0011, 0038) in the same transaction as every insert,
    delete and ``recovery_state`` change of a run, whichever code makes it (services, the
    SQL write path, ``generate_load``), so the inbox counts and the report read at most
    ``COUNT_SHARDS`` rows per state instead of one index entry per run (issue 8). Nothing
    else writes it; ``tests/services/test_state_counts.py`` compares it with a count of
    the runs after every kind of change.
    """

    state = models.CharField(max_length=24)

    class Meta:
        indexes = [models.Index(fields=["tenant", "state"], name="run_state_count_idx")]


class EffectStateCount(StateCounter):
    """How many of a tenant's effects are in ``state`` (the report), kept like
    ``RunStateCount`` by triggers on the effect table (migration 0011)."""

    state = models.CharField(max_length=16)

    class Meta:
        indexes = [models.Index(fields=["tenant", "state"], name="effect_state_count_idx")]


#: Where a run's time in doubt ends (``reports.RESOLVED``, the same order: the partial
#: index below is used only for the same condition).
RESOLVED_STATES = (RecoveryState.HEALTHY, RecoveryState.COMPLETED, RecoveryState.CLOSED)


class RunTransition(TenantOwned):
    """One change of a run's ``recovery_state`` (the report's history, issue 9 item 6):
    ``from_state`` -> ``to_state`` at the database time ``at``. A run's first row has
    ``from_state == ""`` (the run was created in ``to_state``).

    Written ONLY by database triggers on the run table (migration 0013), in the same
    transaction as the insert or the ``recovery_state`` change, whichever code makes it
    (the ORM services, the SQL write path in ``services.writepath``, ``generate_load``), exactly
    like the state counters of migration 0011; nothing in Python writes it. ``at`` is the
    database clock (``CLOCK_TIMESTAMP()`` on PostgreSQL, SQLite's ``'now'`` to the
    millisecond); rows of one run are ordered by ``(at, id)``.

    Retention: a transition lives as long as its run. Deleting a run (the only deletion
    is ``services.runs._drop_if_empty``) removes its transitions (``CASCADE``); no other
    retention applies to runs today (docs/reports.md).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, at) starts with it
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="transitions",
                            db_index=False)  # (run, at) starts with it
    from_state = models.CharField(max_length=24, blank=True)
    to_state = models.CharField(max_length=24)
    at = models.DateTimeField()

    class Meta:
        indexes = [
            # The report's runs entering each state per bucket (a range of the tenant; on
            # PostgreSQL covering to_state, migration 0013).
            models.Index(fields=["tenant", "at"], name="run_transition_at_idx"),
            # Time from ambiguous to resolved: one run's transitions in order.
            models.Index(fields=["run", "at"], name="run_transition_run_idx"),
            # ... and the resolutions of a range (``reports._resolution_seconds``):
            # partial, so a range reads its resolutions, not every transition.
            models.Index(fields=["tenant", "at"], include=["run"],
                         condition=(Q(to_state__in=RESOLVED_STATES)
                                    & ~Q(from_state__in=["", *RESOLVED_STATES])),
                         name="run_transition_resolved_idx"),
        ]


class ResumeDecision(TenantOwned):
    """One claimed resume decision (``POST …/runs/{run_id}/resume``,
    ``services.resume_claim``), written in the claim's own transaction: the answer's
    ``action`` and ``reason`` (``vocab.ResumeAction``/``ResumeReason``), how old the run's
    latest checkpoint was at that moment (``checkpoint_age_ms``: the database time minus
    its ``received_at``, in milliseconds; null when the run had no checkpoint), and the
    database time ``at``. The report's resume age reads it; ``GET …/resume`` (a
    preview) writes none. Deleted with its run (``CASCADE``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, at) starts with it
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=16)
    reason = models.CharField(max_length=32)
    checkpoint_age_ms = models.BigIntegerField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "at"], name="resume_decision_at_idx")]
