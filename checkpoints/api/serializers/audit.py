"""Shapes of the audit trail: an audit event and a page of them."""

from __future__ import annotations

from rest_framework import serializers

from .common import Answer, IsoDateTimeField


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
