"""Dashboard actions: each role does exactly its actions, through the audited services;
a reason is required; reveals and diffs are audited; errors are readable fragments."""

from __future__ import annotations

import html
import json

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import AuditEvent, Conflict, Effect, RetryRequest, Run
from tests.helpers import envelope, put_checkpoint
from tests.views.test_access import REASON, _actions, _snapshot

pytestmark = pytest.mark.django_db


def _events(acme, action):
    return list(AuditEvent.objects.filter(tenant=acme, action=action))


def test_it_lets_a_reviewer_request_a_retry_and_redirects_back(login, rita, unknown, acme):
    url = reverse("run_retry_request", args=["acme", unknown.run_id])
    response = login(rita).post(url, {"reason": "charge may not have gone through"})
    assert response.status_code == 303
    assert response["Location"] == reverse("run_detail", args=["acme", str(unknown.run_id)])
    retry = RetryRequest.objects.get()
    assert retry.state == "requested" and retry.requested_by == rita
    assert Run.objects.get(uuid=unknown.run_id).recovery_state == "awaiting_approval"
    [event] = _events(acme, "retry.request")
    assert event.actor_name == "rita" and event.reason == "charge may not have gone through"


def test_it_returns_the_run_body_and_audit_changed_event_for_htmx(login, rita, unknown):
    url = reverse("run_retry_request", args=["acme", unknown.run_id])
    response = login(rita).post(url, REASON, HTTP_HX_REQUEST="true", HTTP_HX_TRIGGER="f-retry")
    body = response.content.decode()
    assert response.status_code == 200
    assert "audit-changed" in json.loads(response["HX-Trigger"])
    assert body.lstrip().startswith('<div id="run-body">') and "awaiting approval" in body


def test_it_lets_an_approver_approve_anothers_request(login, rita, april, unknown, acme):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id, reason="r")
    response = login(april).post(reverse("retry_approve", args=["acme", retry.pk]),
                                 {"reason": "duplicate charge is refundable"})
    assert response.status_code == 303
    retry.refresh_from_db()
    assert retry.state == "approved" and retry.decided_by == april
    assert Run.objects.get(uuid=unknown.run_id).recovery_state == "retry_approved"
    assert [e.actor_name for e in _events(acme, "retry.approve")] == ["april"]


def test_it_lets_an_approver_reject_anothers_request(login, rita, april, unknown, acme):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id, reason="r")
    response = login(april).post(reverse("retry_reject", args=["acme", retry.pk]),
                                 {"reason": "customer cancelled"})
    assert response.status_code == 303
    retry.refresh_from_db()
    assert retry.state == "rejected"
    assert len(_events(acme, "retry.reject")) == 1


def test_it_refuses_review_actions_to_an_approver_and_approval_to_a_reviewer(
        login, rita, april, unknown, acme):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id, reason="r")
    before = _snapshot(acme)
    approver, reviewer = login(april), login(rita)
    actions = _actions("acme", unknown, retry)
    for url, data in actions[:3] + [actions[5], actions[8]]:
        assert approver.post(url, data).status_code == 403, url
    for url, data in _actions("acme", unknown, retry)[3:5]:
        assert reviewer.post(url, data).status_code == 403, url
    assert _snapshot(acme) == before


def test_it_lets_a_reviewer_mark_an_effect_outcome_unknown(login, rita, stuck, acme):
    url = reverse("effect_mark_unknown", args=["acme", stuck.effect_id])
    assert login(rita).post(url, {"reason": "gateway has no lookup",
                               "confirm": "yes"}).status_code == 303
    assert Effect.objects.get(uuid=stuck.effect_id).state == "unknown"
    assert Run.objects.get(uuid=stuck.run_id).recovery_state == "unknown_outcome"
    assert len(_events(acme, "effect.mark_unknown")) == 1


def test_it_lets_a_reviewer_queue_reconciliation(login, rita, stuck, acme,
                                                 django_capture_on_commit_callbacks):
    url = reverse("run_reconcile", args=["acme", stuck.run_id])
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = login(rita).post(url, {"reason": "ask the payment service"})
    assert response.status_code == 303
    assert len(callbacks) == 1
    assert len(_events(acme, "run.reconcile")) == 1
    # No reconciler is configured for "payments": the in-process task answers unknown.
    assert Effect.objects.get(uuid=stuck.effect_id).state == "unknown"


def test_it_lets_a_reviewer_acknowledge_conflicts(login, rita, wendy, stuck, acme):
    with pytest.raises(services.StaleRevision):
        put_checkpoint(wendy, acme, envelope(stuck.checkpoint_id, stuck.run_id, 1,
                                             payload={"phase": "charging"}), expected=0)
    body = login(rita).get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    assert "Acknowledge 1 conflict" in body
    url = reverse("conflicts_acknowledge", args=["acme", stuck.run_id])
    assert login(rita).post(url, {"reason": "lost race, harmless"}).status_code == 303
    assert Conflict.objects.get().acknowledged_by == rita
    assert len(_events(acme, "conflicts.acknowledge")) == 1


