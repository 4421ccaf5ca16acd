"""Shapes of the API's JSON (CONTRACT.md section 3), for the OpenAPI schema and for output.

Request bodies are never parsed or validated by these serializers: the views read the raw
body with ``checkpoints.jsonparse.loads_object`` and validate it with the service layer's
``parse_envelope`` / ``parse_effect`` (CONTRACT.md section 6 is stricter than DRF). The
input serializers below only *describe* those bodies in the schema.

Output helpers (``run_json``, ``effect_json``, ...) turn model rows into the documented
dicts. Times are ISO 8601 strings (UTC); ``*_ms`` are integers, milliseconds since the epoch.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ..exceptions import Fenced, OwnerLive, StaleRevision
from ..models import AuditEvent, Checkpoint, Conflict, Effect, RetryRequest, Run
from ..vocab import (
    ConflictReason,
    EffectClass,
    EffectState,
    PhaseClass,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    ResumeAction,
    RetryOutcome,
    RetryState,
    TargetType,
)


def _words(values) -> str:
    """``"a, b or c"``: an enum's values for a help text."""
    values = list(values)
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else "".join(values)


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

class ErrorSerializer(serializers.Serializer):
    """Every error answer: a stable snake_case ``error`` word and, usually, a ``detail``
    that names the offending field (``"revision: must be an integer in 0..N"``)."""

    error = serializers.CharField()
    detail = serializers.CharField(required=False)


class ConflictErrorSerializer(serializers.Serializer):
    """412: the compare-and-swap was refused; the store holds ``current_revision``."""

    error = serializers.CharField(default=StaleRevision.error)
    current_revision = serializers.IntegerField()


class FencedErrorSerializer(serializers.Serializer):
    """409: the write carried a fencing token other than the run's current one."""

    error = serializers.CharField(default=Fenced.error)
    fencing_token = serializers.IntegerField()


class OwnerLiveSerializer(serializers.Serializer):
    """409: reconciliation refused while the run's owner is alive; it counts as gone at
    ``lease_expires_at`` (lease expiry, or last write + the ambiguity threshold)."""

    error = serializers.CharField(default=OwnerLive.error)
    detail = serializers.CharField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)


class OperationExistsSerializer(serializers.Serializer):
    """409: another effect id already holds this (service, operation_key) with the same
    fingerprint; continue with ``effect_id``."""

    error = serializers.CharField(default="operation_exists")
    effect_id = serializers.UUIDField()


# --------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------

class EnvelopeSerializer(serializers.Serializer):
    """The runifold-core checkpoint envelope (CONTRACT.md section 2), request and response."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField(min_value=0, max_value=2**63 - 1)
    kind = serializers.RegexField(r"^[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+$")
    schema_version = serializers.IntegerField(min_value=0, max_value=2**32 - 1)
    payload = serializers.JSONField()
    updated_at_ms = serializers.IntegerField(min_value=0, help_text="writer's clock, ms")


class RevisionsSerializer(serializers.Serializer):
    """One page of a checkpoint's accepted revisions, oldest first (an audited export);
    ``next`` is the URL of the following page, or null on the last."""

    results = EnvelopeSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class CheckpointMetaSerializer(serializers.Serializer):
    """A checkpoint's metadata without its payload (lists and write answers)."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField()
    kind = serializers.CharField()
    schema_version = serializers.IntegerField()
    phase_class = serializers.ChoiceField(
        choices=PhaseClass.values)
    phase_label = serializers.CharField()
    updated_at_ms = serializers.IntegerField()
    received_at = serializers.DateTimeField()
    payload_size = serializers.IntegerField(help_text="bytes of the payload's JSON text")
    written_by = serializers.CharField(allow_null=True)


def checkpoint_meta_json(cp: Checkpoint, *, run_id=None) -> dict:
    """``CheckpointMetaSerializer`` dict of a ``Checkpoint`` row (never decrypts)."""
    return {
        "id": str(cp.uuid),
        "run_id": str(run_id or cp.run.uuid),
        "revision": cp.revision,
        "kind": cp.kind,
        "schema_version": cp.schema_version,
        "phase_class": cp.phase_class,
        "phase_label": cp.phase_label,
        "updated_at_ms": cp.updated_at_ms,
        "received_at": _iso(cp.received_at),
        "payload_size": cp.payload_size,
        "written_by": cp.written_by.get_username() if cp.written_by_id else None,
    }


# --------------------------------------------------------------------------------------
# Effects
# --------------------------------------------------------------------------------------

