"""The store: tenants, runs, checkpoints with revision history, effects, conflicts, retry
requests, API tokens and the audit log.

Nothing outside ``checkpoints.services`` writes these tables (DESIGN.md section 5). Each
row belongs to exactly one tenant, and every runtime-visible identity is (tenant, UUID):
the same UUID in two tenants is two objects (CONTRACT.md section 3).

Payloads (checkpoint payloads, refused writes, effect receipts and requests, reconcile
evidence) are stored encrypted (``checkpoints.crypto``); lists read only metadata columns.

Tenant scoping (issue 7, docs/tenancy.md). Every tenant-owned model's manager is a
``TenantQuerySet``: a query on tenant data starts with ``Model.objects.for_tenant(t)``
(one tenant, a tenant id, or the caller's tenants), or, in the few places that span
tenants by design, with ``Model.objects.for_all_tenants(reason=...)``. A related manager
(``run.effects``) is scoped by construction: its parent row was read scoped.
``tests/test_tenant_scoping_lint.py`` fails on any other start (``Model.objects.filter``,
``.get``, ``.all``, ``select_for_update`` ...) in ``checkpoints/``, and lists every
``for_all_tenants`` use with its reason.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from .vocab import (
    BulkActionKind,
    BulkOutcome,
    BulkState,
    ConflictReason,
    EffectClass,
    EffectState,
    PhaseClass,
    ReconcileState,
    RecoveryState,
    RetryState,
)

__all__ = [  # the vocabulary, re-exported for the code that imported it from here
    "ConflictReason", "EffectClass", "EffectState", "PhaseClass", "ReconcileState",
    "RecoveryState", "RetryState",
]

MAX_REVISION = 2**63 - 1


class EncryptedReceipt:
    """``receipt`` of an effect row as a JSON object (or ``None``), kept encrypted in the
    ``receipt_ciphertext`` column like a payload (CONTRACT.md 4: "effect receipts are
    treated like payloads"; issue 6, fault 3).

    Reading ``receipt`` decrypts; assigning it (also ``Model(receipt=...)`` and
    ``objects.create(receipt=...)``) encrypts. Querysets cannot filter or ``update`` on
    it: write ``receipt_ciphertext`` with ``encrypt_receipt``. Raises
    ``cryptography.fernet.InvalidToken`` when no configured key fits.
    """

    receipt_ciphertext: str

    @property
    def receipt(self) -> dict | None:
        token = self.receipt_ciphertext
        if not token:
            return None
        from . import crypto
        from .jsonparse import loads_any

        return loads_any(crypto.decrypt_text(token))

    @receipt.setter
    def receipt(self, value: dict | None) -> None:
        self.receipt_ciphertext = encrypt_receipt(value)

    @property
    def has_receipt(self) -> bool:
        """Whether there is a receipt (without decrypting it)."""
        return bool(self.receipt_ciphertext)


def encrypt_receipt(value: dict | None) -> str:
    """The ``receipt_ciphertext`` of a receipt: its canonical JSON text encrypted, or ""
    for ``None``."""
    if value is None:
        return ""
    from . import crypto
    from .jsonparse import dumps

    return crypto.encrypt_text(dumps(value))


class TenantQuerySet(models.QuerySet):
    """The queryset (and, through ``TenantManager``, the manager) of every tenant-owned
    model: the one way to start a query on tenant data."""

    def for_tenant(self, tenants) -> TenantQuerySet:
        """Rows of one tenant (a ``Tenant`` or its id) or of several (an iterable or a
        queryset of tenants or ids: the caller's tenants). Raises ``TypeError`` for
        ``None``, a bool or anything else, so a missing tenant never means "all"."""
        if isinstance(tenants, Tenant):
            return self.filter(tenant_id=tenants.pk)
        if isinstance(tenants, int) and not isinstance(tenants, bool):
            return self.filter(tenant_id=tenants)
        if isinstance(tenants, models.QuerySet):
            if tenants.model is not Tenant:
                raise TypeError(f"for_tenant: a queryset of {tenants.model.__name__}, "
                                f"not of tenants")
            return self.filter(tenant__in=tenants)
        if isinstance(tenants, list | tuple | set | frozenset):
            ids = []
            for t in tenants:
                if isinstance(t, Tenant):
                    ids.append(t.pk)
                elif isinstance(t, int) and not isinstance(t, bool):
                    ids.append(t)
                else:
                    raise TypeError(f"for_tenant: {type(t).__name__} is not a tenant")
            return self.filter(tenant_id__in=ids)
        raise TypeError(f"for_tenant: {type(tenants).__name__} is not a tenant")

    def for_all_tenants(self, *, reason: str) -> TenantQuerySet:
        """Every tenant's rows: the explicit escape hatch for what spans tenants by design
        (the sweep, re-driving and claiming reconcile jobs, key rotation). The
        ``reason`` (required, non-blank) documents the use; each one is listed with it in
        ``tests/test_tenant_scoping_lint.py``. Raises ``ValueError`` without a reason."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("for_all_tenants: a reason is required")
        return self.all()


TenantManager = models.Manager.from_queryset(TenantQuerySet)


class TenantOwned(models.Model):
    """Abstract base of every tenant-owned model: ``objects`` is a ``TenantManager``."""

    objects = TenantManager()

    class Meta:
        abstract = True


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class Tenant(TimestampedModel):
    """An organisation. Roles are django-guardian object permissions on this row.

    The custom permissions below are the only rights the service checks; a role
    (``checkpoints.roles``) is a named set of them, granted through a per-tenant group.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    ambiguity_threshold_s = models.PositiveIntegerField(
        default=300,
        help_text="A run with an in-flight checkpoint and no lease is ambiguous after this many seconds.",
    )

    class Meta:
        ordering = ["slug"]
        permissions = [
            ("view_runs", "See runs, metadata, reports and audit"),
            ("reveal_payload", "Reveal checkpoint payloads"),
            ("review_runs", "Request retry, mark unknown, reconcile, acknowledge conflicts"),
            ("approve_retry", "Approve or reject retry requests"),
            ("write_runs", "Write checkpoints and effects, take leases, ask resume decisions"),
            ("manage_roles", "Grant roles in this tenant"),
        ]

    def __str__(self) -> str:
        return self.slug


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
    unacknowledged_conflicts = models.PositiveIntegerField(default=0)
    # A reviewer closed the run (handled outside the system); cleared by its next write.
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    closed_reason = models.TextField(blank=True)

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
    received_at = models.DateTimeField(help_text="server receive time")
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"],
                                    name="checkpoint_unique_per_tenant"),
            models.CheckConstraint(condition=Q(revision__gte=0), name="checkpoint_revision_gte_0"),
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
    received_at = models.DateTimeField()
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

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


class Effect(EncryptedReceipt, TenantOwned, TimestampedModel):
    """The write-ahead record of one external side effect, keyed by ``operation_key``.

    ``(tenant, service, operation_key)`` is unique in the database: a second effect id with
    a used key is answered 409 ``operation_exists`` or 422 ``idempotency_key_reuse``.
    ``retry_authorized_by`` is set when an approved retry is consumed; only then may an
    ``unknown``/``not_executed`` effect go back to ``planned`` (attempt + 1).
    ``receipt`` is kept encrypted (``EncryptedReceipt``).
    """

    # No index of their own: (tenant, uuid) and (run, state) start with them.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="effects",
                            db_index=False)
    uuid = models.UUIDField(help_text="the effect's public id (``id`` on the wire)")
    revision = models.BigIntegerField()
    operation_key = models.CharField(max_length=512)
    service = models.CharField(max_length=200)
    effect_class = models.CharField(max_length=16, choices=EffectClass.choices)
    request_fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=EffectState.choices)
    receipt_ciphertext = models.TextField(blank=True, default="")
    attempt = models.PositiveIntegerField(default=1)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(
        null=True, blank=True,
        help_text="database time of the last move to submitted (the settle delay counts from it)")
    # The canonical request whose SHA-256 is request_fingerprint, encrypted; optional, sent
    # by runtimes that want the replay-with-the-same-key reconciler.
    request_ciphertext = models.TextField(blank=True)
    retry_authorized_by = models.ForeignKey(
        "RetryRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="effect_unique_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "service", "operation_key"],
                                    name="effect_operation_key_unique"),
            models.CheckConstraint(condition=Q(revision__gte=0), name="effect_revision_gte_0"),
        ]
        indexes = [
            models.Index(fields=["run", "state"], name="effect_run_state_idx"),
            # The report's effects per state (an index-only GROUP BY).
            models.Index(fields=["tenant", "state"], name="effect_tenant_state_idx"),
            # ``GET …/effects`` (``selectors.effect_find``), newest first, with or without
            # ``service`` (with ``operation_key`` too, ``effect_operation_key_unique``).
            models.Index(fields=["tenant", "-created_at", "-id"], name="effect_tenant_new_idx"),
            models.Index(fields=["tenant", "service", "-created_at", "-id"],
                         name="effect_service_new_idx"),
        ]

    def __str__(self) -> str:
        return f"effect {self.service}:{self.operation_key} ({self.state})"


class EffectRevision(EncryptedReceipt, TenantOwned):
    """One accepted revision of an effect record: who moved it to which state, and when
    (its ``receipt`` encrypted, as on ``Effect``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="revisions",
                               db_index=False)  # (effect, revision) starts with it
    revision = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=EffectState.choices)
    receipt_ciphertext = models.TextField(blank=True, default="")
    attempt = models.PositiveIntegerField(default=1)
    actor_name = models.CharField(max_length=150, help_text='username, or "system"')
    source = models.CharField(max_length=32, help_text="runtime, reconciliation, sweep, reviewer")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["effect_id", "revision"]
        constraints = [
            models.UniqueConstraint(fields=["effect", "revision"], name="effect_revision_unique"),
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


class RetryRequest(TenantOwned, TimestampedModel):
    """A reviewer's request to retry an in-doubt run, decided by a different approver.

    The database refuses ``decided_by == requested_by`` (four eyes), and at most one
    request per run is open (requested or approved) at a time.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, state) starts with it
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="retry_requests")
    state = models.CharField(max_length=16, choices=RetryState.choices,
                             default=RetryState.REQUESTED)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decision_reason = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_fencing_token = models.BigIntegerField(null=True, blank=True)
    # What the approver saw and accepted (services.retry_preview at approval): a consumed
    # retry re-plans only the effects this names as sent again.
    approved_preview = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="retry_requester_is_not_approver",
            ),
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(state__in=[RetryState.REQUESTED, RetryState.APPROVED]),  # OPEN
                name="retry_one_open_request_per_run",
            ),
        ]
        # The report's retry requests per state (an index-only GROUP BY).
        indexes = [models.Index(fields=["tenant", "state"], name="retry_tenant_state_idx"),
                   # The report's approvals per approver: decisions made in a range.
                   models.Index(fields=["tenant", "decided_at"], name="retry_tenant_decided_idx")]


class ApiToken(models.Model):
    """A bearer token for runtimes and scripts. Only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    prefix = models.CharField(max_length=12)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)


class AuditHashScheme(models.IntegerChoices):
    """How an audit event's ``hash`` was computed (``checkpoints.audit``).

    ``SHA256`` is the unkeyed scheme of events written before migration 0005; it is
    accepted only inside the tenant's sealed legacy range (``AuditChainHead.legacy_seq``).
    ``HMAC_SHA256`` is keyed with ``RECOVERY_AUDIT_KEYS``; ``key_id`` names the key.
    ``HMAC_SHA256_ACTOR`` (every event written since issue 17, item 13) is the same key and
    also covers the ``actor_id`` column and the scheme itself; events written before keep
    scheme 2 and verify as they were made.
    """

    SHA256 = 1, "sha256 (legacy, unkeyed)"
    HMAC_SHA256 = 2, "hmac-sha256"
    HMAC_SHA256_ACTOR = 3, "hmac-sha256, actor id covered"


class AuditEvent(TenantOwned):
    """Append-only, per-tenant hash-chained record of every action and payload reveal.

    ``actor`` is who did it (null and ``actor_name == "system"`` for the sweep and
    reconciliation); ``target_type``/``target_ref`` is what it was done to; ``run_uuid`` the
    run it concerns. ``before``/``after`` hold the changed fields. ``hash`` is
    HMAC-SHA256 (key ``key_id`` of ``RECOVERY_AUDIT_KEYS``) over the tenant, ``prev_hash``
    and the event's fields, or plain SHA-256 for events older than migration 0005
    (``hash_scheme``); ``verify_audit_chain`` recomputes it (docs/security/audit.md).
    On PostgreSQL triggers refuse UPDATE, DELETE and TRUNCATE (migrations 0002, 0005);
    SQLite has no such trigger.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, seq) starts with it
    seq = models.BigIntegerField(help_text="position in the tenant's chain, from 1")
    created_at = models.DateTimeField()
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_ref = models.CharField(
        max_length=64, help_text="what it was done to: a UUID, pk, slug or username (``target_id`` in the event JSON)")
    run_uuid = models.UUIDField(null=True, blank=True, help_text="the run's public id (``run_id`` in the event JSON)")
    reason = models.TextField(blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    hash_scheme = models.PositiveSmallIntegerField(choices=AuditHashScheme.choices)
    key_id = models.CharField(max_length=16, blank=True, default="",
                              help_text="id of the RECOVERY_AUDIT_KEYS key of the HMAC")

    class Meta:
        ordering = ["-seq"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "seq"], name="audit_seq_unique_per_tenant"),
        ]
        indexes = [
            models.Index(fields=["tenant", "run_uuid", "-seq"], name="audit_run_idx"),
            models.Index(fields=["tenant", "action", "-seq"], name="audit_action_idx"),
            models.Index(fields=["tenant", "actor_name", "-seq"], name="audit_actor_idx"),
        ]


class AuditChainHead(TenantOwned):
    """The last link of a tenant's audit chain; locked to append in order (the first lock
    of every write of its tenant: ``checkpoints/locks.py``).

    ``seq``/``last_hash`` must equal the last event's (the verifier checks it, so events
    cut from the end or added past the head are found). ``legacy_seq`` is where the
    chain's unkeyed SHA-256 events end (0: none); ``legacy_mac`` seals that position with
    an audit key (migration 0005), so unkeyed events are accepted nowhere else.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, primary_key=True,
                                  related_name="+")
    seq = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default="0" * 64)
    legacy_seq = models.BigIntegerField(default=0)
    legacy_key_id = models.CharField(max_length=16, blank=True, default="")
    legacy_mac = models.CharField(max_length=64, blank=True, default="")


