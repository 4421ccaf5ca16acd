"""Drop ``checkpoints_write_lock``, the first version of the write path's lock function
(migration 0039). Migration 0041 added ``checkpoints_write_lock_v2`` under a new name so
that processes of the release before it could keep calling the old one while a deploy
rolled; no release since calls it (``locks.write_lock_sql`` names only v2), so it goes.

Reversible: going back re-creates it exactly as 0039 made it (``function_sql`` over the
models as they are here; the columns it reads have not changed since).
"""

import importlib

from django.db import migrations

_0039 = importlib.import_module("checkpoints.migrations.0039_checkpoint_write_lock")


def drop(apps, schema_editor):
    _0039.down(apps, schema_editor)


def recreate(apps, schema_editor):
    _0039.up(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0043_audit_incident_search")]
    operations = [migrations.RunPython(drop, recreate)]
