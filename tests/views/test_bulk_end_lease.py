"""Bulk ``end_lease`` in the API and the dashboard (``services.bulk_submit``'s
``lease_owner``): the body's and the bulk bar's owner, the answer's and the result page's
owner, and bad input (400 naming ``lease_owner``, nothing written)."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from checkpoints.models import BulkAction, BulkActionItem, Run
from tests.conftest import bearer_client
from tests.services.test_bulk_end_lease import leased_run

pytestmark = pytest.mark.django_db
URL = "/api/v1/tenants/acme/bulk-actions"


def test_api_end_lease_names_the_owner_and_answers_it(acme, wendy, rita):
    gone, token = leased_run(wendy, acme, "worker-7")
    other, _ = leased_run(wendy, acme, "worker-8")
    api = bearer_client(rita)
    r = api.post(URL, {"action": "end_lease", "lease_owner": "worker-7",
                       "reason": "node 3 terminated", "runs": [str(gone), str(other)]},
                 format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert r.status_code == 201, r.content
    answer = r.json()
    assert (answer["action"], answer["lease_owner"]) == ("end_lease", "worker-7")
    assert [(x["run_id"], x["outcome"], x["error"]) for x in answer["results"]] == [
        (str(gone), "done", ""), (str(other), "refused", "lease_held")]
    assert Run.objects.get(uuid=gone).fencing_token == token + 1
    assert api.get(f"{URL}/{answer['id']}").json()["lease_owner"] == "worker-7"


def test_api_other_actions_answer_no_owner(acme, wendy, rita):
    run, _ = leased_run(wendy, acme, None)
    r = bearer_client(rita).post(URL, {"action": "close", "reason": "done",
                                       "runs": [str(run)]},
                                 format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert r.status_code == 201, r.content
    assert r.json()["lease_owner"] is None


@pytest.mark.parametrize("extra, words", [
    ({"action": "end_lease"}, "lease_owner: required for end_lease"),
    ({"action": "end_lease", "lease_owner": None}, "lease_owner: required for end_lease"),
    ({"action": "end_lease", "lease_owner": ["worker-7"]}, "lease_owner: must be"),
    ({"action": "end_lease", "lease_owner": "worker\u00007"}, "lease_owner:"),
    ({"action": "close", "lease_owner": "worker-7"}, "lease_owner: only end_lease"),
])
def test_api_refuses_a_bad_owner_naming_it(acme, wendy, rita, extra, words):
    gone, token = leased_run(wendy, acme, "worker-7")
    r = bearer_client(rita).post(URL, {"reason": "node 3", "runs": [str(gone)], **extra},
                                 format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert r.status_code == 400, r.content
    assert words in r.json()["detail"]
    assert not BulkAction.objects.exists()
    assert Run.objects.get(uuid=gone).fencing_token == token


def test_the_bulk_bar_ends_an_owners_leases_and_the_result_page_names_it(acme, wendy, rita):
    gone, token = leased_run(wendy, acme, "worker-7")
    client = Client()
    client.force_login(rita)
    inbox = client.get("/t/acme/?state=all").content.decode()
    assert 'name="lease_owner"' in inbox and 'value="end_lease"' in inbox
    r = client.post("/t/acme/bulk/", {
        "action": "end_lease", "reason": "node 3 terminated",
        "client_token": str(uuid.uuid4()), "scope": "selected", "run": [str(gone)],
        "filters": "", "lease_owner": " worker-7"})
    # As sent: " worker-7" is another owner's name, so the run is refused, not ended.
    assert r.status_code == 303
    [item] = BulkActionItem.objects.all()
    assert (item.outcome, item.error) == ("refused", "lease_held")
    assert Run.objects.get(uuid=gone).fencing_token == token
    r = client.post("/t/acme/bulk/", {
        "action": "end_lease", "reason": "node 3 terminated",
        "client_token": str(uuid.uuid4()), "scope": "selected", "run": [str(gone)],
        "filters": "", "lease_owner": "worker-7"})
    assert r.status_code == 303
    page = client.get(r["Location"]).content.decode()
    assert "the leases of <strong class=\"mono\">worker-7</strong> only" in page
    assert Run.objects.get(uuid=gone).fencing_token == token + 1


def test_the_bulk_bar_refuses_end_lease_without_an_owner(acme, wendy, rita):
    gone, token = leased_run(wendy, acme, "worker-7")
    client = Client()
    client.force_login(rita)
    r = client.post("/t/acme/bulk/", {
        "action": "end_lease", "reason": "node 3 terminated",
        "client_token": str(uuid.uuid4()), "scope": "selected", "run": [str(gone)],
        "filters": "", "lease_owner": ""})
    assert r.status_code == 400
    assert "lease_owner" in r.content.decode()
    assert not BulkAction.objects.exists()


def test_the_result_page_says_what_the_filters_searched_for(acme, wendy, rita):
    # The stop-38 newcomer: "every run matching any state, the leases of worker-7 only"
    # read as if every run had been acted on; the search that chose them was not shown.
    leased_run(wendy, acme, "worker-7")
    api = bearer_client(rita)
    r = api.post(URL, {"action": "end_lease", "lease_owner": "worker-7",
                       "reason": "node 3 terminated", "filters": {"q": "worker-7"}},
                 format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert r.status_code == 201, r.content
    client = Client()
    client.force_login(rita)
    page = client.get(f"/t/acme/bulk/{r.json()['id']}/").content.decode()
    assert 'searched for “<span class="mono">worker-7</span>”' in page
