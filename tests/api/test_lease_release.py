"""``POST …/runs/{run_id}/lease/release`` (``services.lease_release``): the runtime
holding the run's live lease gives it back, so the next worker takes it at once instead
of waiting out the ttl (a newcomer runtime developer's finding, stop 39: ``ttl_s: 0`` was
refused and a writer may not revoke)."""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent, Conflict, Run
from tests.api.apihelpers import get, new_checkpoint, post, put_cp, snapshot


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


@pytest.fixture
def leased(w):
    """A stable run whose runtime holds a one-hour lease: ``(run_id, body, token)``."""
    body = new_checkpoint(w, "acme", payload={"phase": "ready"})
    rid = body["run_id"]
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": "worker-1", "ttl_s": 3600})
    assert r.status_code == 200, r.content
    return rid, body, r.json()["fencing_token"]


def test_the_holder_gives_the_lease_back_and_the_next_owner_takes_it_at_once(w, leased):
    rid, body, token = leased
    r = post(w, "acme", f"runs/{rid}/lease/release",
             {"owner": "worker-1", "fencing_token": token})
    assert r.status_code == 200, r.content
    run = Run.objects.get()
    assert r.json() == {"owner": "worker-1", "fencing_token": token + 1,
                        "expires_at": run.lease_expires_at.isoformat()}
    [event] = AuditEvent.objects.filter(action="lease.release")
    assert (event.before["owner"], event.before["fencing_token"]) == ("worker-1", token)
    assert event.after["fencing_token"] == token + 1 and event.actor.username == "wendy"
    # The API's run says ended, by the writer account, and why.
    got = get(w, "acme", f"runs/{rid}").json()["run"]
    assert (got["lease_state"], got["lease_ended_by"]) == ("ended", "wendy")
    # A write still on its way with the released token is fenced, and kept as a conflict.
    r = put_cp(w, "acme", dict(body, revision=1), match=0, token=token)
    assert (r.status_code, r.json()["error"]) == (409, "fenced")
    assert Conflict.objects.get().reason == "fenced"
    # Another worker takes the lease at once (no 409 lease_held for an hour).
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": "worker-2", "ttl_s": 60})
    assert r.status_code == 200, r.content
    assert r.json()["fencing_token"] == token + 2
    got = get(w, "acme", f"runs/{rid}").json()["run"]
    assert (got["lease_state"], got["lease_ended_by"]) == ("live", None)


@pytest.mark.parametrize("body, status, error, field", [
    ({"owner": "worker-2", "fencing_token": 1}, 409, "lease_held", "owner"),
    ({"owner": "worker-1", "fencing_token": 7}, 409, "lease_held", "fencing_token"),
    ({"fencing_token": 1}, 400, "invalid_payload", "owner"),
    ({"owner": "worker-1"}, 400, "invalid_payload", "fencing_token"),
    ({"owner": "worker-1", "fencing_token": -1}, 400, "invalid_payload", "fencing_token"),
    ({"owner": "worker-1", "fencing_token": 2 ** 63}, 400, "invalid_payload",
     "fencing_token"),
    ({"owner": "worker-1", "fencing_token": True}, 400, "invalid_payload", "fencing_token"),
    ({"owner": "worker-1", "fencing_token": "1"}, 400, "invalid_payload", "fencing_token"),
    ({"owner": "", "fencing_token": 1}, 400, "invalid_payload", "owner"),
    ({"owner": "w" * 257, "fencing_token": 1}, 400, "invalid_payload", "owner"),
    ({"owner": "worker\u202e-1", "fencing_token": 1}, 400, "invalid_payload", "owner"),
    ({"owner": "worker-1", "fencing_token": 1, "reason": "x"}, 400, "invalid_payload",
     "reason"),
])
def test_only_the_holder_releases_and_bad_bodies_name_their_field(w, leased, body, status,
                                                                    error, field):
    rid, _, token = leased
    assert token == 1
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease/release", body)
    assert (r.status_code, r.json()["error"]) == (status, error), r.content
    assert r.json()["detail"].startswith(field), r.json()
    assert snapshot() == before


def test_a_lease_no_longer_live_is_not_released(w, leased):
    rid, _, token = leased
    assert post(w, "acme", f"runs/{rid}/lease/release",
                {"owner": "worker-1", "fencing_token": token}).status_code == 200
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease/release",
             {"owner": "worker-1", "fencing_token": token + 1})
    assert (r.status_code, r.json()["error"]) == (409, "no_live_lease")
    assert snapshot() == before


def test_rights_come_from_the_tenants_grants(api_as, vic, rita, wes, leased):
    rid, _, token = leased
    body = {"owner": "worker-1", "fencing_token": token}
    before = snapshot()
    assert post(api_as(vic), "acme", f"runs/{rid}/lease/release", body).status_code == 403
    assert post(api_as(rita), "acme", f"runs/{rid}/lease/release", body).status_code == 403
    # Another tenant's writer: the run does not exist for it, in its tenant or in acme.
    assert post(api_as(wes), "globex", f"runs/{rid}/lease/release", body).status_code == 404
    assert post(api_as(wes), "acme", f"runs/{rid}/lease/release", body).status_code == 404
    assert snapshot() == before


def test_a_run_released_while_in_flight_is_ambiguous_at_once(w):
    body = new_checkpoint(w, "acme", payload={"phase": "charging"})
    rid = body["run_id"]
    token = post(w, "acme", f"runs/{rid}/lease",
                 {"owner": "worker-1", "ttl_s": 3600}).json()["fencing_token"]
    assert Run.objects.get().recovery_state == "healthy"  # its owner is live
    assert post(w, "acme", f"runs/{rid}/lease/release",
                {"owner": "worker-1", "fencing_token": token}).status_code == 200
    assert Run.objects.get().recovery_state == "ambiguous"
