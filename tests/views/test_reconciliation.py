"""The run page's Reconciliation section: every reconcile request with its look-ups, the
evidence behind an audited reveal, a request that gave up or waits for the task queue,
and reconcile refused in place while the run's owner is live."""

from __future__ import annotations

import html
import json

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import AuditEvent, Effect, ReconcileAttempt, ReconcileRequest, Run
from checkpoints.reconcile import Answer
from tests.views.conftest import reconcile
from tests.views.test_access import REASON, _snapshot

pytestmark = pytest.mark.django_db


def _run_url(run_id):
    return reverse("run_detail", args=["acme", run_id])


def _page(client, run_id) -> str:
    response = client.get(_run_url(run_id))
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def _evidence_url(attempt):
    return reverse("reconcile_evidence_reveal", args=["acme", attempt.pk])


# --- the history -----------------------------------------------------------------------

def test_it_lists_every_reconcile_request_newest_first_with_its_look_ups(
        login, rita, stuck, acme, scripted, settings):
    settings.RECOVERY_RECONCILE_MAX_FAILURES = 1
    scripted.answers = [Answer.cannot_tell("payments: HTTP 503")]
    reconcile(rita, acme, stuck.run_id, reason="first try")
    scripted.answers = [Answer.found({"charge_id": "ch_9"}, "payments: charge ch_9 succeeded")]
    reconcile(rita, acme, stuck.run_id, reason="service is back")
    first, second = ReconcileRequest.objects.order_by("pk")
    assert (first.state, second.state, second.outcome) == ("gave_up", "done", "confirmed")

    response = login(rita).get(_run_url(stuck.run_id))
    rows = response.context["reconcile_rows"]
    assert [r["req"].pk for r in rows] == [second.pk, first.pk]  # newest first
    body = html.unescape(response.content.decode())
    section = body[body.index('id="reconciliation"'):]
    assert section.index(f'id="reconcile-{second.pk}"') < section.index(
        f'id="reconcile-{first.pk}"')
    for text in ("payments", "charge:A-1042", "rita", "service is back", "first try",
                 "gave up", "done", "confirmed", "payments: HTTP 503",
                 "payments: charge ch_9 succeeded", "tests.views.reconcilers.Scripted"):
        assert text in section, text
    # Each request's attempt log: number, reconciler, answer, applied state.
    assert 'data-answer="cannot_tell"' in section and 'data-answer="found"' in section
    # The effect moved on since the first request gave up: it no longer waits for a human.
    assert "waits for a human" not in section and "has since moved on" in section


def test_it_shows_queued_requests_with_their_next_attempt_and_counts(
        login, rita, stuck, acme, scripted):
    scripted.answers = [Answer.cannot_tell("payments: no answer within 5 s")]
    reconcile(rita, acme, stuck.run_id)
    req = ReconcileRequest.objects.get()
    assert (req.state, req.attempts, req.failures) == ("queued", 1, 1)
    response = login(rita).get(_run_url(stuck.run_id))
    body = html.unescape(response.content.decode())
    row = body[body.index(f'id="reconcile-{req.pk}"'):]
    row = row[:row.index("</tbody>")]
    assert 'data-state="queued"' in row and "payments: no answer within 5 s" in row
    assert "in " in row  # next attempt, in the future
    assert response.context["next_step"].startswith("Reconciliation is queued")
    # It is not the broker's fault here: no "worker is back" note.
    assert "will run when the worker is back" not in body


def test_it_says_plainly_when_a_request_gave_up_and_what_a_reviewer_can_do(
        login, rita, vic, stuck, acme, scripted, settings):
    settings.RECOVERY_RECONCILE_MAX_FAILURES = 1
    scripted.answers = [Answer.cannot_tell("payments: HTTP 503 from /operations")]
    reconcile(rita, acme, stuck.run_id)
    assert ReconcileRequest.objects.get().state == "gave_up"
    assert Effect.objects.get(uuid=stuck.effect_id).state == "unresolved"

    response = login(rita).get(_run_url(stuck.run_id))
    body = html.unescape(response.content.decode())
    assert "Reconciliation gave up after 1 look-up:" in body
    assert "payments charge:A-1042 waits for a human" in body
    assert "Last error: " in body and "payments: HTTP 503 from /operations" in body
    assert "reconcile again" in body and "mark the outcome unknown" in body
    assert ">Reconcile again<" in body and "Mark outcome unknown" in body
    assert response.context["next_step"] == (
        "Reconciliation gave up on payments charge:A-1042: reconcile again, or mark the "
        "outcome unknown")
    viewer = _page(login(vic), stuck.run_id)
    assert "waits for a human" in viewer and "A reviewer can reconcile again" in viewer


