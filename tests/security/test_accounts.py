"""Issue 6: the account commands (CONTRACT.md 5): ``revoke``, ``revoke_token``,
``deactivate_account``, ``list_tokens``; each write through one audited service, in
every tenant it concerns; a revoked token or a deactivated account is refused at once;
``ApiToken.last_used_at`` is kept, at most once a minute per token."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from checkpoints import permissions, roles, services
from checkpoints.exceptions import InvalidPayload
from checkpoints.models import ApiToken, AuditEvent
from tests.api.apihelpers import snapshot, url

User = get_user_model()


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def events(action: str) -> list[tuple[str, str, str]]:
    return list(AuditEvent.objects.filter(action=action).order_by("tenant__slug", "seq")
                .values_list("tenant__slug", "actor_name", "target_ref"))


def state() -> tuple:
    """What an account command may change: audit, grants, tokens, active flags."""
    return (snapshot(), sorted(User.objects.values_list("username", "is_active")),
            sorted(User.groups.through.objects.values_list("user__username", "group__name")),
            sorted(ApiToken.objects.values_list("prefix", "revoked_at")))


@pytest.fixture
def ann(acme, globex):
    """A reviewer in acme and a writer in globex, with two tokens."""
    user = services.account_create(username="ann", password="pw-for-tests")
    services.role_grant(actor=None, tenant=acme, user=user, role="reviewer")
    services.role_grant(actor=None, tenant=globex, user=user, role="writer")
    user.tokens = [services.token_issue(user=user), services.token_issue(user=user)]
    user.globex = globex
    return user


# --- revoke -----------------------------------------------------------------------------

def test_it_revokes_a_role_at_once_with_one_audit_event(ann, acme):
    client = bearer(ann.tokens[0])
    assert client.get(url("acme", "runs")).status_code == 200
    assert "revoked reviewer in acme from ann" in run("revoke", "ann", "reviewer", "acme")
    assert client.get(url("acme", "runs")).status_code == 404  # the next request
    assert client.get(url("globex", "runs")).status_code == 200  # the other grant stays
    event = AuditEvent.objects.filter(tenant=acme).latest("seq")
    assert (event.action, event.actor_name, event.target_ref, event.before, event.after) == (
        "role.revoke", "system", "ann", {"role": "reviewer"}, {"roles": []})
    ok, n, problem = services.audit_verify(tenant=acme)
    assert ok, problem


def test_it_forgets_the_cached_rights_of_the_same_account_object(acme, rita):
    assert roles.REVIEW in permissions.tenant_perms(rita, acme)  # cached on the object
    services.role_revoke(actor=None, tenant=acme, user=rita, role="reviewer")
    assert permissions.tenant_perms(rita, acme) == set()


def test_it_lets_a_tenant_admin_revoke_but_not_a_reviewer(acme, adam, rita, vic):
    before = state()
    with pytest.raises(services.Forbidden):
        services.role_revoke(actor=rita, tenant=acme, user=vic, role="viewer")
    assert state() == before
    services.role_revoke(actor=adam, tenant=acme, user=vic, role="viewer")
    assert events("role.revoke") == [("acme", "adam", "vic")]


@pytest.mark.parametrize(("args", "message"), [
    (["ann", "approver", "acme"], "holds no approver role in acme"),
    (["ann", "writer", "acme"], "holds no writer role in acme"),
    (["ann", "boss", "acme"], "role: unknown role"),
    (["nobody", "reviewer", "acme"], "username: no account"),
    (["ann", "reviewer", "nowhere"], "tenant: no tenant"),
])
def test_it_refuses_a_revoke_that_cannot_be_done_and_changes_nothing(ann, args, message):
    before = state()
    with pytest.raises(CommandError, match=message):
        run("revoke", *args)
    assert state() == before


# --- issue_token ------------------------------------------------------------------------

def test_it_audits_a_new_token_in_every_tenant_of_the_account_never_the_token(ann, acme):
    """CONTRACT.md 5: issue_token is audited in the tenants it concerns (issue 17,
    item 13): one ``token.issue`` per tenant where the account holds a role, naming the
    prefix; the secret is in no event."""
    before = {t: services.audit_verify(tenant=t)[1] for t in (acme, ann.globex)}
    out, err = io.StringIO(), io.StringIO()
    call_command("issue_token", "ann", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    assert raw.startswith("rcv_") and "\n" not in raw  # the token alone on stdout
    assert "audited in: acme, globex" in err.getvalue()
    issued = AuditEvent.objects.filter(action="token.issue", target_ref="ann",
                                       after__prefix=raw[:12])
    assert sorted(issued.values_list("tenant__slug", "actor_name", "after")) == [
        ("acme", "system", {"prefix": raw[:12], "roles": ["reviewer"]}),
        ("globex", "system", {"prefix": raw[:12], "roles": ["writer"]})]
    for e in AuditEvent.objects.all():
        assert raw not in str((e.before, e.after, e.reason, e.target_ref))
    for t in (acme, ann.globex):
        assert services.audit_verify(tenant=t) == (True, before[t] + 1, "")


def test_it_audits_a_token_of_an_account_without_a_role_in_no_tenant(db, acme):
    """As revoke_token and deactivate_account: an account with no role concerns no
    tenant (issue 17, item 13: decided, docs/security/access.md)."""
    services.account_create(username="loner", service=True)
    err = io.StringIO()
    call_command("issue_token", "loner", stdout=io.StringIO(), stderr=err)
    assert "audited in: no tenant (it holds no role)" in err.getvalue()
    assert not AuditEvent.objects.filter(action="token.issue").exists()


def test_a_refused_token_writes_nothing(ann):
    services.account_deactivate(user=ann)
    before = state()
    with pytest.raises(InvalidPayload, match="deactivated"):
        services.token_issue(user=ann)
    assert state() == before


# --- revoke_token -----------------------------------------------------------------------

def test_it_revokes_every_token_of_an_account_at_once(ann, wes):
    clients = [bearer(raw) for raw in ann.tokens]
    other = bearer(services.token_issue(user=wes))
    assert [c.get(url("globex", "runs")).status_code for c in clients] == [200, 200]
    out = run("revoke_token", "ann")
    assert "revoked 2 token(s) of ann" in out
    assert [c.get(url("globex", "runs")).status_code for c in clients] == [401, 401]
    assert clients[0].get(url("globex", "runs")).json()["error"] == "authentication_failed"
    assert other.get(url("globex", "runs")).status_code == 200  # other accounts unaffected
    # Audited in each tenant the account holds a role in, naming the prefixes.
    assert events("token.revoke") == [("acme", "system", "ann"), ("globex", "system", "ann")]
    after = AuditEvent.objects.filter(action="token.revoke").first().after
    assert sorted(after["revoked"]) == sorted(t[:12] for t in ann.tokens)
    # Nothing left to revoke: nothing written.
    before = state()
    assert "no live token" in run("revoke_token", "ann")
    assert state() == before


def test_it_refuses_revoke_token_for_an_unknown_account(db):
    with pytest.raises(CommandError, match="username: no account"):
        run("revoke_token", "nobody")


# --- deactivate_account -----------------------------------------------------------------

def test_it_deactivates_an_account_everywhere_at_once(client, ann, acme, globex):
    client.force_login(ann)
    api = bearer(ann.tokens[0])
    assert client.get(reverse("run_list", args=["acme"])).status_code == 200
    out = run("deactivate_account", "ann")
    assert "deactivated ann; tokens revoked: 2; audited in: acme, globex" in out
    page = client.get(reverse("run_list", args=["acme"]))  # same session, next request
    assert page.status_code == 302 and page["Location"].startswith(reverse("login"))
    assert api.get(url("globex", "runs")).status_code == 401
    client.logout()
    refused = client.post(reverse("login"), {"username": "ann", "password": "pw-for-tests"})
    assert refused.status_code != 302  # the right password of a deactivated account: no
    assert client.get(reverse("run_list", args=["acme"])).status_code == 302
    assert ApiToken.objects.filter(user=ann, revoked_at__isnull=True).count() == 0
    assert events("account.deactivate") == [("acme", "system", "ann"),
                                            ("globex", "system", "ann")]
    event = AuditEvent.objects.get(tenant=acme, action="account.deactivate")
    assert event.before == {"is_active": True, "roles": ["reviewer"]}
    assert event.after["is_active"] is False and len(event.after["tokens_revoked"]) == 2
    # An inactive account holds no rights, whatever its grants, and gets no new token.
    ann = User.objects.get(pk=ann.pk)
    assert permissions.tenant_perms(ann, acme) == set()
    before = state()
    with pytest.raises(CommandError, match="already deactivated"):
        run("deactivate_account", "ann")
    with pytest.raises(CommandError, match="inactive"):
        run("issue_token", "ann")
    assert state() == before


def test_it_deactivates_an_account_without_any_role_writing_no_tenant_event(db):
    services.account_create(username="loner", password="pw-for-tests")
    assert "audited in: no tenant (it held no role)" in run("deactivate_account", "loner")
    assert not User.objects.get(username="loner").is_active
    assert AuditEvent.objects.count() == 0


# --- list_tokens and last_used_at -------------------------------------------------------

def test_it_lists_prefixes_created_last_used_and_revoked_never_the_secret(ann):
    listing = run("list_tokens", "ann")
    assert listing.count("…") == 2 and all(raw[:12] in listing for raw in ann.tokens)
    assert all(raw not in listing for raw in ann.tokens)
    bearer(ann.tokens[0]).get(url("acme", "report"))
    run("revoke_token", "ann")
    rows = run("list_tokens", "ann").splitlines()[1:]
    used = [r for r in rows if r.startswith(ann.tokens[0][:12])][0].split()
    unused = [r for r in rows if r.startswith(ann.tokens[1][:12])][0].split()
    assert used[2] != "-" and used[3] != "-"  # last used, revoked
    assert unused[2] == "-" and unused[3] != "-"
    services.account_create(username="tokenless")
    assert run("list_tokens", "tokenless").strip() == "tokenless has no token"


def test_it_refuses_list_tokens_for_an_unknown_account(db):
    with pytest.raises(CommandError, match="username: no account"):
        run("list_tokens", "nobody")


def _updates(fetch) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert fetch().status_code == 200
    return sum(1 for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE"))


def test_it_sets_last_used_at_at_most_once_a_minute_per_token(ann):
    client = bearer(ann.tokens[0])
    token = ApiToken.objects.get(prefix=ann.tokens[0][:12])
    assert token.last_used_at is None
    assert _updates(lambda: client.get(url("acme", "report"))) == 1
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    # Within the minute: reads only, the stored time unchanged.
    assert _updates(lambda: client.get(url("acme", "report"))) == 0
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    # A minute later (on the database's clock): one write again.
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=F("last_used_at")
                                                - timedelta(seconds=61))
    assert _updates(lambda: client.get(url("acme", "report"))) == 1
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first - timedelta(seconds=61)
    # The other token was never used; a refused token is never touched.
    assert ApiToken.objects.get(prefix=ann.tokens[1][:12]).last_used_at is None
    run("revoke_token", "ann")
    revoked = ApiToken.objects.get(pk=token.pk).last_used_at
    assert bearer(ann.tokens[0]).get(url("acme", "report")).status_code == 401
    assert ApiToken.objects.get(pk=token.pk).last_used_at == revoked
