"""``manage.py export_audit TENANT --out DIR [--through-tree-size S]``: export the
tenant's sealed audit events and its tombstones (issue 20, item 5; docs/security/audit.md,
"The audit export").

First integrates the tenant's queued events (the sequencer, as ``verify_audit_chain``
does), then writes ``DIR/audit.jsonl`` (the events of the Merkle tree's leaves 0..S-1,
in leaf order; S the newest signed tree head's size, or ``--through-tree-size S``, which
must be the size of a stored signed head), ``DIR/tombstones.jsonl`` (the tombstones those
events' deletions wrote, still there) and ``DIR/manifest.json`` (the signed tree head
with its Ed25519 public key, counts, each file's SHA-256, the highest seq exported,
signed with the newest ``RECOVERY_AUDIT_KEYS`` key), then records the export
(``AuditExport``, an ``audit.export`` event, actor ``system``): what a tombstone purge
requires first. DIR is created if missing and must not hold an export. An export not past
an earlier one writes its files and is recorded, but does not move the watermark.
``verify_audit_chain --export DIR`` checks the files later (the leaves' Merkle root
against the signed head, every event's HMAC).

``--through-seq N`` is refused: a seq is the event's row id, given at INSERT, not at
commit, so an event with a lower seq can commit after the export and the watermark would
claim what the export does not hold. A signed head of size S fixes leaves 0..S-1 for
ever; use ``--through-tree-size`` (the sizes: ``export_audit_head``, the audit page).

Prints one line; exits 1 (``CommandError``) for an unknown tenant, a bad
``--through-tree-size``, ``--through-seq``, a tree that does not hash to its signed head
or a DIR that cannot be written.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError, TreeIncomplete
from checkpoints.models import Tenant

FIELD, OPTION = "through_tree_size:", "--through-tree-size:"


class Command(BaseCommand):
    help = ("Export a tenant's sealed audit events (a prefix of its signed Merkle tree) and "
            "tombstones as JSON Lines with a signed manifest (audited; moves the export "
            "watermark).")

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--out", metavar="DIR", required=True,
                            help="a new directory (or an empty one) for the export's files")
        parser.add_argument("--through-tree-size", type=int, metavar="S",
                            help="export leaves 0..S-1, S the size of a signed tree head "
                                 "(default: the newest head, after integrating)")
        parser.add_argument("--through-seq", type=int, metavar="N",
                            help="refused: a seq is given at insert, not at commit (use "
                                 "--through-tree-size)")

    def handle(self, *args, tenant: str, out: str, through_tree_size: int | None,
               through_seq: int | None, **options):
        if through_seq is not None:
            raise CommandError(
                "--through-seq: no longer taken: a seq is the event's row id, given at "
                "insert and not at commit, so an event below it can commit after the "
                "export; use --through-tree-size S (a signed tree head's size: the export "
                "holds exactly its leaves 0..S-1)")
        t = Tenant.objects.filter(slug=tenant).first()
        if t is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        try:
            result = services.audit_export(actor=None, tenant=t, out_dir=out,
                                           through_tree_size=through_tree_size)
        except TreeIncomplete as exc:  # a DomainError (the proof endpoint's 409): first
            raise CommandError(f"the audit tree is broken: {exc.detail}") from None
        except DomainError as exc:
            detail = exc.detail
            raise CommandError(OPTION + detail[len(FIELD):] if detail.startswith(FIELD)
                               else detail) from None
        except OSError as exc:
            raise CommandError(f"--out: cannot write {out!r} ({exc})") from None
        moved = "" if result["watermark_moved"] else " (not past the watermark: not moved)"
        self.stdout.write(
            f"exported {result['counts']['events']} event(s) (tree size "
            f"{result['through_tree_size']}, seq up to {result['through_seq']}) and "
            f"{result['counts']['tombstones']} tombstone(s) through id "
            f"{result['through_tombstone']} to {out}{moved}")
