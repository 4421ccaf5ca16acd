"""Tombstone governance (issue 20, item 5; RUNIFOLD.md 5; docs/security/audit.md).

1. ``TombstonePurge.tombstone_ids``: the ids a prepared purge froze, so its execution
   deletes exactly them (and re-checks their fingerprint and holds first).
2. PostgreSQL: tombstones are immutable. A trigger refuses every ``UPDATE`` and every
   ``TRUNCATE`` of ``checkpoints_tombstone``, for every role (the owner included; a
   superuser can switch triggers off, as for the audit trail). ``DELETE`` stays allowed:
   a trigger cannot tell the four-eyes purge (``services.tombstone_purge_execute``) from
   another ``DELETE``; what tells them apart afterwards is the audit trail (every purge's
   ``tombstone_purge.execute`` event names its fingerprint and cursors, and the exported
   ``tombstones.jsonl`` holds every tombstone it could delete). SQLite gets no trigger
   (see 0002).
"""

from django.db import migrations, models

PG_UP = """
CREATE OR REPLACE FUNCTION checkpoints_tombstone_immutable() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'checkpoints_tombstone is immutable (% refused): only a four-eyes '
        'tombstone purge deletes tombstones', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS checkpoints_tombstone_no_update ON checkpoints_tombstone;
CREATE TRIGGER checkpoints_tombstone_no_update
    BEFORE UPDATE ON checkpoints_tombstone
    FOR EACH ROW EXECUTE FUNCTION checkpoints_tombstone_immutable();
DROP TRIGGER IF EXISTS checkpoints_tombstone_no_truncate ON checkpoints_tombstone;
CREATE TRIGGER checkpoints_tombstone_no_truncate
    BEFORE TRUNCATE ON checkpoints_tombstone
    FOR EACH STATEMENT EXECUTE FUNCTION checkpoints_tombstone_immutable();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS checkpoints_tombstone_no_truncate ON checkpoints_tombstone;
DROP TRIGGER IF EXISTS checkpoints_tombstone_no_update ON checkpoints_tombstone;
DROP FUNCTION IF EXISTS checkpoints_tombstone_immutable();
"""


def triggers_up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)


def triggers_down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0027_secret_paths'),
    ]

    operations = [
        migrations.AddField(
            model_name='tombstonepurge',
            name='tombstone_ids',
            field=models.JSONField(default=list, help_text="the frozen tombstones' ids, ascending (at most TOMBSTONE_PURGE_MAX)"),
        ),
        migrations.RunPython(triggers_up, triggers_down),
    ]
