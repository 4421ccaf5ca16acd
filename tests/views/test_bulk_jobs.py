"""Bulk actions as stored jobs in the dashboard and the API (issue 22, item 6): "every
run matching" above the inline maximum answers at once with a queued job; its page shows
state, progress counts and (to reviewers, while open) the abort form, htmx getting the
live part only; ``POST …/abort`` (page and API) stops it, audited, and refuses viewers
and other tenants.
"""

from __future__ import annotations

import uuid

import pytest

from checkpoints import services
from checkpoints.jobs import bulk as bulk_job
from checkpoints.models import AuditEvent, BulkAction, BulkActionItem
from checkpoints.vocab import AuditAction, BulkState
from tests.conftest import bearer_client
from tests.services.test_bulk_jobs import closed, many_runs
from tests.views.test_bulk import logged_in

pytestmark = pytest.mark.django_db
API = "/api/v1/tenants/acme/bulk-actions"


@pytest.fixture(autouse=True)
def small_jobs(monkeypatch):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    monkeypatch.setattr(bulk_job, "BATCH", 2)


def job(rita, acme, n=5) -> tuple[BulkAction, list[uuid.UUID]]:
    runs = many_runs(acme, n)
    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="close", reason="r",
                                   client_token=uuid.uuid4(), run_ids=[str(r) for r in runs])
    return bulk, runs


def test_every_run_matching_from_the_inbox_becomes_a_job(acme, rita):
    runs = many_runs(acme, 5)
    response = logged_in(rita).post("/t/acme/bulk/", {
        "action": "close", "reason": "incident 42", "client_token": str(uuid.uuid4()),
        "scope": "matching", "filters": "state=healthy", "confirm": "yes"})
    assert response.status_code == 303
    bulk = BulkAction.objects.get()
    assert bulk.background and bulk.state == BulkState.QUEUED and closed(runs) == 0
    page = logged_in(rita).get(response["Location"]).content.decode()
    assert 'data-job-state="queued"' in page and "Waiting for a worker" in page
    assert "0 of 5</strong> runs have a result" in page
    assert f'action="/t/acme/bulk/{bulk.uuid}/abort/"' in page
    assert "data-live-poll" in page  # refreshes itself while open


def test_the_page_shows_progress_and_htmx_gets_the_live_part(acme, rita, vic):
    bulk, _ = job(rita, acme)
    bulk_job.execute(bulk.pk, budget_s=0)  # one batch: 2 of 5
    url = f"/t/acme/bulk/{bulk.uuid}/"

    fragment = logged_in(rita).get(url, HTTP_HX_REQUEST="true")

    body = fragment.content.decode()
    assert "<html" not in body and 'id="bulk-live"' in body
    assert "2 of 5</strong> runs have a result (40%)" in body
    assert 'data-outcome="done">2 done' in body and "3 not yet done" in body
    assert "HX-Request" in fragment["Vary"]
    # A viewer sees the progress, not the abort form.
    page = logged_in(vic).get(url).content.decode()
    assert "2 of 5" in page and "/abort/" not in page


