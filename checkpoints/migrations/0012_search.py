"""Issue 9, find anything and page without skipping.

1. The run lists page by keyset on ``id`` (which no write changes) instead of
   ``last_write_at`` (which every write changes): ``run_inbox_idx`` becomes
   ``(tenant, recovery_state, -id)`` and ``run_all_idx`` ``(tenant, -id)``.
2. PostgreSQL only: trigram GIN indexes for the search's substring matches
   (``selectors._search_run_ids``), after ``CREATE EXTENSION IF NOT EXISTS pg_trgm``:

   - ``run_search_trgm`` on ``agent || chr(31) || workflow || chr(31) || phase_label ||
     chr(31) || lease_owner``, the expression ``selectors.RunText`` renders (one GIN
     index rather than four: a run row is rewritten on every checkpoint write, and each
     index costs that write an insert);
   - ``effect_opkey_trgm`` on ``operation_key``.

   Prefix searches (run id, checkpoint id) are ranges of the existing ``(tenant, uuid)``
   unique indexes and need nothing new. SQLite gets none of these (its search scans
   the tenant's runs; slower, same answers).

Creating the extension needs a role allowed to (a superuser, or the database owner on
PostgreSQL 13+ since pg_trgm is a "trusted" extension). Where the migrating role may not,
run ``CREATE EXTENSION pg_trgm;`` once as a superuser first: the ``IF NOT EXISTS`` then
makes this step a no-op. On a large installation build the indexes first with ``CREATE
INDEX CONCURRENTLY`` under the same names (``manage.py sqlmigrate checkpoints 0012``
does not print the RunPython part: the statements are ``PG_FORWARD`` below).
"""

from django.db import migrations, models

PG_FORWARD = (
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX IF NOT EXISTS run_search_trgm ON checkpoints_run USING gin "
    "((agent || chr(31) || workflow || chr(31) || phase_label || chr(31) || lease_owner) "
    "gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS effect_opkey_trgm ON checkpoints_effect USING gin "
    "(operation_key gin_trgm_ops)",
)
PG_BACKWARD = (
    "DROP INDEX IF EXISTS run_search_trgm",
    "DROP INDEX IF EXISTS effect_opkey_trgm",
)


def _run_on_postgresql(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for sql in statements:
            schema_editor.execute(sql)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0011_state_counters'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='run', name='run_inbox_idx'),
        migrations.RemoveIndex(model_name='run', name='run_all_idx'),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(fields=['tenant', 'recovery_state', '-id'], name='run_inbox_idx'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(fields=['tenant', '-id'], name='run_all_idx'),
        ),
        migrations.RunPython(_run_on_postgresql(PG_FORWARD),
                             _run_on_postgresql(PG_BACKWARD), elidable=False),
    ]
