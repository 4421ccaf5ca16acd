"""Closing a run from the dashboard: reviewers only, with a reason and a confirmation; the
run shows who closed it, when and why, sits in the inbox's ``closed`` tab, and leaves it
when the runtime writes again."""

from __future__ import annotations

import html
import json

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import AuditEvent, Run
from tests.helpers import envelope, put_checkpoint
from tests.views.test_access import _snapshot

pytestmark = pytest.mark.django_db

CLOSE = {"reason": "refunded by hand in the payment console", "confirm": "yes"}


def _close_url(run_id):
    return reverse("run_close", args=["acme", run_id])


def _run_url(run_id):
    return reverse("run_detail", args=["acme", run_id])


def _tab(client, state):
    response = client.get(reverse("run_list", args=["acme"]), {"state": state})
    counts = {value: n for value, _, n in response.context["tabs"]}
    return [r["uuid"] for r in response.context["rows"]], counts


def test_it_lets_a_reviewer_close_a_run_and_shows_who_when_and_why(login, rita, stuck, acme):
    client = login(rita)
    assert 'id="f-close"' in client.get(_run_url(stuck.run_id)).content.decode()
    response = client.post(_close_url(stuck.run_id), CLOSE)
    assert response.status_code == 303
    assert response["Location"] == _run_url(stuck.run_id)
    run = Run.objects.get(uuid=stuck.run_id)
    assert (run.recovery_state, run.closed_by, run.closed_reason) == (
        "closed", rita, CLOSE["reason"])
    [event] = AuditEvent.objects.filter(tenant=acme, action="run.close")
    assert (event.actor_name, event.reason) == ("rita", CLOSE["reason"])

    page = client.get(_run_url(stuck.run_id))
    body = html.unescape(page.content.decode())
    note = body[body.index('id="closed-note"'):]
    note = note[:note.index("</p>")]
    assert "rita" in note and CLOSE["reason"] in note and " ago" in note
    assert "Any new write by the runtime reopens it." in note
    assert page.context["next_step"].startswith("Closed by rita")
    # Nothing acts on a closed run: no close, reconcile or retry; each says why.
    assert 'id="f-close"' not in body and 'id="f-reconcile"' not in body
    assert 'id="f-retry"' not in body
    assert "No reconcile: the run is closed" in body and "No retry: the run is closed" in body


def test_it_returns_the_run_body_with_the_closed_note_for_htmx(login, rita, stuck):
    response = login(rita).post(_close_url(stuck.run_id), CLOSE, HTTP_HX_REQUEST="true",
                                HTTP_HX_TRIGGER="f-close")
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<div id="run-body">')
    assert 'id="closed-note"' in body and 'id="run-state">closed<' in body
    assert "audit-changed" in json.loads(response["HX-Trigger"])
    assert "?state=closed" in body  # the back link follows the run to its new tab


def test_it_needs_the_confirmation_box_and_changes_nothing_without_it(login, rita, stuck, acme):
    before = _snapshot(acme)
    client = login(rita)
    for data in ({"reason": "done"}, {"reason": "done", "confirm": ""}):
        response = client.post(_close_url(stuck.run_id), data)
        assert response.status_code == 400
        assert b"confirm: tick the box to confirm closing the run" in response.content
    response = client.post(_close_url(stuck.run_id), {"confirm": "yes"})
    assert response.status_code == 400 and b"reason: a reason is required" in response.content
    assert _snapshot(acme) == before


def test_it_refuses_close_to_a_viewer_and_an_approver_and_changes_nothing(
        login, vic, april, stuck, acme):
    before = _snapshot(acme)
    for user in (vic, april):
        client = login(user)
        assert 'id="f-close"' not in client.get(_run_url(stuck.run_id)).content.decode()
        for extra in ({}, {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "f-close"}):
            response = client.post(_close_url(stuck.run_id), CLOSE, **extra)
            assert response.status_code == 403, user
    assert _snapshot(acme) == before
    assert Run.objects.get(uuid=stuck.run_id).closed_at is None


