"""The audit log's search finds events by their incident reference (the newcomer's
finding: ``INC-2041``, shown on each row it was typed for, found nothing).

PostgreSQL only: ``audit_incident_idx``, a partial index ``(tenant_id,
UPPER(incident_ref) text_pattern_ops, seq DESC) WHERE incident_ref IS NOT NULL``, for
``selectors.search.incident_match``'s ``UPPER(incident_ref::text) LIKE UPPER('INC-20%')``
(a case-insensitive prefix: a range of the index whatever the database's collation).
Partial: most events (every write of a runtime, every sweep) carry no incident, and
those cost no entry. The audit table's triggers are untouched (``CREATE INDEX`` is no
``ALTER TABLE``). SQLite gets none (its search reads the tenant's events; same answers).
On a large installation build it first with ``CREATE INDEX CONCURRENTLY`` under the same
name: the ``IF NOT EXISTS`` then makes this step a no-op.
"""

from django.db import migrations

PG_FORWARD = (
    "CREATE INDEX IF NOT EXISTS audit_incident_idx ON checkpoints_auditevent "
    "(tenant_id, UPPER(incident_ref) text_pattern_ops, seq DESC) "
    "WHERE incident_ref IS NOT NULL",
)
PG_BACKWARD = ("DROP INDEX IF EXISTS audit_incident_idx",)


def _run_on_postgresql(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for sql in statements:
            schema_editor.execute(sql)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ("checkpoints", "0042_created_at_database_clock"),
    ]

    operations = [
        migrations.RunPython(_run_on_postgresql(PG_FORWARD),
                             _run_on_postgresql(PG_BACKWARD), elidable=False),
    ]
