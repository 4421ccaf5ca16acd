"""``created_at`` of runs, effects, effect history, retry and reconcile requests,
reconciler configs and tenants is the database's time of the insert (``db_default``),
no longer the writing process's clock (``auto_now_add``): a node whose clock ran ahead
put its rows out of order (stop 32, the attack's finding).

Only the column default changes, and only on PostgreSQL, in place (``ALTER COLUMN ...
SET DEFAULT STATEMENT_TIMESTAMP()``, what Django's ``Now()`` is there), so the tables'
triggers stay. On SQLite Django writes the expression into each ``INSERT`` itself (it
has no ``DEFAULT`` keyword there), so the table needs no default, and an ``AlterField``
would rebuild the table and drop its triggers (the state counters, the transition
history: see 0018). Existing rows keep their times.
"""

from django.db import migrations, models
from django.db.models.functions import Now

#: The models whose ``created_at`` changes (each table is ``checkpoints_<model>``).
MODELS = ("effect", "effectrevision", "reconcilerconfig", "reconcilerequest", "retryrequest",
          "run", "tenant")


def set_defaults(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for model in MODELS:
            schema_editor.execute(f"ALTER TABLE checkpoints_{model} ALTER COLUMN created_at "
                                  "SET DEFAULT STATEMENT_TIMESTAMP()", params=None)


def drop_defaults(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for model in MODELS:
            schema_editor.execute(f"ALTER TABLE checkpoints_{model} ALTER COLUMN created_at "
                                  "DROP DEFAULT", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0041_write_lock_run_facts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(set_defaults, drop_defaults)],
            state_operations=[
                migrations.AlterField(model_name=model, name="created_at",
                                      field=models.DateTimeField(db_default=Now()))
                for model in MODELS
            ],
        ),
    ]
