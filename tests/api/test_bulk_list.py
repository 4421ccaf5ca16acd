"""``GET …/bulk-actions``: the tenant's bulk actions, newest first, keyset pages, filters
checked like bodies, one query for the rows whatever their number (``selectors.bulk_list``;
a newcomer's finding: a bulk action submitted from a script, or from a tab since closed,
could be found again by its id only)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import selectors
from checkpoints.models import BulkAction
from tests.conftest import bearer_client
from tests.helpers import ambiguous_run

pytestmark = pytest.mark.django_db
URL = "/api/v1/tenants/acme/bulk-actions"


def submit(user, runs, action="close", url=URL, **extra) -> dict:
    """One bulk action of ``user`` on ``runs`` through the API (``url``: its tenant's);
    its answer."""
    body = {"action": action, "reason": "incident 42", "run_ids": [str(r) for r in runs],
            "client_token": str(uuid.uuid4()), **extra}
    response = bearer_client(user).post(url, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_the_list_is_newest_first_with_counts_and_no_per_run_results(acme, wendy, rita, vic):
    first = submit(rita, [ambiguous_run(wendy, acme)], action="mark_unknown")
    a = ambiguous_run(wendy, acme)
    second = submit(rita, [a, uuid.uuid4()])
    response = bearer_client(vic).get(URL)  # the viewer role reads it
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["next"] is None
    assert [r["id"] for r in answer["results"]] == [second["id"], first["id"]]
    row = answer["results"][0]
    assert (row["action"], row["state"], row["requested_by"], row["reason"]) == (
        "close", "finished", "rita", "incident 42")
    assert (row["total"], row["done"], row["refused"], row["failed"], row["pending"]) == (
        2, 1, 1, 0, 0)
    assert row["created_at"] and row["finished_at"] and row["job"] is False
    assert row["lease_owner"] is None and row["incident_ref"] is None
    assert "results" not in row and "client_token" not in row


def test_an_inline_bulk_left_running_counts_its_results(acme, wendy, rita):
    """A bulk action whose request died before its counts were written: its results
    counted, as the single GET counts them."""
    bulk = submit(rita, [ambiguous_run(wendy, acme), uuid.uuid4()])
    BulkAction.objects.filter(uuid=bulk["id"]).update(state="running", done=0, refused=0,
                                                       finished_at=None)
    row = bearer_client(rita).get(URL).json()["results"][0]
    single = bearer_client(rita).get(f"{URL}/{bulk['id']}").json()
    assert row["state"] == "running"
    assert (row["done"], row["refused"], row["pending"]) == (1, 1, 0) == (
        single["done"], single["refused"], single["pending"])


def test_end_lease_shows_its_owner_and_the_incident(acme, wendy, rita):
    bulk = bearer_client(rita).post(URL, {
        "action": "end_lease", "reason": "the worker died", "lease_owner": "worker-7",
        "run_ids": [str(uuid.uuid4())], "client_token": str(uuid.uuid4())},
        format="json", HTTP_INCIDENT_REF="INC-2041")
    assert bulk.status_code == 201, bulk.content
    row = bearer_client(rita).get(URL).json()["results"][0]
    assert (row["lease_owner"], row["incident_ref"]) == ("worker-7", "INC-2041")
    # The single GET gives the incident the list gives (stop 39's open item).
    single = bearer_client(rita).get(f"{URL}/{bulk.json()['id']}").json()
    assert (single["lease_owner"], single["incident_ref"]) == ("worker-7", "INC-2041")


def test_filters(acme, wendy, rita, adam):
    close = submit(rita, [ambiguous_run(wendy, acme)])
    unknown = submit(adam, [ambiguous_run(wendy, acme)], action="mark_unknown")
    api = bearer_client(rita)

    def ids(query: str) -> list[str]:
        response = api.get(f"{URL}?{query}")
        assert response.status_code == 200, response.content
        return [r["id"] for r in response.json()["results"]]

    assert ids("action=close") == [close["id"]]
    assert ids("action=mark_unknown") == [unknown["id"]]
    assert ids("requested_by=adam") == [unknown["id"]]
    assert ids("requested_by=") == [unknown["id"], close["id"]]  # blank: everyone's
    assert ids("state=finished&requested_by=rita") == [close["id"]]
    assert ids("state=running") == []


@pytest.mark.parametrize(("query", "field", "words"), [
    ("action=delete", "action", "One of: reconcile, mark_unknown"),
    ("state=done", "state", "One of: queued, running, finished, aborted, failed."),
    ("limit=0", "limit", ""),
    ("limit=201", "limit", ""),
    ("cursor=x", "cursor", ""),
    ("requested_by=" + "r" * 151, "requested_by", "150"),
    ("requested_by=a%07b", "requested_by", "control"),
    ("actor=rita", "actor", "unknown parameter"),
    ("state=finished&state=running", "state", "more than once"),
])
def test_a_bad_filter_is_400_naming_it(acme, rita, query, field, words):
    response = bearer_client(rita).get(f"{URL}?{query}")
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert detail.startswith(f"{field}: ") and words in detail


def test_pages_follow_next_and_never_repeat(acme, wendy, rita):
    made = [submit(rita, [ambiguous_run(wendy, acme)])["id"] for _ in range(5)]
    api, seen, url = bearer_client(rita), [], f"{URL}?limit=2&action=close"
    while url:
        page = api.get(url).json()
        assert len(page["results"]) <= 2
        seen += [r["id"] for r in page["results"]]
        url = page["next"]
    assert seen == made[::-1]


def test_another_tenants_bulk_actions_are_never_listed(acme, globex, wendy, wes, rita, omar):
    mine = submit(rita, [ambiguous_run(wendy, acme)])
    theirs = bearer_client(omar).post("/api/v1/tenants/globex/bulk-actions", {
        "action": "close", "reason": "r", "run_ids": [str(ambiguous_run(wes, globex))],
        "client_token": str(uuid.uuid4())}, format="json").json()
    assert [r["id"] for r in bearer_client(rita).get(URL).json()["results"]] == [mine["id"]]
    assert [r["id"] for r in bearer_client(omar).get(
        "/api/v1/tenants/globex/bulk-actions").json()["results"]] == [theirs["id"]]
    # No grant in the tenant: 404, as every list of the tenant answers.
    assert bearer_client(omar).get(URL).status_code == 404


def test_one_query_for_the_rows_whatever_their_number(acme, wendy, rita):
    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            rows = selectors.bulk_list(user=rita, tenant=acme)
            [(r.n_done, r.pending, r.selected_lease_owner, r.requested_by_name) for r in rows]
        return len(ctx.captured_queries)

    submit(rita, [ambiguous_run(wendy, acme)])
    queries()  # the grant's look-up, cached on the user from then on
    one = queries()
    assert one == 1
    for _ in range(4):
        submit(rita, [ambiguous_run(wendy, acme), uuid.uuid4()])
    BulkAction.objects.update(state="running")  # each counted from its results
    assert queries() == one
