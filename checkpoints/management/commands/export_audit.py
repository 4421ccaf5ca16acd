"""``manage.py export_audit TENANT --out DIR [--through-seq N]``: export the tenant's
audit events and tombstones up to a watermark (issue 20, item 5; docs/security/audit.md,
"The audit export").

Writes ``DIR/audit.jsonl`` (events 1..N, default the chain head), ``DIR/tombstones.jsonl``
(the tombstones those events' deletions wrote, still there) and ``DIR/manifest.json``
(counts, each file's SHA-256, signed with the newest ``RECOVERY_AUDIT_KEYS`` key), then
records the export (``AuditExport``, an ``audit.export`` event, actor ``system``): what a
tombstone purge requires first. DIR is created if missing and must not hold an export.
An export behind an earlier one writes its files and is recorded, but does not move the
watermark. ``verify_audit_chain --export DIR`` checks the files later.

Prints one line; exits 1 (``CommandError``) for an unknown tenant, a bad ``--through-seq``
or a DIR that cannot be written.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant


class Command(BaseCommand):
    help = ("Export a tenant's audit events and tombstones as JSON Lines with a signed "
            "manifest (audited; moves the export watermark).")

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--out", metavar="DIR", required=True,
                            help="a new directory (or an empty one) for the export's files")
        parser.add_argument("--through-seq", type=int, metavar="N",
                            help="the last audit event exported (default: the chain head)")

    def handle(self, *args, tenant: str, out: str, through_seq: int | None, **options):
        t = Tenant.objects.filter(slug=tenant).first()
        if t is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        try:
            result = services.audit_export(actor=None, tenant=t, out_dir=out,
                                           through_seq=through_seq)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        except OSError as exc:
            raise CommandError(f"--out: cannot write {out!r} ({exc})") from None
        moved = "" if result["watermark_moved"] else " (behind the watermark: not moved)"
        self.stdout.write(
            f"exported {result['counts']['events']} event(s) through seq "
            f"{result['through_seq']} and {result['counts']['tombstones']} tombstone(s) "
            f"through id {result['through_tombstone']} to {out}{moved}")
