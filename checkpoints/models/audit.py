"""The audit log: keyed events, each tenant's chain head, and the tenant registry."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from .tenancy import Tenant, TenantOwned


class AuditHashScheme(models.IntegerChoices):
    """How an audit event's ``hash`` was computed (``checkpoints.audit``).

    ``SHA256`` is the unkeyed scheme of events written before migration 0005; it is
    accepted only inside the tenant's sealed legacy range (``AuditChainHead.legacy_seq``).
    ``HMAC_SHA256`` is keyed with ``RECOVERY_AUDIT_KEYS``; ``key_id`` names the key.
    ``HMAC_SHA256_ACTOR`` (every event written since issue 17, item 13) is the same key and
    also covers the ``actor_id`` column and the scheme itself; events written before keep
    scheme 2 and verify as they were made. ``HMAC_SHA256_LEAF`` (every event written since
    issue 22, item 1) is the same key over the event alone (no ``prev_hash``, no ``seq``):
    its place is its leaf in the tenant's Merkle tree (``AuditLeaf``), given by the
    sequencer after the event's transaction commits, so an append takes no per-tenant row.
    """

    SHA256 = 1, "sha256 (legacy, unkeyed)"
    HMAC_SHA256 = 2, "hmac-sha256"
    HMAC_SHA256_ACTOR = 3, "hmac-sha256, actor id covered"
    HMAC_SHA256_LEAF = 4, "hmac-sha256, Merkle leaf (no chain link)"


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
    seq = models.BigIntegerField(
        null=True, blank=True,
        help_text="the event's number in its tenant, increasing in append order: for the "
                  "chained events (schemes 1-3) their position in the chain from 1, for "
                  "scheme 4 the row's id, set by a database trigger at insert (migration "
                  "0035; never null once stored). The event's place in the Merkle tree is "
                  "its ``AuditLeaf``")
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
    incident_ref = models.CharField(
        max_length=64, null=True, blank=True,
        help_text="the incident the actor was working on (``INC-2041``), typed in the "
                  "dashboard and kept in their session (issue 21, item 10); null: none. "
                  "Covered by the hash when set (``audit.audit_fields``)")

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


class AuditPending(TenantOwned):
    """An audit event not yet integrated into its tenant's Merkle tree: the sequencer's
    queue (issue 22, item 1). A database trigger inserts the row with every event
    (migration 0035), in the event's transaction, so the queue holds exactly the
    committed events still to integrate; the sequencer deletes the rows it integrates in
    the transaction that writes their leaves. The only audit table rows are deleted from.
    ``queued_at`` is written by the database (a column default: ``STATEMENT_TIMESTAMP()``
    on PostgreSQL, SQLite's ``'now'`` to the millisecond), so the sequencer's lag
    (``audittree.integration_lag``) compares one clock with itself (CONTRACT.md 3).
    """

    event = models.OneToOneField(AuditEvent, on_delete=models.CASCADE, primary_key=True,
                                 related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, event) starts with it
    queued_at = models.DateTimeField(
        db_default=Now(), help_text="when the event was queued, database clock (the "
                                    "column default; never written by a process)")

    class Meta:
        indexes = [models.Index(fields=["tenant", "event"], name="audit_pending_idx")]


class AuditLeaf(TenantOwned):
    """Leaf ``index`` (from 0) of the tenant's Merkle tree (RFC 6962): the event it holds
    and the leaf hash, SHA-256(0x00 || leaf input) (``audit.leaf_input``). Append-only
    (PostgreSQL triggers, migration 0035)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # (tenant, index) starts with it
    index = models.BigIntegerField()
    event = models.OneToOneField(AuditEvent, on_delete=models.PROTECT, related_name="leaf")
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "index"], name="audit_leaf_unique"),
        ]


class AuditTreeNode(TenantOwned):
    """A stored inner node of the tenant's Merkle tree: the root of the perfect subtree of
    ``2**level`` leaves starting at leaf ``index * 2**level``, kept for the levels of
    ``audit.TILE_LEVELS`` once complete, so an inclusion or consistency proof reads a few
    hundred rows whatever the tree's size. Append-only (PostgreSQL triggers)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    level = models.PositiveSmallIntegerField()
    index = models.BigIntegerField()
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "level", "index"],
                                    name="audit_node_unique"),
        ]


class AuditTreeHead(TenantOwned):
    """A signed tree head: the tenant's Merkle tree of ``tree_size`` leaves has root
    ``root_hash`` (hex), signed with Ed25519 (``signature``, base64) by the key
    ``key_id`` derived from an audit key (``audit.signing_key``), at the database time
    ``created_at``. One per sequencer batch; append-only (PostgreSQL triggers). The signed
    text is a C2SP tlog checkpoint (``audit.checkpoint_text``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    tree_size = models.BigIntegerField()
    root_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    key_id = models.CharField(max_length=16)
    signature = models.CharField(max_length=128)
    frontier = models.JSONField(
        default=list, blank=True,
        help_text="the roots (hex) of the perfect subtrees the tree of tree_size leaves "
                  "splits into, largest first: where the sequencer's next batch starts. A "
                  "cache: the verifier recomputes every head's root from the leaves")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tree_size"],
                                    name="audit_tree_head_unique"),
        ]