class AuditTenant(models.Model):
    """The tenant registry: one row per tenant ever created (``tenant_create``), so that
    ``verify_audit_chain`` knows every tenant it must find, even one whose row, events and
    chain head were all deleted (issue 17, item 13).

    ``seq`` numbers the registrations 1, 2, ... without gaps; ``mac`` is HMAC-SHA256 with
    the audit key ``key_id`` over (seq, tenant_pk, slug, created_at), so a row cannot be
    changed, renumbered or forged without the key, and a row deleted from the middle leaves
    a gap. ``tenant_pk`` is no foreign key: the row outlives its tenant. Append-only like
    the events (PostgreSQL triggers; the app role may only SELECT and INSERT).
    """

    seq = models.BigIntegerField(unique=True, help_text="registration number, from 1")
    tenant_pk = models.BigIntegerField(unique=True, help_text="the tenant's primary key")
    slug = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    key_id = models.CharField(max_length=16)
    mac = models.CharField(max_length=64)


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
            from datetime import timedelta

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


#: Rows per (tenant, state) of the state counters: concurrent writers in one tenant whose
#: runs (effects) change state rarely wait on the same row (``id % COUNT_SHARDS``).
COUNT_SHARDS = 8


class StateCounter(TenantOwned):
    """Abstract base of the state counters: ``n`` rows of ``tenant`` in a state, in shard
    ``shard`` (``id % COUNT_SHARDS`` of the counted row). Subclasses add ``state``."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    shard = models.PositiveSmallIntegerField()
    n = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class RunStateCount(StateCounter):
    """How many of a tenant's runs are in ``state``: the sum of ``n`` over its shards.

    Kept by database triggers (migration 0011) in the same transaction as every insert,
    delete and ``recovery_state`` change of a run, whichever code makes it (services, the
    SQL write path, ``generate_load``), so the inbox counts and the report read at most
    ``COUNT_SHARDS`` rows per state instead of one index entry per run (issue 8). Nothing
    else writes it; ``tests/services/test_state_counts.py`` compares it with a count of
    the runs after every kind of change.
    """

    state = models.CharField(max_length=24)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "state", "shard"],
                                    name="run_state_count_unique"),
        ]


class EffectStateCount(StateCounter):
    """How many of a tenant's effects are in ``state`` (the report), kept like
    ``RunStateCount`` by triggers on the effect table (migration 0011)."""

    state = models.CharField(max_length=16)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "state", "shard"],
                                    name="effect_state_count_unique"),
        ]


class RunTransition(TenantOwned):
    """One change of a run's ``recovery_state`` (the report's history, issue 9 item 6):
    ``from_state`` -> ``to_state`` at the database time ``at``. A run's first row has
    ``from_state == ""`` (the run was created in ``to_state``).

    Written ONLY by database triggers on the run table (migration 0013), in the same
    transaction as the insert or the ``recovery_state`` change, whichever code makes it
    (the ORM services, the SQL write path in ``writepath``, ``generate_load``), exactly
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
#: The most runs one bulk action may act on (issue 9, item 3): the dashboard says so next
#: to "all matching", and a bigger selection is refused (400 naming the field) before
#: anything is written. Inline in the request, 500 runs take a few seconds (docs/bulk.md).
BULK_MAX_RUNS = 500


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
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, uuid) starts with it
    uuid = models.UUIDField(help_text="the bulk action's public id (``id`` on the wire)")
    client_token = models.UUIDField(help_text="the submitter's idempotency key")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                     related_name="+")
    requested_by_name = models.CharField(max_length=150)
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

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="bulk_unique_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "requested_by", "client_token"],
                                    name="bulk_one_per_client_token"),
            models.CheckConstraint(condition=Q(state__in=BulkState.values),
                                   name="bulk_state_valid"),
        ]

    def __str__(self) -> str:
        return f"bulk action {self.uuid} ({self.action}, {self.state})"


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
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["bulk_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["bulk", "run_uuid"], name="bulk_item_once_per_run"),
        ]

    @property
    def found(self) -> bool:
        """Whether the run was found in the bulk's tenant (the result page links it)."""
        from .exceptions import NotFound

        return self.error != NotFound.error


