"""``POST …/runs/{run_id}/lease/revoke`` (``services.lease_revoke``): a reviewer ends the
live lease of an owner they know is gone; its writes are fenced from then on and
reconcile stops answering ``owner_live`` for the lease."""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent, Conflict, Run
from tests.api.apihelpers import new_checkpoint, post, put_cp, put_fx, snapshot
from tests.helpers import effect_body


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


@pytest.fixture
def leased(w, acme):
    """A run in flight whose runtime took a one-hour lease and sent a charge, then died:
    ``(run_id, checkpoint body, token)``."""
    body = new_checkpoint(w, "acme", payload={"phase": "charging"})
    rid = body["run_id"]
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": "worker-1", "ttl_s": 3600})
    assert r.status_code == 200, r.content
    token = r.json()["fencing_token"]
    fx = effect_body(run_id=rid)
    assert put_fx(w, "acme", fx, create=True, token=token).status_code == 201
    assert put_fx(w, "acme", dict(fx, revision=1, state="submitted"), match=0,
                  token=token).status_code == 200
    return rid, body, token


def test_it_ends_the_lease_and_answers_the_lease_state(api_as, rita, leased):
    rid, _, token = leased
    r = post(api_as(rita), "acme", f"runs/{rid}/lease/revoke",
             {"reason": "worker-1's pod was evicted", "owner": "worker-1"})
    assert r.status_code == 200, r.content
    run = Run.objects.get()
    assert r.json() == {"owner": "worker-1", "fencing_token": token + 1,
                        "expires_at": run.lease_expires_at.isoformat()}
    [event] = AuditEvent.objects.filter(action="lease.revoke")
    assert event.reason == "worker-1's pod was evicted"


def test_the_old_token_is_fenced_and_reconcile_is_no_longer_refused(w, api_as, rita, leased):
    rid, body, token = leased
    reviewer = api_as(rita)
    r = post(reviewer, "acme", f"runs/{rid}/reconcile", {"reason": "ask payments"})
    assert (r.status_code, r.json()["error"]) == (409, "owner_live")
    assert post(reviewer, "acme", f"runs/{rid}/lease/revoke",
                {"reason": "gone"}).status_code == 200
    r = put_cp(w, "acme", dict(body, revision=1), match=0, token=token)  # the old owner
    assert r.status_code == 409
    assert r.json() == {"error": "fenced", "fencing_token": token + 1}
    assert Conflict.objects.get().reason == "fenced"
    r = post(reviewer, "acme", f"runs/{rid}/reconcile", {"reason": "ask payments"})
    assert r.status_code == 202, r.content


@pytest.mark.parametrize(("body", "field"), [
    (None, "reason"), ({}, "reason"), ({"reason": "  "}, "reason"), ({"reason": 5}, "reason"),
    ({"reason": "x" * 4001}, "reason"), ({"reason": "x", "owner": 7}, "owner"),
    ({"reason": "x", "owner": ""}, "owner"), ({"reason": "x", "ttl_s": 1}, "ttl_s"),
])
def test_it_refuses_bad_input_naming_the_field(api_as, rita, leased, body, field):
    rid, _, _ = leased
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/lease/revoke", body,
             raw=b"" if body is None else None)
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith(field)
    assert snapshot() == before


@pytest.mark.parametrize("who", ["vic", "wendy", "april"])
def test_it_is_403_for_other_roles(api_as, vic, wendy, april, leased, who):
    rid, _, _ = leased
    before = snapshot()
    user = {"vic": vic, "wendy": wendy, "april": april}[who]
    r = post(api_as(user), "acme", f"runs/{rid}/lease/revoke", {"reason": "gone"})
    assert r.status_code == 403
    assert snapshot() == before


def test_it_is_404_for_another_tenant_or_an_unknown_run(api_as, omar, rita, leased):
    rid, _, _ = leased
    before = snapshot()
    assert post(api_as(omar), "acme", f"runs/{rid}/lease/revoke",
                {"reason": "gone"}).status_code == 404
    assert post(api_as(omar), "globex", f"runs/{rid}/lease/revoke",
                {"reason": "gone"}).status_code == 404
    assert post(api_as(rita), "acme", "runs/not-a-uuid/lease/revoke",
                {"reason": "gone"}).status_code == 404
    assert snapshot() == before


def test_it_is_409_without_a_live_lease_or_for_another_owner(w, api_as, rita, leased):
    rid, _, _ = leased
    reviewer = api_as(rita)
    before = snapshot()
    r = post(reviewer, "acme", f"runs/{rid}/lease/revoke", {"reason": "gone", "owner": "w-9"})
    assert r.status_code == 409
    assert r.json()["error"] == "lease_held" and r.json()["detail"].startswith("owner: ")
    assert snapshot() == before
    assert post(reviewer, "acme", f"runs/{rid}/lease/revoke",
                {"reason": "gone"}).status_code == 200
    before = snapshot()
    r = post(reviewer, "acme", f"runs/{rid}/lease/revoke", {"reason": "again"})
    assert r.status_code == 409 and r.json()["error"] == "no_live_lease"
    assert snapshot() == before


def test_the_token_the_caller_saw_ends_only_that_lease(w, api_as, rita, april, leased):
    """(stop 37, the second attack) A lease ended and taken again since, even by the same
    owner, is not ended by a caller who names the old token: 409 naming
    ``fencing_token``, the live runtime's token untouched; its own token ends it."""
    rid, _, token = leased
    reviewer = api_as(rita)
    assert post(reviewer, "acme", f"runs/{rid}/lease/revoke",
                {"reason": "gone", "fencing_token": token}).status_code == 200
    again = post(w, "acme", f"runs/{rid}/lease", {"owner": "worker-1", "ttl_s": 3600})
    assert again.json()["fencing_token"] == token + 2
    stale = post(reviewer, "acme", f"runs/{rid}/lease/revoke",
                 {"reason": "gone", "owner": "worker-1", "fencing_token": token})
    assert stale.status_code == 409 and stale.json()["error"] == "lease_held"
    assert stale.json()["detail"].startswith("fencing_token: ")
    assert Run.objects.get().fencing_token == token + 2
    for bad in (-1, 2**63, "3", True, 1.5):
        r = post(reviewer, "acme", f"runs/{rid}/lease/revoke",
                 {"reason": "gone", "fencing_token": bad})
        assert r.status_code == 400 and r.json()["detail"].startswith("fencing_token: "), bad
