"""Shapes of review: conflicts, retry requests, reconcile requests and their look-ups,
what a retry would do, the body of every review action (``ReasonSerializer``) and the
answers of reconcile, close and acknowledge."""

from __future__ import annotations

from rest_framework import serializers

from ...vocab import (
    ConflictReason,
    ReconcileAnswer,
    ReconcileState,
    RetryOutcome,
    RetryState,
    TargetType,
)
from .common import Answer, IsoDateTimeField, RunUuidField, _words


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
    decided_at = IsoDateTimeField(allow_null=True, help_text=(
        "when it was approved, rejected or withdrawn; for one expired while still "
        "requested, when it expired"))
    expired_at = IsoDateTimeField(allow_null=True, help_text=(
        "when closing the run expired it (state expired); an approved one keeps its "
        "decided_at"))
    consumed_at = IsoDateTimeField(allow_null=True)
    usage_burnt = serializers.DictField(
        child=serializers.IntegerField(), read_only=True,
        help_text="what recovery cost: the usage counters the runtime that consumed the "
                  "retry reported above its checkpoint's ({counter: int}; {} when none)")


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


class _QueueItem:
    """A ``selectors.QueueRow`` read as one object: the request's own attributes from
    its row, the queue's (``preview``, ``possible_duplicates``, ``own``) from the
    ``QueueRow``."""

    def __init__(self, row):
        self._retry = row.retry
        self.preview = row.preview
        self.possible_duplicates = row.duplicates
        self.own = row.own

    def __getattr__(self, name):
        return getattr(self._retry, name)


# Rendered from a ``selectors.QueueRow`` (``selectors.retry_request_list``/``_get``).
class RetryRequestItemSerializer(RetryRequestSerializer):
    """A retry request as the dashboard's Approvals page shows it (``GET
    …/retry-requests``): the request, its run's kind, and while it awaits a decision what
    an approval would do now (``preview``, the page's rows) and how many of those are
    possible duplicates; ``own``: you asked for it, so another approver decides."""

    run_kind = serializers.CharField(source="run.kind")
    preview = RetryPreviewSerializer(
        many=True, allow_null=True,
        help_text="state requested: what an approval would do now to each effect, oldest "
                  "first (the Approvals page's rows); null once the request is decided, "
                  "withdrawn, expired or consumed")
    possible_duplicates = serializers.IntegerField(
        help_text=f"rows of preview whose outcome is {RetryOutcome.POSSIBLE_DUPLICATE} "
                  f"(what an approval accepts); 0 when preview is null")
    own = serializers.BooleanField(
        help_text="you requested it: not yours to decide (four eyes)")

    def to_representation(self, instance):
        return super().to_representation(_QueueItem(instance))


class RetryRequestPageSerializer(Answer):
    """One keyset page of retry requests in the order asked (``sort``); ``next`` is the
    URL of the following page (``?cursor=``), null on the last."""

    results = RetryRequestItemSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class ReasonSerializer(serializers.Serializer):
    """Body of every review action; a non-blank reason (at most 4000 characters)."""

    reason = serializers.CharField(max_length=4000)


# Rendered from a dict of ``services.run_reconcile``'s answer and the stored requests.
class TaskSerializer(Answer):
    """Reconciliation requested: the task, where its requests went (``dispatch``) and the
    stored requests, each with its own ``state`` as of this answer."""


    task_id = serializers.CharField()
    queued = serializers.BooleanField(
        help_text="true: the requests were handed over to a worker (see dispatch: they may "
                  "already have run); false: the task queue was unavailable, the requests "
                  "are stored and run when the worker is back")
    dispatch = serializers.CharField(
        help_text="where the requests went: in_process (no broker: they ran in this process "
                  "before this answer, each request's state says how it ended: done, "
                  "gave_up, or queued again for a later look-up), worker (published for a "
                  "Celery worker, which may still be running them: follow them on GET "
                  "…/runs/{run_id}), waiting (the task queue was unavailable, from the first "
                  "request or part-way: those not sent are stored, the sweep sends them "
                  "when it is back)")
    detail = serializers.CharField(help_text="the same in words for people")
    requests = ReconcileRequestSerializer(many=True)


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
