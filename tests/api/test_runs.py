"""Runs, leases and resume decisions over HTTP (CONTRACT.md section 3, "Runs and recovery")."""

from __future__ import annotations

import uuid

import pytest

from checkpoints.models import AuditEvent, RetryRequest, Run
from tests.api.apihelpers import get, new_checkpoint, post, put_cp, put_fx, snapshot, walk
from tests.helpers import age_world, effect_body


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


def _resume(client, run_id, **params):
    r = get(client, "acme", f"runs/{run_id}/resume", **params)
    assert r.status_code == 200, r.content
    return r.json()


def test_it_pages_through_every_run_by_keyset(w, acme):
    made = [new_checkpoint(w, "acme")["run_id"] for _ in range(5)]
    seen, next_url, pages = [], None, 0
    r = get(w, "acme", "runs", limit=2)
    while True:
        assert r.status_code == 200
        pages += 1
        seen += [row["run_id"] for row in r.json()["results"]]
        next_url = r.json()["next"]
        if next_url is None:
            break
        r = w.get(next_url)
    assert pages == 3
    assert seen == list(reversed(made))  # newest write first, each run exactly once


def test_it_filters_runs_by_recovery_state_and_kind(w, acme):
    healthy = new_checkpoint(w, "acme")["run_id"]
    odd = new_checkpoint(w, "acme", kind="zeta.thing", payload={})["run_id"]
    r = get(w, "acme", "runs", recovery_state="schema_mismatch")
    assert [x["run_id"] for x in r.json()["results"]] == [odd]
    r = get(w, "acme", "runs", recovery_state="healthy", kind="acme.order")
    assert [x["run_id"] for x in r.json()["results"]] == [healthy]
    row = r.json()["results"][0]
    assert row["tenant"] == "acme" and row["recovery_state"] == "healthy"
    assert "payload" not in row


def test_it_filters_runs_by_age(w, acme):
    new_checkpoint(w, "acme")
    assert get(w, "acme", "runs", age_s_min=3600).json()["results"] == []
    assert len(get(w, "acme", "runs", age_s_min=0).json()["results"]) == 1


@pytest.mark.parametrize("param,value", [("recovery_state", "sleepy"), ("limit", "0"),
                                         ("limit", "x"), ("age_s_min", "-5"),
                                         ("cursor", "garbage")])
def test_it_refuses_a_bad_run_filter_naming_it(w, acme, param, value):
    r = get(w, "acme", "runs", **{param: value})
    assert r.status_code == 400
    assert r.json()["detail"].startswith(param)


def test_it_shows_a_run_with_checkpoints_effects_and_open_review_items(w, api_as, rita, acme):
    body = new_checkpoint(w, "acme")
    rid = body["run_id"]
    put_cp(w, "acme", dict(body, revision=1), match=0)
    put_cp(w, "acme", dict(body, revision=1), match=0)  # refused: a conflict
    fx = effect_body(run_id=rid)
    walk(w, "acme", fx, "submitted")
    age_world(3600)  # the owner is gone: a reviewer may declare it
    assert post(api_as(rita), "acme", f"effects/{fx['id']}/mark-unknown",
                {"reason": "no lookup"}).status_code == 200
    assert post(api_as(rita), "acme", f"runs/{rid}/retry-requests",
                {"reason": "stuck"}).status_code == 201
    r = get(api_as(rita), "acme", f"runs/{rid}")
    assert r.status_code == 200
    data = r.json()
    assert data["run"]["run_id"] == rid
    assert [c["id"] for c in data["checkpoints"]] == [body["id"]]
    assert data["checkpoints"][0]["revision"] == 1 and "payload" not in data["checkpoints"][0]
    assert [e["id"] for e in data["effects"]] == [fx["id"]]
    items = data["open_review_items"]
    assert items["retry_request"]["state"] == "requested"
    assert items["retry_request"]["requested_by"] == "rita"
    assert [(c["expected_revision"], c["actual_revision"]) for c in items["conflicts"]] == [(0, 1)]
    # What to do next, in the list's words for the same run (stop 35: the detail had none).
    listed = {row["run_id"]: row for row in get(api_as(rita), "acme", "runs").json()["results"]}
    assert data["next_step"] and data["next_step"] == listed[rid]["next_step"]


def test_it_answers_404_for_a_missing_or_malformed_run(w, acme):
    assert get(w, "acme", f"runs/{uuid.uuid4()}").status_code == 404
    assert get(w, "acme", "runs/xyz").status_code == 404
    before = snapshot()
    r = post(w, "acme", f"runs/{uuid.uuid4()}/lease", {"owner": "a", "ttl_s": 5})
    assert r.status_code == 404
    assert post(w, "acme", f"runs/{uuid.uuid4()}/resume", {}).status_code == 404
    assert get(w, "acme", f"runs/{uuid.uuid4()}/resume").status_code == 404
    assert snapshot() == before  # neither the lease nor the resume made a run


def test_it_leases_renews_and_refuses_another_owner_with_409(w, acme):
    rid = new_checkpoint(w, "acme")["run_id"]
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": "w1", "ttl_s": 60})
    assert r.status_code == 200
    token = r.json()["fencing_token"]
    assert set(r.json()) == {"fencing_token", "expires_at"}
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": "w1", "ttl_s": 60})
    assert r.json()["fencing_token"] == token
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": "w2", "ttl_s": 60})
    assert r.status_code == 409 and r.json()["error"] == "lease_held"
    assert snapshot() == before


