"""What the run page and inbox offer and show, per run state and role: "Request retry" only
where the service would accept it, the approver's default tab, the back link after an
action, the next-step hint, receipts hidden from viewers, a human 404."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction
from django.urls import reverse

from checkpoints import services
from checkpoints.exceptions import InvalidTransition, OwnerLive
from checkpoints.models import AuditEvent, Effect, RetryRequest, Run
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect
from tests.views.conftest import make_stuck_run
from tests.views.test_access import REASON, _snapshot

pytestmark = pytest.mark.django_db


def _run_url(run_id):
    return reverse("run_detail", args=["acme", run_id])


# --- scenarios: each returns the run id of a run in one situation ---------------------

def _fresh_stuck(acme, wendy):
    order = f"O-{uuid.uuid4().hex[:8]}"
    return make_stuck_run(wendy, acme, order_id=order, key=f"charge:{order}")


def _stuck(acme, wendy, rita):  # ambiguous, effect unresolved
    return _fresh_stuck(acme, wendy).run_id


def _unknown(acme, wendy, rita):  # unknown_outcome, nothing in doubt
    stuck = _fresh_stuck(acme, wendy)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    return stuck.run_id


def _settled_in_flight(acme, wendy, rita):  # ambiguous: in flight, owner gone, effect confirmed
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging",
                                                                  "order_id": "S-1"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:S-1"),
                "submitted", "confirmed")
    sweep_later()
    return run_id


def _healthy(acme, wendy, rita):  # stable checkpoint, no effect
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "ready",
                                                                  "order_id": "H-1"}))
    return run_id


def _open_request(acme, wendy, rita):  # awaiting_approval
    run_id = _unknown(acme, wendy, rita)
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="try again")
    return run_id


SCENARIOS = {"stuck": _stuck, "unknown": _unknown, "settled_in_flight": _settled_in_flight,
             "healthy": _healthy, "open_request": _open_request}


def _service_accepts(rita, acme, run_id) -> bool:
    """Would ``services.retry_request`` accept? Asked inside a rolled-back savepoint."""
    try:
        with transaction.atomic():
            services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="probe")
            transaction.set_rollback(True)
    except (InvalidTransition, OwnerLive):  # owner_live: judged first (stop 39)
        return False
    return True


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_it_offers_request_retry_exactly_when_the_service_would_accept_it(
        login, rita, wendy, acme, scenario):
    run_id = SCENARIOS[scenario](acme, wendy, rita)
    response = login(rita).get(_run_url(run_id))
    offered = response.context["can_request_retry"]
    body = response.content.decode()
    assert offered == ('id="f-retry"' in body)
    assert offered == _service_accepts(rita, acme, run_id), scenario
    # When it is not offered, a reviewer is told why in one line.
    assert offered == ('id="retry-blocked"' not in body), scenario
    assert offered == (scenario in {"unknown", "settled_in_flight"})


def test_it_refuses_a_posted_retry_while_an_effect_is_in_doubt(login, rita, stuck, acme):
    before = _snapshot(acme)
    response = login(rita).post(reverse("run_retry_request", args=["acme", stuck.run_id]),
                                REASON)
    assert response.status_code == 422
    assert _snapshot(acme) == before and not RetryRequest.objects.exists()


def test_it_tells_only_reviewers_why_retry_is_not_offered(login, rita, vic, april, stuck):
    assert 'id="retry-blocked"' in login(rita).get(_run_url(stuck.run_id)).content.decode()
    for user in (vic, april):
        body = login(user).get(_run_url(stuck.run_id)).content.decode()
        assert 'id="retry-blocked"' not in body and 'id="f-retry"' not in body


def test_it_gives_a_next_step_derived_from_the_runs_state(login, rita, wendy, acme):
    client = login(rita)
    hint = {name: client.get(_run_url(make(acme, wendy, rita))).context["next_step"]
            for name, make in SCENARIOS.items()}
    assert hint["stuck"].startswith("Reconcile first") and "payments" in hint["stuck"]
    assert "request a retry" in hint["unknown"] and "charge:O-" in hint["unknown"]
    assert hint["settled_in_flight"].startswith("Every recorded effect is settled")
    assert "other than rita" in hint["open_request"]
    assert hint["healthy"] == ""


# --- the approver's default tab --------------------------------------------------------

def test_it_opens_the_awaiting_approval_tab_for_an_approver_when_it_has_runs(
        login, rita, april, adam, wendy, acme):
    make_stuck_run(wendy, acme, order_id="X-1", key="charge:X-1")
    url = reverse("run_list", args=["acme"])
    assert login(april).get(url).context["state"] == "ambiguous"  # nothing awaits approval
    awaiting = _open_request(acme, wendy, rita)
    response = login(april).get(url)
    assert response.context["state"] == "awaiting_approval"
    assert [r["uuid"] for r in response.context["rows"]] == [awaiting]
    assert login(april).get(url, {"state": "ambiguous"}).context["state"] == "ambiguous"
    # A reviewer, and an admin who may also review, keep the ambiguous tab.
    assert login(rita).get(url).context["state"] == "ambiguous"
    assert login(adam).get(url).context["state"] == "ambiguous"


# --- the back link follows the run's state ---------------------------------------------

def _back_href(body: str) -> str:
    start = body.index('id="back-link" href="') + len('id="back-link" href="')
    return body[start:body.index('"', start)]


def test_it_points_the_back_link_at_the_runs_current_tab_after_an_action(
        login, rita, april, unknown):
    base = reverse("run_list", args=["acme"])
    page = login(rita).get(_run_url(unknown.run_id)).content.decode()
    assert _back_href(page) == f"{base}?state=unknown_outcome"
    response = login(rita).post(reverse("run_retry_request", args=["acme", unknown.run_id]),
                                REASON, HTTP_HX_REQUEST="true", HTTP_HX_TRIGGER="f-retry")
    assert response.status_code == 200
    assert _back_href(response.content.decode()) == f"{base}?state=awaiting_approval"
    retry = RetryRequest.objects.get()
    response = login(april).post(reverse("retry_approve", args=["acme", retry.pk]), REASON,
                                 HTTP_HX_REQUEST="true")
    assert _back_href(response.content.decode()) == f"{base}?state=retry_approved"


@pytest.mark.django_db(transaction=True)
def test_it_says_truthfully_that_an_embedded_reconciliation_already_ran(login, rita, stuck):
    # Real commits: the in-process task runs on commit, before the page is rendered.
    response = login(rita).post(reverse("run_reconcile", args=["acme", stuck.run_id]),
                                REASON, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert "Reconciliation of 1 effect requested" in body and "queued" not in body
    assert "shows what the services answered" in body
    assert Run.objects.get(uuid=stuck.run_id).recovery_state == "unknown_outcome"
    assert 'id="run-state">unknown outcome<' in body  # the page shows the answer already


def test_an_approved_run_that_must_be_migrated_first_says_how(login, rita, april, wendy,
                                                              acme, kind_registry, api_as):
    """An approved retry of an older version of an offline kind (RECOVERY_OFFLINE_KINDS):
    the runtime's resume answers migration_required, so the page says that, with the
    command, instead of promising a retry."""
    from checkpoints.apps import set_offline_kinds

    run_id = _settled_in_flight(acme, wendy, rita)  # acme.order v1
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="again")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="fine")
    lazy_page = login(rita).get(_run_url(run_id))
    lazy = lazy_page.context["next_step"]
    set_offline_kinds(["acme.order"])
    offline_page = login(rita).get(_run_url(run_id))
    offline = offline_page.context["next_step"]

    assert lazy == "Approved: the runtime's next resume call will retry"
    # The header and the live line say what the next step says it waits for.
    lazy_body, offline_body = lazy_page.content.decode(), offline_page.content.decode()
    assert "waiting for the runtime to resume" in lazy_body
    assert "an approved retry waits for the runtime" in lazy_body
    assert "waiting for the runtime" not in offline_body
    assert "waits for the runtime" not in offline_body
    assert "waiting for a migration before the runtime can resume" in offline_body
    assert "an approved retry waits for a migration" in offline_body
    # What the dashboard says, the API says (the attack's finding): list and detail.
    api = api_as(rita)
    listed = api.get("/api/v1/tenants/acme/runs?recovery_state=retry_approved").json()
    detail = api.get(f"/api/v1/tenants/acme/runs/{run_id}").json()
    for run in (listed["results"][0], detail["run"]):
        assert run["recovery_reason"] == ("retry approved, waiting for a migration before "
                                          "the runtime can resume")
    # ... and so does a notification about the run (the second attack's finding).
    from checkpoints.services import notify_dispatch

    pk = Run.objects.get(uuid=run_id).pk
    assert notify_dispatch._facts([pk])[pk].reason == detail["run"]["recovery_reason"]
    assert offline.startswith("Approved, but waiting for a migration: acme.order v1 must be "
                              "migrated to v2")
    assert (f"python manage.py migrate_checkpoints acme.order --to 2 --tenant acme "
            f"--run {run_id}") in offline


# --- payload-derived data and the 404 page ---------------------------------------------

def test_it_shows_effect_receipts_only_through_an_audited_reveal(
        login, vic, rita, april, adam, wendy, acme):
    run_id = _settled_in_flight(acme, wendy, rita)
    viewer = login(vic).get(_run_url(run_id)).content.decode()
    assert "ch_1" not in viewer and "hidden (needs reveal right)" in viewer
    assert "Reveal receipt" not in viewer
    for user in (rita, april, adam):  # issue 6: not even the roles that may reveal
        body = login(user).get(_run_url(run_id)).content.decode()
        assert "ch_1" not in body and "Reveal receipt" in body, user
    effect = Effect.objects.get(run__uuid=run_id)
    url = reverse("effect_receipt_reveal", args=["acme", effect.uuid])
    before = _snapshot(acme)
    refused = login(vic).post(url, REASON)
    assert refused.status_code == 403 and "ch_1" not in refused.content.decode()
    no_reason = login(rita).post(url, {"reason": " "}, HTTP_HX_REQUEST="true")
    assert no_reason.status_code == 400 and "ch_1" not in no_reason.content.decode()
    assert _snapshot(acme) == before
    revealed = login(rita).post(url, REASON, HTTP_HX_REQUEST="true")
    assert revealed.status_code == 200 and "ch_1" in revealed.content.decode()
    assert "audit-changed" in revealed["HX-Trigger"]
    event = AuditEvent.objects.filter(tenant=acme).latest("seq")
    assert (event.action, event.actor_name, event.reason) == (
        "receipt.reveal", "rita", REASON["reason"])
    assert event.target_ref == str(effect.uuid)


def test_it_answers_a_human_sentence_not_an_error_code_on_404(login, omar, rita, stuck):
    for user, url in ((omar, _run_url(stuck.run_id)),
                      (rita, reverse("run_detail", args=["acme", uuid.uuid4()]))):
        response = login(user).get(url)
        assert response.status_code == 404
        body = response.content.decode()
        assert "not_found" not in body and "We could not find that" in body
