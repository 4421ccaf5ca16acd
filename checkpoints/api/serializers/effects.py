"""Shapes of effects: the PUT body, the stored record, a list of them, and a revealed
receipt."""

from __future__ import annotations

from rest_framework import serializers

from ... import intranges
from ...vocab import EffectClass, EffectState
from .common import Answer, IsoDateTimeField, RunUuidField, WriterReceiptField


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
