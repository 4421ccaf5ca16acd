"""A retry request's expiry gets its own time (``expired_at``): closing a run used to write
the close's time into ``decided_at``, over an approved request's approval time. Requests
expired before this keep that time, now read as their expiry too (the approval's time of
an approved one was overwritten then and cannot be recovered)."""

from django.db import migrations, models
from django.db.models import F


def expired_at_from_decided_at(apps, schema_editor):
    retry = apps.get_model("checkpoints", "RetryRequest")
    retry.objects.filter(state="expired", expired_at__isnull=True).update(
        expired_at=F("decided_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0044_drop_write_lock_v1'),
    ]

    operations = [
        migrations.AddField(
            model_name='retryrequest',
            name='expired_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(expired_at_from_decided_at, migrations.RunPython.noop),
    ]
