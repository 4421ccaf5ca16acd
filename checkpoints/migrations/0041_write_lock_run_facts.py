"""Issue 22, item 2: a stale write refused in the same two round trips as an accepted one.

``checkpoints_write_lock_v2`` is ``checkpoints_write_lock`` (migration 0039) returning
also the run's phase, last write time, kind, schema version and identity: what the run's
recovery state needs when a refused write leaves the run as it was, but one conflict
more (``services.writepath``). A new name, not a changed return type: processes of the
previous release still call the old function while a deploy rolls, so it stays (a later
migration drops it once no release calls it).
"""

import importlib

from django.db import migrations

_0039 = importlib.import_module("checkpoints.migrations.0039_checkpoint_write_lock")

NAME = "checkpoints_write_lock_v2"
RUN_COLUMNS = [*_0039.RUN_COLUMNS, "phase_class", "phase_label", "last_write_at", "kind",
               "schema_version", "agent", "model", "workflow", "definition_version"]


def up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0039.function_sql(apps, schema_editor.connection, name=NAME,
                                                 run_columns=RUN_COLUMNS), params=None)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {NAME}("
                              "bigint, uuid, uuid, text[], text[]);", params=None)


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0040_audit_export_tree_size")]
    operations = [migrations.RunPython(up, down)]