@pytest.mark.parametrize("body,field", [({"owner": "", "ttl_s": 5}, "owner"),
                                        ({"owner": "a", "ttl_s": 0}, "ttl_s"),
                                        ({"owner": "a", "ttl_s": True}, "ttl_s"),
                                        ({"owner": "a", "ttl_s": "5"}, "ttl_s"),
                                        ({"owner": "a"}, "ttl_s"),
                                        ({"owner": "a", "ttl_s": 5, "x": 1}, "x")])
def test_it_refuses_a_bad_lease_body_naming_the_field(w, acme, body, field):
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease", body)
    assert r.status_code == 400 and r.json()["detail"].startswith(field)
    assert snapshot() == before


@pytest.mark.parametrize("phase,action,reason", [
    ("ready", "continue", "stable"),
    ("completed", "replay", "completed"),
    ("charging", "reject", "in_flight"),
])
def test_it_answers_resume_by_phase(w, acme, phase, action, reason):
    body = new_checkpoint(w, "acme", payload={"phase": phase})
    data = _resume(w, body["run_id"])
    assert (data["action"], data["reason"]) == (action, reason)
    assert data["checkpoint_id"] == body["id"] and data["revision"] == 0
    assert data["fencing_token"] == 0


def test_it_answers_resume_identity_mismatch_for_another_workflow(w, acme):
    rid = new_checkpoint(w, "acme", payload={"phase": "ready", "workflow": "orders"})["run_id"]
    assert _resume(w, rid, workflow="orders")["action"] == "continue"
    data = _resume(w, rid, workflow="refunds")
    assert (data["action"], data["reason"]) == ("reject", "identity_mismatch")


def test_it_answers_resume_unsupported_schema(w, acme):
    rid = new_checkpoint(w, "acme", kind="zeta.thing", payload={})["run_id"]
    assert _resume(w, rid)["reason"] == "unsupported_schema"


def test_it_answers_resume_reconcile_for_an_effect_in_doubt(w, acme):
    rid = new_checkpoint(w, "acme")["run_id"]
    walk(w, "acme", effect_body(run_id=rid), "submitted")
    data = _resume(w, rid)
    assert (data["action"], data["reason"]) == ("reconcile", "effects_in_doubt")


def test_it_answers_resume_reject_outcome_unknown_then_retry_once_approved(w, api_as, rita,
                                                                         april, acme):
    rid = new_checkpoint(w, "acme")["run_id"]
    fx = effect_body(run_id=rid)
    walk(w, "acme", fx, "submitted")
    age_world(3600)  # the owner is gone: a reviewer may declare it
    r = post(api_as(rita), "acme", f"effects/{fx['id']}/mark-unknown", {"reason": "no lookup"})
    assert r.status_code == 200
    assert _resume(w, rid)["reason"] == "outcome_unknown"
    retry = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", {"reason": "try again"})
    assert _resume(w, rid)["reason"] == "awaiting_approval"
    r = post(api_as(april), "acme", f"retry-requests/{retry.json()['id']}/approve",
             {"reason": "ok"})
    assert r.status_code == 200
    # The GET only previews: it says a retry is there, and consumes, fences, audits nothing.
    events = AuditEvent.objects.count()
    data = _resume(w, rid)
    assert (data["action"], data["reason"], data["fencing_token"]) == ("retry", "retry_approved",
                                                                       0)
    assert RetryRequest.objects.get(pk=retry.json()["id"]).state == "approved"
    assert AuditEvent.objects.count() == events
    # The runtime's POST claims it: consumed once, the old owner fenced.
    r = post(w, "acme", f"runs/{rid}/resume", {})
    assert r.status_code == 200
    data = r.json()
    assert (data["action"], data["reason"], data["fencing_token"]) == ("retry", "retry_approved",
                                                                       1)
    assert RetryRequest.objects.get(pk=retry.json()["id"]).state == "consumed"
    assert _resume(w, rid)["action"] != "retry"  # consumed once
    assert post(w, "acme", f"runs/{rid}/resume", {}).json()["action"] != "retry"
    # The retry authorises the effect to go back to planned (attempt 2) with the new token.
    r = put_fx(w, "acme", dict(fx, revision=3, state="planned"), match=2, token=1)
    assert r.status_code == 200 and r.json()["attempt"] == 2


def test_it_answers_resume_no_checkpoint_for_an_effect_only_run(w, acme):
    fx = effect_body()
    walk(w, "acme", fx)
    assert _resume(w, fx["run_id"]) == {"action": "reject", "reason": "no_checkpoint",
                                        "checkpoint_id": None, "revision": None,
                                        "fencing_token": 0}
    assert Run.objects.filter(uuid=fx["run_id"]).exists()


def test_the_next_step_of_a_run_deleted_meanwhile_is_a_404_not_a_500(acme, rita, wendy):
    """(stop 35, the second attack's doubt) The run detail reads the run, then its next
    step (``selectors.run_step``) in a second query: a run retention deleted between the
    two is ``NotFound`` (the detail's 404), not ``DoesNotExist`` (a 500)."""
    from checkpoints import selectors
    from checkpoints.exceptions import NotFound
    from checkpoints.models import Run
    from tests.helpers import envelope, put_checkpoint

    body = envelope()
    put_checkpoint(wendy, acme, body)
    run = Run.objects.get(uuid=body["run_id"])
    assert selectors.run_step(user=rita, tenant=acme, run=run).short is not None
    gone = Run(pk=run.pk + 10**6, tenant=acme, uuid=uuid.uuid4())  # read, then deleted
    with pytest.raises(NotFound):
        selectors.run_step(user=rita, tenant=acme, run=gone)
