"""``manage.py rotate_payload_keys``: after a new master key was prepended to
``RECOVERY_ENCRYPTION_KEYS``, re-wrap the tenants' data keys under it and move legacy
ciphertexts to the data keys (``services.payloads_rotate_keys``).

Prepend the new key, deploy, run this, then drop the old key. Safe beside live writers
and safe to run twice.
"""

from __future__ import annotations

from cryptography.fernet import InvalidToken
from django.core.management.base import BaseCommand, CommandError

from checkpoints import intranges, services


class Command(BaseCommand):
    help = ("Re-wrap every data key under the newest RECOVERY_ENCRYPTION_KEYS key and move "
            "legacy ciphertexts to the tenants' data keys.")

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=500)

    def handle(self, *args, **options):
        batch = intranges.ROTATE_BATCH
        if not batch.contains(options["batch_size"]):
            raise CommandError(f"--batch-size: must be an integer in "
                               f"{batch.minimum}..{batch.maximum}")
        try:
            stats = services.payloads_rotate_keys(batch_size=options["batch_size"])
        except InvalidToken:
            raise CommandError("a stored payload or data key fits none of "
                               "RECOVERY_ENCRYPTION_KEYS: keep every key that was ever used "
                               "until this succeeds") from None
        self.stdout.write(f"re-wrapped {stats['keys']} data key(s) and moved {stats['rows']} "
                          f"legacy row(s) in {stats['tenants']} tenant(s)")
