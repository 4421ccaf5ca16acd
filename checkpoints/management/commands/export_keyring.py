"""``manage.py export_keyring --out FILE``: write every tenant's data keys, wrapped (or
marked destroyed), as JSON lines (``services.keyring_export``; docs/operations/backup.md).

Keep FILE beside the backups and export again after every ``rotate_payload_keys`` and
every ``shred_tenant``: restoring an older backup then reads with today's master keys,
and the keys destroyed since stay destroyed (``import_keyring``). FILE holds no key in
clear, but treat it like a database dump. The file is replaced (written to a temporary
file first, then renamed). Writes nothing to the database.
"""

from __future__ import annotations

import json
import os

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.ops import operatorfiles


class Command(BaseCommand):
    help = "Export every tenant's data keys (wrapped, or destroyed) as JSON lines."

    def add_arguments(self, parser):
        parser.add_argument("--out", required=True, metavar="FILE")

    def handle(self, *args, out: str, **options):
        operatorfiles.check_output(out, what="--out")
        partial = f"{out}.partial"
        operatorfiles.check_output(partial, what="--out")  # as export_runifold's
        records = services.keyring_export()
        try:
            with operatorfiles.open_private(partial, "w") as fh:
                for record in records:
                    fh.write(json.dumps(record, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(partial, out)
        except OSError as exc:
            raise CommandError(f"--out: cannot write {out!r} ({exc})") from None
        self.stdout.write(f"wrote {len(records)} data key(s) to {out}")
