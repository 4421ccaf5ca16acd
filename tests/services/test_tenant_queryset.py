"""``TenantQuerySet.for_tenant`` (issue 7, item 4): one tenant, a tenant id, or the
caller's tenants (an iterable or a queryset); never "all" by accident."""

from __future__ import annotations

import pytest

from checkpoints.models import Run, Tenant
from tests.helpers import envelope, put_checkpoint


@pytest.fixture
def two_tenants(db, acme, wendy):
    globex = Tenant.objects.create(slug="globex", name="Globex")
    mine = put_checkpoint(wendy, acme, envelope()).run
    theirs = Run.objects.create(tenant=globex, uuid=mine.uuid)  # same UUID, other tenant
    return acme, globex, mine, theirs


def test_it_scopes_to_one_tenant_by_object_or_id(two_tenants):
    acme, globex, mine, theirs = two_tenants
    assert list(Run.objects.for_tenant(acme)) == [mine]
    assert list(Run.objects.for_tenant(globex.pk)) == [theirs]
    assert Run.objects.for_tenant(acme).get(uuid=mine.uuid) == mine


def test_it_scopes_to_the_callers_tenants_as_a_list_or_a_queryset(two_tenants):
    acme, globex, mine, theirs = two_tenants
    assert set(Run.objects.for_tenant([acme, globex.pk])) == {mine, theirs}
    assert set(Run.objects.for_tenant(Tenant.objects.filter(slug="globex"))) == {theirs}
    assert list(Run.objects.for_tenant([])) == []


@pytest.mark.parametrize("bad", [None, True, "acme", 1.0, [None]])
def test_it_refuses_anything_that_is_not_a_tenant(two_tenants, bad):
    with pytest.raises(TypeError):
        Run.objects.for_tenant(bad)


def test_a_queryset_of_something_else_is_refused(two_tenants):
    with pytest.raises(TypeError):
        Run.objects.for_tenant(Run.objects.for_tenant(two_tenants[0]))


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_the_escape_hatch_needs_a_reason(two_tenants, reason):
    with pytest.raises(ValueError):
        Run.objects.for_all_tenants(reason=reason)
    assert Run.objects.for_all_tenants(reason="a test spans tenants").count() == 2
