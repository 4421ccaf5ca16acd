"""Shapes of bulk actions (issue 9, item 3): the request, its filters, the action and
its per-run results."""

from __future__ import annotations

from rest_framework import serializers

from ...models import BULK_JOB_MAX_RUNS, Run
from ...selectors import SEARCH_MAX, filter_limit
from ...vocab import BulkActionKind, BulkOutcome, BulkState, RecoveryState
from .common import Answer, IsoDateTimeField


class BulkFiltersSerializer(Answer):
    """The inbox filters a bulk action was asked for ("every run matching"), as in
    ``GET …/runs``; null means not filtered on. Lengths: ``selectors.filter_limit`` (the
    run columns') and ``SEARCH_MAX``, as ``GET …/runs`` and the view's check read them."""

    recovery_state = serializers.ChoiceField(choices=RecoveryState.values, allow_null=True)
    kind = serializers.CharField(allow_null=True, max_length=filter_limit("kind"))
    subject = serializers.CharField(allow_null=True, max_length=filter_limit("subject"),
                                    help_text="agent or workflow name contains (any case)")
    age_s_min = serializers.IntegerField(allow_null=True, min_value=0, max_value=10**9,
                                         help_text="last write at least this many seconds ago")
    q = serializers.CharField(allow_null=True, required=False, max_length=SEARCH_MAX,
                              help_text="the search, as GET …/runs?q= reads it; an empty "
                                        "one (blank) is 400: leave q out instead")


class BulkActionInputSerializer(serializers.Serializer):
    """Describes the body of ``POST …/bulk-actions`` (validated by ``services.bulk_submit``
    and the view; 400 naming the field): ``runs`` (or its older name ``run_ids``) or
    ``filters``, one of the two."""

    action = serializers.ChoiceField(choices=BulkActionKind.values)
    reason = serializers.CharField(max_length=4000)
    runs = serializers.ListField(child=serializers.UUIDField(), required=False,
                                 min_length=1, max_length=BULK_JOB_MAX_RUNS,
                                 help_text="the selected run ids (CONTRACT.md 3)")
    run_ids = serializers.ListField(child=serializers.UUIDField(), required=False,
                                    min_length=1, max_length=BULK_JOB_MAX_RUNS,
                                    help_text="the older name of `runs` (one of the two)")
    filters = BulkFiltersSerializer(required=False)
    lease_owner = serializers.CharField(
        required=False, max_length=Run._meta.get_field("lease_owner").max_length,
        trim_whitespace=False,
        help_text="`end_lease` only, and required for it: the owner whose live leases end "
                  "(the runtime that is gone); a run leased by another owner is refused "
                  "`lease_held`, one without a live lease `no_live_lease`")
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
    progress = serializers.CharField(
        help_text="what the run came to, as the bulk result page says it: for a reconcile, "
                  "`queued` or `running` while its look-up is under way, then the effect "
                  "state it found (`confirmed`, `not_executed`, `unknown`, ...), `gave_up` or "
                  "`cancelled`; otherwise the outcome")
    pending = serializers.BooleanField(help_text="a reconcile request of this run is still "
                                                 "open (the result is not final)")


# Rendered from a ``selectors.BulkResult``.
class BulkActionSerializer(Answer):
    """A bulk action and its per-run results, in selection order."""

    id = serializers.UUIDField(source="bulk.uuid")
    action = serializers.ChoiceField(source="bulk.action", choices=BulkActionKind.values)
    reason = serializers.CharField(source="bulk.reason")
    state = serializers.ChoiceField(source="bulk.state", choices=BulkState.values)
    requested_by = serializers.CharField(source="bulk.requested_by_name")
    incident_ref = serializers.CharField(
        source="bulk.incident_ref", allow_null=True,
        help_text="the incident the requester tagged the request with (Incident-Ref), or "
                  "null; the list gives it too")
    client_token = serializers.UUIDField(
        allow_null=True, help_text="the requester's idempotency key, shown to the requester "
                                   "only (null for everyone else)")
    created_at = IsoDateTimeField(source="bulk.created_at")
    finished_at = IsoDateTimeField(source="bulk.finished_at", allow_null=True)
    filters = BulkFiltersSerializer(allow_null=True, help_text="null when runs were selected "
                                                               "by id")
    lease_owner = serializers.CharField(allow_null=True,
                                        help_text="`end_lease`'s owner; null for the other "
                                                  "actions")
    total = serializers.IntegerField(source="bulk.total", help_text="runs selected")
    done = serializers.IntegerField()
    refused = serializers.IntegerField()
    failed = serializers.IntegerField()
    pending = serializers.IntegerField(help_text="runs without a result yet (while running)")
    results = BulkResultSerializer(
        source="items", many=True,
        help_text="per-run results in selection order; for a job, at most 500, refused and "
                  "failed first (``unlisted`` counts the others)")
    # A stored job (issue 22, item 6): more than 500 runs, run by a worker.
    job = serializers.BooleanField(source="bulk.background",
                                   help_text="run by a worker as a stored job (more than 500 "
                                             "runs): queued, running, then finished, aborted "
                                             "or failed")
    unlisted = serializers.IntegerField(help_text="results counted but not in `results`")
    last_error = serializers.CharField(source="bulk.last_error",
                                       help_text="a job's last failure (empty when none)")
    aborted_by = serializers.CharField(source="bulk.aborted_by_name",
                                       help_text="who aborted the job (empty when nobody)")
    abort_reason = serializers.CharField(source="bulk.abort_reason")



# Rendered from a ``models.BulkAction`` of ``selectors.bulk_list``.
class BulkActionSummarySerializer(Answer):
    """A bulk action as the list gives it: what, who, when, and its counts; never its
    per-run results (``GET …/bulk-actions/{id}`` has them) nor its client token."""

    id = serializers.UUIDField(source="uuid")
    action = serializers.ChoiceField(choices=BulkActionKind.values)
    reason = serializers.CharField()
    state = serializers.ChoiceField(choices=BulkState.values)
    requested_by = serializers.CharField(source="requested_by_name")
    incident_ref = serializers.CharField(
        allow_null=True, help_text="the incident the requester tagged the request with "
                                   "(Incident-Ref), or null")
    created_at = IsoDateTimeField()
    finished_at = IsoDateTimeField(allow_null=True)
    lease_owner = serializers.CharField(source="selected_lease_owner", allow_null=True,
                                        help_text="`end_lease`'s owner; null for the other "
                                                  "actions")
    job = serializers.BooleanField(source="background",
                                   help_text="run by a worker as a stored job (more than 500 "
                                             "runs)")
    total = serializers.IntegerField(help_text="runs selected")
    done = serializers.IntegerField(source="n_done")
    refused = serializers.IntegerField(source="n_refused")
    failed = serializers.IntegerField(source="n_failed")
    pending = serializers.IntegerField(help_text="runs without a result yet (while running)")


class BulkActionPageSerializer(Answer):
    """One keyset page of bulk actions, newest first; ``next`` is the URL of the
    following page (``?cursor=``), null on the last."""

    results = BulkActionSummarySerializer(many=True)
    next = serializers.URLField(allow_null=True)
