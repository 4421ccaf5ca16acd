"""``manage.py restore_drill``: dump the database, restore it into a fresh one, and prove
the copy serves (``checkpoints.ops.restoredrill``; docs/operations/backup.md).

    manage.py restore_drill [--heads FILE] [--dump FILE] [--keyring FILE]
                            [--erased SLUG ...] [--target NAME] [--keep]

``--heads``: audit heads exported right before the dump (``export_audit_head --out``;
without ``--heads`` and ``--dump``: exported now, audited, then dumped; a ``--dump``
without ``--heads``: the chain is verified without an exported head). ``--dump``: restore this ``pg_dump --format=custom`` file instead of
dumping now. ``--keyring``: a keyring exported after the dump (``export_keyring``).
``--erased``: a tenant that must serve no payload after the restore (crypto-shredded, or
its master key dropped). Prints the report as JSON; exits 1 (``CommandError``) naming
each problem. ``--check`` is the step that runs in the new process against the copy.
"""

from __future__ import annotations

import json
import os

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from checkpoints.ops import restoredrill


class Command(BaseCommand):
    help = "Dump, restore into a fresh database, verify the audit chain and serve the copy."

    def add_arguments(self, parser):
        parser.add_argument("--heads", metavar="FILE",
                            help="audit heads exported right before the dump")
        parser.add_argument("--dump", metavar="FILE",
                            help="a pg_dump --format=custom file (default: dump now)")
        parser.add_argument("--keyring", metavar="FILE",
                            help="a keyring exported after the dump (export_keyring)")
        parser.add_argument("--erased", metavar="SLUG", action="append", default=[],
                            help="a tenant that must serve no payload (repeatable)")
        parser.add_argument("--target", metavar="NAME",
                            help="the restored copy's database (default <database>_drill)")
        parser.add_argument("--keep", action="store_true",
                            help="keep the restored copy")
        parser.add_argument("--check", action="store_true",
                            help="(internal) check the database this process uses")

    def handle(self, *args, **o):
        # The check runs in a new process started in the repository: a path given relative
        # to where the operator stands is made absolute here.
        for name in ("heads", "keyring", "dump"):
            if o[name]:
                o[name] = os.path.abspath(o[name])
        try:
            if o["check"]:
                self.stdout.write(json.dumps(restoredrill.check(heads=o["heads"],
                                                                keyring=o["keyring"])))
                return
            result = restoredrill.drill(heads=o["heads"], dump_path=o["dump"],
                                        keyring=o["keyring"], erased=set(o["erased"]),
                                        target=o["target"], keep=o["keep"])
        except restoredrill.DrillFailed as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:  # e.g. the service's role may not create databases
            raise CommandError(f"restore drill: the database refused: {str(exc).strip()} "
                               "(run it as a role that may create and drop databases, "
                               "docs/operations/backup.md)") from None
        self.stdout.write(json.dumps(result.report, sort_keys=True))
        if result.problems:
            raise CommandError("restore drill failed: " + "; ".join(result.problems))
        self.stdout.write("restore drill passed")
