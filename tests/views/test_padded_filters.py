"""Filters take every name a write can store (``jsonparse.name_problem``), leading and
trailing spaces included: a run whose workflow is ``"refund "`` is filtered by
``subject=refund%20`` alike in the inbox, ``GET …/runs``, and a bulk action's filters
(the dashboard's bulk bar and the API's ``filters``), and only it is (the dashboard
stripped the value, so the filter also took ``"refund"``, and ``" "`` filtered
nothing)."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from checkpoints.models import BulkAction, BulkActionItem, Run
from tests.conftest import bearer_client
from tests.helpers import ambiguous_run, envelope

pytestmark = pytest.mark.django_db


def _run(wendy, acme, workflow: str) -> uuid.UUID:
    body = envelope(payload={"phase": "charging", "order_id": "A-1042", "workflow": workflow})
    run_id = ambiguous_run(wendy, acme, body)
    assert Run.objects.get(uuid=run_id).workflow == workflow  # the write stores it as sent
    return run_id


@pytest.fixture
def runs(acme, wendy) -> dict[str, uuid.UUID]:
    return {name: _run(wendy, acme, name) for name in ("refund ", "refund", " refund")}


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(("subject", "listed"), [
    ("refund ", {"refund "}),
    (" refund", {" refund"}),
    (" ", {"refund ", " refund"}),
    ("refund", {"refund ", "refund", " refund"}),
])
def test_the_inbox_and_the_api_filter_a_padded_name_as_sent(runs, rita, subject, listed):
    want = {str(runs[name]) for name in listed}
    page = _logged_in(rita).get("/t/acme/", {"state": "all", "subject": subject})
    assert page.status_code == 200
    shown = {str(run_id) for run_id in runs.values() if str(run_id) in page.content.decode()}
    assert shown == want
    answer = bearer_client(rita).get("/api/v1/tenants/acme/runs",
                                     {"subject": subject})
    assert answer.status_code == 200, answer.content
    assert {row["run_id"] for row in answer.json()["results"]} == want


def test_a_bulk_action_takes_a_padded_name_as_sent(runs, rita):
    response = _logged_in(rita).post("/t/acme/bulk/", {
        "action": "request_retry", "reason": "incident 42", "client_token": str(uuid.uuid4()),
        "scope": "matching", "filters": "state=ambiguous&subject=refund%20", "confirm": "yes"})
    assert response.status_code == 303, response.content  # see_other, as every POST
    bulk = BulkAction.objects.get()
    assert {i.run_uuid for i in BulkActionItem.objects.filter(bulk=bulk)} == {runs["refund "]}

    answer = bearer_client(rita).post("/api/v1/tenants/acme/bulk-actions", {
        "action": "request_retry", "reason": "r", "client_token": str(uuid.uuid4()),
        "filters": {"recovery_state": "ambiguous", "subject": " refund"}}, format="json")
    assert answer.status_code == 201, answer.content
    assert [r["run_id"] for r in answer.json()["results"]] == [str(runs[" refund"])]
    assert answer.json()["filters"]["subject"] == " refund"
