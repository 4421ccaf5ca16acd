"""Issue 17, item 13: the audit MAC covers ``actor_id``, and a tenant registry.

1. ``AuditEvent.hash_scheme`` 3: HMAC-SHA256 over the fields of scheme 2 plus
   ``actor_id`` and the scheme number. New events are scheme 3; events written before
   stay scheme 2 and verify as they were made (no data changes here).
2. ``AuditTenant``, the tenant registry: one keyed row per tenant ever created, so that
   ``verify_audit_chain`` reports a tenant whose row, events and head were all deleted.
   Existing tenants are registered here, with the newest ``RECOVERY_AUDIT_KEYS`` key (run
   ``migrate`` with the service's keys, as for 0005).
3. PostgreSQL: triggers refuse UPDATE, DELETE and TRUNCATE of the registry, with the
   audit trail's function (0005); ``setup_database_roles`` leaves the app role SELECT and
   INSERT on it. SQLite gets no trigger (see 0002).
"""

from django.db import migrations, models

PG_UP = """
DROP TRIGGER IF EXISTS checkpoints_audittenant_append_only ON checkpoints_audittenant;
CREATE TRIGGER checkpoints_audittenant_append_only
    BEFORE UPDATE OR DELETE ON checkpoints_audittenant
    FOR EACH ROW EXECUTE FUNCTION checkpoints_audit_append_only();
DROP TRIGGER IF EXISTS checkpoints_audittenant_no_truncate ON checkpoints_audittenant;
CREATE TRIGGER checkpoints_audittenant_no_truncate
    BEFORE TRUNCATE ON checkpoints_audittenant
    FOR EACH STATEMENT EXECUTE FUNCTION checkpoints_audit_append_only();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS checkpoints_audittenant_no_truncate ON checkpoints_audittenant;
DROP TRIGGER IF EXISTS checkpoints_audittenant_append_only ON checkpoints_audittenant;
"""


def triggers_up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)


def triggers_down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)


def register(apps, schema_editor):
    from checkpoints.audit import register_existing_tenants

    register_existing_tenants(apps.get_model("checkpoints", "Tenant"),
                              apps.get_model("checkpoints", "AuditTenant"))


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0019_conflict_created_at_database_clock'),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditevent',
            name='hash_scheme',
            field=models.PositiveSmallIntegerField(choices=[(1, 'sha256 (legacy, unkeyed)'), (2, 'hmac-sha256'), (3, 'hmac-sha256, actor id covered')]),
        ),
        migrations.CreateModel(
            name='AuditTenant',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField(help_text='registration number, from 1', unique=True)),
                ('tenant_pk', models.BigIntegerField(help_text="the tenant's primary key", unique=True)),
                ('slug', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField()),
                ('key_id', models.CharField(max_length=16)),
                ('mac', models.CharField(max_length=64)),
            ],
        ),
        migrations.RunPython(register, migrations.RunPython.noop),
        migrations.RunPython(triggers_up, triggers_down),
    ]
