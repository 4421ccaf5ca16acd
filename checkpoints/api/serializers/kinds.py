"""Shapes of ``GET …/kinds``: the tenant's kinds and schema versions beside the kind
registry (``selectors.kind_usage``; docs/kinds.md)."""

from __future__ import annotations

from rest_framework import serializers

from ... import intranges
from .common import Answer

_VERSION = intranges.SCHEMA_VERSION.field_kwargs()


class KindVersionSerializer(Answer):
    """One schema version of a kind, with the tenant's counts."""

    schema_version = serializers.IntegerField(**_VERSION)
    supported = serializers.BooleanField(
        help_text="the registry classifies this version; false: its checkpoints are stored "
                  "but unsupported, and a run whose latest checkpoint is one of them is "
                  "schema_mismatch")
    checkpoints = serializers.IntegerField(help_text="the tenant's checkpoints of this version")
    runs = serializers.IntegerField(help_text="the runs those checkpoints belong to")
    schema_mismatch_runs = serializers.IntegerField(
        help_text="runs in schema_mismatch whose latest checkpoint is of this kind and version")
    migrates_to_newest = serializers.BooleanField(
        help_text="a chain of migrations leads from this version to the newest supported "
                  "one (POST …/kinds/{kind}/migrations can move its checkpoints there)")


class KindSerializer(Answer):
    """A kind the tenant's checkpoints use, or one the registry supports (then perhaps
    with zero counts)."""

    kind = serializers.CharField()
    registered = serializers.BooleanField(help_text="the kind registry knows this kind (in "
                                                    "code, or declared by this tenant)")
    declared = serializers.BooleanField(help_text="this tenant's admin declared it (PUT "
                                                  "…/kinds/{kind}/versions/{v}); not in code")
    description = serializers.CharField(help_text="the registry's one line; empty when "
                                                  "not registered")
    supported_versions = serializers.ListField(
        child=serializers.IntegerField(**_VERSION),
        help_text="the schema versions the registry supports, oldest first; empty when the "
                  "kind is not registered")
    newest_supported_version = serializers.IntegerField(allow_null=True, **_VERSION)
    versions = KindVersionSerializer(
        many=True, help_text="the supported versions and the versions in use, oldest first")


class KindListSerializer(Answer):
    """``GET …/kinds``: every kind, by name."""

    kinds = KindSerializer(many=True)


class KindDeclarationSerializer(Answer):
    """``GET``/``PUT …/kinds/{kind}/versions/{v}``: one declared kind version
    (``kinds.declarative``; docs/kinds.md "Declaring a kind without Python")."""

    kind = serializers.CharField()
    version = serializers.IntegerField(**_VERSION)
    digest = serializers.CharField(help_text="SHA-256 of the declaration's canonical JSON")
    description = serializers.CharField()
    declaration = serializers.JSONField(
        help_text="the declaration as given: schema (JSON Schema, Draft 2020-12), phase "
                  "(pointer, stable, in_flight, completed, label), identity, usage, "
                  "migration (ops from the version before)")
    declared_by = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField()
    outcome = serializers.ChoiceField(
        choices=["created", "replaced", "unchanged", "read"],
        help_text="what this request did: created, replaced (no checkpoint used it), "
                  "unchanged (the same declaration), or read (GET)")

    @classmethod
    def of(cls, row, outcome: str) -> dict:
        return cls.render({
            "kind": row.kind, "version": row.version, "digest": row.digest,
            "description": row.description, "declaration": row.body,
            "declared_by": row.declared_by.username if row.declared_by_id else None,
            "updated_at": row.updated_at, "outcome": outcome})
