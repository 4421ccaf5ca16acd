"""``manage.py set_reconciler TENANT SERVICE PLUGIN [--url URL] [--timeout-s N]
[--settle-delay-s N]``: choose how reconciliation asks one service in one tenant.

PLUGIN is ``http_status`` (``GET URL/{operation_key}``), ``replay`` (``POST URL`` again
with the same key, idempotent effects only), ``none`` (no look-up: the outcome is unknown
and a human decides), a dotted path to your own class (see ``checkpoints.reconcile``), or
``default`` to fall back to ``RECOVERY_RECONCILERS``. Audited in the tenant.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints import services
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant


class Command(BaseCommand):
    help = "Choose the reconciler for a service in a tenant (http_status, replay, none, " \
           "a dotted path, or default)."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("service", help="the effects' service name, e.g. payments")
        parser.add_argument("plugin", help="http_status, replay, none, default, or a.dotted.Path")
        parser.add_argument("--url", default="", help="the service's base URL")
        parser.add_argument("--timeout-s", type=int, default=5, help="per look-up, 1..120")
        parser.add_argument("--settle-delay-s", type=int, default=None,
                            help="wait this long after submitted before 'not found' counts "
                                 "(default: RECOVERY_RECONCILE_SETTLE_DELAY_S)")

    def handle(self, *args, tenant, service, plugin, url, timeout_s, settle_delay_s, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        try:
            services.reconciler_configure(actor=None, tenant=tenant_obj, service=service,
                                          plugin=plugin, url=url, timeout_s=timeout_s,
                                          settle_delay_s=settle_delay_s)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        shown = "the environment default" if plugin == "default" else plugin
        self.stdout.write(f"{tenant_obj.slug}: {service} is reconciled by {shown}")
