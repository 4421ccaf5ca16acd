"""Shapes of the API's JSON (CONTRACT.md section 3), for the OpenAPI schema and for output.

Each answer's shape is written once, as an ``Answer`` serializer: drf-spectacular reads
its fields for the schema, and the view renders the answer with it
(``RunSerializer.render(run, tenant=t)``), so the schema and the wire cannot drift apart.
Error bodies too (``ErrorSerializer`` and the four specific ones; ``error_body`` picks
the one for a domain error). ``tests/conftest.py`` validates every answer of the test
suite against the served schema.

Request bodies are never parsed or validated by these serializers: the views read the raw
body with ``checkpoints.jsonparse.loads_object`` and validate it with the service layer's
``parse_envelope`` / ``parse_effect`` (CONTRACT.md section 6 is stricter than DRF). The
input serializers below only *describe* those bodies in the schema.

Times are ISO 8601 strings as Python writes them (UTC, ``+00:00``); ``*_ms`` are integers,
milliseconds since the epoch.
"""

from __future__ import annotations

import threading

from rest_framework import serializers

from .. import exceptions, intranges
from ..models import BULK_MAX_RUNS
from ..vocab import (
    BulkActionKind,
    BulkOutcome,
    BulkState,
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


class Answer(serializers.Serializer):
    """Base of every answer's shape (output only): its fields are the one definition of
    the answer's keys (in order), types and nulls, for the schema and for ``render``.

    Field values come from the instance's attribute or key of the field's name (or
    ``source``; dotted paths follow relations), ``None`` is always written as ``null``.
    Keyword arguments of ``render`` are the serializer's context (e.g. ``tenant`` for
    ``RunSerializer``, ``receipts`` for ``EffectSerializer``), passed on to nested shapes.
    """

    @classmethod
    def render(cls, instance, **context) -> dict:
        """The answer's dict for ``instance`` (a model row, an object or a dict).

        Uses one bound serializer per class and thread (``_bound``): building one per
        answer deep-copies every field, about 50 times the cost of rendering a
        checkpoint's metadata, on the write path."""
        serializer = cls._bound()
        serializer._context = context
        try:
            return serializer.to_representation(instance)
        finally:
            serializer._context = {}

    @classmethod
    def _bound(cls) -> Answer:
        cache = _BOUND.__dict__.setdefault("serializers", {})
        serializer = cache.get(cls)
        if serializer is None:
            serializer = cache[cls] = cls()
            serializer.fields  # noqa: B018 - bind the fields once
        return serializer


#: Per thread: one bound serializer of each ``Answer`` class (``Answer.render``).
_BOUND = threading.local()


class IsoDateTimeField(serializers.DateTimeField):
    """A time as ``datetime.isoformat()`` writes it (``2025-01-02T03:04:05.123456+00:00``),
    the API's format since version 1 (DRF's own would write ``Z`` and convert zones). A
    string is taken as already formatted."""

    def to_representation(self, value):
        return value if isinstance(value, str) else value.isoformat()


def error_word(word: str) -> serializers.ChoiceField:
    """The ``error`` of a specific error body: always ``word`` (an enum of one in the
    schema), so that a client can tell the bodies of one status apart."""
    return serializers.ChoiceField(choices=[word])


class TenantSlugField(serializers.CharField):
    """The slug of the answer's tenant, from the context's ``tenant`` (a ``Tenant``)."""

    def get_attribute(self, instance):
        return self.context["tenant"].slug


class RunUuidField(serializers.UUIDField):
    """The UUID of the row's run: the context's ``run_id`` when the caller knows it (it
    then saves loading the run; every row of such an answer belongs to that run), else
    ``instance.run.uuid``."""

    def __init__(self, **kwargs):
        kwargs.setdefault("source", "run.uuid")
        super().__init__(**kwargs)

    def get_attribute(self, instance):
        run_id = self.context.get("run_id")
        return run_id if run_id is not None else super().get_attribute(instance)


class WriterReceiptField(serializers.JSONField):
    """An effect's receipt when the context's ``receipts`` is true
    (``permissions.receipts_in_answers``), else ``None`` without decrypting it. Every
    caller must say which: a missing ``receipts`` is a ``KeyError``."""

    def get_attribute(self, instance):
        if not self.context["receipts"]:
            return None
        return super().get_attribute(instance)


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

# Rendered from a ``DomainError`` (its ``error`` and ``detail``) or a dict; an empty
# ``detail`` is left out.
class ErrorSerializer(Answer):
    """Every error answer: a stable snake_case ``error`` word and, usually, a ``detail``
    that names the offending field (``"revision: must be an integer in 0..N"``)."""

    error = serializers.CharField()
    detail = serializers.CharField(required=False)

    def to_representation(self, instance):
        out = super().to_representation(instance)
        if not out.get("detail", True):
            del out["detail"]
        return out


class ConflictErrorSerializer(Answer):
    """412: the compare-and-swap was refused; the store holds ``current_revision``."""

    error = error_word("conflict")
    current_revision = serializers.IntegerField()


class FencedErrorSerializer(Answer):
    """409: the write carried a fencing token other than the run's current one."""

    error = error_word("fenced")
    fencing_token = serializers.IntegerField(source="extra.fencing_token")


class OwnerLiveSerializer(Answer):
    """409: reconciliation refused while the run's owner is alive; it counts as gone at
    ``lease_expires_at`` (lease expiry, or last write + the ambiguity threshold)."""

    error = error_word("owner_live")
    detail = serializers.CharField()
    lease_expires_at = IsoDateTimeField(source="extra.lease_expires_at", allow_null=True)


class OperationExistsSerializer(Answer):
    """409: another effect id already holds this (service, operation_key) with the same
    fingerprint; continue with ``effect_id``."""

    error = error_word("operation_exists")
    effect_id = serializers.UUIDField(source="extra.effect_id")


class ThreadConflictSerializer(Answer):
    """412 of a LangGraph put or copy (docs/langgraph.md): refused and kept as a conflict;
    ``current_revision`` is the namespace envelope's revision and ``head_checkpoint_id``
    LangGraph's id of its newest checkpoint (both null when it has none)."""

    error = error_word("conflict")
    current_revision = serializers.IntegerField(allow_null=True)
    head_checkpoint_id = serializers.CharField(allow_null=True)
    detail = serializers.CharField()


#: The body of each domain error that has its own shape; every other one is an
#: ``ErrorSerializer``.
ERROR_SHAPES: dict[type[exceptions.DomainError], type[Answer]] = {
    exceptions.StaleRevision: ConflictErrorSerializer,
    exceptions.ThreadConflict: ThreadConflictSerializer,
    exceptions.Fenced: FencedErrorSerializer,
    exceptions.OwnerLive: OwnerLiveSerializer,
    exceptions.OperationExists: OperationExistsSerializer,
}


def error_body(exc: exceptions.DomainError) -> dict:
    """The JSON body of a domain error, in the shape ``ERROR_SHAPES`` gives its class."""
    return ERROR_SHAPES.get(type(exc), ErrorSerializer).render(exc)


# --------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------

# Rendered from ``services.checkpoint_envelope``'s dict.
class EnvelopeSerializer(Answer):
    """The runifold-core checkpoint envelope (CONTRACT.md section 2), request and response."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField(**intranges.REVISION.field_kwargs())
    kind = serializers.RegexField(r"^[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+$")
    schema_version = serializers.IntegerField(**intranges.SCHEMA_VERSION.field_kwargs())
    payload = serializers.JSONField()
    updated_at_ms = serializers.IntegerField(**intranges.UPDATED_AT_MS.field_kwargs(),
                                             help_text="writer's clock, ms")


class RevisionsSerializer(Answer):
    """One page of a checkpoint's accepted revisions, oldest first (an audited export);
    ``next`` is the URL of the following page, or null on the last."""

    results = EnvelopeSerializer(many=True)
    next = serializers.URLField(allow_null=True)


# Rendered from a ``Checkpoint`` row (never decrypts); ``run`` and ``written_by`` loaded,
# set or (``run_id=``) given, else each costs a query.
class CheckpointMetaSerializer(Answer):
    """A checkpoint's metadata without its payload (lists and write answers)."""

    id = serializers.UUIDField(source="uuid")
    run_id = RunUuidField()
    revision = serializers.IntegerField()
    kind = serializers.CharField()
    schema_version = serializers.IntegerField()
    phase_class = serializers.ChoiceField(
        choices=PhaseClass.values)
    phase_label = serializers.CharField()
    updated_at_ms = serializers.IntegerField()
    received_at = IsoDateTimeField()
    payload_size = serializers.IntegerField(help_text="bytes of the payload's JSON text")
    written_by = serializers.CharField(source="written_by.get_username", allow_null=True)


# --------------------------------------------------------------------------------------
# Effects
# --------------------------------------------------------------------------------------

class EffectInputSerializer(serializers.Serializer):
    """``PUT …/effects/{id}`` body (CONTRACT.md section 3, "Effects")."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField(**intranges.REVISION.field_kwargs())
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


# Rendered from an ``Effect`` row (``run`` loaded or set) with ``receipts=`` true or false
# (``permissions.receipts_in_answers``).
class EffectSerializer(Answer, EffectInputSerializer):
    """An effect record as stored; the fingerprint is lower-case.

    ``receipt`` is answered only to runtimes (a role that writes and may not reveal:
    the writer), which replay it; to every other role it is ``null``, and
    ``has_receipt`` says whether there is one to reveal (``POST
    …/effects/{id}/reveal-receipt``, audited, for reviewers, approvers and admins).
    Receipts are treated like payloads (CONTRACT.md 4)."""

    id = serializers.UUIDField(source="uuid")
    run_id = RunUuidField()
    receipt = WriterReceiptField(
        allow_null=True,
        help_text="the receipt object for a writer; null for other roles (see has_receipt)")
    has_receipt = serializers.BooleanField(
        help_text="whether the effect has a receipt (shown to every role; the receipt "
                  "itself only to writers or through an audited reveal)")
    attempt = serializers.IntegerField(help_text="1, +1 for each approved retry")
    state_changed_at = IsoDateTimeField(allow_null=True)
    created_at = IsoDateTimeField()
    updated_at = IsoDateTimeField()


class EffectListSerializer(Answer):
    """The effects found (at most ``limit``)."""

    results = EffectSerializer(many=True)


# Rendered from ``services.receipt_reveal``'s dict.
class ReceiptRevealSerializer(Answer):
    """An effect's current receipt, revealed with a reason (one ``receipt.reveal`` audit
    event; none when there was no receipt to reveal)."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField()
    receipt = serializers.JSONField(allow_null=True)