@pytest.mark.django_db(transaction=True)  # real commits: the dispatch runs before rendering
def test_it_says_a_request_waits_for_the_worker_when_the_broker_was_down(
        login, rita, stuck, acme, settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = False  # a broker is configured...

    def unreachable(*args, **kwargs):
        raise ConnectionRefusedError("redis://127.0.0.1:6379: connection refused")

    monkeypatch.setattr("celery.app.base.Celery.send_task", unreachable)  # ...and down
    url = reverse("run_reconcile", args=["acme", stuck.run_id])
    response = login(rita).post(url, REASON, HTTP_HX_REQUEST="true",
                                HTTP_HX_TRIGGER="f-reconcile")
    assert response.status_code == 200
    req = ReconcileRequest.objects.get()
    assert req.state == "queued" and req.attempts == 0
    body = html.unescape(response.content.decode())
    assert "it will run when the worker is back" in body  # the action's notice
    assert "Queued, will run when the worker is back" in body  # the request's row
    page = login(rita).get(_run_url(stuck.run_id))
    assert "Queued, will run when the worker is back" in page.content.decode()
    assert page.context["next_step"].startswith(
        "Reconciliation is queued and will run when the worker is back")


def test_it_shows_no_reconciliation_section_for_a_run_with_nothing_to_reconcile(
        login, rita, unknown):
    body = login(rita).get(_run_url(unknown.run_id)).content.decode()
    assert 'id="reconciliation"' not in body


def test_it_says_no_reconciliation_was_requested_for_an_in_doubt_effect(login, vic, stuck):
    body = login(vic).get(_run_url(stuck.run_id)).content.decode()
    assert 'id="reconciliation"' in body
    assert "No reconciliation has been requested for this run." in body


# --- the next step after reconciliation settled an in-flight run -----------------------

def test_it_suggests_a_retry_or_closing_after_reconciliation_confirmed_the_effect(
        login, rita, stuck, acme, scripted):
    reconcile(rita, acme, stuck.run_id)
    run = Run.objects.get(uuid=stuck.run_id)
    assert Effect.objects.get(uuid=stuck.effect_id).state == "confirmed"
    assert (run.recovery_state, run.phase_class) == ("ambiguous", "in_flight")
    response = login(rita).get(_run_url(stuck.run_id))
    assert response.context["next_step"] == (
        "Reconciliation confirmed payments charge:A-1042: request a retry (it replays the "
        "confirmed receipt; not called again) or close the run")
    body = response.content.decode()
    # Both end states are on offer.
    assert 'id="f-retry"' in body and 'id="f-close"' in body
    assert 'data-outcome="replay_receipt"' in body


def test_it_suggests_a_retry_or_closing_after_reconciliation_found_nothing(
        login, rita, stuck, acme, scripted):
    scripted.answers = [Answer.not_executed("payments: no such operation")]
    reconcile(rita, acme, stuck.run_id)
    assert Effect.objects.get(uuid=stuck.effect_id).state == "not_executed"
    hint = login(rita).get(_run_url(stuck.run_id)).context["next_step"]
    assert hint == ("Reconciliation found that payments charge:A-1042 never ran: request a "
                    "retry (it is submitted again with the same key) or close the run")


# --- evidence: shown only through an audited reveal ------------------------------------

@pytest.fixture
def attempt(stuck, acme, rita, scripted) -> ReconcileAttempt:
    reconcile(rita, acme, stuck.run_id)
    found = ReconcileAttempt.objects.get()
    assert found.answer == "found" and found.evidence_ciphertext
    return found


def test_it_keeps_evidence_out_of_every_page_until_revealed(login, rita, april, vic, adam,
                                                           attempt, stuck):
    for user in (rita, april, vic, adam):
        body = _page(login(user), stuck.run_id)
        assert "gw-777" not in body, user
    assert f'id="f-evidence-{attempt.pk}"' in _page(login(rita), stuck.run_id)
    assert f'id="f-evidence-{attempt.pk}"' in _page(login(april), stuck.run_id)
    viewer = _page(login(vic), stuck.run_id)
    assert "Reveal evidence" not in viewer and "hidden (needs reveal right)" in viewer


def test_it_reveals_evidence_and_writes_exactly_one_audit_event(login, rita, attempt, acme):
    before = AuditEvent.objects.filter(tenant=acme).count()
    response = login(rita).post(_evidence_url(attempt), {"reason": "which charge is it?"},
                                HTTP_HX_REQUEST="true", HTTP_HX_TRIGGER=f"f-evidence-{attempt.pk}")
    body = html.unescape(response.content.decode())
    assert response.status_code == 200
    assert "gw-777" in body and "<html" not in body and "revealed and audited" in body
    assert "audit-changed" in json.loads(response["HX-Trigger"])
    assert AuditEvent.objects.filter(tenant=acme).count() == before + 1
    [event] = AuditEvent.objects.filter(tenant=acme, action="evidence.reveal")
    assert (event.actor_name, event.reason) == ("rita", "which charge is it?")
    assert event.after == {"request": attempt.request_id, "attempt": attempt.number}


def test_it_reveals_evidence_in_the_full_page_without_htmx(login, april, attempt, stuck, acme):
    response = login(april).post(_evidence_url(attempt), {"reason": "before approving"})
    body = html.unescape(response.content.decode())
    assert response.status_code == 200 and "<html" in body
    slot = body[body.index(f'id="evidence-{attempt.pk}"'):]
    assert "gw-777" in slot[:slot.index("</td>")]
    assert AuditEvent.objects.filter(tenant=acme, action="evidence.reveal").count() == 1


def test_it_refuses_evidence_to_a_viewer_and_changes_nothing(login, vic, attempt, acme):
    before = _snapshot(acme)
    for extra in ({}, {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "f-x"}):
        response = login(vic).post(_evidence_url(attempt), REASON, **extra)
        assert response.status_code == 403
        assert b"gw-777" not in response.content
    assert _snapshot(acme) == before
    assert not AuditEvent.objects.filter(action="evidence.reveal").exists()


def test_it_answers_404_for_evidence_of_another_tenant_and_changes_nothing(
        login, omar, attempt, acme):
    before = _snapshot(acme)
    client = login(omar)
    assert client.post(_evidence_url(attempt), REASON).status_code == 404
    other = reverse("reconcile_evidence_reveal", args=["globex", attempt.pk])
    assert client.post(other, REASON).status_code == 404
    assert _snapshot(acme) == before


def test_it_needs_a_reason_to_reveal_evidence_and_a_post(login, rita, attempt, acme):
    before = _snapshot(acme)
    client = login(rita)
    response = client.post(_evidence_url(attempt), {"reason": "  "})
    assert response.status_code == 400 and b"reason: a reason is required" in response.content
    assert client.get(_evidence_url(attempt)).status_code == 405
    missing = reverse("reconcile_evidence_reveal", args=["acme", attempt.pk + 1000])
    assert client.post(missing, REASON).status_code == 404
    assert _snapshot(acme) == before


# --- reconcile refused while the owner is live ------------------------------------------

@pytest.fixture
def owned(stuck, acme, wendy):
    """The stuck run after its runtime came back: a live lease by ``worker-7``."""
    services.lease_acquire(actor=wendy, tenant=acme, run_id=stuck.run_id, owner="worker-7",
                           ttl_s=600)
    return stuck


def test_it_explains_why_reconcile_is_not_offered_while_the_owner_is_live(login, rita, vic,
                                                                          owned):
    response = login(rita).get(_run_url(owned.run_id))
    body = html.unescape(response.content.decode())
    assert 'id="f-reconcile"' not in body
    note = body[body.index('id="reconcile-blocked"'):]
    note = note[:note.index("</p>")]
    assert "The owner worker-7 is live until " in note and " UTC (in " in note
    assert "reconcile after it is gone" in note
    assert response.context["next_step"].startswith("Wait: the owner worker-7 is live until")
    assert 'id="reconcile-blocked"' not in login(vic).get(_run_url(owned.run_id)).content.decode()


@pytest.mark.parametrize("htmx", [False, True])
def test_it_shows_the_owner_live_refusal_in_place_and_changes_nothing(
        login, rita, owned, acme, htmx):
    # The page was rendered before the owner came back; the reviewer presses Reconcile.
    before = _snapshot(acme)
    extra = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "f-reconcile"} if htmx else {}
    response = login(rita).post(reverse("run_reconcile", args=["acme", owned.run_id]),
                                REASON, **extra)
    assert response.status_code == 409
    body = html.unescape(response.content.decode())
    assert "Reconcile refused." in body
    assert "The owner worker-7 is live until " in body and "reconcile after it is gone" in body
    assert "Could not do that" not in body  # not the error page
    if htmx:
        assert body.lstrip().startswith('<div id="run-body">')
        assert "HX-Retarget" not in response  # swapped where the form's target says
    else:
        assert "<html" in body and 'id="run-state"' in body
    assert _snapshot(acme) == before
    assert not ReconcileRequest.objects.exists()
