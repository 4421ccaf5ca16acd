"""Stop 37's second attack, on what changed since 440f604: a reviewer ending a dead
owner's lease (``services.lease_revoke``, ``POST …/runs/{id}/lease/revoke``, the run
page's "End the lease"), see_other's 303, bulk filters' empty ``q``, the inbox's
``name_filter``, legal holds' textarea value and ``runs_held``, erasure words.

A finding is ``xfail(strict=True)`` with its reason (it fails today, passes once fixed);
a probe that held is ``test_PASS_…``."""

from __future__ import annotations

import html
import json
import uuid
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import reverse

from checkpoints import selectors, services
from checkpoints.dbclock import db_now
from checkpoints.exceptions import AlreadyDone, Fenced, NoLiveLease, RunDeleted
from checkpoints.jobs import bulk as bulk_job
from checkpoints.models import AuditEvent, BulkAction, LegalHold, RetryRequest, Run
from tests.api.apihelpers import post
from tests.conftest import bearer_client
from tests.helpers import envelope, put_checkpoint
from tests.lifecycle.test_erasure_holds import SECRET_CUSTOMER, completed_run, declare
from tests.services.test_bulk_jobs import many_runs
from tests.views.conftest import make_stuck_run
from tests.views.test_access import _snapshot
from tests.views.test_bulk import URL, ambiguous_run, form, logged_in

pytestmark = pytest.mark.django_db


def _login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _leased(acme, wendy, owner="worker-1", ttl_s=3600) -> uuid.UUID:
    stuck = make_stuck_run(wendy, acme)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=stuck.run_id, owner=owner,
                           ttl_s=ttl_s)
    return stuck.run_id


def _revoke_url(run_id):
    return reverse("run_lease_revoke", args=["acme", run_id])


def _page(run_id):
    return reverse("run_detail", args=["acme", run_id])


def _form_owner(body: str, name: str = "owner") -> str:
    form = body[body.index('id="f-lease-revoke"'):]
    form = form[:form.index("</form>")]
    start = form.index(f'name="{name}" value="') + len(f'name="{name}" value="')
    return html.unescape(form[start:form.index('"', start)])


# ---- kind 1 / 11: the dashboard form vs the service's owner ---------------------------

# Was a FINDING (fixed in this stop): the run page cannot end the lease of an owner whose name begins or ends with a space (lease_acquire takes 'worker-1 ', name_problem allows it): the fo…
def test_the_page_ends_the_lease_of_an_owner_with_a_trailing_space(acme, wendy, rita):
    run_id = _leased(acme, wendy, owner="worker-1 ")
    client = _login(rita)
    shown = _form_owner(client.get(_page(run_id)).content.decode())
    assert shown == "worker-1 "  # the page sends what it shows
    response = client.post(_revoke_url(run_id), {"reason": "node drained", "confirm": "yes",
                                                  "owner": shown})
    assert response.status_code == 303, response.content.decode()[:300]
    assert Run.objects.get(uuid=run_id).fencing_token == 2


# ---- races: a stale page vs the same owner retaking the lease -------------------------

# Was a FINDING (fixed in this stop): a stale 'End the lease' form ends a lease its owner took again after the page was shown (the proof the owner is alive): the form and the API's optiona…
def test_a_stale_form_does_not_end_the_lease_the_owner_took_again(acme, wendy, rita, adam):
    run_id = _leased(acme, wendy)
    page_a = _login(rita).get(_page(run_id)).content.decode()
    shown, token = _form_owner(page_a), _form_owner(page_a, "fencing_token")
    services.lease_revoke(actor=adam, tenant=acme, run_id=run_id, reason="B: node gone")
    again = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="worker-1",
                                   ttl_s=3600)
    assert again.fencing_token == 3  # worker-1 is alive and writing with token 3
    response = _login(rita).post(_revoke_url(run_id), {
        "reason": "A: node gone", "confirm": "yes", "owner": shown, "fencing_token": token})
    assert response.status_code == 409 and "fencing_token: the lease you saw" in \
        html.unescape(response.content.decode())
    assert Run.objects.get(uuid=run_id).fencing_token == 3


def test_PASS_the_runtime_renewing_after_the_end_gets_a_new_token_and_the_old_is_fenced(
        acme, wendy, rita):
    run_id = _leased(acme, wendy)
    old = Run.objects.get(uuid=run_id).fencing_token
    services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason="gone")
    run = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="worker-1",
                                 ttl_s=60)
    assert run.fencing_token == old + 2
    body = envelope(uuid.uuid4(), run_id, 0, payload={"phase": "ready"})
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, body, token=old)