class GraphCheckpoint(TenantOwned):
    """One LangGraph checkpoint (issue 10, docs/langgraph.md): a row per checkpoint of a
    thread's namespace, kept beside the recovery checkpoint ``envelope`` of that
    (thread, namespace), whose revisions summarise the namespace's head.

    ``checkpoint_ciphertext`` is LangGraph's checkpoint JSON (channel values as the
    serializer's ``{"type", "b64"}``, never decoded here) and ``metadata_ciphertext`` its
    metadata JSON, each encrypted like a payload (the metadata apart, so a list filter
    decrypts only it). ``lg_run_id`` is ``metadata["run_id"]`` in clear (for
    ``delete_for_runs``), ``""`` when there is none. ``envelope_revision`` is the
    envelope revision the put that stored this row wrote (its answer's ``revision``).
    Unique per (tenant, thread, namespace, checkpoint id); thread, namespace and id compare
    byte-wise on PostgreSQL (collation "C", migration 0016), as Python and SQLite compare.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # the unique key and indexes start with it
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="graph_checkpoints",
                            db_index=False)  # (run, ...) is never a query of its own
    envelope = models.ForeignKey(Checkpoint, on_delete=models.PROTECT,
                                 related_name="graph_checkpoints")
    thread_id = models.CharField(max_length=256)
    checkpoint_ns = models.CharField(max_length=256, blank=True)
    checkpoint_id = models.CharField(max_length=128)
    parent_checkpoint_id = models.CharField(max_length=128, blank=True,
                                            help_text='"" when the checkpoint has no parent')
    lg_run_id = models.CharField(max_length=128, blank=True,
                                 help_text='LangGraph\'s metadata["run_id"], "" without one')
    checkpoint_ciphertext = models.TextField()
    metadata_ciphertext = models.TextField()
    payload_size = models.PositiveIntegerField(
        help_text="bytes of the checkpoint's and the metadata's JSON text")
    envelope_revision = models.BigIntegerField()
    created_at = models.DateTimeField(help_text="database time of the put")
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "thread_id", "checkpoint_ns", "checkpoint_id"],
                                    name="graph_checkpoint_unique"),
        ]
        indexes = [
            # ``GET …/langgraph/checkpoints`` without a thread: the tenant's newest first.
            models.Index(fields=["tenant", "-checkpoint_id"], name="graph_checkpoint_new_idx"),
            # ... of one thread, every namespace (the unique key orders by namespace first).
            models.Index(fields=["tenant", "thread_id", "-checkpoint_id"],
                         name="graph_checkpoint_thread_idx"),
            # ``POST …/langgraph/runs/delete``.
            models.Index(fields=["tenant", "lg_run_id"], name="graph_checkpoint_lg_run_idx"),
        ]

    def __str__(self) -> str:
        return f"graph checkpoint {self.thread_id}/{self.checkpoint_ns}/{self.checkpoint_id}"


class GraphWrite(TenantOwned):
    """One pending write of a LangGraph task on a checkpoint (``put_writes``): ``value``
    is the serializer's ``{"type", "b64"}`` JSON, encrypted (``value_ciphertext``).
    Unique per (checkpoint, task, idx); ``idx`` < 0 marks LangGraph's special channels
    (error, interrupt, scheduled, resume), which a later write replaces."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    graph_checkpoint = models.ForeignKey(GraphCheckpoint, on_delete=models.CASCADE,
                                         related_name="writes",
                                         db_index=False)  # the unique key starts with it
    task_id = models.CharField(max_length=128)
    task_path = models.CharField(max_length=1024, blank=True)
    idx = models.IntegerField()
    channel = models.CharField(max_length=256)
    value_ciphertext = models.TextField()
    value_size = models.PositiveIntegerField(help_text="bytes of the value's JSON text")
    created_at = models.DateTimeField(help_text="database time of the write")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["graph_checkpoint", "task_id", "idx"],
                                    name="graph_write_unique"),
        ]


class Heartbeat(models.Model):
    """When background work last finished, on the database clock (issue 17, items 6 and
    11; ``checkpoints.heartbeat``): one row per ``name`` (``sweep``: any stale-run sweep;
    ``sweep.celery``, ``sweep.inprocess``, ``sweep.web``: a sweep run by a Celery worker,
    the embedded in-process worker or a web process catching up; ``job``: a reconcile
    job). System-wide, not a tenant's: it names no run, no tenant, no person."""

    name = models.CharField(max_length=32, primary_key=True)
    at = models.DateTimeField(help_text="database time the work last finished")

    def __str__(self) -> str:
        return f"{self.name} at {self.at}"
