"""``manage.py grant USERNAME ROLE TENANT`` (CONTRACT.md sections 4 and 5)."""

from __future__ import annotations

from checkpoints import roles, services
from checkpoints.management.base import RoleCommand
from checkpoints.models import Tenant


class Command(RoleCommand):
    help = f"Give an account a role in a tenant. Roles: {', '.join(roles.ROLES)}."
    missing_hint = ("(create_account first)", "(create_tenant first)")
    done = "granted {role} in {tenant} to {user}"

    def change(self, *, tenant: Tenant, user, role: str) -> None:
        """``services.role_grant`` by the command (``actor=None``)."""
        services.role_grant(actor=None, tenant=tenant, user=user, role=role)