def test_PASS_two_reviewers_one_after_the_other_end_it_once(acme, wendy, rita, adam):
    run_id = _leased(acme, wendy)
    services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason="one")
    with pytest.raises(NoLiveLease):
        services.lease_revoke(actor=adam, tenant=acme, run_id=run_id, reason="two",
                              expected_owner="worker-1")
    assert AuditEvent.objects.filter(tenant=acme, action="lease.revoke").count() == 1


# ---- a closed or deleted run ----------------------------------------------------------

def test_PASS_ending_the_lease_of_a_closed_run_keeps_it_closed(acme, wendy, rita):
    run_id = _leased(acme, wendy)
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="handled by hand")
    state = Run.objects.get(uuid=run_id).recovery_state
    run = Run.objects.get(uuid=run_id)
    if not selectors.run_get(user=rita, tenant=acme, run_id=str(run_id)).lease_live:
        pytest.skip("closing ended the lease")
    services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason="gone")
    after = Run.objects.get(uuid=run_id)
    assert after.recovery_state == state and after.fencing_token == run.fencing_token + 1


def test_PASS_a_deleted_runs_lease_is_refused_409_on_api_and_page(acme, wendy, rita, api_as):
    run_id = _leased(acme, wendy)
    Run.objects.filter(uuid=run_id).update(payloads_deleted_at=db_now())
    with pytest.raises(RunDeleted):
        services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason="x")
    r = post(api_as(rita), "acme", f"runs/{run_id}/lease/revoke", {"reason": "gone"})
    assert r.status_code == 409 and r.json()["error"] == "run_deleted", r.content
    page = _login(rita).post(_revoke_url(run_id), {"reason": "gone", "confirm": "yes",
                                                   "owner": "worker-1"})
    assert page.status_code in (404, 409)
    assert not AuditEvent.objects.filter(tenant=acme, action="lease.revoke").exists()


# ---- kind 2: values fit before any query ----------------------------------------------

@pytest.mark.parametrize(("body", "field"), [
    ({"reason": "r" * 4001}, "reason"),
    ({"reason": "ok", "owner": "o" * 257}, "owner"),
    ({"reason": "ok\x00"}, "reason"),
    ({"reason": "ok", "owner": ""}, "owner"),
    ({"reason": "ok", "owner": 7}, "owner"),
    ({"reason": "ok", "fencing_token": -1}, "fencing_token"),  # a field since: out of range
])
def test_PASS_the_api_refuses_values_that_do_not_fit_naming_the_field(acme, wendy, rita,
                                                                     api_as, body, field):
    run_id = _leased(acme, wendy)
    r = post(api_as(rita), "acme", f"runs/{run_id}/lease/revoke", body)
    assert r.status_code == 400 and field in json.dumps(r.json()), r.content
    assert Run.objects.get(uuid=run_id).fencing_token == 1


@pytest.mark.parametrize("data", [
    {"reason": "ok\x00", "confirm": "yes", "owner": "worker-1"},
    {"reason": "r" * 4001, "confirm": "yes", "owner": "worker-1"},
    {"reason": "ok", "confirm": "yes", "owner": "o" * 257},
    {"reason": "ok", "confirm": "yes", "owner": "worker-1\x00"},
])
def test_PASS_the_page_refuses_values_that_do_not_fit(acme, wendy, rita, data):
    run_id = _leased(acme, wendy)
    response = _login(rita).post(_revoke_url(run_id), data)
    assert response.status_code == 400
    assert Run.objects.get(uuid=run_id).fencing_token == 1


# ---- kind 4: the database clock -------------------------------------------------------

def test_PASS_the_lease_ends_at_the_database_time(acme, wendy, rita):
    run_id = _leased(acme, wendy)
    before = db_now()
    run = services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason="gone")
    after = db_now()
    assert before <= run.lease_expires_at <= after


# ---- kind 5 / 9: a GET writes nothing; Vary ------------------------------------------

def test_PASS_a_get_of_the_revoke_url_writes_nothing(acme, wendy, rita):
    run_id = _leased(acme, wendy)
    before = _snapshot(acme)
    response = _login(rita).get(_revoke_url(run_id))
    assert response.status_code == 405 and "HX-Request" in response["Vary"]
    assert _snapshot(acme) == before


