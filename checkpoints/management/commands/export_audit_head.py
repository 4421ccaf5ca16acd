"""``manage.py export_audit_head [TENANT] [--out FILE]``: a signed checkpoint of each
tenant's audit chain head, to keep outside the database (docs/security/audit.md).

Prints one JSON line per tenant (one, or all): ``{"tenant", "seq", "last_hash",
"exported_at", "key_id", "signature"}``, signed with the newest ``RECOVERY_AUDIT_KEYS``
key. Each export is itself an audit event (``audit.export_head``, actor ``system``),
written in the same transaction that reads the head; the exported head is that event.
With ``--out FILE`` the lines are appended to FILE (created if missing; flushed to disk
line by line) instead of printed, so one file collects the history of exports.
``verify_audit_chain --against FILE`` later proves that nothing up to them was cut.

Exits 1 (``CommandError``) for an unknown tenant or a FILE that cannot be written.
"""

from __future__ import annotations

import contextlib
import json
import os

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.models import Tenant
from checkpoints.ops import operatorfiles


class Command(BaseCommand):
    help = ("Export each tenant's newest signed tree head (Ed25519, after sealing what is "
            "queued; audited), to keep outside the database.")

    def add_arguments(self, parser):
        parser.add_argument("tenant", nargs="?", help="tenant slug (default: every tenant)")
        parser.add_argument("--out", metavar="FILE",
                            help="append the JSON lines to FILE instead of printing them")

    def handle(self, *args, tenant: str | None, out: str | None, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant is not None:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"tenant: no tenant {tenant!r}")
        fh = None
        if out:
            # Checked and opened before any export, so that a path we cannot write (or a
            # device, a FIFO: refused, never blocked on) exports nothing.
            operatorfiles.check_output(out, what="--out")
            try:
                fh = open(out, "a", encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"--out: cannot write {out!r} ({exc})") from None
        try:
            count = 0
            for t in tenants:
                # Written after the export's transaction commits: a line never names a
                # head that was rolled back.
                line = json.dumps(services.audit_head_export(tenant=t), sort_keys=True)
                if fh is None:
                    try:
                        self.stdout.write(line)
                        self.stdout.flush()
                    except OSError as exc:
                        raise operatorfiles.write_error("stdout", "standard output",
                                                        exc) from None
                else:
                    try:
                        fh.write(line + "\n")
                        fh.flush()
                        os.fsync(fh.fileno())
                    except OSError as exc:
                        raise CommandError(f"--out: cannot write {out!r} ({exc})") from None
                count += 1
        finally:
            if fh is not None:
                with contextlib.suppress(OSError):  # the write's own error is raised
                    fh.close()
        if fh is not None:
            self.stdout.write(f"appended {count} signed head(s) to {out}")
