"""Shapes of ``…/legal-holds`` and ``…/erasure-requests`` (CONTRACT.md 8; issue 20,
items 2 and 4): the request bodies (described; the services validate them) and the
stored hold and request. No payload value and no subject value anywhere: a subject is
its declared field's name only."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ... import services
from ...models import LIFECYCLE_MAX_RUNS
from ...selectors.lifecycle_requests import HOLD_RUNS_SHOWN
from ...vocab import ErasureOutcome, ErasureState, HoldScope
from .common import Answer, IsoDateTimeField


@extend_schema_field({"oneOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]})
class SubjectValueField(serializers.Field):
    """A subject's value: a non-empty string or an integer (not a boolean), the values
    ``services.subject_value`` (the subject index's one rule) takes, documented in the
    OpenAPI schema as that ``oneOf`` (a ``CharField`` documented a string only, though
    ``42`` is taken). Validated as the service validates it: anything else is "must be a
    non-empty string or an integer"."""

    default_error_messages = {"invalid": "must be a non-empty string or an integer"}

    def to_internal_value(self, data):
        if services.subject_value(data) is None:
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class SubjectInputSerializer(serializers.Serializer):
    """A subject: a field the tenant's data policy declares and its value (never stored:
    only its keyed digest is)."""

    field = serializers.CharField(max_length=64, help_text="a declared subject field, e.g. "
                                                           "customer")
    value = SubjectValueField(
        help_text="its value, exactly as the payload holds it: a non-empty string (any "
                  "length the body carries, not trimmed) or an integer "
                  "(services.subject_value, the subject index's own rule); kept as a "
                  "digest only")


def _runs_field(**kwargs):
    return serializers.ListField(child=serializers.UUIDField(), min_length=1,
                                 max_length=LIFECYCLE_MAX_RUNS, **kwargs)


class LegalHoldInputSerializer(serializers.Serializer):
    """``POST …/legal-holds``: exactly one of ``runs``, ``subject``, ``tenant``."""

    runs = _runs_field(required=False, help_text="runs of this tenant to hold")
    subject = SubjectInputSerializer(required=False, help_text="every run of this subject, "
                                                               "now and later")
    tenant = serializers.BooleanField(required=False, help_text="true: every run of the "
                                                                "tenant")
    reason = serializers.CharField(max_length=1024, help_text="why (1..1024 bytes)")


class ErasureRequestInputSerializer(serializers.Serializer):
    """``POST …/erasure-requests``: exactly one of ``runs`` and ``subject``."""

    runs = _runs_field(required=False, help_text="runs of this tenant to erase")
    subject = SubjectInputSerializer(required=False, help_text="every run of this subject "
                                                               "the subject index found")
    reason = serializers.CharField(max_length=1024, help_text="why (1..1024 bytes)")


class OptionalReasonSerializer(serializers.Serializer):
    """An approval's body: an optional note."""

    reason = serializers.CharField(required=False, max_length=1024,
                                   help_text="optional (1..1024 bytes)")


class HeldBySerializer(Answer):
    """A legal hold as a run it covers shows it (``GET …/runs/{run_id}``'s
    ``legal_holds``); ``LegalHoldSerializer`` is the whole hold."""

    id = serializers.UUIDField(source="uuid")
    scope = serializers.ChoiceField(choices=HoldScope.values)
    subject_field = serializers.CharField(allow_null=True,
                                          help_text="the subject's field (scope subject); "
                                                    "its value is never shown")
    reason = serializers.CharField()
    placed_by = serializers.CharField(source="placed_by_name")
    placed_at = IsoDateTimeField()

    def to_representation(self, instance):
        out = super().to_representation(instance)
        out["subject_field"] = out["subject_field"] or None
        return out


class LegalHoldSerializer(HeldBySerializer):
    """A legal hold: active until released; the row is kept after release."""

    runs = serializers.ListField(source="run_uuids", child=serializers.UUIDField(),
                                 help_text="the runs held (scope runs); empty otherwise")
    runs_held = serializers.IntegerField(
        allow_null=True, help_text="how many runs it holds: scope runs, the runs named; "
                                   "scope subject, the tenant's runs the subject index "
                                   "finds for it now (more may come); scope tenant, null "
                                   "(every run)")
    runs_now = serializers.ListField(
        child=serializers.UUIDField(), allow_null=True,
        help_text=f"the ids of the runs it holds now, lowest first, at most "
                  f"{HOLD_RUNS_SHOWN} (runs_held says how many there are): scope runs, "
                  "the runs named; scope subject, "
                  "the tenant's runs the subject index finds for it (the coverage rule "
                  "of docs/security/retention.md); empty once released; scope tenant, "
                  "null (every run)")
    active = serializers.BooleanField()
    released_by = serializers.CharField(source="released_by_name", allow_null=True)
    released_at = IsoDateTimeField(allow_null=True)
    release_reason = serializers.CharField(allow_null=True)

    def to_representation(self, instance):
        out = super().to_representation(instance)
        if instance.active:
            out["released_by"] = out["release_reason"] = None
        return out


class LegalHoldListSerializer(Answer):
    """The tenant's legal holds, active first (at most 200)."""

    results = LegalHoldSerializer(many=True)


class ErasureCountsSerializer(Answer):
    """An executed request's counts: runs covered, erased, blocked, and per blocker."""

    runs = serializers.IntegerField()
    erased = serializers.IntegerField()
    blocked = serializers.IntegerField(help_text="runs not erased (each counted below by "
                                                 "what stopped it; a run may have several)")
    legal_hold = serializers.IntegerField()
    not_ended = serializers.IntegerField()
    effect_in_doubt = serializers.IntegerField()
    already_deleted = serializers.IntegerField()


class ErasureRequestSerializer(Answer):
    """An erasure request: requested, then approved (and executed at once) or rejected."""

    id = serializers.UUIDField(source="uuid")
    state = serializers.ChoiceField(choices=ErasureState.values)
    runs = serializers.ListField(source="run_uuids", child=serializers.UUIDField(),
                                 help_text="the runs named (a runs request); empty otherwise")
    subject_field = serializers.CharField(allow_null=True,
                                          help_text="a subject request's field; its value "
                                                    "is never shown")
    reason = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by_name")
    requested_at = IsoDateTimeField()
    decided_by = serializers.CharField(source="decided_by_name", allow_null=True)
    decided_at = IsoDateTimeField(allow_null=True)
    decision_reason = serializers.CharField(allow_null=True)
    executed_at = IsoDateTimeField(allow_null=True)
    counts = ErasureCountsSerializer(source="executed_counts", allow_null=True,
                                     help_text="once executed (runs 0: it matched no run); null "
                                               "before, and for a rejected request, "
                                               "which is never counted")
    outcome = serializers.ChoiceField(
        choices=ErasureOutcome.values, allow_null=True,
        help_text="once executed, what it did: erased, partly_erased, nothing_erased "
                  "(every covered run blocked, e.g. by a legal hold: the state is still "
                  "executed) or matched_nothing; null before, and for a rejected request")
    preview = ErasureCountsSerializer(
        allow_null=True,
        help_text="while requested: what approving it now would do, in counts' shape "
                  "(erased: would be erased; blocked and each blocker: would not be), "
                  "judged by the rule the execution applies; null once decided")

    def to_representation(self, instance):
        out = super().to_representation(instance)
        out["subject_field"] = out["subject_field"] or None
        if instance.decided_at is None:
            out["decided_by"] = out["decision_reason"] = None
        return out


class ErasureRequestListSerializer(Answer):
    """The tenant's erasure requests, waiting ones first (at most 200)."""

    results = ErasureRequestSerializer(many=True)
