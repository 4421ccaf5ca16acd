"""Issue 6, fault 1: the superuser and staff flags give nothing inside a tenant.

Rights come only from the tenant's role groups (CONTRACT.md 4), in the permission
helpers, the selectors, the services, the API and the dashboard alike. (The isolation
table, ``test_isolation_table``, checks every URL for a flagged account without a role;
this file checks a flagged account *with* a small role, and the layers below the URLs.)
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from guardian.shortcuts import assign_perm

from checkpoints import permissions, roles, selectors, services
from checkpoints.exceptions import Forbidden, NotFound
from tests.api.apihelpers import snapshot, url
from tests.conftest import bearer_client
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect

User = get_user_model()


def _flagged(name: str, *, superuser: bool, staff: bool):
    user = services.account_create(username=name, password="pw-for-tests")
    User.objects.filter(pk=user.pk).update(is_superuser=superuser, is_staff=staff)
    return User.objects.get(pk=user.pk)


@pytest.fixture(params=["superuser", "staff"])
def flagged(request, db):
    """An account made with ``createsuperuser`` (or flagged staff later), with no role."""
    return _flagged(f"{request.param}-sam", superuser=request.param == "superuser",
                    staff=True)


@pytest.fixture
def acme_run(acme, wendy):
    """An acme run with a checkpoint and a confirmed effect (a receipt)."""
    run_id, cp_id, fx_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(cp_id, run_id, payload={"phase": "ready",
                                                                  "order_id": "SECRET-9"}))
    walk_effect(wendy, acme, effect_body(fx_id, run_id), "submitted", "confirmed")
    return run_id, cp_id, fx_id


def test_it_gives_a_flagged_account_without_a_role_no_tenant(flagged, acme, globex):
    assert permissions.tenant_perms(flagged, acme) == set()
    assert list(selectors.tenants_for_user(flagged)) == []
    with pytest.raises(NotFound):
        permissions.access_tenant(flagged, "acme")


def test_it_gives_a_flagged_viewer_exactly_a_viewers_rights(flagged, acme, globex, acme_run,
                                                           wendy):
    services.role_grant(actor=None, tenant=acme, user=flagged, role="viewer")
    assert permissions.tenant_perms(flagged, acme) == {roles.VIEW}
    assert [t.slug for t in selectors.tenants_for_user(flagged)] == ["acme"]
    run_id, cp_id, fx_id = acme_run
    api = bearer_client(flagged)
    before = snapshot()
    # A viewer may not read payloads, nor receipts, nor act; another tenant does not exist.
    assert api.get(url("acme", f"checkpoints/{cp_id}")).status_code == 403
    assert api.get(url("acme", f"checkpoints/{cp_id}/revisions")).status_code == 403
    effect = api.get(url("acme", f"effects/{fx_id}")).json()
    assert (effect["receipt"], effect["has_receipt"]) == (None, True)
    assert api.post(url("acme", f"effects/{fx_id}/reveal-receipt"), {"reason": "x"},
                    format="json").status_code == 403
    assert api.post(url("acme", f"runs/{run_id}/close"), {"reason": "x"},
                    format="json").status_code == 403
    assert api.get(url("globex", "runs")).status_code == 404
    assert snapshot() == before
    # Services refuse too, whoever calls them.
    cp = selectors.checkpoint_get(user=flagged, tenant=acme, checkpoint_id=cp_id)
    with pytest.raises(Forbidden):
        services.payload_reveal(actor=flagged, tenant=acme, checkpoint=cp, reason="x")
    with pytest.raises(Forbidden):
        services.receipt_reveal(actor=flagged, tenant=acme, effect_id=fx_id, reason="x")
    with pytest.raises(Forbidden):
        services.role_grant(actor=flagged, tenant=acme, user=wendy, role="admin")
    assert snapshot() == before


def test_it_shows_a_flagged_viewer_the_dashboard_of_a_viewer(client, flagged, acme, globex,
                                                             acme_run):
    services.role_grant(actor=None, tenant=acme, user=flagged, role="viewer")
    run_id, cp_id, _ = acme_run
    client.force_login(flagged)
    page = client.get(reverse("run_detail", args=["acme", run_id]))
    body = page.content.decode()
    assert page.status_code == 200
    assert "SECRET-9" not in body and "ch_1" not in body
    assert "Reveal payload" not in body and "Reveal receipt" not in body
    assert client.get(reverse("run_list", args=["globex"])).status_code == 404
    before = snapshot()
    reveal = client.post(reverse("checkpoint_reveal", args=["acme", cp_id]),
                         {"reason": "x", "revision": "0"})
    assert reveal.status_code == 403 and "SECRET-9" not in reveal.content.decode()
    assert snapshot() == before


def test_it_ignores_object_permissions_given_to_the_account_itself(acme, vic):
    # Only role groups count: a permission assigned straight to the account (from a
    # shell, say) widens nothing, in checks or in lists.
    assign_perm("checkpoints.reveal_payload", vic, acme)
    stranger = services.account_create(username="stranger")
    assign_perm("checkpoints.view_runs", stranger, acme)
    assert permissions.tenant_perms(vic, acme) == {roles.VIEW}
    assert permissions.tenant_perms(stranger, acme) == set()
    assert list(selectors.tenants_for_user(stranger)) == []


def test_it_ignores_global_permissions(acme, vic):
    from django.contrib.auth.models import Permission

    vic.user_permissions.add(*Permission.objects.filter(codename__in=[
        roles.REVEAL, roles.WRITE, roles.MANAGE]))
    vic = User.objects.get(pk=vic.pk)
    assert permissions.tenant_perms(vic, acme) == {roles.VIEW}
