"""``manage.py import_runifold FILE --tenant T``: read a runifold JSON Lines file
(checkpoint envelopes and effect records, RUNIFOLD.md 1-4) into one tenant (issue 10,
item 4; ``docs/runifold.md``).

Every line is checked and written by ``runifold.runifold_import`` (batches, each in one
transaction with its audit events); this command only reads the arguments and prints.
Each bad line is reported on stderr as ``line N: field: rule``; the others are imported.
The summary goes to stdout; the exit status is 1 when any line failed. Importing the same
file again imports nothing new. ``FILE`` may be ``-`` for standard input; anything else
must be a regular file (a device, FIFO or directory is refused), and the input at most
``RECOVERY_IMPORT_MAX_BYTES`` and ``RECOVERY_IMPORT_MAX_LINES`` (``checkpoints.ops.operatorfiles``,
checked before anything is written). A progress bar
(tqdm) is drawn on stderr when it is a terminal, unless ``--no-progress``.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from checkpoints.exceptions import DomainError
from checkpoints.interop import runifold
from checkpoints.models import Tenant
from checkpoints.ops.operatorfiles import open_input


class Command(BaseCommand):
    help = "Import a runifold JSON Lines file (checkpoints and effect records) into a tenant."

    def add_arguments(self, parser):
        parser.add_argument("file", help="the JSON Lines file, or - for standard input")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--batch-size", type=int, default=runifold.DEFAULT_BATCH,
                            help="lines per transaction, 1..10000 "
                                 f"(default {runifold.DEFAULT_BATCH})")
        parser.add_argument("--no-progress", action="store_true",
                            help="no progress bar (there is none when stderr is not a terminal)")

    def handle(self, *args, file: str, tenant: str, batch_size: int, no_progress: bool,
               **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        # A regular file or standard input, within RECOVERY_IMPORT_MAX_BYTES and
        # RECOVERY_IMPORT_MAX_LINES, checked before the first line is imported (issue 17).
        stream, total = open_input(file, what="file")
        bar = _progress(total, no_progress or not self.stderr.isatty())

        def error(number: int, detail: str) -> None:
            line = f"line {number}: {detail}"
            if bar is not None:
                bar.write(line, file=sys.stderr)
            else:
                self.stderr.write(line)

        try:
            report = runifold.runifold_import(
                actor=None, tenant=tenant_obj, lines=runifold.jsonl_lines(stream),
                batch_size=batch_size, on_error=error,
                on_progress=bar.update if bar is not None else None)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        finally:
            if bar is not None:
                bar.close()
            stream.close()
        self.stdout.write(
            f"{tenant_obj.slug}: {report.imported} line(s) imported, {report.skipped} skipped "
            f"as already present, {report.failed} failed ({report.lines} line(s) read)")
        if report.failed:
            raise CommandError(f"{report.failed} line(s) failed (listed above); the other "
                               f"lines were imported")


def _progress(total: int | None, off: bool):
    """A tqdm bar over the file's bytes on stderr, or ``None``."""
    if off:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc="import", file=sys.stderr)
