"""CONTRACT.md 4's roles table, read from docs/CONTRACT.md, against the permission check
(``checkpoints.permissions``) for every role x every right the table names; granting roles
(the one right with no API path) through ``services.role_grant``. The API's answer per
role x operation is tests/api/test_access.py."""

from __future__ import annotations

import pytest

from checkpoints import permissions, roles, services
from checkpoints.exceptions import Forbidden
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
