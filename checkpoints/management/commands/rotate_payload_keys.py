"""``manage.py rotate_payload_keys``: re-encrypt stored payloads under the newest key.

Prepend the new key to ``RECOVERY_ENCRYPTION_KEYS``, deploy, run this, then drop the old
key. Safe beside live writers and safe to run twice (``services.payloads_rotate_keys``).
"""

from __future__ import annotations

from cryptography.fernet import InvalidToken
from django.core.management.base import BaseCommand, CommandError

from checkpoints import services


class Command(BaseCommand):
    help = "Re-encrypt every stored payload under the newest RECOVERY_ENCRYPTION_KEYS key."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=500)

    def handle(self, *args, **options):
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            stats = services.payloads_rotate_keys(batch_size=options["batch_size"])
        except InvalidToken:
            raise CommandError("a stored payload fits none of RECOVERY_ENCRYPTION_KEYS: "
                               "keep every key that was ever used until this succeeds") from None
        self.stdout.write(f"re-encrypted {stats['rows']} row(s) in {stats['tenants']} tenant(s)")
