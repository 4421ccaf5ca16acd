"""Shapes of ``POST …/kinds/{kind}/migrations`` and ``GET …/kinds/{kind}/migrations/{id}``
(CONTRACT.md 8; docs/migrations.md): the request, the preview of a dry run, and a stored
job with its per-checkpoint results. No payload value anywhere: key paths, versions,
ids and refusal words only."""

from __future__ import annotations

from rest_framework import serializers

from ... import intranges
from ...models import MIGRATION_MAX_RUNS
from ...vocab import MigrationJobState, MigrationOutcome, MigrationRefusal
from .common import Answer, IsoDateTimeField

_VERSION = intranges.SCHEMA_VERSION.field_kwargs()


class MigrationInputSerializer(serializers.Serializer):
    """Describes the body of ``POST …/kinds/{kind}/migrations`` (validated by the
    services; 400 naming the field)."""

    to_version = serializers.IntegerField(**_VERSION, help_text="one of the kind's versions")
    dry_run = serializers.BooleanField(
        required=False, default=False,
        help_text="true: answer the preview (200) and write nothing; false (default): store "
                  "a job (202), which needs an idempotency key")
    reverse = serializers.BooleanField(
        required=False, default=False,
        help_text="take steps back (down) to a lower version; only then is down allowed")
    runs = serializers.ListField(child=serializers.UUIDField(), required=False, min_length=1,
                                 max_length=MIGRATION_MAX_RUNS,
                                 help_text="only these runs' checkpoints; every run of the "
                                           "kind when left out")
    client_token = serializers.UUIDField(
        required=False, help_text="idempotency key; or the Idempotency-Key header (if both, "
                                  "they must be equal)")


class MigrationCountsSerializer(Answer):
    """Checkpoints per outcome."""

    migrated = serializers.IntegerField(help_text="migrated (a dry run: would be)")
    skipped = serializers.IntegerField(help_text="already at the target version, or gone")
    refused = serializers.IntegerField(help_text="refused: see reason")
    conflict = serializers.IntegerField(help_text="a runtime's write won; it stands")


class MigrationItemSerializer(Answer):
    """One checkpoint's result (or, in a preview, what would happen to it)."""

    checkpoint_id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    outcome = serializers.ChoiceField(choices=MigrationOutcome.values)
    reason = serializers.CharField(help_text=f"why it was refused ({', '.join(MigrationRefusal.values)}); "
                                             f"empty otherwise")
    detail = serializers.CharField(help_text="in words: versions and fields, never a value")
    from_version = serializers.IntegerField(allow_null=True, **_VERSION)
    revision = serializers.IntegerField(allow_null=True,
                                        help_text="the revision read (the one it replaced)")


class MigrationJobItemSerializer(MigrationItemSerializer):
    """One checkpoint's result in a stored job."""

    checkpoint_id = serializers.UUIDField(source="checkpoint_uuid")
    run_id = serializers.UUIDField(source="run_uuid")


class MigrationExampleSerializer(Answer):
    """One distinct change (key paths only), with how many checkpoints make it and one of
    them."""

    from_version = serializers.IntegerField(**_VERSION)
    to_version = serializers.IntegerField(**_VERSION)
    added = serializers.ListField(child=serializers.CharField())
    removed = serializers.ListField(child=serializers.CharField())
    changed = serializers.ListField(child=serializers.CharField())
    count = serializers.IntegerField()
    checkpoint_id = serializers.UUIDField()


class MigrationPreviewSerializer(Answer):
    """A dry run's answer (200): what a job would do now; nothing was written. Owners may
    come and go before the job runs."""

    kind = serializers.CharField()
    to_version = serializers.IntegerField(**_VERSION)
    reverse = serializers.BooleanField()
    dry_run = serializers.BooleanField(help_text="always true here")
    runs = serializers.ListField(child=serializers.UUIDField(), allow_null=True,
                                 help_text="the runs asked for; null: every run of the kind")
    checkpoints = serializers.IntegerField(help_text="checkpoints looked at (not at the "
                                                     "target version)")
    counts = MigrationCountsSerializer()
    refusals = serializers.DictField(child=serializers.IntegerField(),
                                     help_text="refused checkpoints per reason")
    examples = MigrationExampleSerializer(many=True,
                                          help_text="one per distinct change, most frequent "
                                                    "first")
    refused = MigrationItemSerializer(many=True,
                                      help_text="the checkpoints that would be refused or "
                                                "conflict, and why (the first 200)")


class MigrationJobSerializer(Answer):
    """A stored migration job (202 when submitted; ``GET …/migrations/{id}``) and its
    per-checkpoint results in the order they were done (the first 1000; ``counts`` cover
    them all)."""

    id = serializers.UUIDField(source="job.uuid", help_text="the job id, also the batch_id "
                                                            "of its checkpoint.migrate events")
    kind = serializers.CharField(source="job.kind")
    to_version = serializers.IntegerField(source="job.to_version", **_VERSION)
    reverse = serializers.BooleanField(source="job.reverse")
    runs = serializers.ListField(child=serializers.UUIDField(), allow_null=True,
                                 help_text="the runs asked for; null: every run of the kind")
    state = serializers.ChoiceField(source="job.state", choices=MigrationJobState.values)
    requested_by = serializers.CharField(source="job.requested_by_name")
    client_token = serializers.UUIDField(
        allow_null=True, help_text="the requester's idempotency key, shown to the requester "
                                   "only (null for everyone else)")
    created_at = IsoDateTimeField(source="job.created_at")
    finished_at = IsoDateTimeField(source="job.finished_at", allow_null=True)
    attempts = serializers.IntegerField(source="job.attempts",
                                        help_text="times a worker took it up")
    last_error = serializers.CharField(source="job.last_error",
                                       help_text="why the last attempt failed or waits; "
                                                 "empty when none did")
    checkpoints = serializers.IntegerField(source="total",
                                           help_text="checkpoints with a result so far")
    counts = MigrationCountsSerializer()
    results = MigrationJobItemSerializer(source="items", many=True)