class EffectInputSerializer(serializers.Serializer):
    """``PUT …/effects/{id}`` body (CONTRACT.md section 3, "Effects")."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField(min_value=0, max_value=2**63 - 1)
    operation_key = serializers.CharField(max_length=512)
    service = serializers.CharField(max_length=200)
    effect_class = serializers.ChoiceField(choices=EffectClass.values)
    request_fingerprint = serializers.RegexField(r"^[0-9a-fA-F]{64}$",
                                                 help_text="hex SHA-256 of the canonical request")
    state = serializers.ChoiceField(choices=EffectState.values)
    receipt = serializers.JSONField(allow_null=True, help_text="object, required for confirmed")


class EffectWriteSerializer(EffectInputSerializer):
    """The PUT body: the record, plus optionally the canonical request itself."""

    request = serializers.JSONField(
        required=False, allow_null=True,
        help_text="optional: the request object whose SHA-256 (canonical JSON: sorted keys, "
                  "no spaces, UTF-8) is request_fingerprint (400 otherwise). Stored encrypted, "
                  "never returned; lets the replay reconciler send it again with the same key")


class EffectSerializer(EffectInputSerializer):
    """An effect record as stored; the fingerprint is lower-case.

    ``receipt`` is answered only to runtimes (a role that writes and may not reveal:
    the writer), which replay it; to every other role it is ``null``, and
    ``has_receipt`` says whether there is one to reveal (``POST
    …/effects/{id}/reveal-receipt``, audited, for reviewers, approvers and admins).
    Receipts are treated like payloads (CONTRACT.md 4)."""

    receipt = serializers.JSONField(
        allow_null=True,
        help_text="the receipt object for a writer; null for other roles (see has_receipt)")
    has_receipt = serializers.BooleanField(
        help_text="whether the effect has a receipt (shown to every role; the receipt "
                  "itself only to writers or through an audited reveal)")
    attempt = serializers.IntegerField(help_text="1, +1 for each approved retry")
    state_changed_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EffectListSerializer(serializers.Serializer):
    results = EffectSerializer(many=True)


class ReceiptRevealSerializer(serializers.Serializer):
    """An effect's current receipt, revealed with a reason (one ``receipt.reveal`` audit
    event; none when there was no receipt to reveal)."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField()
    receipt = serializers.JSONField(allow_null=True)


def effect_json(effect: Effect, *, with_receipt: bool) -> dict:
    """``EffectSerializer`` dict of an ``Effect`` row (``effect.run`` must be loaded).

    ``with_receipt``: whether the caller may have the receipt unaudited
    (``permissions.receipts_in_answers``); otherwise ``receipt`` is ``None`` and the
    receipt is not even decrypted. Every caller must say which.
    """
    return {
        "id": str(effect.uuid),
        "run_id": str(effect.run.uuid),
        "revision": effect.revision,
        "operation_key": effect.operation_key,
        "service": effect.service,
        "effect_class": effect.effect_class,
        "request_fingerprint": effect.request_fingerprint,
        "state": effect.state,
        "receipt": effect.receipt if with_receipt else None,
        "has_receipt": effect.has_receipt,
        "attempt": effect.attempt,
        "state_changed_at": _iso(effect.state_changed_at),
        "created_at": _iso(effect.created_at),
        "updated_at": _iso(effect.updated_at),
    }


# --------------------------------------------------------------------------------------
# Runs, leases, resume
# --------------------------------------------------------------------------------------

class RunSerializer(serializers.Serializer):
    """A run's metadata and materialised recovery state (never a payload)."""

    run_id = serializers.UUIDField()
    tenant = serializers.CharField(help_text="tenant slug")
    kind = serializers.CharField()
    schema_version = serializers.IntegerField(allow_null=True)
    agent = serializers.CharField()
    model = serializers.CharField(help_text="provider/name")
    workflow = serializers.CharField()
    definition_version = serializers.CharField()
    phase_class = serializers.CharField()
    phase_label = serializers.CharField()
    # Every value ``Run.recovery_state`` can hold, ``closed`` included (a reviewer's close).
    recovery_state = serializers.ChoiceField(choices=RecoveryState.values)
    recovery_reason = serializers.CharField()
    state_changed_at = serializers.DateTimeField(allow_null=True)
    last_write_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    lease_owner = serializers.CharField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    fencing_token = serializers.IntegerField()
    unacknowledged_conflicts = serializers.IntegerField()


RUN_FIELDS = ("kind", "schema_version", "agent", "model", "workflow", "definition_version",
              "phase_class", "phase_label", "recovery_state", "recovery_reason",
              "lease_owner", "fencing_token", "unacknowledged_conflicts")
RUN_TIME_FIELDS = ("state_changed_at", "last_write_at", "created_at", "lease_expires_at")