# --------------------------------------------------------------------------------------
# Runs, leases, resume
# --------------------------------------------------------------------------------------

#: Every value ``Run.recovery_state`` can hold, ``closed`` included (a reviewer's close).
RECOVERY_STATES = list(RecoveryState.values)


# Rendered from a ``Run`` row or a ``selectors.run_list`` row, with ``tenant=`` its Tenant.
class RunSerializer(Answer):
    """A run's metadata and materialised recovery state (never a payload)."""

    run_id = serializers.UUIDField(source="uuid")
    tenant = TenantSlugField(help_text="tenant slug")
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
    lease_owner = serializers.CharField()
    fencing_token = serializers.IntegerField()
    unacknowledged_conflicts = serializers.IntegerField()
    state_changed_at = IsoDateTimeField(allow_null=True)
    last_write_at = IsoDateTimeField(allow_null=True)
    created_at = IsoDateTimeField()
    lease_expires_at = IsoDateTimeField(allow_null=True)


class RunPageSerializer(Answer):
    """One keyset page; ``next`` is the URL of the following page, or null on the last;
    ``previous`` the URL of the page before, or null on the first."""

    results = RunSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


# Rendered from a ``Conflict`` row.
class ConflictSerializer(Answer):
    """A refused write: ``reason`` stale_revision | id_exists | fenced
    (``expected_revision`` null for a create; ``actual_revision`` null when a fenced
    create found nothing)."""

    id = serializers.IntegerField(source="pk")
    reason = serializers.ChoiceField(choices=ConflictReason.values)
    target_type = serializers.ChoiceField(choices=TargetType.WRITABLE)
    target_id = serializers.UUIDField(source="target_uuid")
    expected_revision = serializers.IntegerField(allow_null=True)
    actual_revision = serializers.IntegerField(allow_null=True)
    attempted_revision = serializers.IntegerField(allow_null=True)
    fencing_token_sent = serializers.IntegerField(allow_null=True)
    fencing_token_current = serializers.IntegerField(allow_null=True)
    writer = serializers.CharField(source="writer_name")
    created_at = IsoDateTimeField()


