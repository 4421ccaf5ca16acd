"""``Run.schema_version`` as a 64-bit column (issue 17, item 1: the API takes 0..2^32-1,
which PostgreSQL's 32-bit ``integer`` could not hold: ``integer out of range``, a 500).

On SQLite an ``AlterField`` rebuilds the table (a new table, the rows copied, the old one
dropped), and the old table's triggers go with it: the run table's state-counter
triggers (migration 0011) and its transition history triggers (0013). They are created
again after the rebuild, and before the rebuild of the reverse step likewise. The rows
are copied without firing anything, so the counters stay right. PostgreSQL alters the
column in place and keeps its triggers. ``tests/test_migration_triggers.py`` checks that
every trigger the migrations create is there after ``migrate``.
"""

import importlib

from django.db import migrations, models

RUN_TABLE = "checkpoints_run"


def sqlite_run_triggers(apps, schema_editor):
    """Create the run table's SQLite triggers again (after a table rebuild)."""
    if schema_editor.connection.vendor != "sqlite":
        return
    counters = importlib.import_module("checkpoints.migrations.0011_state_counters")
    history = importlib.import_module("checkpoints.migrations.0013_report_history")
    statements = []
    for table, col, counter in counters.PAIRS:
        if table == RUN_TABLE:
            statements += [f"DROP TRIGGER IF EXISTS {counter}_{suffix};"
                           for suffix in ("ins", "del", "upd")]
            statements += counters._sqlite_up(table, col, counter)
    statements += [f"DROP TRIGGER IF EXISTS {history.HISTORY}_{suffix};"
                   for suffix in ("ins", "upd")]
    statements += history.SQLITE_UP
    for statement in statements:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0017_heartbeat'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_run_triggers),
        migrations.AlterField(
            model_name='run',
            name='schema_version',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(sqlite_run_triggers, migrations.RunPython.noop),
    ]