def run_json(run: Run | dict, tenant_slug: str) -> dict:
    """``RunSerializer`` dict of a ``Run`` row or a ``selectors.run_list`` row."""
    get = run.get if isinstance(run, dict) else (lambda key: getattr(run, key))
    out: dict[str, Any] = {"run_id": str(get("uuid")), "tenant": tenant_slug}
    for key in RUN_FIELDS:
        out[key] = get(key)
    for key in RUN_TIME_FIELDS:
        out[key] = _iso(get(key))
    return out


class RunPageSerializer(serializers.Serializer):
    """One keyset page; ``next`` is the URL of the following page, or null on the last."""

    results = RunSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class ConflictSerializer(serializers.Serializer):
    """A refused write: ``reason`` stale_revision | id_exists | fenced
    (``expected_revision`` null for a create; ``actual_revision`` null when a fenced
    create found nothing)."""

    id = serializers.IntegerField()
    reason = serializers.ChoiceField(choices=ConflictReason.values)
    target_type = serializers.ChoiceField(choices=TargetType.WRITABLE)
    target_id = serializers.UUIDField()
    expected_revision = serializers.IntegerField(allow_null=True)
    actual_revision = serializers.IntegerField(allow_null=True)
    attempted_revision = serializers.IntegerField(allow_null=True)
    fencing_token_sent = serializers.IntegerField(allow_null=True)
    fencing_token_current = serializers.IntegerField(allow_null=True)
    writer = serializers.CharField()
    created_at = serializers.DateTimeField()


def conflict_json(c: Conflict) -> dict:
    return {
        "id": c.pk,
        "reason": c.reason,
        "target_type": c.target_type,
        "target_id": str(c.target_uuid),
        "expected_revision": c.expected_revision,
        "actual_revision": c.actual_revision,
        "attempted_revision": c.attempted_revision,
        "fencing_token_sent": c.fencing_token_sent,
        "fencing_token_current": c.fencing_token_current,
        "writer": c.writer_name,
        "created_at": _iso(c.created_at),
    }


class RetryRequestSerializer(serializers.Serializer):
    """A retry request (CONTRACT.md section 3): requested -> approved | rejected;
    approved -> consumed by the runtime's next resume call."""

    id = serializers.IntegerField()
    run_id = serializers.UUIDField()
    # A plain string (not an enum) so the schema's "state" enum stays the effect states.
    state = serializers.CharField(help_text=_words(RetryState.values))
    requested_by = serializers.CharField()
    decided_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField()
    decision_reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True)
    consumed_at = serializers.DateTimeField(allow_null=True)


def retry_json(r: RetryRequest, *, run_id=None) -> dict:
    return {
        "id": r.pk,
        "run_id": str(run_id or r.run.uuid),
        "state": r.state,
        "requested_by": r.requested_by.get_username(),
        "decided_by": r.decided_by.get_username() if r.decided_by_id else None,
        "reason": r.reason,
        "decision_reason": r.decision_reason,
        "created_at": _iso(r.created_at),
        "decided_at": _iso(r.decided_at),
        "consumed_at": _iso(r.consumed_at),
    }


class OpenReviewItemsSerializer(serializers.Serializer):
    retry_request = RetryRequestSerializer(allow_null=True,
                                           help_text="the open (requested or approved) one")
    conflicts = ConflictSerializer(many=True, help_text="unacknowledged conflicts")


class ReconcileAttemptSerializer(serializers.Serializer):
    """One look-up of a reconcile request (the evidence itself is shown on the dashboard
    to roles that may reveal payloads, audited)."""

    number = serializers.IntegerField()
    reconciler = serializers.CharField()
    answer = serializers.CharField(
        help_text=_words(ReconcileAnswer.values))
    detail = serializers.CharField()
    applied = serializers.CharField(help_text="effect state it led to, or empty")
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField()


class ReconcileRequestSerializer(serializers.Serializer):
    """A stored reconcile request: queued -> running -> done | gave_up | cancelled."""

    id = serializers.IntegerField()
    task_id = serializers.UUIDField()
    effect_id = serializers.UUIDField()
    service = serializers.CharField()
    operation_key = serializers.CharField()
    state = serializers.CharField(help_text=_words(ReconcileState.values))
    requested_by = serializers.CharField()
    attempts = serializers.IntegerField()
    failures = serializers.IntegerField(help_text="look-ups in a row that could not tell")
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()
    outcome = serializers.CharField(help_text="effect state it settled, moved_on, or empty")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    attempt_log = ReconcileAttemptSerializer(many=True)


