"""Issue 7: integer foreign keys no longer share names with UUID fields.

A model's own public UUID is ``uuid`` (``Run.uuid``, ``Checkpoint.uuid``,
``Effect.uuid``); a denormalised UUID copy on another model is ``<thing>_uuid``
(``AuditEvent.run_uuid``, ``Conflict.target_uuid``, ``ReconcileRequest.task_uuid``); the
audit event's free-form target is ``target_ref``. So every ``<thing>_id`` attribute on a
model is an integer foreign key. Column renames only: data, constraints and indexes are
kept: the database renames the column inside its unique constraints and index (PostgreSQL
and SQLite's ``RENAME COLUMN`` both do), so the constraint and index operations below
change only the migration state (``SeparateDatabaseAndState``), without rebuilding an
index. The wire names (``run_id``, ``id``,
``target_id``, ``task_id``) are unchanged (CONTRACT.md).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("checkpoints", "0007_merge_20261130_1552"),
    ]

    operations = [
        migrations.RenameField("run", "run_id", "uuid"),
        migrations.RenameField("checkpoint", "checkpoint_id", "uuid"),
        migrations.RenameField("effect", "effect_id", "uuid"),
        migrations.RenameField("conflict", "target_id", "target_uuid"),
        migrations.RenameField("auditevent", "run_id", "run_uuid"),
        migrations.RenameField("auditevent", "target_id", "target_ref"),
        migrations.RenameField("reconcilerequest", "task_id", "task_uuid"),
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveConstraint("run", "run_unique_per_tenant"),
            migrations.AddConstraint("run", models.UniqueConstraint(
                fields=["tenant", "uuid"], name="run_unique_per_tenant")),
            migrations.RemoveConstraint("checkpoint", "checkpoint_unique_per_tenant"),
            migrations.AddConstraint("checkpoint", models.UniqueConstraint(
                fields=["tenant", "uuid"], name="checkpoint_unique_per_tenant")),
            migrations.RemoveConstraint("effect", "effect_unique_per_tenant"),
            migrations.AddConstraint("effect", models.UniqueConstraint(
                fields=["tenant", "uuid"], name="effect_unique_per_tenant")),
            migrations.RemoveIndex("auditevent", "audit_run_idx"),
            migrations.AddIndex("auditevent", models.Index(
                fields=["tenant", "run_uuid", "-seq"], name="audit_run_idx")),
        ]),
        migrations.AlterField(
            "run", "uuid",
            models.UUIDField(help_text="the run's public id (``run_id`` on the wire)")),
        migrations.AlterField(
            "checkpoint", "uuid",
            models.UUIDField(help_text="the checkpoint's public id (``id`` on the wire)")),
        migrations.AlterField(
            "effect", "uuid",
            models.UUIDField(help_text="the effect's public id (``id`` on the wire)")),
        migrations.AlterField(
            "conflict", "target_uuid",
            models.UUIDField(help_text="the checkpoint's or effect's public id")),
        migrations.AlterField(
            "auditevent", "run_uuid",
            models.UUIDField(blank=True, null=True,
                             help_text="the run's public id (``run_id`` in the event JSON)")),
        migrations.AlterField(
            "auditevent", "target_ref",
            models.CharField(max_length=64, help_text="what it was done to: a UUID, pk, slug "
                             "or username (``target_id`` in the event JSON)")),
        migrations.AlterField(
            "reconcilerequest", "task_uuid",
            models.UUIDField(help_text="the id the reviewer was given (one per action; "
                             "``task_id`` on the wire)")),
    ]