def test_it_answers_422_for_closing_a_closed_run(login, rita, stuck, acme):
    client = login(rita)
    client.post(_close_url(stuck.run_id), CLOSE)
    before = _snapshot(acme)
    response = client.post(_close_url(stuck.run_id), CLOSE)
    assert response.status_code == 422 and b"already closed" in response.content
    assert _snapshot(acme) == before


def test_it_lists_a_closed_run_in_the_closed_tab_until_the_runtime_writes_again(
        login, rita, wendy, stuck, acme):
    client = login(rita)
    rows, counts = _tab(client, "closed")
    assert rows == [] and counts["closed"] == 0
    client.post(_close_url(stuck.run_id), CLOSE)

    rows, counts = _tab(client, "closed")
    assert rows == [stuck.run_id] and counts["closed"] == 1
    assert _tab(client, "ambiguous")[0] == []
    inbox = html.unescape(client.get(reverse("run_list", args=["acme"]),
                                     {"state": "closed"}).content.decode())
    assert str(stuck.run_id)[:8] in inbox
    assert "closed by rita" in inbox and CLOSE["reason"] in inbox  # who and why, per row

    # The runtime writes again: the run reopens and leaves the closed tab.
    put_checkpoint(wendy, acme, envelope(stuck.checkpoint_id, stuck.run_id, 2,
                                         payload={"phase": "charging", "order_id": "A-1042"}),
                   expected=1)
    run = Run.objects.get(uuid=stuck.run_id)
    assert run.closed_at is None and run.recovery_state != "closed"
    rows, counts = _tab(client, "closed")
    assert rows == [] and counts["closed"] == 0
    assert stuck.run_id in _tab(client, run.recovery_state)[0]
    body = client.get(_run_url(stuck.run_id)).content.decode()
    assert 'id="closed-note"' not in body and 'id="f-close"' in body


def test_it_shows_an_empty_closed_tab_with_a_sentence(login, vic, stuck):
    body = login(vic).get(reverse("run_list", args=["acme"]), {"state": "closed"}).content
    assert b"Runs a reviewer closed show here until their runtime writes again." in body


def test_a_retry_approved_then_expired_by_the_close_says_when_it_expired(
        login, rita, april, unknown, acme):
    """(stop 34, an attack's doubt) Closing a run expires its approved retry request
    (``close_locked``), which sets the decision's time to the expiry's: the run page
    read "april <the close's time>" beside the approval's reason, as if april had
    decided then. It now says who approved and when the request expired."""
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                   reason="the gateway lost it")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="go")
    services.run_close(actor=rita, tenant=acme, run_id=unknown.run_id, reason="by hand")
    body = html.unescape(login(rita).get(_run_url(unknown.run_id)).content.decode())
    row = body[body.index('<table class="retries">'):]
    row = row[:row.index("</tr>", row.index("<tbody>"))]
    assert "approved by april " in row and "expired " in row


def test_closing_keeps_an_approvals_time_and_stores_the_expiry_apart(
        login, rita, april, unknown, acme, api_as):
    """(stop 37, the ux helper's finding) ``close_locked`` wrote the close's time into
    an approved request's ``decided_at``: the API said april decided at the close, and
    the report counted her approval in the close's window. The approval keeps its time;
    the expiry has ``expired_at``. A request still requested when the run closed takes
    the close's time as both."""
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                   reason="the gateway lost it")
    approved = services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk,
                                      reason="go")
    services.run_close(actor=rita, tenant=acme, run_id=unknown.run_id, reason="by hand")
    retry.refresh_from_db()
    run = Run.objects.for_tenant(acme).get(uuid=unknown.run_id)
    assert (retry.state, retry.decided_at) == ("expired", approved.decided_at)
    assert retry.expired_at == run.closed_at and retry.expired_at > retry.decided_at
    answer = api_as(april).get(f"/api/v1/tenants/acme/retry-requests/{retry.pk}").json()
    assert answer["decided_by"] == "april"
    assert answer["decided_at"] < answer["expired_at"]