@pytest.mark.parametrize("index", range(9))
def test_it_answers_400_without_a_reason_and_writes_nothing(login, adam, rita, unknown, acme,
                                                            index):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id, reason="r")
    url, data = _actions("acme", unknown, retry)[index]
    if index == 0:  # a second open request would be refused anyway; test on a fresh run
        services.retry_reject(actor=adam, tenant=acme, retry_id=retry.pk, reason="make room")
    before = _snapshot(acme)
    data = {k: v for k, v in data.items() if k != "reason"}
    client = login(adam)
    for extra in ({}, {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "f-x"}):
        response = client.post(url, {**data, "reason": "   "}, **extra)
        assert response.status_code == 400, url
        assert b"reason: a reason is required" in response.content
    assert _snapshot(acme) == before


def test_it_retargets_an_htmx_error_into_the_forms_error_slot(login, rita, stuck):
    url = reverse("run_retry_request", args=["acme", stuck.run_id])
    response = login(rita).post(url, {}, HTTP_HX_REQUEST="true", HTTP_HX_TRIGGER="f-retry")
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#f-retry-error"
    assert response["HX-Reswap"] == "innerHTML"
    assert "<html" not in response.content.decode()
    odd = login(rita).post(url, {}, HTTP_HX_REQUEST="true", HTTP_HX_TRIGGER="x'];alert(1)")
    assert odd["HX-Retarget"] == "#flash"


def test_it_shows_a_readable_422_for_a_second_retry_request(login, rita, acme, unknown):
    client = login(rita)
    url = reverse("run_retry_request", args=["acme", unknown.run_id])
    assert client.post(url, REASON).status_code in (200, 303)
    before = _snapshot(acme)
    response = client.post(url, REASON)
    assert response.status_code == 422
    assert b"already requested by rita" in response.content  # who acted first (issue 9)
    assert _snapshot(acme) == before


def test_it_reveals_a_payload_and_writes_one_audit_event(login, april, stuck, acme):
    before = AuditEvent.objects.filter(tenant=acme).count()
    url = reverse("checkpoint_reveal", args=["acme", stuck.checkpoint_id])
    response = login(april).post(url, {"reason": "check the amount", "revision": 1},
                                 HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and "2599" in body and "<html" not in body
    assert "audit-changed" in json.loads(response["HX-Trigger"])
    assert AuditEvent.objects.filter(tenant=acme).count() == before + 1
    [event] = _events(acme, "payload.reveal")
    assert (event.actor_name, event.reason, event.after) == ("april", "check the amount",
                                                             {"revision": 1})


def test_it_reveals_in_the_full_page_without_htmx(login, rita, stuck):
    url = reverse("checkpoint_reveal", args=["acme", stuck.checkpoint_id])
    response = login(rita).post(url, {"reason": "look", "revision": 0})
    body = response.content.decode()
    assert response.status_code == 200 and "<html" in body
    assert "Payload at r0" in body and "A-1042" in body and "2599" not in body


def test_it_diffs_two_revisions_and_audits_both_reveals(login, rita, stuck, acme):
    url = reverse("checkpoint_diff", args=["acme", stuck.checkpoint_id])
    response = login(rita).post(url, {"reason": "what changed", "from_rev": 0, "to_rev": 1},
                                HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = html.unescape(response.content.decode())
    assert '<span class="d-add">+  "amount_cents": 2599,</span>' in body
    assert '<span class="d-del">-  "phase": "ready"</span>' in body
    assert '<span class="d-add">+  "phase": "charging"</span>' in body
    events = _events(acme, "payload.reveal")
    assert sorted(e.after["revision"] for e in events) == [0, 1]


def test_it_answers_400_for_a_diff_of_a_revision_that_does_not_exist(login, rita, stuck, acme):
    before = _snapshot(acme)
    url = reverse("checkpoint_diff", args=["acme", stuck.checkpoint_id])
    response = login(rita).post(url, {"reason": "x", "from_rev": 0, "to_rev": 9})
    assert response.status_code == 400 and b"to_rev:" in response.content
    assert login(rita).post(url, {"reason": "x", "from_rev": "a", "to_rev": 1}).status_code == 400
    assert _snapshot(acme) == before


def test_the_run_header_says_the_state_s_time_and_the_runtime_s_last_write(
        login, rita, wendy, acme):
    """(stop 35, the newcomer's finding) Acknowledging a completed run's conflict moves
    it into ``completed`` now, so the header's "since" read as "completed 0 s ago" for a
    run the runtime finished an hour before. It says "in this state since", and the
    runtime's last write beside it when that is older; not when the write is the
    state's own time."""
    from tests.helpers import age_world

    body = envelope(payload={"phase": "completed", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    done = {**body, "revision": 1}
    put_checkpoint(wendy, acme, done, expected=0)
    page = reverse("run_detail", args=["acme", body["run_id"]])
    header = login(rita).get(page).content.decode()
    assert "in this state since" in header and "last write by the runtime" not in header
    with pytest.raises(services.StaleRevision):
        put_checkpoint(wendy, acme, done, expected=0)  # a lost race: a conflict
    age_world(3600)
    services.conflicts_acknowledge(actor=rita, tenant=acme, run_id=body["run_id"],
                                   reason="lost race, harmless")
    run = Run.objects.get(uuid=body["run_id"])
    assert run.recovery_state == "completed" and run.last_write_at < run.state_changed_at
    header = login(rita).get(page).content.decode()
    written = f"{run.last_write_at:%Y-%m-%d %H:%M:%S} UTC"
    assert "last write by the runtime <time datetime=" in header and written in header