# Rendered from a ``RetryRequest`` row (``run``, ``requested_by``, ``decided_by`` loaded,
# set or, for ``run``, ``run_id=`` given; else each costs a query).
class RetryRequestSerializer(Answer):
    """A retry request (CONTRACT.md section 3): requested -> approved | rejected;
    approved -> consumed by the runtime's next resume call."""

    id = serializers.IntegerField(source="pk")
    run_id = RunUuidField()
    # A plain string (not an enum) so the schema's "state" enum stays the effect states.
    state = serializers.CharField(help_text=_words(RetryState.values))
    requested_by = serializers.CharField(source="requested_by.get_username")
    decided_by = serializers.CharField(source="decided_by.get_username", allow_null=True)
    reason = serializers.CharField()
    decision_reason = serializers.CharField()
    created_at = IsoDateTimeField()
    decided_at = IsoDateTimeField(allow_null=True)
    consumed_at = IsoDateTimeField(allow_null=True)


class OpenReviewItemsSerializer(Answer):
    """What awaits a decision on the run: its open retry request and its unacknowledged
    conflicts."""

    retry_request = RetryRequestSerializer(allow_null=True,
                                           help_text="the open (requested or approved) one")
    conflicts = ConflictSerializer(many=True, help_text="unacknowledged conflicts")


