"""Shapes of tombstone governance (issue 20, item 5): a tombstone, a page of them, a
tombstone purge and its evidence."""

from __future__ import annotations

from rest_framework import serializers

from ...vocab import DeletionCause, PurgeState
from .common import Answer, IsoDateTimeField


# Rendered from a ``Tombstone`` row.
class TombstoneSerializer(Answer):
    """What remains of a run whose payloads retention or erasure deleted: ids, kind and
    version, final state, times, the policy or request that deleted it, the rows deleted
    per table; never a payload value. ``id`` is the cursor."""

    id = serializers.IntegerField(source="pk")
    run_id = serializers.UUIDField(source="run_uuid")
    kind = serializers.CharField()
    schema_version = serializers.IntegerField(allow_null=True)
    final_state = serializers.CharField()
    cause = serializers.ChoiceField(choices=DeletionCause.values)
    run_created_at = IsoDateTimeField()
    ended_at = IsoDateTimeField(allow_null=True)
    deleted_at = IsoDateTimeField()
    policy = serializers.JSONField(help_text="numbers and ids only")
    counts = serializers.JSONField(help_text="rows deleted or blanked, per table")
    erasure_request = serializers.UUIDField(source="erasure.uuid", allow_null=True)


class TombstonePageSerializer(Answer):
    """Ascending id; ``next`` continues after the last one (``?after=``), null at the end."""

    results = TombstoneSerializer(many=True)
    next = serializers.URLField(allow_null=True)


# Rendered from a ``TombstonePurge`` row.
class TombstonePurgeSerializer(Answer):
    """A four-eyes purge of tombstones and its evidence: who prepared, approved (never the
    preparer) and executed it, the frozen tombstones (count, first and last cursor, their
    fingerprint), the export watermark they were under, the approval deadline."""

    id = serializers.UUIDField(source="uuid")
    state = serializers.ChoiceField(choices=PurgeState.values)
    tombstone_count = serializers.IntegerField()
    first_cursor = serializers.IntegerField()
    last_cursor = serializers.IntegerField()
    export_through = serializers.IntegerField(help_text="the export watermark (a tombstone id)")
    fingerprint = serializers.CharField(help_text="SHA-256 hex over the frozen tombstones")
    deadline = IsoDateTimeField()
    prepared_by = serializers.CharField(source="prepared_by.username")
    prepared_at = IsoDateTimeField()
    approved_by = serializers.CharField(source="approved_by.username", allow_null=True)
    approved_at = IsoDateTimeField(allow_null=True)
    rejected_reason = serializers.CharField()
    executed_by = serializers.CharField(source="executed_by.username", allow_null=True)
    executed_at = IsoDateTimeField(allow_null=True)


class TombstonePurgeListSerializer(Answer):
    """The tenant's purges, newest first."""

    results = TombstonePurgeSerializer(many=True)