def test_abort_from_the_page(acme, rita):
    bulk, runs = job(rita, acme)
    bulk_job.execute(bulk.pk, budget_s=0)
    url = f"/t/acme/bulk/{bulk.uuid}/abort/"

    response = logged_in(rita).post(url, {"reason": "wrong runs"}, HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-job-state="aborted"' in body and "Aborted by <strong>rita</strong>" in body
    assert "/abort/" not in body and "data-live-poll" not in body
    bulk.refresh_from_db()
    assert bulk.state == BulkState.ABORTED and closed(runs) == 2
    # Again: who and when, 422, nothing more written.
    again = logged_in(rita).post(url, {"reason": "again"})
    assert again.status_code == 303  # plain form: back to the page, with the words
    assert AuditEvent.objects.filter(action=AuditAction.BULK_ABORT).count() == 1
    # No reason: 400 naming it, nothing written.
    other, _ = job(rita, acme)
    refused = logged_in(rita).post(f"/t/acme/bulk/{other.uuid}/abort/", {"reason": ""})
    assert refused.status_code == 400
    other.refresh_from_db()
    assert other.state == BulkState.QUEUED


def test_abort_rights_on_the_page(acme, globex, rita, vic, omar):
    bulk, _ = job(rita, acme)
    url = f"/t/acme/bulk/{bulk.uuid}/abort/"
    assert logged_in(vic).post(url, {"reason": "x"}).status_code == 403
    assert logged_in(omar).post(url, {"reason": "x"}).status_code == 404
    assert logged_in(omar).post(f"/t/globex/bulk/{bulk.uuid}/abort/",
                                {"reason": "x"}).status_code == 404
    bulk.refresh_from_db()
    assert bulk.state == BulkState.QUEUED


def test_the_api_answers_a_queued_job_and_aborts_it(acme, rita, vic):
    runs = many_runs(acme, 5)
    response = bearer_client(rita).post(API, {"action": "close", "reason": "r",
                                              "runs": [str(r) for r in runs]},
                                        format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert response.status_code == 201, response.content
    got = response.json()
    assert (got["state"], got["job"], got["pending"], got["results"]) == ("queued", True, 5, [])
    url = f"{API}/{got['id']}/abort"

    assert bearer_client(vic).post(url, {"reason": "x"}, format="json").status_code == 403
    no_reason = bearer_client(rita).post(url, {}, format="json")
    assert no_reason.status_code == 400 and no_reason.json()["error"] == "reason_required"
    aborted = bearer_client(rita).post(url, {"reason": "stop"}, format="json")

    assert aborted.status_code == 200, aborted.content
    body = aborted.json()
    assert (body["state"], body["aborted_by"], body["abort_reason"]) == ("aborted", "rita",
                                                                         "stop")
    again = bearer_client(rita).post(url, {"reason": "stop"}, format="json")
    assert again.status_code == 422 and again.json()["error"] == "invalid_transition"
    assert bearer_client(rita).post(f"{API}/{uuid.uuid4()}/abort", {"reason": "x"},
                                    format="json").status_code == 404
    assert bulk_job.execute(BulkAction.objects.get().pk)["result"] == "skipped"
    assert not BulkActionItem.objects.exists() and closed(runs) == 0


def test_the_api_lists_refusals_first_and_counts_the_rest(acme, rita, monkeypatch):
    monkeypatch.setattr("checkpoints.selectors.objects.BULK_RESULTS_LISTED", 2)
    bulk, runs = job(rita, acme)
    services.run_close(actor=rita, tenant=acme, run_id=runs[3], reason="by hand")
    bulk_job.execute(bulk.pk)

    got = bearer_client(rita).get(f"{API}/{bulk.uuid}").json()

    assert (got["state"], got["done"], got["refused"], got["pending"]) == ("finished", 4, 1, 0)
    assert [r["run_id"] for r in got["results"]] == [str(runs[3]), str(runs[0])]
    assert got["unlisted"] == 3


def test_over_the_job_maximum_is_400_naming_the_field(acme, rita, monkeypatch):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_JOB_MAX_RUNS", 4)
    response = bearer_client(rita).post(API, {"action": "close", "reason": "r",
                                              "run_ids": [str(uuid.uuid4()) for _ in range(5)]},
                                        format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert response.status_code == 400
    assert response.json()["detail"].startswith("run_ids: at most 4 runs")
    assert not BulkAction.objects.exists()


def test_abort_of_an_ended_job_from_the_page_says_who_and_when(acme, rita):
    bulk, _ = job(rita, acme)
    services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason="first")
    response = logged_in(rita).post(f"/t/acme/bulk/{bulk.uuid}/abort/", {"reason": "again"},
                                    HTTP_HX_REQUEST="true")
    assert response.status_code == 422
    assert "Not done: already aborted by rita" in response.content.decode()
    assert AuditEvent.objects.filter(action=AuditAction.BULK_ABORT).count() == 1
