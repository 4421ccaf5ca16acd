"""``manage.py purge_expired [--tenant T] [--dry-run] [--batch-size K]``: apply the
tenants' data policies now (issue 20, item 1; docs/security/retention.md), as the
scheduled purge does (Celery beat, or the in-process worker).

Everything is done by ``services.retention_purge_all`` (the fenced cleanup lease per
tenant, one transaction per run, a tombstone and an audit event each); this command reads
the arguments and prints one line per tenant, with how many runs a legal hold keeps.
``--dry-run`` counts what the real run would do now (the same selection, on the database
clock: a run phase 1 would purge and phase 2 then expire counts in both) and writes
nothing. Exit status 1 for an unknown tenant or a bad
batch size, before anything is done; 0 otherwise (a tenant whose lease another purger
holds is named, and left to it).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.jsonparse import text_problem
from checkpoints.models import Tenant
from checkpoints.services.retention import BATCH_MAX


class Command(BaseCommand):
    help = "Delete what the tenants' data policies say has expired (docs/security/retention.md)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="tenant slug (default: every tenant with a policy)")
        parser.add_argument("--dry-run", action="store_true",
                            help="count the eligible runs; write nothing")
        parser.add_argument("--batch-size", type=int, default=BATCH_MAX,
                            help=f"runs read per batch, 1..{BATCH_MAX} (default {BATCH_MAX}); "
                                 "each run is deleted in its own transaction")

    def handle(self, *args, tenant: str | None, dry_run: bool, batch_size: int, **options):
        if tenant is not None and (text_problem(tenant) or len(tenant) > 50
                                   or not Tenant.objects.filter(slug=tenant).exists()):
            raise CommandError(f"tenant: no tenant {tenant[:64]!r}")
        if not 1 <= batch_size <= BATCH_MAX:
            raise CommandError(f"--batch-size: must be in 1..{BATCH_MAX}")
        result = services.retention_purge_all(batch_size=batch_size, dry_run=dry_run,
                                              tenant_slug=tenant)
        if not result["tenants"] and not result["failed"]:
            self.stdout.write(f"{tenant}: no data policy: nothing to do" if tenant
                              else "no tenant with a data policy: nothing to do")
        for stats in result["tenants"]:
            slug = stats["tenant"]
            held = f"{stats['kept_by_hold']} kept by a legal hold"
            if dry_run:
                self.stdout.write(
                    f"{slug}: {stats['eligible_payloads']} run(s) eligible for payload "
                    f"deletion, {stats['eligible_expiry']} for expiry, {held} (dry run: "
                    "nothing written)")
            elif stats["lease"] == "held":
                self.stdout.write(f"{slug}: another purge holds the cleanup lease; left to it")
            else:
                fenced = " (stopped: the lease was taken over)" if stats["fenced"] else ""
                self.stdout.write(f"{slug}: {stats['purged']} run(s)' payloads deleted, "
                                  f"{stats['expired']} run(s) expired, {stats['skipped']} "
                                  f"skipped, {held}{fenced}")
        if result["failed"]:
            raise CommandError("the purge failed for " + ", ".join(result["failed"])
                               + " (the log has the traceback); the other tenants were purged")
