"""``manage.py revoke USERNAME ROLE TENANT`` (CONTRACT.md sections 4 and 5)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from checkpoints import roles, services
from checkpoints.exceptions import DomainError
from checkpoints.models import Tenant


class Command(BaseCommand):
    help = (f"Take a role in a tenant away from an account (audited in the tenant). "
            f"Roles: {', '.join(roles.ROLES)}.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", help=", ".join(roles.ROLES))
        parser.add_argument("tenant", help="tenant slug")

    def handle(self, *args, username: str, role: str, tenant: str, **options):
        if role not in roles.ROLE_PERMISSIONS:
            raise CommandError(f"role: unknown role {role!r}; one of {', '.join(roles.ROLES)}")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no account {username!r}")
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        try:
            services.role_revoke(actor=None, tenant=tenant_obj, user=user, role=role)
        except DomainError as exc:
            raise CommandError(exc.detail or exc.error) from None
        self.stdout.write(f"revoked {role} in {tenant_obj.slug} from {user.get_username()}")