@pytest.mark.parametrize("htmx", [False, True])
def test_PASS_a_refusal_says_vary_hx_request(acme, wendy, rita, htmx):
    run_id = _leased(acme, wendy)
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = _login(rita).post(_revoke_url(run_id), {"reason": "x", "confirm": "yes",
                                                       "owner": "worker-0"}, **extra)
    assert response.status_code == 409 and "HX-Request" in response["Vary"]


# ---- kind 6: rights from grants only --------------------------------------------------

def test_PASS_another_tenants_reviewer_cannot_reach_the_run_through_their_own_tenant(
        acme, wendy, omar, api_as):
    run_id = _leased(acme, wendy)
    r = post(api_as(omar), "globex", f"runs/{run_id}/lease/revoke", {"reason": "x"})
    assert r.status_code == 404
    page = _login(omar).post(reverse("run_lease_revoke", args=["globex", run_id]),
                             {"reason": "x", "confirm": "yes", "owner": "worker-1"})
    assert page.status_code == 404
    assert Run.objects.get(uuid=run_id).fencing_token == 1


def test_PASS_a_writer_cannot_end_its_own_lease_by_the_page(acme, wendy):
    run_id = _leased(acme, wendy)
    page = _login(wendy).post(_revoke_url(run_id), {"reason": "x", "confirm": "yes",
                                                    "owner": "worker-1"})
    assert page.status_code in (403, 404)
    assert Run.objects.get(uuid=run_id).fencing_token == 1


# ---- kind 3 / 11: bulk filters' empty q, the bulk bar and the API alike --------------

@pytest.mark.parametrize("q", ["\u3000", "\u00a0", "\t"])
def test_PASS_an_empty_looking_search_is_refused_by_the_bar_and_the_api(acme, wendy, rita, q):

    a = ambiguous_run(wendy, acme)
    page = logged_in(rita).post("/t/acme/bulk/", form("close", [a]) | {
        "scope": "matching", "filters": f"state=ambiguous&q={quote(q)}"})
    api = bearer_client(rita).post(URL, {"action": "close", "reason": "r",
                                         "filters": {"q": q}}, format="json",
                                   HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert page.status_code == 400 and "filters: q" in page.content.decode()
    assert api.status_code == 400 and api.json()["detail"].startswith("filters.q")
    assert not BulkAction.objects.exists()


# ---- kind 10 / 6 / 11: holds ----------------------------------------------------------

def test_PASS_runs_held_counts_the_tenants_own_runs_only(acme, globex, wendy, wes, adam,
                                                        api_as):
    declare(acme)
    declare(globex)
    completed_run(wendy, acme)
    completed_run(wes, globex)
    completed_run(wes, globex)
    r = post(api_as(adam), "acme", "legal-holds", {
        "reason": "case", "subject": {"field": "customer", "value": SECRET_CUSTOMER}})
    assert r.status_code == 201, r.content
    assert r.json()["runs_held"] == 1 and SECRET_CUSTOMER not in r.content.decode()


# Was a FINDING (fixed in this stop): the hold form's subject value is a textarea: a value typed or pasted with a trailing line break ('cust-4711-zebra' + Enter, sent CR LF) becomes 'cust-…
def test_a_hold_typed_with_a_trailing_enter_holds_the_run_or_is_refused(acme, wendy, adam):
    declare(acme)
    run = completed_run(wendy, acme)
    response = _login(adam).post(reverse("legal_hold_place", args=["acme"]), {
        "scope": "subject", "subject_field": "customer",
        "subject_value": SECRET_CUSTOMER + "\r\n", "reason": "litigation"})
    held = list(selectors.covering_holds(Run.objects.get(uuid=run.uuid)))
    assert LegalHold.objects.count() == 1 or response.status_code == 400
    assert response.status_code == 400 or held, (response.status_code, held)


# ---- kind 8: health after a lease end -------------------------------------------------

def test_PASS_liveness_answers_and_writes_nothing_after_a_lease_end(acme, wendy, rita):
    run_id = _leased(acme, wendy)
    services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason="gone")
    before = _snapshot(acme)
    assert Client().get("/healthz").status_code == 200
    assert _snapshot(acme) == before


# ---- kind 11: one owner rule, two paths -----------------------------------------------

