"""The dashboard's erasure requests and legal holds (issue 20): the run page's forms by
role, the approval queue (approve executes, the requester sees no buttons), the holds
list and release; what a role may not do is 403 and writes nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from checkpoints import services
from checkpoints.models import Checkpoint, ErasureRequest, LegalHold
from tests.conftest import bearer_client
from tests.lifecycle.test_erasure_holds import completed_run, declare

pytestmark = pytest.mark.django_db


def as_(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_run_page_offers_erasure_to_reviewers_and_holds_to_admins(acme, wendy, rita,
                                                                      adam, april, vic):
    run = completed_run(wendy, acme)
    page = f"/t/acme/runs/{run.uuid}/"
    assert 'id="f-erasure"' in as_(rita).get(page).content.decode()
    assert 'id="f-hold"' not in as_(rita).get(page).content.decode()
    admin_page = as_(adam).get(page).content.decode()
    assert 'id="f-erasure"' in admin_page and 'id="f-hold"' in admin_page
    for user in (vic, april):
        body = as_(user).get(page).content.decode()
        assert 'id="f-erasure"' not in body and 'id="f-hold"' not in body


def test_file_approve_and_see_the_counts(acme, wendy, rita, april):
    run = completed_run(wendy, acme)
    r = as_(rita).post(f"/t/acme/runs/{run.uuid}/erasure-request/", {"reason": "art. 17"})
    assert r.status_code == 303
    request = ErasureRequest.objects.for_tenant(acme).get()
    queue = as_(rita).get("/t/acme/erasure-requests/").content.decode()
    assert "art. 17" in queue and "Approve and erase" not in queue  # not an approver
    queue = as_(april).get("/t/acme/erasure-requests/").content.decode()
    assert "Approve and erase" in queue
    r = as_(april).post(f"/t/acme/erasure-requests/{request.uuid}/approve/", {}, follow=True)
    assert "1 run erased" in r.content.decode()
    assert not Checkpoint.objects.for_tenant(acme).filter(run=run).exists()
    r = as_(april).post(f"/t/acme/erasure-requests/{request.uuid}/reject/", {"reason": "x"})
    assert r.status_code == 409


def test_the_requester_gets_no_buttons_and_is_refused(acme, wendy, adam):
    run = completed_run(wendy, acme)
    as_(adam).post(f"/t/acme/runs/{run.uuid}/erasure-request/", {"reason": "x"})
    request = ErasureRequest.objects.for_tenant(acme).get()
    queue = as_(adam).get("/t/acme/erasure-requests/").content.decode()
    assert "Another approver must decide your own request." in queue
    r = as_(adam).post(f"/t/acme/erasure-requests/{request.uuid}/approve/", {})
    assert r.status_code == 403
    assert ErasureRequest.objects.for_tenant(acme).get().state == "requested"


def test_place_and_release_a_hold_from_the_dashboard(acme, wendy, adam, rita):
    run = completed_run(wendy, acme)
    assert as_(rita).post(f"/t/acme/runs/{run.uuid}/legal-hold/",
                          {"reason": "x"}).status_code == 403
    assert as_(adam).post(f"/t/acme/runs/{run.uuid}/legal-hold/",
                          {"reason": ""}).status_code == 400
    assert not LegalHold.objects.for_tenant(acme).exists()
    assert as_(adam).post(f"/t/acme/runs/{run.uuid}/legal-hold/",
                          {"reason": "case 5"}).status_code == 303
    hold = LegalHold.objects.for_tenant(acme).get()
    listed = as_(rita).get("/t/acme/legal-holds/").content.decode()
    assert "case 5" in listed and "Why release?" not in listed
    r = as_(adam).post(f"/t/acme/legal-holds/{hold.uuid}/release/", {"reason": "done"},
                       follow=True)
    assert "Legal hold released." in r.content.decode()
    assert LegalHold.objects.for_tenant(acme).get().released_at is not None


def test_another_tenants_reviewer_gets_404_everywhere_and_changes_nothing(
        acme, wendy, rita, adam, omar):
    run = completed_run(wendy, acme)
    as_(rita).post(f"/t/acme/runs/{run.uuid}/erasure-request/", {"reason": "x"})
    as_(adam).post(f"/t/acme/runs/{run.uuid}/legal-hold/", {"reason": "x"})
    request = ErasureRequest.objects.for_tenant(acme).get()
    hold = LegalHold.objects.for_tenant(acme).get()
    client = as_(omar)
    for page in ("/t/acme/erasure-requests/", "/t/acme/legal-holds/"):
        assert client.get(page).status_code == 404
    for action in (f"/t/acme/runs/{run.uuid}/erasure-request/",
                   f"/t/acme/runs/{run.uuid}/legal-hold/",
                   f"/t/acme/erasure-requests/{request.uuid}/approve/",
                   f"/t/acme/erasure-requests/{request.uuid}/reject/",
                   f"/t/acme/legal-holds/{hold.uuid}/release/"):
        assert client.post(action, {"reason": "x"}).status_code == 404, action
    assert ErasureRequest.objects.for_tenant(acme).get().state == "requested"
    assert LegalHold.objects.for_tenant(acme).get().released_at is None
    assert LegalHold.objects.for_tenant(acme).count() == 1


def test_a_request_that_matched_no_run_says_so_and_one_not_run_yet_says_that(
        acme, wendy, rita, april, vic):
    """An executed erasure request that matched no run says "matched no run" with its 0
    (the API: ``counts.runs`` 0), on the requests page, the Data page and the approval's
    notice; one not executed yet (``counts`` null in the API) says it is not counted
    yet, and a rejected one that it never will be, rather than an unexplained dash."""
    declare(acme)
    completed_run(wendy, acme)  # another customer's run: never matched, never named
    none = services.erasure_request(actor=rita, tenant=acme, reason="art. 17",
                                    subject={"field": "customer", "value": "nobody-here"})
    waiting = services.erasure_request(actor=rita, tenant=acme, reason="art. 17",
                                       subject={"field": "customer", "value": "someone"})
    rejected = services.erasure_request(actor=rita, tenant=acme, reason="art. 17",
                                        subject={"field": "customer", "value": "else"})
    services.erasure_reject(actor=april, tenant=acme, request_id=rejected.uuid, reason="no")
    r = as_(april).post(f"/t/acme/erasure-requests/{none.uuid}/approve/", {}, follow=True)
    assert "Erasure approved and executed: it matched no run (0): nothing to erase." in (
        r.content.decode())
    api = bearer_client(vic)
    answer = api.get(f"/api/v1/tenants/acme/erasure-requests/{none.uuid}").json()
    assert answer["state"] == "executed" and answer["counts"]["runs"] == 0
    assert answer["counts"]["erased"] == 0
    assert api.get(f"/api/v1/tenants/acme/erasure-requests/{waiting.uuid}").json()[
        "counts"] is None
    for url in ("/t/acme/erasure-requests/", "/t/acme/data/"):
        page = as_(vic).get(url).content.decode()
        assert page.count("matched no run (0): nothing to erase") == 1, url
        # The queue previews what approving would do (services.erasure_preview); the
        # Data page, which offers no approval, says it is not counted yet.
        waits = ("if approved now: it matches no run: nothing to erase"
                 if url == "/t/acme/erasure-requests/" else "not counted yet: counted when approved")
        assert page.count(waits) == 1, url
        assert page.count("never counted: rejected, nothing erased") == 1, url
        assert "nobody-here" not in page and "someone" not in page


def test_a_subject_hold_shows_how_many_runs_it_holds(acme, globex, wendy, wes, adam, vic):
    """A subject hold's page row, Data page row and API answer say how many of the
    tenant's runs it holds now (the subject index's count, one query with the list);
    a runs hold its runs, a tenant hold null. Another tenant's runs of the same value
    are never counted."""
    declare(acme)
    declare(globex)
    for _ in range(2):
        completed_run(wendy, acme, customer="c-42")
    completed_run(wendy, acme, customer="c-43")
    completed_run(wes, globex, customer="c-42")
    hold = services.legal_hold_place(actor=adam, tenant=acme, reason="litigation",
                                     subject={"field": "customer", "value": "c-42"})
    api = bearer_client(vic)
    listed = api.get("/api/v1/tenants/acme/legal-holds").json()["results"]
    assert [h["runs_held"] for h in listed] == [2]
    one = api.get(f"/api/v1/tenants/acme/legal-holds/{hold.uuid}").json()
    assert one["runs_held"] == 2
    for url in ("/t/acme/legal-holds/", "/t/acme/data/"):
        page = as_(vic).get(url).content.decode()
        assert "(2 runs now)" in page, url
        assert "c-42" not in page