def reconcile_request_json(r, *, attempts: bool = True) -> dict:
    open_ = r.state in ReconcileState.OPEN
    return {
        "id": r.pk,
        "task_id": str(r.task_uuid),
        "effect_id": str(r.effect.uuid),
        "service": r.effect.service,
        "operation_key": r.effect.operation_key,
        "state": r.state,
        "requested_by": r.requested_by_name,
        "attempts": r.attempts,
        "failures": r.failures,
        "next_attempt_at": _iso(r.next_attempt_at) if open_ else None,
        "last_error": r.last_error,
        "outcome": r.outcome,
        "created_at": _iso(r.created_at),
        "finished_at": _iso(r.finished_at),
        "attempt_log": [{
            "number": a.number, "reconciler": a.reconciler, "answer": a.answer,
            "detail": a.detail, "applied": a.applied, "started_at": _iso(a.started_at),
            "finished_at": _iso(a.finished_at),
        } for a in r.attempt_log.all()] if attempts else [],
    }


class RetryPreviewSerializer(serializers.Serializer):
    """What an approved retry would do to one effect (issue 5)."""

    effect_id = serializers.UUIDField()
    service = serializers.CharField()
    operation_key = serializers.CharField()
    state = serializers.CharField()
    outcome = serializers.CharField(
        help_text=f"{_words(RetryOutcome.values)}; {RetryOutcome.POSSIBLE_DUPLICATE} is what "
                  f"the approver accepts")
    words = serializers.CharField()


class RunDetailSerializer(serializers.Serializer):
    run = RunSerializer()
    checkpoints = CheckpointMetaSerializer(many=True, help_text="latest revision of each")
    effects = EffectSerializer(many=True)
    open_review_items = OpenReviewItemsSerializer()
    reconcile_requests = ReconcileRequestSerializer(many=True, help_text="newest first")
    retry_preview = RetryPreviewSerializer(many=True)


class LeaseInputSerializer(serializers.Serializer):
    owner = serializers.CharField(max_length=256)
    ttl_s = serializers.IntegerField(min_value=1, max_value=86400)


class LeaseSerializer(serializers.Serializer):
    fencing_token = serializers.IntegerField()
    expires_at = serializers.DateTimeField()


class ResumeSerializer(serializers.Serializer):
    """The resume decision (CONTRACT.md section 3)."""

    action = serializers.ChoiceField(choices=ResumeAction.values)
    reason = serializers.CharField(help_text="stable snake_case word, e.g. in_flight")
    checkpoint_id = serializers.UUIDField(allow_null=True)
    revision = serializers.IntegerField(allow_null=True)
    fencing_token = serializers.IntegerField()


# --------------------------------------------------------------------------------------
# Review actions, audit, report
# --------------------------------------------------------------------------------------

class ReasonSerializer(serializers.Serializer):
    """Body of every review action; a non-blank reason (at most 4000 characters)."""

    reason = serializers.CharField(max_length=4000)


class TaskSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    queued = serializers.BooleanField(
        help_text="false when the task queue was unavailable: the requests are stored and "
                  "run when the worker is back")
    detail = serializers.CharField()
    requests = ReconcileRequestSerializer(many=True)


class ResumeInputSerializer(serializers.Serializer):
    agent = serializers.CharField(required=False)
    model = serializers.CharField(required=False, help_text="provider/name")
    workflow = serializers.CharField(required=False)
    definition_version = serializers.CharField(required=False)


class ClosedSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    recovery_state = serializers.CharField()
    closed_at = serializers.DateTimeField()
    closed_by = serializers.CharField()


class AcknowledgedSerializer(serializers.Serializer):
    acknowledged = serializers.IntegerField(help_text="how many conflicts were acknowledged")


class AuditEventSerializer(serializers.Serializer):
    """An audit event exactly as CONTRACT.md section 3 lists it."""

    id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    actor = serializers.CharField(help_text='username, or "system"')
    action = serializers.CharField()
    target_type = serializers.CharField()
    target_id = serializers.CharField()
    run_id = serializers.UUIDField(allow_null=True)
    reason = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)


def audit_json(e: AuditEvent) -> dict:
    return {
        "id": e.pk,
        "created_at": _iso(e.created_at),
        "actor": e.actor_name,
        "action": e.action,
        "target_type": e.target_type,
        "target_id": e.target_ref,
        "run_id": str(e.run_uuid) if e.run_uuid else None,
        "reason": e.reason,
        "before": e.before,
        "after": e.after,
    }


class AuditPageSerializer(serializers.Serializer):
    """Newest first; ``next`` pages backwards (``before_seq``), null on the last page."""

    results = AuditEventSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class ReportSerializer(serializers.Serializer):
    runs = serializers.DictField(child=serializers.IntegerField(),
                                 help_text="recovery_state -> number of runs")
    effects = serializers.DictField(child=serializers.IntegerField(),
                                    help_text="effect state -> number")
    retry_requests = serializers.DictField(child=serializers.IntegerField())
    open_conflicts = serializers.IntegerField()
