"""Issue 6, fault 3: effect receipts are encrypted at rest like payloads, and labels never
carry payload values.

1. ``Effect.receipt`` and ``EffectRevision.receipt`` (JSON in clear) become
   ``receipt_ciphertext`` (Fernet text, ``checkpoints.crypto``): each existing receipt is
   encrypted as its canonical JSON text, then the clear column is dropped. Backwards,
   each is decrypted into the JSON column again.
2. Phase labels and recovery reasons written from a payload its kind's validator refused
   quoted the refused value (``... must be one of [...], not 'secret'``). Those stored
   texts are replaced by ``payload does not match KIND vN`` (kind and version are
   envelope metadata); the next write of the run names the field and the rule again.
   The demo kind ``acme.order`` put the payload's order id into its labels
   (``charging order A-1042``); those labels keep the phase only.
   Audit events that quoted such a label are append-only and hash-chained, so they are
   left as they are (docs/security/access.md says so).
"""

from django.db import migrations, models

LEAKY = "payload does not match "


def encrypt_receipts(apps, schema_editor):
    from checkpoints import crypto
    from checkpoints.jsonparse import dumps

    for name in ("Effect", "EffectRevision"):
        model = apps.get_model("checkpoints", name)
        rows = model.objects.filter(receipt__isnull=False).values_list("pk", "receipt")
        for pk, receipt in rows.iterator():
            model.objects.filter(pk=pk).update(
                receipt_ciphertext=crypto.encrypt_text(dumps(receipt), tenant=None))


def decrypt_receipts(apps, schema_editor):
    from checkpoints import crypto
    from checkpoints.jsonparse import loads_any

    for name in ("Effect", "EffectRevision"):
        model = apps.get_model("checkpoints", name)
        rows = model.objects.exclude(receipt_ciphertext="").values_list(
            "pk", "receipt_ciphertext")
        for pk, token in rows.iterator():
            model.objects.filter(pk=pk).update(
                receipt=loads_any(crypto.decrypt_text(token, tenant=None)))


def scrub_labels(apps, schema_editor):
    for name in ("Checkpoint", "CheckpointRevision"):
        model = apps.get_model("checkpoints", name)
        rows = (model.objects.filter(phase_class="unsupported", phase_label__startswith=LEAKY)
                .values_list("pk", "kind", "schema_version"))
        for pk, kind, version in rows.iterator():
            model.objects.filter(pk=pk).update(phase_label=f"{LEAKY}{kind} v{version}"[:256])
    for name in ("Checkpoint", "CheckpointRevision", "Run"):
        model = apps.get_model("checkpoints", name)
        rows = (model.objects.filter(kind="acme.order", phase_label__contains=" order ")
                .exclude(phase_class="unsupported").values_list("pk", "phase_label"))
        for pk, label in rows.iterator():
            model.objects.filter(pk=pk).update(phase_label=label.split(" order ", 1)[0])
    run_model = apps.get_model("checkpoints", "Run")
    for column in ("phase_label", "recovery_reason"):
        rows = (run_model.objects.filter(**{f"{column}__startswith": LEAKY})
                .values_list("pk", "kind", "schema_version"))
        for pk, kind, version in rows.iterator():
            run_model.objects.filter(pk=pk).update(**{column: f"{LEAKY}{kind} v{version}"[:256]})


class Migration(migrations.Migration):

    dependencies = [
        ("checkpoints", "0003_reconcile_jobs_close"),
    ]

    operations = [
        migrations.AddField(
            model_name="effect",
            name="receipt_ciphertext",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="effectrevision",
            name="receipt_ciphertext",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.RunPython(encrypt_receipts, decrypt_receipts),
        migrations.RemoveField(model_name="effect", name="receipt"),
        migrations.RemoveField(model_name="effectrevision", name="receipt"),
        migrations.RunPython(scrub_labels, migrations.RunPython.noop),
    ]
