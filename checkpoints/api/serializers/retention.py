"""Shapes of ``GET``/``PUT …/data-policy``: a tenant's data policy (issue 20, item 1;
``services.data_policy_set``; docs/security/retention.md)."""

from __future__ import annotations

from rest_framework import serializers

from ...models.lifecycle import (
    PAYLOAD_FLAG_BYTES_MAX,
    RESTART_INTERVAL_S_MAX,
    RETENTION_DAYS_MAX,
    SUBJECT_FIELDS_MAX,
)
from ...vocab import SecretsPolicy
from .common import Answer, IsoDateTimeField

_DAYS = {"min_value": 1, "max_value": RETENTION_DAYS_MAX, "allow_null": True}


class _PolicyFields(serializers.Serializer):
    """The policy's fields, shared by the answer and the request's description."""

    payload_retention_days = serializers.IntegerField(
        **_DAYS, help_text="days after a run ended (completed or closed) before its payloads "
                           "and history are deleted, leaving a tombstone; null: kept forever")
    effect_retention_days = serializers.IntegerField(
        **_DAYS, help_text="days after a deleted run ended before its effect records, "
                           "operation keys and the run row go; never shorter than "
                           "restart_interval_s (the idempotency window); null: kept forever")
    restart_interval_s = serializers.IntegerField(
        min_value=1, max_value=RESTART_INTERVAL_S_MAX,
        help_text="the longest a runtime may take to restart and retry (seconds)")
    tombstone_retention_days = serializers.IntegerField(
        **_DAYS, help_text="days a tombstone is kept before a four-eyes purge may delete it; "
                           "null: kept forever")
    secrets_policy = serializers.ChoiceField(
        choices=SecretsPolicy.values,
        help_text="a credential found in a payload: warn (stored, flagged) or refuse (422)")
    payload_flag_bytes = serializers.IntegerField(
        min_value=1, max_value=PAYLOAD_FLAG_BYTES_MAX, allow_null=True,
        help_text="a payload larger than this many bytes is flagged; null: never")
    subject_fields = serializers.DictField(
        child=serializers.CharField(max_length=512),
        help_text=f"at most {SUBJECT_FIELDS_MAX} subject field names ([a-z][a-z0-9_]{{0,63}}) "
                  "-> RFC 6901 JSON pointers into payloads (a customer id, ...)")


class DataPolicyInputSerializer(_PolicyFields):
    """``PUT …/data-policy``: any subset of the policy's fields (one left out keeps its
    value); an unknown field is a 400 naming it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


class DataPolicySerializer(_PolicyFields, Answer):
    """The tenant's data policy (the defaults when its admin never set one)."""

    updated_at = IsoDateTimeField(allow_null=True, help_text="null: never set (defaults)")
    updated_by = serializers.CharField(source="updated_by_name", allow_blank=True)
    changed = serializers.BooleanField(
        help_text="this request changed the policy (false on a GET, and on a PUT of the "
                  "values already stored: nothing written, nothing audited)")

    @classmethod
    def of(cls, row, *, changed: bool) -> dict:
        stored = not row._state.adding
        return cls.render({**{f: getattr(row, f) for f in (
            "payload_retention_days", "effect_retention_days", "restart_interval_s",
            "tombstone_retention_days", "secrets_policy", "payload_flag_bytes",
            "subject_fields", "updated_by_name")},
            "updated_at": row.updated_at if stored else None, "changed": changed})
