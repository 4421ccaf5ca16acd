"""Issue 8, lists that do not grow with the tenant: an index for each list's filter and
order (every list page is an index scan stopped by its LIMIT, every count an index-only
GROUP BY), and ``Run.last_write_at`` NOT NULL so that the inbox order
``-last_write_at, -id`` is the indexes' order on PostgreSQL and SQLite alike (PostgreSQL's
DESC puts NULLs first, SQLite's last; SQLite indexes cannot say NULLS LAST).

A run without a last write (none is made by the services, which create a run with its
first write) takes its last state change or creation time first.

On a large installation these CREATE INDEX statements hold a write lock on their table
while they build (the audit and effect tables are the big ones): apply with the service
stopped, or build them first with ``CREATE INDEX CONCURRENTLY`` under the same names
(``manage.py sqlmigrate checkpoints 0009`` prints them).
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0008_uuid_field_names'),
    ]

    operations = [
        migrations.RunSQL(
            "UPDATE checkpoints_run SET last_write_at = COALESCE(state_changed_at, created_at) "
            "WHERE last_write_at IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name='run',
            name='last_write_at',
            field=models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(fields=['tenant', 'actor_name', '-seq'], name='audit_actor_idx'),
        ),
        migrations.AddIndex(
            model_name='conflict',
            index=models.Index(fields=['run', '-created_at', '-id'], name='conflict_run_new_idx'),
        ),
        migrations.AddIndex(
            model_name='conflict',
            index=models.Index(condition=models.Q(('acknowledged_at__isnull', True)), fields=['tenant'], name='conflict_open_idx'),
        ),
        migrations.AddIndex(
            model_name='effect',
            index=models.Index(fields=['tenant', 'state'], name='effect_tenant_state_idx'),
        ),
        migrations.AddIndex(
            model_name='effect',
            index=models.Index(fields=['tenant', '-created_at', '-id'], name='effect_tenant_new_idx'),
        ),
        migrations.AddIndex(
            model_name='effect',
            index=models.Index(fields=['tenant', 'service', '-created_at', '-id'], name='effect_service_new_idx'),
        ),
        migrations.AddIndex(
            model_name='retryrequest',
            index=models.Index(fields=['tenant', 'state'], name='retry_tenant_state_idx'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(fields=['tenant', '-last_write_at', '-id'], name='run_all_idx'),
        ),
    ]