# Was a FINDING (fixed in this stop): minor): lease_revoke's owner is not checked by the owner rule lease_acquire applies (check_name with blank_words): an owner that is no name ('\\u200d'…
@pytest.mark.parametrize("owner", ["\u200d", "a\nb", "x\u202e"])
def test_a_revoke_owner_that_is_no_name_is_400_as_in_lease_acquire(acme, wendy, rita,
                                                                     api_as, owner):
    run_id = _leased(acme, wendy)
    taken = post(api_as(wendy), "acme", f"runs/{run_id}/lease", {"owner": owner, "ttl_s": 60})
    assert taken.status_code == 400
    r = post(api_as(rita), "acme", f"runs/{run_id}/lease/revoke", {"reason": "x",
                                                                   "owner": owner})
    assert r.status_code == 400 and r.json()["detail"].startswith("owner: "), r.content


def test_PASS_mark_unknown_and_retry_are_no_longer_refused_owner_live(acme, wendy, rita):
    stuck = make_stuck_run(wendy, acme)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=stuck.run_id, owner="worker-1",
                           ttl_s=3600)
    with pytest.raises(Exception, match="owner"):
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                     reason="no lookup")
    services.lease_revoke(actor=rita, tenant=acme, run_id=stuck.run_id, reason="gone")
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id, reason="again")
    status = selectors.run_owner_status(user=rita, tenant=acme,
                                        run=Run.objects.get(uuid=stuck.run_id))
    assert not status.live


# ---- kind 7 / 11: a bulk job selected by a search is stored, the bar and the API alike

def test_PASS_a_searched_bulk_job_is_stored_with_the_same_runs_from_the_bar_and_the_api(
        acme, rita, monkeypatch):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    monkeypatch.setattr(bulk_job, "BATCH", 2)
    runs = set(many_runs(acme, 5))
    page = logged_in(rita).post("/t/acme/bulk/", {
        "action": "close", "reason": "incident 42", "client_token": str(uuid.uuid4()),
        "scope": "matching", "filters": "state=healthy&q=%20acme.order%20",
        "confirm": "yes"})
    assert page.status_code == 303, page.content.decode()[:300]
    api = bearer_client(rita).post(URL, {"action": "close", "reason": "r", "filters": {
        "recovery_state": "healthy", "q": " acme.order "}}, format="json",
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert api.status_code in (200, 201, 202), api.content
    jobs = list(BulkAction.objects.order_by("pk"))
    assert len(jobs) == 2 and all(j.background for j in jobs)
    for j in jobs:
        assert {uuid.UUID(r) for r in j.targets} == runs and j.total == 5
        assert j.selection["filters"]["q"] == "acme.order"  # stored as the search reads it


# ---- kind 2: a run id that is no UUID is refused before any query ---------------------

@pytest.mark.parametrize("rid", ["not-a-uuid", "x" * 5000, "%00"])
def test_PASS_a_malformed_run_id_is_404_on_page_and_api(acme, rita, api_as, rid):
    before = _snapshot(acme)
    r = post(api_as(rita), "acme", f"runs/{rid}/lease/revoke", {"reason": "x"})
    assert r.status_code in (400, 404), r.content
    page = _login(rita).post(f"/t/acme/runs/{rid}/lease/revoke/",
                             {"reason": "x", "confirm": "yes", "owner": "w"})
    assert page.status_code in (400, 404)
    assert _snapshot(acme) == before


# ---- kind 11: a retry expired by closing, its approval time and its expiry -----------

# Was a FINDING (fixed in this stop): acting on an approved retry request that closing its run expired is refused with the approval's time as the expiry's: services.review._retry_done read…
def test_the_refusal_of_an_expired_retry_says_when_it_expired(acme, wendy, rita, april):
    stuck = make_stuck_run(wendy, acme)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="gateway has no lookup")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id,
                                   reason="again")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    approved_at = db_now() - timedelta(hours=1)  # april approved an hour before the close
    RetryRequest.objects.filter(pk=retry.pk).update(decided_at=approved_at)
    services.run_close(actor=rita, tenant=acme, run_id=stuck.run_id, reason="by hand")
    row = RetryRequest.objects.get(pk=retry.pk)
    assert row.state == "expired" and row.decided_at == approved_at
    with pytest.raises(AlreadyDone) as refused:
        services.retry_reject(actor=april, tenant=acme, retry_id=retry.pk, reason="late")
    assert refused.value.at == row.expired_at, (refused.value.at, row.expired_at)
