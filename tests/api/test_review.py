"""Review actions over HTTP: reasons, four eyes, audit events in the same transaction."""

from __future__ import annotations

import pytest

from checkpoints import audit
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    Conflict,
    Effect,
    ReconcileRequest,
    RetryRequest,
    Run,
)
from tests.api.apihelpers import get, new_checkpoint, post, put_cp, snapshot, walk
from tests.helpers import age_world, effect_body, sweep_later

# CONTRACT.md 3's keys, and ``incident_ref`` (the incident the actor worked on, or null).
AUDIT_KEYS = {"id", "created_at", "actor", "action", "target_type", "target_id", "run_id",
              "reason", "before", "after", "incident_ref"}


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


@pytest.fixture
def in_doubt(w, acme):
    """A run whose charge was submitted: (run_id, effect_id)."""
    rid = new_checkpoint(w, "acme", payload={"phase": "charging"})["run_id"]
    fx = effect_body(run_id=rid)
    walk(w, "acme", fx, "submitted")
    return rid, fx["id"]


@pytest.fixture
def retryable(w, acme):
    """A run a reviewer may retry: in flight, owner gone (swept ambiguous), no effect in
    doubt. Returns its run id."""
    rid = new_checkpoint(w, "acme", payload={"phase": "charging"})["run_id"]
    sweep_later()
    return rid


@pytest.mark.parametrize("path", ["runs/{rid}/retry-requests", "effects/{eid}/mark-unknown",
                                  "runs/{rid}/reconcile", "runs/{rid}/conflicts/acknowledge"])
@pytest.mark.parametrize("body", [None, {}, {"reason": ""}, {"reason": "   "}])
def test_it_requires_a_reason_naming_it(api_as, rita, in_doubt, path, body):
    rid, eid = in_doubt
    before = snapshot()
    r = post(api_as(rita), "acme", path.format(rid=rid, eid=eid),
             raw=b"" if body is None else None, body=body)
    assert r.status_code == 400
    assert r.json()["detail"].startswith("reason")
    assert snapshot() == before


@pytest.mark.parametrize("body,field", [({"reason": 5}, "reason"), ({"reason": ["x"]}, "reason"),
                                        ({"reason": "x", "other": 1}, "other")])
def test_it_refuses_a_bad_reason_body_naming_the_field(api_as, rita, in_doubt, body, field):
    rid, _ = in_doubt
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", body)
    assert r.status_code == 400 and r.json()["detail"].startswith(field)
    assert not RetryRequest.objects.exists()


def test_it_requests_and_approves_a_retry_with_four_eyes(api_as, rita, april, retryable):
    rid = retryable
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "customer asked"})
    assert r.status_code == 201
    retry = r.json()
    assert {"id", "run_id", "state", "requested_by", "decided_by"} <= set(retry)
    assert (retry["run_id"], retry["state"], retry["requested_by"], retry["decided_by"]) == (
        rid, "requested", "rita", None)
    assert Run.objects.get(uuid=rid).recovery_state == "awaiting_approval"
    r = post(api_as(april), "acme", f"retry-requests/{retry['id']}/approve", {"reason": "fine"})
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["decided_by"]) == ("approved", "april")
    assert Run.objects.get(uuid=rid).recovery_state == "retry_approved"
    r = post(api_as(april), "acme", f"retry-requests/{retry['id']}/reject", {"reason": "late"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_transition"


def test_it_forbids_the_requester_to_decide_their_own_retry(api_as, adam, retryable):
    rid = retryable
    retry = post(api_as(adam), "acme", f"runs/{rid}/retry-requests", {"reason": "x"}).json()
    before = snapshot()
    for verb in ("approve", "reject"):
        r = post(api_as(adam), "acme", f"retry-requests/{retry['id']}/{verb}", {"reason": "me"})
        assert r.status_code == 403
    assert snapshot() == before


def test_it_rejects_a_retry_and_answers_404_for_an_unknown_one(api_as, rita, april, retryable):
    rid = retryable
    retry = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "x"}).json()
    r = post(api_as(april), "acme", f"retry-requests/{retry['id']}/reject", {"reason": "no"})
    assert r.status_code == 200 and r.json()["state"] == "rejected"
    before = snapshot()
    for bad in ("999999", "abc", "0", "-1", "1" * 40):
        assert post(api_as(april), "acme", f"retry-requests/{bad}/approve",
                    {"reason": "x"}).status_code == 404
    assert snapshot() == before


