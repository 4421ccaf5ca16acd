# Issue 21, item 10: the incident a reviewer worked on, on each audit event they cause.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0033_notify_aging_mark'),
    ]

    operations = [
        migrations.AddField(
            model_name='auditevent',
            name='incident_ref',
            field=models.CharField(blank=True, help_text='the incident the actor was working on (``INC-2041``), typed in the dashboard and kept in their session (issue 21, item 10); null: none. Covered by the hash when set (``audit.audit_fields``)', max_length=64, null=True),
        ),
    ]