class ReconcileAttemptSerializer(Answer):
    """One look-up of a reconcile request (the evidence itself is shown on the dashboard
    to roles that may reveal payloads, audited)."""

    number = serializers.IntegerField()
    reconciler = serializers.CharField()
    answer = serializers.CharField(
        help_text=_words(ReconcileAnswer.values))
    detail = serializers.CharField()
    applied = serializers.CharField(help_text="effect state it led to, or empty")
    started_at = IsoDateTimeField()
    finished_at = IsoDateTimeField()


# Rendered from a ``ReconcileRequest`` row (``effect`` loaded, ``attempt_log`` prefetched:
# ``reconciliation.requests_for_run`` / ``request_get``).
class ReconcileRequestSerializer(Answer):
    """A stored reconcile request: queued -> running -> done | gave_up | cancelled;
    ``next_attempt_at`` is null once it is no longer queued or running."""

    id = serializers.IntegerField(source="pk")
    task_id = serializers.UUIDField(source="task_uuid")
    effect_id = serializers.UUIDField(source="effect.uuid")
    service = serializers.CharField(source="effect.service")
    operation_key = serializers.CharField(source="effect.operation_key")
    state = serializers.CharField(help_text=_words(ReconcileState.values))
    requested_by = serializers.CharField(source="requested_by_name")
    attempts = serializers.IntegerField()
    failures = serializers.IntegerField(help_text="look-ups in a row that could not tell")
    next_attempt_at = IsoDateTimeField(allow_null=True)
    last_error = serializers.CharField()
    outcome = serializers.CharField(help_text="effect state it settled, moved_on, or empty")
    created_at = IsoDateTimeField()
    finished_at = IsoDateTimeField(allow_null=True)
    waiting_for_worker_since = IsoDateTimeField(
        allow_null=True, read_only=True,
        help_text="open and waiting for a worker since then (its worker died, or none took "
                  "it): the next stale-run sweep sends it again; null otherwise")
    attempt_log = ReconcileAttemptSerializer(many=True)

    def to_representation(self, instance):
        out = super().to_representation(instance)
        if out["state"] not in ReconcileState.OPEN:
            out["next_attempt_at"] = None
        return out


