"""``POST …/retry-requests/{id}/withdraw`` (issue 9): the requester takes back their own
open retry request; who may (roles), and the refusal once someone acted first, in the
API's error shape (the closed-world check validates every answer against the schema)."""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent, RetryRequest, Run
from tests.api.apihelpers import new_checkpoint, post, snapshot
from tests.helpers import sweep_later


@pytest.fixture
def requested(api_as, wendy, rita, acme):
    """A swept, retryable run with rita's open retry request: (run id, retry id)."""
    rid = new_checkpoint(api_as(wendy), "acme", payload={"phase": "charging"})["run_id"]
    sweep_later()
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "stuck"})
    assert r.status_code == 201
    return rid, r.json()["id"]


def test_the_requester_withdraws_it(api_as, rita, requested):
    rid, pk = requested
    r = post(api_as(rita), "acme", f"retry-requests/{pk}/withdraw", {"reason": "by phone"})
    assert r.status_code == 200
    body = r.json()
    assert (body["id"], body["run_id"], body["state"], body["requested_by"],
            body["decided_by"], body["decision_reason"]) == (pk, rid, "withdrawn", "rita",
                                                             None, "by phone")
    assert body["decided_at"] is not None
    assert Run.objects.get(uuid=rid).recovery_state == "ambiguous"
    assert AuditEvent.objects.filter(action="retry.withdraw", actor_name="rita").count() == 1


@pytest.mark.parametrize("who,status", [("adam", 403), ("april", 403), ("vic", 403),
                                        ("wendy", 403), ("omar", 404)])
def test_nobody_else_may_withdraw_it(request, api_as, requested, who, status):
    """Admin (reviewer rights, not the requester), approver, viewer, writer: 403; another
    tenant's account: 404 (the tenant is not theirs to know about)."""
    _, pk = requested
    client = api_as(request.getfixturevalue(who))
    before = snapshot()
    r = post(client, "acme", f"retry-requests/{pk}/withdraw", {"reason": "x"})
    assert r.status_code == status
    assert snapshot() == before


def test_a_decided_request_is_refused_naming_who_decided(api_as, rita, april, requested):
    _, pk = requested
    assert post(api_as(april), "acme", f"retry-requests/{pk}/approve",
                {"reason": "ok"}).status_code == 200
    before = snapshot()
    r = post(api_as(rita), "acme", f"retry-requests/{pk}/withdraw", {"reason": "x"})
    assert r.status_code == 422
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == "invalid_transition"
    assert body["detail"].startswith("state: already approved by april at ")
    assert snapshot() == before


def test_a_second_approval_is_refused_naming_the_first_approver(api_as, rita, april, adam,
                                                                  requested):
    _, pk = requested
    post(api_as(april), "acme", f"retry-requests/{pk}/approve", {"reason": "ok"})
    r = post(api_as(adam), "acme", f"retry-requests/{pk}/approve", {"reason": "ok too"})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("state: already approved by april at ")
    assert RetryRequest.objects.get().decided_by.username == "april"


def test_an_unknown_or_foreign_id_is_404(api_as, rita, requested):
    for pk in ("999999", "x1", "-1"):
        r = post(api_as(rita), "acme", f"retry-requests/{pk}/withdraw", {"reason": "x"})
        assert r.status_code == 404