def test_it_refuses_a_retry_while_an_effect_is_in_doubt(api_as, rita, in_doubt):
    rid, _ = in_doubt
    sweep_later()  # ambiguous now, but its charge is unresolved: reconcile first
    assert Run.objects.get(uuid=rid).recovery_state == "ambiguous"
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "x"})
    assert r.status_code == 422 and "reconcile" in r.json()["detail"]
    assert snapshot() == before


def test_it_answers_422_for_a_second_open_retry_request(api_as, rita, retryable):
    rid = retryable
    assert post(api_as(rita), "acme", f"runs/{rid}/retry-requests",
                {"reason": "x"}).status_code == 201
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "again"})
    assert r.status_code == 422
    assert snapshot() == before  # still the one open request, no second audit event


def test_it_marks_a_submitted_effect_unknown_once_and_refuses_it_again(w, api_as, rita, acme,
                                                                      in_doubt):
    # Every state x mark-unknown, from CONTRACT.md's table: tests/services/test_effects.py.
    rid, eid = in_doubt
    age_world(3600)  # the owner is gone: a reviewer may declare it
    r = post(api_as(rita), "acme", f"effects/{eid}/mark-unknown", {"reason": "no lookup"})
    assert r.status_code == 200 and r.json()["state"] == "unknown"
    assert Run.objects.get(uuid=rid).recovery_state == "unknown_outcome"
    before = snapshot()
    r = post(api_as(rita), "acme", f"effects/{eid}/mark-unknown", {"reason": "again"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_transition"
    assert snapshot() == before


def test_it_refuses_to_reconcile_while_the_owner_is_live_and_changes_nothing(
        api_as, rita, in_doubt):
    rid, eid = in_doubt  # written just now, no lease: the owner counts as live for 300 s
    events = AuditEvent.objects.count()
    r = post(api_as(rita), "acme", f"runs/{rid}/reconcile", {"reason": "check payments"})
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "owner_live" and body["lease_expires_at"]
    assert "live until" in body["detail"]
    assert Effect.objects.get(uuid=eid).state == "submitted"
    assert not ReconcileRequest.objects.exists()
    assert AuditEvent.objects.count() == events


def test_it_refuses_to_mark_an_outcome_unknown_while_the_owner_is_live(api_as, rita, in_doubt):
    """Marking unknown waits for the owner like reconciling does: 409 owner_live
    (documented), nothing changed."""
    rid, eid = in_doubt  # written just now: the owner counts as live for 300 s
    before = snapshot()
    r = post(api_as(rita), "acme", f"effects/{eid}/mark-unknown", {"reason": "stuck?"})
    assert r.status_code == 409, r.content
    body = r.json()
    assert body["error"] == "owner_live" and body["lease_expires_at"]
    assert snapshot() == before


def test_it_refuses_a_retry_request_while_the_owner_is_live(w, api_as, rita, in_doubt):
    """An unknown-outcome run whose runtime took a lease again: a retry would fence a live
    owner, so it is 409 owner_live (documented), nothing changed."""
    rid, eid = in_doubt
    age_world(3600)
    assert post(api_as(rita), "acme", f"effects/{eid}/mark-unknown",
                {"reason": "no lookup"}).status_code == 200
    lease = post(w, "acme", f"runs/{rid}/lease", {"owner": "worker-2", "ttl_s": 600})
    assert lease.status_code == 200
    assert Run.objects.get(uuid=rid).recovery_state == "unknown_outcome"
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "retry it"})
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "owner_live"
    assert r.json()["lease_expires_at"] == lease.json()["expires_at"]
    assert snapshot() == before


def test_it_queues_reconciliation_with_202_and_a_task_id(api_as, rita, in_doubt,
                                                          django_capture_on_commit_callbacks):
    rid, eid = in_doubt
    age_world(301)  # the owner went quiet past the tenant's threshold
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        r = post(api_as(rita), "acme", f"runs/{rid}/reconcile", {"reason": "check payments"})
    assert r.status_code == 202
    assert set(r.json()) == {"task_id", "queued", "dispatch", "detail", "requests"}
    assert [q["effect_id"] for q in r.json()["requests"]] == [eid]
    assert len(callbacks) == 1
    # The in-process worker asked the service's reconciler; "payments" has no lookup here
    # -> unknown, and the stored request says so.
    assert Effect.objects.get(uuid=eid).state == "unknown"
    request = ReconcileRequest.objects.get()
    assert (request.state, request.outcome, request.attempts) == ("done", "unknown", 1)
    assert request.attempt_log.get().answer == "no_lookup"
    event = AuditEvent.objects.get(action="run.reconcile")
    assert event.after["task_id"] == r.json()["task_id"] == str(request.task_uuid)
    detail = get(api_as(rita), "acme", f"runs/{rid}").json()
    assert detail["reconcile_requests"][0]["outcome"] == "unknown"
    assert detail["reconcile_requests"][0]["attempt_log"][0]["answer"] == "no_lookup"


