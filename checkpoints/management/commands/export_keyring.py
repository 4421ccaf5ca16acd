"""``manage.py export_keyring --out FILE``: write every tenant's data keys, wrapped (or
marked destroyed), as JSON lines (``services.keyring_export``; docs/operations/backup.md).

Keep FILE beside the backups and export again after every ``rotate_payload_keys`` and
every ``shred_tenant``: restoring an older backup then reads with today's master keys,
and the keys destroyed since stay destroyed (``import_keyring``). FILE holds no key in
clear, but treat it like a database dump. An existing FILE is refused (exit 1, nothing
written: the operator's walk, item 3: a keyring kept beside older backups was replaced
without a word) unless ``--force``, which replaces it. The file is written to
``FILE.partial`` first, then linked (or, with ``--force``, renamed) into place, so FILE
is whole or absent. Writes nothing to the database. (``export_audit_head --out``
appends instead: one file collects the history of exported heads.)
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
        parser.add_argument("--force", action="store_true",
                            help="replace FILE if it exists (default: refuse)")

    def handle(self, *args, out: str, force: bool = False, **options):
        operatorfiles.check_output(out, what="--out")
        if not force and os.path.lexists(out):
            raise CommandError(self._exists(out))
        partial = f"{out}.partial"
        operatorfiles.check_output(partial, what="--out")  # as export_runifold's
        records = services.keyring_export()
        try:
            with operatorfiles.open_private(partial, "w") as fh:
                for record in records:
                    fh.write(json.dumps(record, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            if force:
                os.replace(partial, out)
            else:  # no overwrite even if FILE appeared meanwhile
                try:
                    os.link(partial, out)
                finally:
                    os.unlink(partial)
        except FileExistsError:
            raise CommandError(self._exists(out)) from None
        except OSError as exc:
            raise CommandError(f"--out: cannot write {out!r} ({exc})") from None
        self.stdout.write(f"wrote {len(records)} data key(s) to {out}")

    @staticmethod
    def _exists(out: str) -> str:
        return (f"--out: {out} exists, and a keyring kept beside older backups is not "
                f"replaced: give a new name (e.g. keyring-$(date +%F).jsonl), or --force "
                f"to replace it. Nothing written")
