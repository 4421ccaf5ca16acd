"""``manage.py import_keyring FILE``: after restoring a backup, bring its data keys up to
a keyring exported later (``export_keyring``; ``services.keyring_restore``): keys
destroyed since are destroyed here too, live keys take the copy wrapped by today's master
key. Audited in each tenant's chain. Exits 1 for an unreadable or malformed FILE, and
after applying it when some live key's copy fits no configured master key.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError, InvalidPayload
from checkpoints.jsonparse import loads_object
from checkpoints.ops.operatorfiles import open_input


class Command(BaseCommand):
    help = "Apply a keyring exported by export_keyring to this (restored) database."

    def add_arguments(self, parser):
        parser.add_argument("file", help="JSON lines written by export_keyring (or -)")

    def handle(self, *args, file: str, **options):
        stream, _ = open_input(file, what="file")
        try:
            with stream:
                lines = stream.read().decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"file: cannot read {file!r} ({exc})") from None
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:  # the strict rules of API bodies: no repeated key, NaN or overflow
                records.append(loads_object(line, what=f"record {number}"))
            except InvalidPayload as exc:
                raise CommandError(f"file: {exc.detail} (nothing imported)") from None
        try:
            done = services.keyring_restore(records=records)
        except DomainError as exc:
            raise CommandError(f"file: {exc.detail}") from None
        self.stdout.write(f"destroyed {done['destroyed']} and re-wrapped "
                          f"{done['rewrapped']} data key(s)")
        if done["unwrappable"]:
            raise CommandError(
                f"{done['unwrappable']} data key(s) in the file fit none of "
                "RECOVERY_ENCRYPTION_KEYS: left as they were (is the master key that "
                "wrapped the keyring configured?)")
