"""Shapes of the report: tenant numbers now and the figures over a range
(``checkpoints.reports``)."""

from __future__ import annotations

from rest_framework import serializers

from .common import Answer, IsoDateTimeField


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


class FlaggedSerializer(Answer):
    """What screening flagged in the tenant's stored data (``selectors.flagged_counts``;
    docs/security/secrets.md), as the report page shows it."""

    runs = serializers.IntegerField(help_text="runs with a credential-like value stored")
    checkpoints = serializers.IntegerField(
        help_text="checkpoints whose current revision holds one")
    effects = serializers.IntegerField(help_text="effects whose request or receipt holds one")
    large_payloads = serializers.IntegerField(
        help_text="checkpoints above the data policy's payload_flag_bytes when written")


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
    flagged = FlaggedSerializer(help_text="credentials and large payloads now (the report "
                                          "page's counts; stop 34: the page had them, the "
                                          "API did not)")
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
    recovery_cost = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField()),
        help_text="kind -> usage counter -> what the interrupted attempts spent beyond "
                  "their checkpoints, over the retries consumed in the range")