# Rendered from a row of ``services.retry_preview``.
class RetryPreviewSerializer(Answer):
    """What an approved retry would do to one effect (issue 5)."""

    effect_id = serializers.UUIDField()
    service = serializers.CharField()
    operation_key = serializers.CharField()
    state = serializers.CharField()
    outcome = serializers.CharField(
        help_text=f"{_words(RetryOutcome.values)}; {RetryOutcome.POSSIBLE_DUPLICATE} is what "
                  f"the approver accepts")
    words = serializers.CharField()


# Rendered from a dict of the rows, with ``tenant=``, ``receipts=`` and ``run_id=``.
class RunDetailSerializer(Answer):
    """A run, its latest checkpoints (metadata), effects, open review items, reconcile
    requests, and what an approved retry would do to each effect."""


    run = RunSerializer()
    checkpoints = CheckpointMetaSerializer(many=True, help_text="latest revision of each")
    effects = EffectSerializer(many=True)
    open_review_items = OpenReviewItemsSerializer()
    reconcile_requests = ReconcileRequestSerializer(many=True, help_text="newest first")
    retry_preview = RetryPreviewSerializer(many=True)


class LeaseInputSerializer(serializers.Serializer):
    owner = serializers.CharField(max_length=256)
    ttl_s = serializers.IntegerField(**intranges.LEASE_TTL_S.field_kwargs())


# Rendered from the ``Run`` row.
class LeaseSerializer(Answer):
    """The run's lease: the owner's fencing token and when the lease expires."""


    fencing_token = serializers.IntegerField()
    expires_at = IsoDateTimeField(source="lease_expires_at")


# Rendered from ``services.resume_preview`` / ``resume_claim``.
class ResumeSerializer(Answer):
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


# Rendered from a dict of ``reconciliation.run_reconcile``'s answer and the stored requests.
class TaskSerializer(Answer):
    """Reconciliation requested: the task and the stored requests it runs."""


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


# Rendered from the ``Run`` row (``closed_by`` set).
class ClosedSerializer(Answer):
    """A run a reviewer closed (it stays closed until its next write)."""


    run_id = serializers.UUIDField(source="uuid")
    recovery_state = serializers.CharField()
    closed_at = IsoDateTimeField()
    closed_by = serializers.CharField(source="closed_by.get_username")


class AcknowledgedSerializer(Answer):
    """How many of the run's open conflicts the call acknowledged."""

    acknowledged = serializers.IntegerField(help_text="how many conflicts were acknowledged")


# Rendered from an ``AuditEvent`` row.
class AuditEventSerializer(Answer):
    """An audit event exactly as CONTRACT.md section 3 lists it."""

    id = serializers.IntegerField(source="pk")
    created_at = IsoDateTimeField()
    actor = serializers.CharField(source="actor_name", help_text='username, or "system"')
    action = serializers.CharField()
    target_type = serializers.CharField()
    target_id = serializers.CharField(source="target_ref")
    run_id = serializers.UUIDField(source="run_uuid", allow_null=True)
    reason = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)


