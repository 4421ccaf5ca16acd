"""Shapes of the audit trail: an audit event and a page of them."""

from __future__ import annotations

from rest_framework import serializers

from .common import Answer, IsoDateTimeField


# Rendered from an ``AuditEvent`` row.
class AuditEventSerializer(Answer):
    """An audit event as CONTRACT.md section 3 lists it, and ``incident_ref`` (issue 22's
    stop: the dashboard's audit log showed it, the API did not)."""

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
    incident_ref = serializers.CharField(
        allow_null=True,
        help_text="the incident the actor was working on when they caused the event "
                  "(INC-2041, typed in the dashboard and covered by the event's hash); "
                  "null: none (the system's events, and events caused through the API, "
                  "which has no incident). "
                  "GET …/audit-events?q= finds events by its prefix (case-insensitive)")


class AuditPageSerializer(Answer):
    """Newest first; ``next`` pages backwards (``before_seq``), null on the last page."""

    results = AuditEventSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class TreeHeadSerializer(Answer):
    """A signed tree head of the tenant's audit Merkle tree (``audittree.head_json``):
    an outsider checks ``signature`` over ``checkpoint`` with ``public_key`` alone
    (``python -m checkpoints.merkle verify-head``)."""

    origin = serializers.CharField(help_text="the tree's name, recovery.audit/<tenant id>")
    tree_size = serializers.IntegerField(help_text="leaves the head covers")
    root_hash = serializers.CharField(help_text="RFC 6962 root, 64 hex digits")
    created_at = serializers.CharField(help_text="when the sequencer signed it (ISO 8601)")
    key_id = serializers.CharField(help_text="first 16 hex digits of SHA-256 of the raw "
                                             "public key")
    public_key = serializers.CharField(allow_null=True,
                                       help_text="raw Ed25519 public key, base64")
    signature = serializers.CharField(help_text="Ed25519 over checkpoint, base64")
    checkpoint = serializers.CharField(help_text="the signed text: a C2SP tlog checkpoint "
                                                 "(origin, size, base64 root)")


class AuditProofSerializer(Answer):
    """``GET …/audit-events/{id}/proof``: the event as the audit list gives it, its leaf
    in the tenant's Merkle tree and the inclusion proof under a signed tree head. Check:
    SHA-256(0x00 || ``leaf_input``) is ``leaf_hash``; the path from it (RFC 9162
    2.1.3.2) gives ``tree_head.root_hash``; the head's signature verifies."""

    event = AuditEventSerializer()
    leaf_index = serializers.IntegerField(help_text="the leaf's index, from 0")
    leaf_input = serializers.CharField(help_text="the exact canonical JSON text hashed "
                                                 "into the leaf (UTF-8)")
    leaf_hash = serializers.CharField(help_text="SHA-256(0x00 || leaf_input), hex")
    tree_head = TreeHeadSerializer()
    audit_path = serializers.ListField(child=serializers.CharField(),
                                       help_text="sibling hashes (hex), bottom up")
