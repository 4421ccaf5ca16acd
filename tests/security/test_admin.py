"""The Django admin (issue 6, fault 1): read-only, and no tenant's content. It shows
tenants, accounts (with the roles they hold) and token prefixes to operators; it edits
nothing, and it cannot grant a role (Django's group and user pages are gone), so it is no
way around tenant scoping or the audit. See checkpoints/admin.py and
docs/security/access.md."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from checkpoints import services
from checkpoints.models import ApiToken, Tenant
from tests.api.apihelpers import snapshot
from tests.helpers import envelope, put_checkpoint

User = get_user_model()


def state() -> tuple:
    return (snapshot(), sorted(User.objects.values_list("username", "is_active", "is_staff",
                                                        "is_superuser", "password")),
            sorted(User.groups.through.objects.values_list("user_id", "group_id")),
            sorted(Group.objects.values_list("name", flat=True)),
            sorted(ApiToken.objects.values_list("prefix", "revoked_at")),
            sorted(Tenant.objects.values_list("slug", "name", "ambiguity_threshold_s")))


@pytest.fixture
def root(db, client):
    user = services.account_create(username="root", password="pw-for-tests")
    User.objects.filter(pk=user.pk).update(is_superuser=True, is_staff=True)
    client.force_login(User.objects.get(pk=user.pk))
    return client


@pytest.fixture
def world(acme, wendy, vic):
    put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "order_id": "ADM-SECRET"}))
    return services.token_issue(user=wendy)


def test_it_registers_only_tenants_accounts_and_tokens():
    assert {m._meta.label for m in admin.site._registry} == {
        "checkpoints.Tenant", "auth.User", "checkpoints.ApiToken"}


def test_it_shows_an_operator_tenants_accounts_and_token_prefixes_only(root, world, wendy):
    before = state()
    tokens = root.get("/admin/checkpoints/apitoken/")
    body = tokens.content.decode()
    assert tokens.status_code == 200 and world[:12] in body
    token = ApiToken.objects.filter(user=wendy).latest("created_at")
    assert token.key_hash not in body and world not in body
    accounts = root.get("/admin/auth/user/").content.decode()
    assert "acme:writer" in accounts and "acme:viewer" in accounts
    account = root.get(f"/admin/auth/user/{wendy.pk}/change/")
    assert account.status_code == 200 and wendy.password not in account.content.decode()
    assert root.get("/admin/checkpoints/tenant/").status_code == 200
    # No tenant content: not the runs, checkpoints, effects or audit events.
    for model in ("run", "checkpoint", "checkpointrevision", "effect", "auditevent",
                  "conflict", "retryrequest", "reconcilerequest"):
        assert root.get(f"/admin/checkpoints/{model}/").status_code == 404, model
    assert "ADM-SECRET" not in root.get("/admin/").content.decode()
    assert state() == before


def test_it_refuses_every_change_even_to_a_superuser(root, world, vic, acme):
    before = state()
    refusals = [
        root.get("/admin/auth/user/add/"),
        root.post("/admin/auth/user/add/", {"username": "eve", "password1": "x",
                                            "password2": "x"}),
        root.post(f"/admin/auth/user/{vic.pk}/change/", {
            "username": "vic", "is_active": "on", "is_superuser": "on",
            "groups": [g.pk for g in Group.objects.all()]}),
        root.get(f"/admin/auth/user/{vic.pk}/delete/"),
        root.post(f"/admin/auth/user/{vic.pk}/delete/", {"post": "yes"}),
        root.post(f"/admin/checkpoints/tenant/{acme.pk}/change/", {"slug": "x", "name": "x"}),
        root.post("/admin/checkpoints/apitoken/", {"action": "delete_selected",
                                                  "_selected_action": ["1"]}),
    ]
    assert [r.status_code for r in refusals[:6]] == [403] * 6
    assert refusals[6].status_code in (200, 302)  # no actions: the list just shows again
    # Django's own group and password pages, which would bypass the audit, do not exist.
    assert root.get("/admin/auth/group/").status_code == 404
    password = root.get(f"/admin/auth/user/{vic.pk}/password/", follow=True)
    assert "password1" not in password.content.decode()  # no form to set one
    assert state() == before


def test_it_gives_staff_without_model_permissions_nothing(client, world, db):
    staff = services.account_create(username="staffer", password="pw-for-tests")
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get("/admin/").status_code == 200
    for page in ("/admin/auth/user/", "/admin/checkpoints/apitoken/",
                 "/admin/checkpoints/tenant/"):
        assert client.get(page).status_code == 403, page


def test_it_sends_tenant_roles_without_the_staff_flag_to_the_admin_login(client, adam, world):
    client.force_login(adam)  # a tenant admin is not an operator
    page = client.get("/admin/checkpoints/apitoken/")
    assert page.status_code == 302 and page["Location"].startswith("/admin/login/")