class AuditPageSerializer(Answer):
    """Newest first; ``next`` pages backwards (``before_seq``), null on the last page."""

    results = AuditEventSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class ReportRangeSerializer(Answer):
    """The report's range: ``[from, to)`` and the bucket size of its series."""

    name = serializers.ChoiceField(choices=["24h", "7d", "30d", "custom"])
    # ``from`` is a keyword: the field is declared by name.
    locals()["from"] = IsoDateTimeField()
    to = IsoDateTimeField()
    bucket = serializers.ChoiceField(choices=["hour", "day"])


class StatsSerializer(Answer):
    """How many values, their median, 95th percentile (``PERCENTILE_CONT``: linear
    interpolation) and maximum; null without values."""

    n = serializers.IntegerField()
    p50 = serializers.FloatField(allow_null=True)
    p95 = serializers.FloatField(allow_null=True)
    max = serializers.FloatField(allow_null=True)


class ApprovalsSerializer(Answer):
    """One approver's decisions in the range."""

    approved = serializers.IntegerField()
    rejected = serializers.IntegerField()


def _series(help_text: str) -> serializers.DictField:
    return serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()),
        help_text=help_text + "; one count per bucket, in the order of buckets")


# Rendered from ``selectors.report`` merged with ``reports.figures``.
class ReportSerializer(Answer):
    """Tenant numbers now, and the report's figures over a range (``checkpoints.reports``;
    docs/reports.md)."""


    runs = serializers.DictField(child=serializers.IntegerField(),
                                 help_text="recovery_state -> number of runs")
    effects = serializers.DictField(child=serializers.IntegerField(),
                                    help_text="effect state -> number")
    retry_requests = serializers.DictField(child=serializers.IntegerField())
    open_conflicts = serializers.IntegerField()
    as_of = IsoDateTimeField(help_text="the database time the figures were read at")
    range = ReportRangeSerializer()
    buckets = serializers.ListField(child=IsoDateTimeField(),
                                    help_text="the start of every bucket (UTC)")
    runs_entering = _series("recovery_state -> runs entering it (a creation counts)")
    schema_mismatches = serializers.ListField(
        child=serializers.IntegerField(), help_text="runs entering schema_mismatch per bucket")
    conflicts = _series("conflict reason -> refused writes")
    reconcile_outcomes = _series("outcome (the effect state settled, moved_on, gave_up or "
                                 "cancelled) -> reconcile requests finished")
    reconcile_answers = _series("look-up answer -> look-ups made")
    time_to_resolve_s = StatsSerializer(
        help_text="seconds from entering ambiguous/unknown_outcome to healthy, completed "
                  "or closed, of the resolutions in the range")
    resume_age_ms = serializers.DictField(
        child=StatsSerializer(),
        help_text="resume action -> age in ms of the latest checkpoint at claimed resumes")
    checkpoint_size_bytes = serializers.DictField(
        child=StatsSerializer(), help_text="kind -> payload bytes of the revisions accepted")
    approvals = serializers.DictField(child=ApprovalsSerializer(),
                                      help_text="approver's username -> decisions")


# --------------------------------------------------------------------------------------
# Bulk actions (issue 9, item 3)
# --------------------------------------------------------------------------------------

class BulkFiltersSerializer(Answer):
    """The inbox filters a bulk action was asked for ("every run matching"), as in
    ``GET …/runs``; null means not filtered on."""

    recovery_state = serializers.ChoiceField(choices=RecoveryState.values, allow_null=True)
    kind = serializers.CharField(allow_null=True, max_length=200)
    subject = serializers.CharField(allow_null=True, max_length=256,
                                    help_text="agent or workflow name contains (any case)")
    age_s_min = serializers.IntegerField(allow_null=True, min_value=0, max_value=10**9,
                                         help_text="last write at least this many seconds ago")
    q = serializers.CharField(allow_null=True, required=False, max_length=512,
                              help_text="the search, as GET …/runs?q= reads it")