def test_it_answers_422_when_nothing_is_in_doubt_to_reconcile(w, api_as, rita, acme):
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/reconcile", {"reason": "x"})
    assert r.status_code == 422
    assert snapshot() == before


def test_it_acknowledges_conflicts(w, api_as, rita, acme):
    body = new_checkpoint(w, "acme")
    put_cp(w, "acme", body, create=True)  # refused: conflict
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "conflicted"
    r = post(api_as(rita), "acme", f"runs/{body['run_id']}/conflicts/acknowledge",
             {"reason": "duplicate start"})
    assert r.status_code == 200 and r.json() == {"acknowledged": 1}
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "healthy"
    assert Conflict.objects.get().acknowledged_by.username == "rita"


def test_it_lists_audit_events_exactly_as_the_contract_reads_them(api_as, rita, vic, retryable):
    rid = retryable
    post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "why not"})
    r = get(api_as(vic), "acme", "audit-events", run=rid, actor="rita", action="retry.request")
    assert r.status_code == 200
    [event] = r.json()["results"]
    assert set(event) == AUDIT_KEYS
    assert (event["actor"], event["action"], event["run_id"], event["reason"]) == (
        "rita", "retry.request", rid, "why not")
    assert event["target_type"] == "retry_request"
    r = get(api_as(vic), "acme", "audit-events", actor="system")
    assert r.json()["results"] and {e["actor"] for e in r.json()["results"]} == {"system"}
    r = get(api_as(vic), "acme", "audit-events", run="nope")
    assert r.status_code == 400 and r.json()["detail"].startswith("run")


def test_it_pages_audit_events_backwards(api_as, vic, acme, rita):
    total = AuditEvent.objects.filter(tenant=acme).count()
    seen, r = [], get(api_as(vic), "acme", "audit-events", limit=1)
    while True:
        seen += [e["id"] for e in r.json()["results"]]
        if r.json()["next"] is None:
            break
        r = api_as(vic).get(r.json()["next"])
    assert len(seen) == len(set(seen)) == total


def test_it_reports_tenant_numbers(api_as, vic, in_doubt):
    r = get(api_as(vic), "acme", "report")
    assert r.status_code == 200
    data = r.json()
    assert data["effects"] == {"submitted": 1}
    assert sum(data["runs"].values()) == 1 and data["open_conflicts"] == 0


@pytest.mark.parametrize("action", ["retry", "mark-unknown", "acknowledge", "checkpoint"])
def test_it_writes_the_audit_event_in_the_same_transaction_as_the_action(
        monkeypatch, w, api_as, rita, in_doubt, retryable, action):
    """If the audit write fails, the action itself is rolled back."""
    rid, eid = in_doubt
    before = snapshot()
    checkpoints = Checkpoint.objects.count()

    def broken_audit(*args, **kwargs):
        raise RuntimeError("audit store down")

    monkeypatch.setattr(audit, "new_event", broken_audit)
    client = api_as(rita)
    with pytest.raises(RuntimeError):
        if action == "retry":
            post(client, "acme", f"runs/{retryable}/retry-requests", {"reason": "x"})
        elif action == "mark-unknown":
            post(client, "acme", f"effects/{eid}/mark-unknown", {"reason": "x"})
        elif action == "acknowledge":
            post(client, "acme", f"runs/{rid}/conflicts/acknowledge", {"reason": "x"})
        else:
            new_checkpoint(w, "acme")
    assert snapshot() == before
    assert not RetryRequest.objects.exists()
    assert Checkpoint.objects.count() == checkpoints


def test_a_retry_request_on_a_run_that_just_crashed_is_owner_live_not_its_state(
        api_as, rita, in_doubt):
    """CONTRACT.md 3: retry requests answer 409 owner_live, as reconcile does, while the
    run's owner is live. A run whose owner is live reads healthy, and the request was
    refused 422 "this run is healthy", which said nothing of the owner or when it goes
    (a newcomer's finding, stop 39)."""
    rid, eid = in_doubt  # written just now: the owner counts as live for 300 s
    assert Run.objects.get(uuid=rid).recovery_state == "healthy"
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "retry it"})
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "owner_live" and r.json()["lease_expires_at"]
    assert snapshot() == before
