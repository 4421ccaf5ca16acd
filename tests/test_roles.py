"""CONTRACT.md 4's roles table, read from docs/CONTRACT.md, against the permission check
(``checkpoints.permissions``) for every role x every right the table names; granting roles
(the one right with no API path) through ``services.role_grant``. The API's answer per
role x operation is tests/api/test_access.py."""

from __future__ import annotations

import pytest

from checkpoints import permissions, roles, services
from checkpoints.exceptions import Forbidden, NotFound
from checkpoints.models import AuditEvent
from tests import contract_tables
from tests.conftest import _person

# The permission (``roles.*``) each phrase of the roles table needs. A phrase missing
# here (CONTRACT.md changed) fails test_every_phrase_has_a_permission.
PHRASE_PERMS = {
    "see runs": roles.VIEW,
    "metadata": roles.VIEW,
    "reports": roles.VIEW,
    "audit": roles.VIEW,
    "reveal payloads": roles.REVEAL,
    "request retry": roles.REVIEW,
    "mark unknown": roles.REVIEW,
    "reconcile": roles.REVIEW,
    "acknowledge": roles.REVIEW,
    "approve or reject others' retry requests": roles.APPROVE,
    "write checkpoints and effects": roles.WRITE,
    "take leases": roles.WRITE,
    "ask resume decisions": roles.WRITE,
    "grant roles in it": roles.MANAGE,
}
DENIED_PERMS = {"payloads": roles.REVEAL}
# Where the code gives more than CONTRACT.md 4 (the same deviation as
# tests/api/test_access.py's ROLES_BEYOND_CONTRACT): the writer, a runtime's account, holds
# the viewer's right to read (docs/security/access.md).
PERMS_BEYOND_CONTRACT = {"writer": {roles.VIEW}}
ALL_PERMS = sorted(set(roles.ROLE_PERMISSIONS["admin"]))
TABLE = contract_tables.roles()


def _expected(role: str) -> set[str]:
    return {PHRASE_PERMS[p] for p in TABLE[role].rights} | PERMS_BEYOND_CONTRACT.get(role, set())


def test_every_phrase_has_a_permission():
    assert set().union(*(r.rights for r in TABLE.values())) == set(PHRASE_PERMS)
    assert set().union(*(r.denied for r in TABLE.values())) <= set(DENIED_PERMS)


def test_every_exception_is_outside_the_contract():
    for role, perms in PERMS_BEYOND_CONTRACT.items():
        assert not perms & {PHRASE_PERMS[p] for p in TABLE[role].rights}, role


@pytest.mark.parametrize("perm", ALL_PERMS)
@pytest.mark.parametrize("role", list(TABLE))
def test_each_role_holds_exactly_the_rights_of_its_row(acme, role, perm):
    user = _person(f"someone-{role}", acme, role)
    assert (perm in permissions.tenant_perms(user, acme)) is (perm in _expected(role))
    for denied in TABLE[role].denied:
        assert DENIED_PERMS[denied] not in permissions.tenant_perms(user, acme)


@pytest.mark.parametrize("role", list(TABLE))
def test_only_a_role_that_may_grant_roles_grants_them(acme, role):
    actor = _person(f"someone-{role}", acme, role)
    newcomer = services.account_create(username="newcomer", password=None)
    if "grant roles in it" in TABLE[role].rights:
        services.role_grant(actor=actor, tenant=acme, user=newcomer, role="viewer")
        assert permissions.tenant_perms(newcomer, acme) == {roles.VIEW}
    else:
        events = AuditEvent.objects.count()
        with pytest.raises(Forbidden):
            services.role_grant(actor=actor, tenant=acme, user=newcomer, role="viewer")
        assert permissions.role_names(newcomer, acme) == []
        assert AuditEvent.objects.count() == events


def test_the_rights_read_in_one_query_are_guardians(acme, globex):
    """``permissions`` reads the tenant and the caller's rights in one statement of its
    own (issue 8); its answer must be django-guardian's ``get_group_perms`` for every
    combination of roles, in both tenants, whatever else the account was given."""
    from django.contrib.auth.models import Permission
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from guardian.core import ObjectPermissionChecker
    from guardian.shortcuts import assign_perm

    combos = [(), ("viewer",), ("writer",), ("reviewer", "approver"), ("admin", "viewer")]
    for i, held in enumerate(combos):
        user = services.account_create(username=f"combo-{i}", password=None)
        for role in held:
            services.role_grant(actor=None, tenant=acme, user=user, role=role)
        if i % 2:  # given outside the role groups: must count for nothing in both answers
            assign_perm("checkpoints.manage_roles", user, acme)
            user.user_permissions.add(Permission.objects.get(codename=roles.REVEAL))
        for tenant in (acme, globex):
            permissions.forget_perms(user)
            guardian = set(ObjectPermissionChecker(user).get_group_perms(tenant))
            assert permissions.tenant_perms(user, tenant) == guardian, (held, tenant.slug)
            permissions.forget_perms(user)
            with CaptureQueriesContext(connection) as ctx:
                if roles.VIEW in guardian:
                    assert permissions.access_tenant(user, tenant.slug) == tenant
                    assert permissions.tenant_perms(user, tenant) == guardian  # kept
                else:
                    with pytest.raises(NotFound):
                        permissions.access_tenant(user, tenant.slug)
            assert len(ctx.captured_queries) == 1