class BulkActionInputSerializer(serializers.Serializer):
    """Describes the body of ``POST …/bulk-actions`` (validated by ``services.bulk_submit``
    and the view; 400 naming the field): ``runs`` (or its older name ``run_ids``) or
    ``filters``, one of the two."""

    action = serializers.ChoiceField(choices=BulkActionKind.values)
    reason = serializers.CharField(max_length=4000)
    runs = serializers.ListField(child=serializers.UUIDField(), required=False,
                                 min_length=1, max_length=BULK_MAX_RUNS,
                                 help_text="the selected run ids (CONTRACT.md 3)")
    run_ids = serializers.ListField(child=serializers.UUIDField(), required=False,
                                    min_length=1, max_length=BULK_MAX_RUNS,
                                    help_text="the older name of `runs` (one of the two)")
    filters = BulkFiltersSerializer(required=False)
    client_token = serializers.UUIDField(
        required=False, help_text="idempotency key; or the Idempotency-Key header (if both, "
                                  "they must be equal)")


# Rendered from a ``BulkActionItem`` row.
class BulkResultSerializer(Answer):
    """One run's result: ``done`` (acted on, audited with the bulk id), ``refused`` (its
    rule refused it: nothing written; ``error`` is the code the single action answers,
    e.g. owner_live, invalid_transition, not_found) or ``failed`` (unexpected, rolled
    back)."""

    run_id = serializers.UUIDField(source="run_uuid")
    outcome = serializers.ChoiceField(choices=BulkOutcome.values)
    error = serializers.CharField(help_text="the refusal's code; empty when done")
    detail = serializers.CharField(help_text="what happened, in words")


# Rendered from a ``selectors.BulkResult``.
class BulkActionSerializer(Answer):
    """A bulk action and its per-run results, in selection order."""

    id = serializers.UUIDField(source="bulk.uuid")
    action = serializers.ChoiceField(source="bulk.action", choices=BulkActionKind.values)
    reason = serializers.CharField(source="bulk.reason")
    state = serializers.ChoiceField(source="bulk.state", choices=BulkState.values)
    requested_by = serializers.CharField(source="bulk.requested_by_name")
    client_token = serializers.UUIDField(
        allow_null=True, help_text="the requester's idempotency key, shown to the requester "
                                   "only (null for everyone else)")
    created_at = IsoDateTimeField(source="bulk.created_at")
    finished_at = IsoDateTimeField(source="bulk.finished_at", allow_null=True)
    filters = BulkFiltersSerializer(allow_null=True, help_text="null when runs were selected "
                                                               "by id")
    total = serializers.IntegerField(source="bulk.total", help_text="runs selected")
    done = serializers.IntegerField()
    refused = serializers.IntegerField()
    failed = serializers.IntegerField()
    pending = serializers.IntegerField(help_text="runs without a result yet (while running)")
    results = BulkResultSerializer(source="items", many=True)


# --------------------------------------------------------------------------------------
# LangGraph threads (issue 10, docs/langgraph.md)
# --------------------------------------------------------------------------------------

class TypedValueSerializer(serializers.Serializer):
    """A value as LangGraph's serializer wrote it (``dumps_typed``): its type tag and its
    bytes in standard base64. The server never decodes it."""

    type = serializers.CharField(max_length=64)
    b64 = serializers.CharField(allow_blank=True)


