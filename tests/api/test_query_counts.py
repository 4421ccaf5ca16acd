"""What an API request costs in queries beyond its service (issue 8, issue 22 item 3): the
bearer token, its account, the URL's tenant and the caller's rights there in one query,
nothing while the answer renders; the same for every repetition. And since nothing of
the caller is kept between requests, a change of rights counts from the very next one.

The service's own statements (``services.checkpoint_put``, ``payload_reveal``) are
counted apart, so these budgets hold whatever the write path does inside.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import selectors, services
from tests.api.apihelpers import put_cp, url
from tests.conftest import bearer_client
from tests.helpers import envelope

#: Per request, outside the service or selector it calls: the token with its account,
#: the tenant and the caller's rights, in one statement (``api.auth.token_user``).
OVERHEAD = 1


class Counted:
    """Wraps module functions so the queries made inside them are counted apart."""

    def __init__(self, monkeypatch, *targets):
        self.inside = 0
        for module, name in targets:
            monkeypatch.setattr(module, name, self._wrap(getattr(module, name)))

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            with CaptureQueriesContext(connection) as ctx:
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.inside += len(ctx.captured_queries)
        return counted


def _cost(send, counted: Counted) -> tuple[int, int]:
    """(queries outside the counted functions, inside them) of one request."""
    counted.inside = 0
    with CaptureQueriesContext(connection) as ctx:
        response = send()
    assert response.status_code in (200, 201), response.content[:300]
    return len(ctx.captured_queries) - counted.inside, counted.inside


@pytest.fixture
def writer_api(acme, wendy):
    api = bearer_client(wendy)
    api.get(url("acme", "report"))  # the token's first use notes its last_used_at
    return api


def test_a_checkpoint_update_costs_one_query_beyond_its_service_every_time(
        monkeypatch, writer_api):
    counted = Counted(monkeypatch, (services, "checkpoint_put"))
    body = envelope()
    assert put_cp(writer_api, "acme", body, create=True).status_code == 201
    costs = []
    for revision in range(4):
        body = dict(body, revision=revision + 1, payload={"phase": "ready", "n": revision})
        costs.append(_cost(lambda b=body, r=revision: put_cp(writer_api, "acme", b, match=r),
                           counted))
    assert costs == [costs[0]] * 4, costs  # constant, whatever the revision
    assert costs[0][0] == OVERHEAD


def test_a_checkpoint_read_costs_one_query_beyond_its_selector_and_reveal(
        monkeypatch, writer_api):
    counted = Counted(monkeypatch, (selectors, "checkpoint_get"),
                      (services, "payload_reveal"))
    body = envelope()
    put_cp(writer_api, "acme", body, create=True)
    path = url("acme", f"checkpoints/{body['id']}")
    costs = [_cost(lambda: writer_api.get(path), counted) for _ in range(3)]
    assert costs == [costs[0]] * 3, costs
    assert costs[0][0] == OVERHEAD


def test_a_head_costs_two_queries_and_writes_nothing(writer_api):
    body = envelope()
    put_cp(writer_api, "acme", body, create=True)
    path = url("acme", f"checkpoints/{body['id']}")
    for _ in range(3):
        with CaptureQueriesContext(connection) as ctx:
            r = writer_api.head(path)
        assert (r.status_code, r["ETag"], r.content) == (200, '"0"', b"")
        sql = [q["sql"] for q in ctx.captured_queries]
        assert len(sql) == OVERHEAD + 1, sql  # + the checkpoint
        assert not [s for s in sql if not s.lstrip().upper().startswith("SELECT")], sql


def test_a_head_answers_as_the_get_without_a_body_or_an_audit_event(
        acme, wendy, rita, vic, omar):
    from checkpoints.models import AuditEvent

    body = envelope()
    put_cp(bearer_client(wendy), "acme", body, create=True)
    present, missing = (url("acme", f"checkpoints/{cid}") for cid in (body["id"], uuid.uuid4()))
    for user in (wendy, rita, vic, omar):
        api = bearer_client(user)
        for path in (present, missing, present + "/revisions", missing + "/revisions"):
            events = AuditEvent.objects.count()
            head = api.head(path)
            assert AuditEvent.objects.count() == events, (user, path)
            get = api.get(path)
            assert head.status_code == get.status_code, (user, path)
            assert head.content == b""
            if get.status_code == 200 and not path.endswith("/revisions"):
                assert head["ETag"] == get["ETag"]


# --- rights are read per request ---------------------------------------------------------

def _put(api, body, **kw):
    return put_cp(api, "acme", body, **kw).status_code


def test_a_grant_counts_from_the_next_request(acme, vic):
    api = bearer_client(vic)
    body = envelope()
    assert _put(api, body, create=True) == 403
    services.role_grant(actor=None, tenant=acme, user=vic, role="writer")
    assert _put(api, body, create=True) == 201


def test_a_revocation_counts_from_the_next_request(acme, wendy):
    api = bearer_client(wendy)
    body = envelope()
    assert _put(api, body, create=True) == 201
    services.role_revoke(actor=None, tenant=acme, user=wendy, role="writer")
    assert _put(api, dict(body, revision=1), match=0) == 404  # no role left: no tenant


def test_a_deactivation_counts_from_the_next_request(acme, wendy):
    api = bearer_client(wendy)
    body = envelope()
    assert _put(api, body, create=True) == 201
    services.account_deactivate(user=wendy)
    assert _put(api, dict(body, revision=1), match=0) == 401


def test_a_token_revocation_counts_from_the_next_request(acme, wendy):
    api = bearer_client(wendy)
    body = envelope()
    assert _put(api, body, create=True) == 201
    services.tokens_revoke(user=wendy)
    assert _put(api, dict(body, revision=1), match=0) == 401
