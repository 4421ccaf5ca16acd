"""``manage.py migrate_checkpoints KIND --to V [--tenant T] [--run R ...] [--dry-run]
[--reverse] [--batch-size K]``: migrate a kind's checkpoints to schema version V
through its registered migrations (issue 19, item 2; ``docs/migrations.md``).

Every checkpoint is checked and written by ``services.checkpoints_migrate`` (each in its
own transaction, audited); this command reads the arguments, calls it per tenant (the
one named, or every tenant in slug order) and prints. stdout: one line per checkpoint
refused or lost to a conflict, each change's example (key paths only) and the counts per
tenant. Exit status: 0 when nothing was left behind; 3 when some checkpoints were refused
or lost to a conflict (listed; run again once their owners are gone); 1 for a bad kind,
version, tenant or run id, before anything is done. ``--dry-run`` answers the same, and
writes nothing.
"""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError

from checkpoints import declared, intranges, kinds, services
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant
from checkpoints.services.migrations import MAX_BATCH
from checkpoints.vocab import MigrationOutcome

#: Exit status when checkpoints were left behind (refused, or lost to a conflict).
LEFT_BEHIND = 3


class Command(BaseCommand):
    help = "Migrate the checkpoints of a kind to another schema version (docs/migrations.md)."

    def add_arguments(self, parser):
        parser.add_argument("kind", help="the kind, e.g. acme.order")
        parser.add_argument("--to", dest="to_version", required=True,
                            help="the target schema version (0..2^32-1)")
        parser.add_argument("--tenant", help="tenant slug (default: every tenant)")
        parser.add_argument("--run", dest="runs", nargs="+", action="extend",
                            help="only these runs (run ids; the option may repeat)")
        parser.add_argument("--dry-run", action="store_true",
                            help="say what would be done; write nothing")
        parser.add_argument("--reverse", action="store_true",
                            help="migrate down (with each step's inverse)")
        parser.add_argument("--batch-size", type=int, default=100,
                            help=f"checkpoints read per query, 1..{MAX_BATCH} (default 100); "
                                 "each is migrated in its own transaction")

    def handle(self, *args, kind: str, to_version: str, tenant: str | None, runs, dry_run: bool,
               reverse: bool, batch_size: int, **options):
        try:  # the API's reading of a version, not int()'s
            to_version = intranges.SCHEMA_VERSION.parse(to_version, "--to")
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        if tenant is not None:
            tenants = list(Tenant.objects.filter(slug=tenant))
            if not tenants:
                raise CommandError(f"tenant: no tenant {tenant!r}")
        elif kind in kinds.registered():
            tenants = list(Tenant.objects.order_by("slug"))
        else:  # a declared kind: the tenants that declared it
            tenants = [t for t in Tenant.objects.order_by("slug") if kinds.versions(
                kind, lookup=declared.lookup(t))]
        if not tenants and kind not in kinds.registered():  # declared by no tenant
            self._refuse_kind(kind)
        in_code = kinds.versions(kind)
        if in_code and to_version not in in_code:  # whether or not there are tenants
            raise CommandError(f"--to: {kind} has no version {to_version} (versions: "
                               f"{', '.join(str(v) for v in in_code)})")
        # Every tenant by the service's own rule, before anything is done: a declared kind
        # may have the version in one tenant and not in the next.
        for each in tenants:
            try:
                services.migration_target_check(each, kind, to_version)
            except DomainError:
                versions = kinds.versions(kind, lookup=declared.lookup(each))
                if not versions:
                    self._refuse_kind(kind)
                whose = "" if kind in kinds.registered() else f"{each.slug}'s "
                raise CommandError(f"--to: {whose}{kind} has no version {to_version} "
                                   f"(versions: {', '.join(str(v) for v in versions)})") \
                    from None
        if not 1 <= batch_size <= MAX_BATCH:
            raise CommandError(f"--batch-size: must be in 1..{MAX_BATCH}")
        for run in runs or []:
            try:
                uuid.UUID(run)
            except ValueError:
                raise CommandError(f"--run: {run[:64]!r} is not a run id (a UUID)") from None
        left = 0
        for each in tenants:
            try:
                report = services.checkpoints_migrate(
                    actor=None, tenant=each, kind=kind, to_version=to_version, run_ids=runs,
                    dry_run=dry_run, reverse=reverse, batch_size=batch_size)
            except DomainError as exc:
                raise CommandError(exc.detail or exc.error) from None
            left += self._print(each, report)
        if left:
            raise CommandError(f"{left} checkpoint(s) {'would be' if dry_run else 'were'} "
                               "left behind (listed above); run again once their owners are "
                               "gone or the refusals are fixed", returncode=LEFT_BEHIND)

    @staticmethod
    def _refuse_kind(kind: str):
        raise CommandError(f"kind: {kind!r} is not registered (registered: "
                           f"{', '.join(kinds.registered())}; or declared by the tenant)")

    def _print(self, tenant: Tenant, report) -> int:
        """Print one tenant's report; returns how many checkpoints were left behind."""
        out = self.stdout.write
        would = "would be " if report.dry_run else ""
        for item in report.items:
            if item.outcome in (MigrationOutcome.REFUSED, MigrationOutcome.CONFLICT):
                why = f" {item.reason}" if item.reason else ""
                out(f"{tenant.slug}: {item.outcome}{why}: checkpoint {item.checkpoint_id} "
                    f"(run {item.run_id}, v{item.from_version}): {item.detail}")
        for change in report.examples:
            parts = [f"{word} {', '.join(change[word])}" for word in ("added", "removed",
                                                                      "changed") if change[word]]
            out(f"{tenant.slug}: v{change['from_version']} -> v{change['to_version']}, "
                f"{change['count']} checkpoint(s): {'; '.join(parts) or 'no change'} "
                f"(e.g. checkpoint {change['checkpoint_id']})")
        counts = report.counts
        out(f"{tenant.slug}: {report.kind} to v{report.to_version}"
            f"{' (dry run)' if report.dry_run else ''}: "
            f"{counts[MigrationOutcome.MIGRATED]} {would}migrated, "
            f"{counts[MigrationOutcome.SKIPPED]} skipped, "
            f"{counts[MigrationOutcome.REFUSED]} {would}refused, "
            f"{counts[MigrationOutcome.CONFLICT]} conflict(s) (batch {report.batch_id})")
        return counts[MigrationOutcome.REFUSED] + counts[MigrationOutcome.CONFLICT]