class GraphPutInputSerializer(serializers.Serializer):
    """``POST …/langgraph/checkpoints`` body."""

    thread_id = serializers.CharField(max_length=256)
    checkpoint_ns = serializers.CharField(max_length=256, allow_blank=True, required=False,
                                          help_text='default ""')
    parent_checkpoint_id = serializers.CharField(max_length=128, allow_null=True,
                                                 required=False)
    checkpoint = serializers.JSONField(
        help_text="LangGraph's checkpoint: id, v, ts, channel_values ({channel: "
                  "{type, b64}}), channel_versions, versions_seen, updated_channels")
    metadata = serializers.JSONField(help_text="LangGraph's checkpoint metadata (an object)")
    identity = serializers.DictField(child=serializers.CharField(allow_blank=True),
                                     required=False,
                                     help_text="agent, model, workflow, definition_version")
    sends = serializers.IntegerField(
        min_value=0, max_value=2**31 - 1, required=False,
        help_text="the Send packets pending in __pregel_tasks, counted by the saver")
    interrupt_before = serializers.JSONField(
        required=False, help_text='the graph\'s static breakpoints: null, "*" or node names')
    interrupt_after = serializers.JSONField(
        required=False, help_text='the graph\'s static breakpoints: null, "*" or node names')


# Rendered from ``langgraph.graph_put``'s answer.
class GraphPutSerializer(Answer):
    """A stored LangGraph checkpoint: its run and the envelope revision its put wrote."""

    thread_id = serializers.CharField()
    checkpoint_ns = serializers.CharField(allow_blank=True)
    checkpoint_id = serializers.CharField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField()


class GraphWriteInputSerializer(serializers.Serializer):
    idx = serializers.IntegerField(min_value=-2**31, max_value=2**31 - 1)
    channel = serializers.CharField(max_length=256)
    value = TypedValueSerializer()


class GraphWritesInputSerializer(serializers.Serializer):
    """``POST …/langgraph/writes`` body."""

    thread_id = serializers.CharField(max_length=256)
    checkpoint_ns = serializers.CharField(max_length=256, allow_blank=True, required=False)
    checkpoint_id = serializers.CharField(max_length=128)
    task_id = serializers.CharField(max_length=128)
    task_path = serializers.CharField(max_length=1024, allow_blank=True, required=False)
    writes = GraphWriteInputSerializer(many=True)


class StoredSerializer(Answer):
    """How many pending writes the call inserted or replaced."""

    stored = serializers.IntegerField()


class PendingWriteSerializer(Answer):
    task_id = serializers.CharField()
    channel = serializers.CharField()
    value = serializers.JSONField(help_text="{type, b64}")
    idx = serializers.IntegerField()


class GraphTupleSerializer(Answer):
    """One LangGraph checkpoint as stored, with its pending writes (task path, task id,
    idx order)."""

    thread_id = serializers.CharField()
    checkpoint_ns = serializers.CharField(allow_blank=True)
    checkpoint_id = serializers.CharField()
    parent_checkpoint_id = serializers.CharField(allow_null=True)
    run_id = serializers.UUIDField()
    checkpoint = serializers.JSONField()
    metadata = serializers.JSONField()
    pending_writes = PendingWriteSerializer(many=True)


class GraphPageSerializer(Answer):
    """Newest first; ``next_before`` (pass it as ``before``) is set while more checkpoints
    remain, even when this page holds fewer than ``limit``."""

    results = GraphTupleSerializer(many=True)
    next_before = serializers.CharField(allow_null=True)


class ThreadInputSerializer(serializers.Serializer):
    thread_id = serializers.CharField(max_length=256)


class ThreadCopyInputSerializer(serializers.Serializer):
    source_thread_id = serializers.CharField(max_length=256)
    target_thread_id = serializers.CharField(max_length=256)


class ThreadPruneInputSerializer(serializers.Serializer):
    thread_ids = serializers.ListField(child=serializers.CharField(max_length=256),
                                       max_length=1000)
    strategy = serializers.ChoiceField(choices=["keep_latest", "delete"])


class RunsDeleteInputSerializer(serializers.Serializer):
    run_ids = serializers.ListField(child=serializers.CharField(max_length=128),
                                    max_length=1000, help_text="LangGraph run ids")


class DeletedSerializer(Answer):
    """How many LangGraph checkpoints the call deleted."""

    deleted = serializers.IntegerField()


class CopiedSerializer(Answer):
    """How many LangGraph checkpoints the call copied."""

    copied = serializers.IntegerField()
