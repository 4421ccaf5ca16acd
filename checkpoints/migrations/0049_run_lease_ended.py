"""Who ended a run's lease, when and why (``services.lease_revoke``; the run page, the
inbox and the API say "ended", not "expired": ``policy.lease_state``).

The three columns are nullable: on SQLite adding a NOT NULL column rebuilds the table and
drops the run table's triggers (the state counters, the transition history, the
notification outbox: see 0018 and 0027); a nullable one is an ``ALTER TABLE ADD COLUMN``
there, and on PostgreSQL a change of the catalogue only.
``tests/test_migration_triggers.py`` checks every trigger is there after ``migrate``.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0048_job_incident_ref'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='lease_ended_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='lease_ended_by',
            field=models.CharField(blank=True, max_length=150, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='lease_ended_reason',
            field=models.TextField(blank=True, null=True),
        ),
    ]
