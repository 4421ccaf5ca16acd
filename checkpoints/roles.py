"""Tenant roles (CONTRACT.md section 4) as sets of object permissions on the tenant.

A role is granted by adding the account to the tenant's group for that role; the group
holds the django-guardian object permissions on the ``Tenant`` row. Nothing is ever
granted globally, so a global permission can never widen a list.
"""

from __future__ import annotations

from .vocab import Role

VIEW = "view_runs"
REVEAL = "reveal_payload"
REVIEW = "review_runs"
APPROVE = "approve_retry"
WRITE = "write_runs"
MANAGE = "manage_roles"

ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    Role.VIEWER: (VIEW,),
    Role.REVIEWER: (VIEW, REVEAL, REVIEW),
    Role.APPROVER: (VIEW, REVEAL, APPROVE),
    Role.WRITER: (VIEW, WRITE),
    Role.ADMIN: (VIEW, REVEAL, REVIEW, APPROVE, WRITE, MANAGE),
}
ROLES = tuple(Role.values)


def group_name(tenant_slug: str, role: str) -> str:
    """The auth group that carries ``role`` in a tenant: ``tenant:<slug>:<role>``."""
    return f"tenant:{tenant_slug}:{role}"
