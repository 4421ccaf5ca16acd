"""``manage.py export_runifold FILE --tenant T [--run RUN_ID ...] [--history]``: write a
tenant's runifold checkpoints and effect records as runifold JSON Lines (issue 10, item
4; ``docs/runifold.md``), the file ``import_runifold`` reads.

``runifold.runifold_export`` reads, decrypts and audits each page (``runifold.export``);
this command only reads the arguments and writes the lines. Without ``--history`` each
checkpoint's latest revision and each effect's current record are written; with it,
every stored revision, oldest first (of a checkpoint with an unsupported, schema-mismatch
revision, those after the last such; the summary counts the rest). ``FILE`` may be ``-`` for standard output (the
summary then goes to stderr); otherwise the lines go to ``FILE.partial``, renamed to
``FILE`` when the export is complete.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from checkpoints.exceptions import DomainError
from checkpoints.interop import runifold
from checkpoints.models import Tenant
from checkpoints.ops import operatorfiles


class Command(BaseCommand):
    help = "Export a tenant's runifold checkpoints and effect records as JSON Lines."

    def add_arguments(self, parser):
        parser.add_argument("file", help="the JSON Lines file to write, or - for standard output")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--run", dest="runs", action="extend", nargs="+", default=None,
                            metavar="RUN_ID", help="only these runs (repeatable)")
        parser.add_argument("--history", action="store_true",
                            help="every stored revision, oldest first (default: the latest)")
        parser.add_argument("--no-progress", action="store_true",
                            help="no progress bar (there is none when stderr is not a terminal)")

    def handle(self, *args, file: str, tenant: str, runs, history: bool, no_progress: bool,
               **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        run_ids = None
        if runs is not None:
            run_ids = []
            for value in runs:
                try:
                    run_ids.append(uuid.UUID(value))
                except ValueError:
                    raise CommandError(f"--run: {value[:64]!r} is not a UUID") from None
        to_stdout = file == "-"
        target = None if to_stdout else file + ".partial"
        if not to_stdout:  # a device, FIFO, directory or link is refused, never replaced
            operatorfiles.check_output(file)
            operatorfiles.check_output(target)
        try:
            out = sys.stdout.buffer if to_stdout else operatorfiles.open_private(target, "wb")
        except OSError as exc:
            raise CommandError(f"file: cannot write {target}: {exc.strerror}") from None
        bar = None
        if not (no_progress or not self.stderr.isatty()):
            bar = tqdm(unit=" lines", desc="export", file=sys.stderr)
        try:
            report = runifold.runifold_export(
                actor=None, tenant=tenant_obj, run_ids=run_ids, history=history,
                write=lambda line: out.write(line.encode("utf-8") + b"\n"),
                on_progress=bar.update if bar is not None else None)
        except BaseException as exc:
            if target:  # nothing half-written is left behind under FILE's name
                with contextlib.suppress(OSError):
                    out.close()
                os.unlink(target)
            if isinstance(exc, DomainError):
                raise CommandError(exc.detail or exc.error) from None
            if isinstance(exc, OSError):  # a full disk, a closed pipe
                raise operatorfiles.write_error("file", file, exc) from None
            raise
        finally:
            if bar is not None:
                bar.close()
        try:
            if to_stdout:
                out.flush()
            else:
                out.close()
                os.replace(target, file)
        except OSError as exc:
            if target and os.path.exists(target):
                os.unlink(target)
            raise operatorfiles.write_error("file", file, exc) from None
        summary = (f"{tenant_obj.slug}: {report.checkpoint_lines} checkpoint line(s) and "
                   f"{report.effect_lines} effect line(s) exported")
        left = []
        if report.left_out_checkpoints:
            left.append(f"{report.left_out_checkpoints} checkpoint(s) of other kinds or "
                        f"unsupported schemas")
        if report.left_out_revisions:
            left.append(f"{report.left_out_revisions} older revision(s) up to a checkpoint's "
                        f"last unsupported schema")
        if report.left_out_effects:
            left.append(f"{report.left_out_effects} effect(s) without a runifold request")
        if left:
            summary += "; left out: " + ", ".join(left)
        (self.stderr if to_stdout else self.stdout).write(summary)
