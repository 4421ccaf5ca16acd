"""``manage.py verify_audit_chain [TENANT]``: recompute each tenant's audit hash chain.

Exits 0 when every chain checked is intact, 1 (``CommandError``) when one is broken or the
tenant does not exist. The first broken link is named.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.models import Tenant


class Command(BaseCommand):
    help = "Verify the audit log's per-tenant hash chain; exits non-zero when it is broken."

    def add_arguments(self, parser):
        parser.add_argument("tenant", nargs="?", help="tenant slug (default: every tenant)")

    def handle(self, *args, tenant: str | None, **options):
        tenants = Tenant.objects.order_by("slug")
        if tenant is not None:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"tenant: no tenant {tenant!r}")
        broken = []
        for t in tenants:
            intact, n, problem = services.audit_verify(tenant=t)
            if intact:
                self.stdout.write(f"{t.slug}: intact ({n} event(s))")
            else:
                self.stdout.write(f"{t.slug}: BROKEN at {problem}")
                broken.append(t.slug)
        if broken:
            raise CommandError(f"audit chain broken for: {', '.join(broken)}")
