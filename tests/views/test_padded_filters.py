"""Filters take every name a write can store (``jsonparse.name_problem``), leading and
trailing spaces included: a run whose workflow is ``"refund "`` is filtered by
``subject=refund%20`` alike in the inbox, ``GET …/runs``, and a bulk action's filters
(the dashboard's bulk bar and the API's ``filters``), and only it is (the dashboard
stripped the value, so the filter also took ``"refund"``, and ``" "`` filtered
nothing)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from django.test import Client

from checkpoints.api.serializers.notifications import NotificationEndpointInputSerializer
from checkpoints.models import (
    BulkAction,
    BulkActionItem,
    Effect,
    NotificationEndpoint,
    NotificationMessage,
    Run,
)
from checkpoints.models.notifications import filter_value_max
from checkpoints.services import notify_dispatch
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


# --- notification rules (issue 22's stop, item 3) ------------------------------------------

def _agent_run(wendy, acme, agent: str) -> uuid.UUID:
    """A ``runifold.agent`` run of ``agent``, in flight with no lease and swept: ambiguous,
    one ``run.needs_review`` event in the outbox. The write stores the agent as sent."""
    fixture = Path(__file__).resolve().parent.parent / "fixtures/kinds/runifold.agent/v1"
    payload = json.loads((fixture / "turn_in_flight.json").read_text())["payload"]
    run_id = ambiguous_run(wendy, acme, envelope(kind="runifold.agent",
                                                 payload=dict(payload, agent=agent)))
    assert Run.objects.get(uuid=run_id).agent == agent
    return run_id


def _heard(endpoint_id) -> set[str]:
    return {run["id"] for m in NotificationMessage.objects.filter(endpoint__uuid=endpoint_id)
            for run in m.payload["data"]["runs"]}


def test_a_notification_rule_on_a_padded_agent_hears_that_agent_only(acme, wendy, adam):
    """A rule on ``"refund "`` (the API's body, and the dashboard's form, one value a line)
    is stored as sent and matches the run of agent ``"refund "``, not the run of
    ``"refund"``; a rule on ``" "`` is a value too (an agent may be one space). Both were
    refused (400 ``leading or trailing whitespace``), so no rule could hear such a run."""
    api = bearer_client(adam)
    body = {"channel": "webhook", "url": "https://hooks.example.com/in/1",
            "event_types": ["run.needs_review"], "group_window_s": 0}
    made = api.post("/api/v1/tenants/acme/notification-endpoints",
                    dict(body, name="padded", agents=["refund "]), format="json")
    assert made.status_code == 201, made.content
    by_api = made.json()["endpoint"]
    assert by_api["agents"] == ["refund "]  # as sent
    form = _logged_in(adam).post("/t/acme/notifications/new/", {
        "name": "padded form", "channel": "webhook", "url": "https://hooks.example.com/in/2",
        "event_types": ["run.needs_review"], "group_window_s": "0",
        "agents": "refund \r\n \r\n"})
    assert form.status_code in (200, 303), form.content[:2000]
    by_form = NotificationEndpoint.objects.for_tenant(acme).get(name="padded form")
    assert by_form.agents == ["refund ", " "]  # each line as typed; the empty one dropped

    padded, plain = _agent_run(wendy, acme, "refund "), _agent_run(wendy, acme, "refund")
    notify_dispatch.dispatch_round()

    assert _heard(by_api["id"]) == {str(padded)}
    assert _heard(by_form.uuid) == {str(padded)}
    assert str(plain) not in _heard(by_api["id"]) | _heard(by_form.uuid)


@pytest.mark.parametrize(("field", "column"), [
    ("kinds", Run._meta.get_field("kind")), ("agents", Run._meta.get_field("agent")),
    ("agents", Run._meta.get_field("workflow")),
    ("services", Effect._meta.get_field("service"))])
def test_a_filter_value_is_as_long_as_the_column_it_matches(adam, field, column):
    """Each filter list takes values as long as its column (an agent or workflow of 256
    characters; a copied 200 refused 201..256), one more is a 400 naming the field; the
    API's schema says the same length."""
    most = column.max_length
    assert filter_value_max(field) >= most
    api = bearer_client(adam)
    body = {"channel": "email", "email": "ops@example.com", "event_types": ["run.needs_review"]}
    fits = api.post("/api/v1/tenants/acme/notification-endpoints",
                    dict(body, name=f"{field} {column.name}", **{field: ["x" * most]}),
                    format="json")
    assert fits.status_code == 201, fits.content
    over = "x" * (filter_value_max(field) + 1)
    refused = api.post("/api/v1/tenants/acme/notification-endpoints",
                       dict(body, name="over", **{field: [over]}), format="json")
    assert refused.status_code == 400 and refused.json()["detail"].startswith(f"{field}"), \
        refused.content
    child = NotificationEndpointInputSerializer().fields[field].child
    assert child.max_length == filter_value_max(field)
