# Issue 9: a reviewer may withdraw their own open retry request (RetryState.WITHDRAWN);
# only the choices change (no constraint names the states it adds).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0013_report_history'),
    ]

    operations = [
        migrations.AlterField(
            model_name='retryrequest',
            name='state',
            field=models.CharField(choices=[('requested', 'Requested'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('expired', 'Expired'), ('consumed', 'Consumed'), ('withdrawn', 'Withdrawn')], default='requested', max_length=16),
        ),
    ]
