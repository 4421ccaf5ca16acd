"""Side effects with their revision history (receipts encrypted: ``EncryptedReceipt``), and
retry requests.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from .. import crypto
from ..jsonparse import dumps, loads_any
from ..vocab import (
    EffectClass,
    EffectState,
    RetryState,
)
from .runs import Run
from .tenancy import Tenant, TenantOwned, TimestampedModel


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
        return loads_any(crypto.decrypt_text(token, tenant=self.tenant_id))

    @receipt.setter
    def receipt(self, value: dict | None) -> None:
        self.receipt_ciphertext = encrypt_receipt(value, tenant=self.tenant_id)

    @property
    def has_receipt(self) -> bool:
        """Whether there is a receipt (without decrypting it)."""
        return bool(self.receipt_ciphertext)


def encrypt_receipt(value: dict | None, *, tenant) -> str:
    """The ``receipt_ciphertext`` of a receipt: its canonical JSON text encrypted under
    ``tenant``'s data key (a ``Tenant`` or its id; ``crypto.encrypt_text``), or "" for
    ``None``."""
    if value is None:
        return ""
    return crypto.encrypt_text(dumps(value), tenant=tenant)


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
    secret_paths = models.JSONField(
        default=list, db_default=models.Value([], models.JSONField()), blank=True,
        help_text="credential-like values found in the request and the current receipt: "
                  "[{path: /request/... or /receipt/..., type: word}] (never a value)")

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
            # The report's flagged counts: only the effects screening flagged (partial).
            models.Index(fields=["tenant", "run"], condition=~Q(secret_paths=[]),
                         name="effect_secret_idx"),
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
    created_at = models.DateTimeField(db_default=Now())  # database clock, as the import's

    class Meta:
        ordering = ["effect_id", "revision"]
        constraints = [
            models.UniqueConstraint(fields=["effect", "revision"], name="effect_revision_unique"),
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
    # When closing the run expired the request (``services.close_locked``); an approved
    # one keeps its ``decided_at``, the approval's time.
    expired_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_fencing_token = models.BigIntegerField(null=True, blank=True)
    # What recovery cost (issue 19, item 4): the usage counters the runtime that consumed
    # the retry reported above its checkpoint's, ``{counter: int}`` (what the interrupted
    # attempt spent and the retry will spend again); {} when it sent no usage.
    usage_burnt = models.JSONField(default=dict, blank=True)
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
