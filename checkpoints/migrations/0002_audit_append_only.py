"""PostgreSQL: the audit log refuses UPDATE and DELETE (DESIGN.md section 5).

SQLite gets no trigger: the test runner's flush of TransactionTestCase deletes rows there,
and the embedded default is for demos. Stated in README "Guarantees per backend".
"""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION checkpoints_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'checkpoints_auditevent is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS checkpoints_audit_append_only ON checkpoints_auditevent;
CREATE TRIGGER checkpoints_audit_append_only
    BEFORE UPDATE OR DELETE ON checkpoints_auditevent
    FOR EACH ROW EXECUTE FUNCTION checkpoints_audit_append_only();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS checkpoints_audit_append_only ON checkpoints_auditevent;
DROP FUNCTION IF EXISTS checkpoints_audit_append_only();
"""


def up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0001_initial")]
    operations = [migrations.RunPython(up, down)]
