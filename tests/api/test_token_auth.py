"""``api.auth.token_user``, the API's one-query token look-up (issue 8), answers exactly
as ``services.token_authenticate`` and leaves the token's bookkeeping write to it."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import services
from checkpoints.api.auth import token_user
from checkpoints.models import ApiToken


def _writes(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries
            if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]


def test_it_answers_as_the_service_for_every_kind_of_token(acme, wendy, vic):
    live, revoked, other = (services.token_issue(user=u) for u in (wendy, vic, vic))
    services.tokens_revoke(user=vic)
    gone = services.token_issue(user=vic)
    services.account_deactivate(user=vic)
    for raw in (live, revoked, other, gone, "rcv_unknown", "rcv_\u00e9t\u00e9", "", 7):
        assert token_user(raw) == services.token_authenticate(raw), raw
    user = token_user(live)
    assert (user.pk, user.username, user.is_active) == (wendy.pk, "wendy", True)
    assert user.date_joined == wendy.date_joined  # converted like the ORM's
    assert not hasattr(user, "token_db_now")


def test_it_reads_in_one_query_and_leaves_the_note_of_use_to_the_service(acme, wendy):
    raw = services.token_issue(user=wendy)
    with CaptureQueriesContext(connection) as first:
        assert token_user(raw) == wendy
    assert len(_writes(first)) == 1  # never used: the service notes last_used_at
    with CaptureQueriesContext(connection) as again:
        assert token_user(raw) == wendy
    assert len(again.captured_queries) == 1 and not _writes(again)
    token = ApiToken.objects.get(user=wendy)
    ApiToken.objects.filter(pk=token.pk).update(
        last_used_at=token.last_used_at - services.TOKEN_TOUCH_INTERVAL - timedelta(seconds=1))
    with CaptureQueriesContext(connection) as due:
        assert token_user(raw) == wendy
    assert len(_writes(due)) == 1  # a minute later: noted again, by the service


# --- the token, the URL's tenant and the caller's rights in one statement (issue 22) ----

def _scope(user):
    from checkpoints.permissions import _SCOPE

    return user.__dict__.get(_SCOPE)


def test_the_scoped_look_up_reads_the_tenant_and_rights_as_access_tenant_does(
        acme, globex, wendy, vic, adam, omar):
    from checkpoints.permissions import _read

    services.role_grant(actor=None, tenant=globex, user=adam, role="viewer")
    for user in (wendy, vic, adam, omar):
        raw = services.token_issue(user=user)
        token_user(raw)  # its first use notes last_used_at
        for slug in ("acme", "globex", "nowhere", "x" * 65):
            with CaptureQueriesContext(connection) as ctx:
                found = token_user(raw, tenant_slug=slug)
            assert found == user and len(ctx.captured_queries) == 1, (user, slug)
            if len(slug) > 64:  # longer than a slug can be: not looked up at all
                assert _scope(found) is None
                continue
            tenant, perms = _read(user, "slug", slug)
            read_slug, read_tenant, read_perms = _scope(found)
            assert (read_slug, read_perms) == (slug, perms), (user, slug)
            if tenant is None:
                assert read_tenant is None
            else:
                assert [getattr(read_tenant, f.attname) for f in tenant._meta.concrete_fields] \
                    == [getattr(tenant, f.attname) for f in tenant._meta.concrete_fields]
                assert read_tenant._state.adding is False
            assert not hasattr(found, "scope_codename")


def test_the_scoped_look_up_refuses_what_the_plain_one_refuses(acme, wendy, vic):
    revoked = services.token_issue(user=vic)
    services.tokens_revoke(user=vic)
    assert token_user(revoked, tenant_slug="acme") is None
    live = services.token_issue(user=wendy)
    services.account_deactivate(user=wendy)
    assert token_user(live, tenant_slug="acme") is None


def test_a_token_due_for_its_note_still_brings_the_tenant_read(acme, wendy):
    raw = services.token_issue(user=wendy)  # never used: the service notes it
    with CaptureQueriesContext(connection) as ctx:
        user = token_user(raw, tenant_slug="acme")
    assert len(_writes(ctx)) == 1
    from checkpoints import roles

    assert _scope(user)[1] == acme and roles.WRITE in _scope(user)[2]


def test_an_api_request_reads_the_scope_once_and_answers_as_before(acme, globex, wendy, vic):
    """Through the API: a writer's PUT, a viewer's PUT (403), another tenant (404), an
    unknown one (404), with one statement for the token, the tenant and the role."""
    from tests.api.apihelpers import put_cp
    from tests.conftest import bearer_client
    from tests.helpers import envelope

    writer, viewer = bearer_client(wendy), bearer_client(vic)
    body = envelope()
    assert put_cp(writer, "acme", body, create=True).status_code == 201
    assert put_cp(viewer, "acme", envelope(), create=True).status_code == 403
    assert put_cp(writer, "globex", envelope(), create=True).status_code == 404
    assert put_cp(writer, "nowhere", envelope(), create=True).status_code == 404
    with CaptureQueriesContext(connection) as ctx:
        r = put_cp(writer, "acme", dict(body, revision=1), match=0)
    assert r.status_code == 200
    scope_reads = [q["sql"] for q in ctx.captured_queries if "key_hash" in q["sql"]]
    assert len(scope_reads) == 1 and "scope_codename" in scope_reads[0]
