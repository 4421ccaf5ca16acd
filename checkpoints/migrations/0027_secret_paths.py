"""Screening's flags on checkpoints, revisions and effects (issue 20, item 7).

On SQLite, adding a JSON field with a default rebuilds the table, and the effect table's
state-counter triggers (migration 0011) go with it, as 0018 found for the run table: they
are created again after the rebuild (and after the reverse step's rebuild).
``tests/test_migration_triggers.py`` checks every trigger is there after ``migrate``.
"""

import importlib

from django.db import migrations, models

EFFECT_TABLE = "checkpoints_effect"


def sqlite_effect_triggers(apps, schema_editor):
    """Create the effect table's SQLite state-counter triggers again (after a rebuild)."""
    if schema_editor.connection.vendor != "sqlite":
        return
    counters = importlib.import_module("checkpoints.migrations.0011_state_counters")
    for table, col, counter in counters.PAIRS:
        if table != EFFECT_TABLE:
            continue
        for suffix in ("ins", "del", "upd"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {counter}_{suffix};", params=None)
        for statement in counters._sqlite_up(table, col, counter):
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0026_lifecycle'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_effect_triggers),
        migrations.AddField(
            model_name='checkpoint',
            name='large_above',
            field=models.PositiveIntegerField(blank=True, help_text="the tenant's payload_flag_bytes the payload was above when written", null=True),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='secret_paths',
            field=models.JSONField(blank=True, default=list, db_default=models.Value([], models.JSONField()), help_text='credential-like values found in the payload when written: [{path: JSON pointer, type: word}] (checkpoints.secrets_scan; never a value)'),
        ),
        migrations.AddField(
            model_name='checkpointrevision',
            name='large_above',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='checkpointrevision',
            name='secret_paths',
            field=models.JSONField(blank=True, default=list, db_default=models.Value([], models.JSONField()), help_text='as Checkpoint.secret_paths, for this revision'),
        ),
        migrations.AddField(
            model_name='effect',
            name='secret_paths',
            field=models.JSONField(blank=True, default=list, db_default=models.Value([], models.JSONField()), help_text='credential-like values found in the request and the current receipt: [{path: /request/... or /receipt/..., type: word}] (never a value)'),
        ),
        migrations.RunPython(sqlite_effect_triggers, migrations.RunPython.noop),
    ]
