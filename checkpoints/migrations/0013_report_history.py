"""The report's history (issue 9, item 6): ``RunTransition`` (every change of a run's
recovery state, written by triggers on the run table in the same transaction as the
change, on PostgreSQL and SQLite, like the state counters of migration 0011),
``ResumeDecision`` (claimed resume decisions, written by ``services.resume_claim``), and
the indexes the report's range queries use.

The triggers record a run's insert (``from_state = ''``) and every ``recovery_state``
change, whichever code makes it: the ORM services, the SQL write path
(``checkpoints.writepath``) and ``generate_load`` alike. ``at`` is the database clock:
``CLOCK_TIMESTAMP()`` on PostgreSQL (so two changes in one transaction keep their
order), ``STRFTIME('%Y-%m-%d %H:%M:%f', 'now')`` on SQLite (Django's text format).

Backfill, best effort: one row per existing run, ``'' -> recovery_state`` at the time it
entered that state (``state_changed_at``, else ``created_at``). Earlier changes were
never recorded.
"""


import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


TABLE, COL, HISTORY = "checkpoints_run", "recovery_state", "checkpoints_runtransition"
_INSERT = (f"INSERT INTO {HISTORY} (tenant_id, run_id, from_state, to_state, at) "
           f"VALUES (NEW.tenant_id, NEW.id, {{old}}, NEW.{COL}, {{now}});")
PG_NOW, SQLITE_NOW = "CLOCK_TIMESTAMP()", "STRFTIME('%Y-%m-%d %H:%M:%f', 'now')"

PG_UP = f"""
CREATE OR REPLACE FUNCTION {HISTORY}_keep() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_INSERT.format(old="''", now=PG_NOW)}
    ELSIF NEW.{COL} IS DISTINCT FROM OLD.{COL} THEN
        {_INSERT.format(old=f"OLD.{COL}", now=PG_NOW)}
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS {HISTORY}_keep ON {TABLE};
CREATE TRIGGER {HISTORY}_keep AFTER INSERT OR UPDATE OF {COL} ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION {HISTORY}_keep();
"""
SQLITE_UP = [
    f"CREATE TRIGGER {HISTORY}_ins AFTER INSERT ON {TABLE} "
    f"BEGIN {_INSERT.format(old=chr(39) * 2, now=SQLITE_NOW)} END;",
    f"CREATE TRIGGER {HISTORY}_upd AFTER UPDATE OF {COL} ON {TABLE} "
    f"WHEN OLD.{COL} IS NOT NEW.{COL} "
    f"BEGIN {_INSERT.format(old=f'OLD.{COL}', now=SQLITE_NOW)} END;",
]
BACKFILL = (f"INSERT INTO {HISTORY} (tenant_id, run_id, from_state, to_state, at) "
            f"SELECT tenant_id, id, '', {COL}, COALESCE(state_changed_at, created_at) "
            f"FROM {TABLE}")

#: PostgreSQL only: the report's range indexes made covering (``INCLUDE``), so a range is
#: an index-only scan (the checkpoint sizes read 10^5..10^6 revisions). Same names and key
#: columns as the ``Meta.indexes`` entries (Django's state); SQLite has no ``INCLUDE``.
PG_COVERING = [
    ("checkpoint_revision_recv_idx", "checkpoints_checkpointrevision",
     "tenant_id, received_at", "kind, payload_size"),
    ("run_transition_at_idx", "checkpoints_runtransition", "tenant_id, at", "to_state"),
]


def up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)
        for name, table, keys, extra in PG_COVERING:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}; CREATE INDEX {name} ON "
                                  f"{table} ({keys}) INCLUDE ({extra});", params=None)
    else:
        for statement in SQLITE_UP:
            schema_editor.execute(statement, params=None)
    schema_editor.execute(BACKFILL, params=None)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {HISTORY}_keep ON {TABLE}; "
                              f"DROP FUNCTION IF EXISTS {HISTORY}_keep();", params=None)
    else:
        for suffix in ("ins", "upd"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {HISTORY}_{suffix};", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0012_search'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ResumeDecision',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(max_length=16)),
                ('reason', models.CharField(max_length=32)),
                ('checkpoint_age_ms', models.BigIntegerField(blank=True, null=True)),
                ('at', models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name='RunTransition',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('from_state', models.CharField(blank=True, max_length=24)),
                ('to_state', models.CharField(max_length=24)),
                ('at', models.DateTimeField()),
            ],
        ),
        migrations.AddIndex(
            model_name='checkpointrevision',
            index=models.Index(fields=['tenant', 'received_at'], name='checkpoint_revision_recv_idx'),
        ),
        migrations.AddIndex(
            model_name='conflict',
            index=models.Index(fields=['tenant', 'created_at'], name='conflict_tenant_new_idx'),
        ),
        migrations.AddIndex(
            model_name='reconcileattempt',
            index=models.Index(fields=['tenant', 'finished_at'], name='reconcile_attempt_done_idx'),
        ),
        migrations.AddIndex(
            model_name='reconcilerequest',
            index=models.Index(fields=['tenant', 'finished_at'], name='reconcile_tenant_done_idx'),
        ),
        migrations.AddIndex(
            model_name='retryrequest',
            index=models.Index(fields=['tenant', 'decided_at'], name='retry_tenant_decided_idx'),
        ),
        migrations.AddField(
            model_name='resumedecision',
            name='run',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='checkpoints.run'),
        ),
        migrations.AddField(
            model_name='resumedecision',
            name='tenant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant'),
        ),
        migrations.AddField(
            model_name='runtransition',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='checkpoints.run'),
        ),
        migrations.AddField(
            model_name='runtransition',
            name='tenant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant'),
        ),
        migrations.AddIndex(
            model_name='resumedecision',
            index=models.Index(fields=['tenant', 'at'], name='resume_decision_at_idx'),
        ),
        migrations.AddIndex(
            model_name='runtransition',
            index=models.Index(fields=['tenant', 'at'], name='run_transition_at_idx'),
        ),
        migrations.AddIndex(
            model_name='runtransition',
            index=models.Index(fields=['run', 'at'], name='run_transition_run_idx'),
        ),
        migrations.RunPython(up, down),
    ]
