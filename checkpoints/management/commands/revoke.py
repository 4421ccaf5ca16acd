"""``manage.py revoke USERNAME ROLE TENANT`` (CONTRACT.md sections 4 and 5)."""

from __future__ import annotations

from checkpoints import roles, services
from checkpoints.management.base import RoleCommand
from checkpoints.models import Tenant


class Command(RoleCommand):
    help = (f"Take a role in a tenant away from an account (audited in the tenant). "
            f"Roles: {', '.join(roles.ROLES)}.")
    done = "revoked {role} in {tenant} from {user}"

    def change(self, *, tenant: Tenant, user, role: str) -> None:
        """``services.role_revoke`` by the command (``actor=None``)."""
        services.role_revoke(actor=None, tenant=tenant, user=user, role=role)
