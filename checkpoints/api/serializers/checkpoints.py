"""Shapes of checkpoints: the envelope (request and answer), a page of its revisions,
and a checkpoint's metadata."""

from __future__ import annotations

from rest_framework import serializers

from ... import intranges
from ...vocab import PhaseClass
from .common import Answer, IsoDateTimeField, RunUuidField


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
    usage = serializers.DictField(
        child=serializers.IntegerField(), read_only=True,
        help_text="the usage counters its kind declares ({counter: int}; {} when none): "
                  "they never decrease from one revision to the next (CONTRACT.md 8)")
    written_by = serializers.CharField(source="written_by.get_username", allow_null=True)
