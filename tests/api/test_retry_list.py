"""``GET …/retry-requests`` and ``GET …/retry-requests/{id}``: the approvers' queue over
the API, the rows of the dashboard's Approvals page (``selectors.retry_requests_in``, one
queryset for both), with the page's rights (approvers and admins), keyset pages, its
filters checked like bodies, and nothing written by a read."""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints import selectors, services
from tests.api.apihelpers import get, snapshot
from tests.helpers import ambiguous_run, envelope, put_checkpoint, sweep_later
from tests.views.test_approvals import _duplicate_request

pytestmark = pytest.mark.django_db


def _clean_request(requester, acme, wendy, reason="re-run the step"):
    """A retry request of a run with no side effect: nothing can be sent twice."""
    return services.retry_request(actor=requester, tenant=acme,
                                  run_id=ambiguous_run(wendy, acme), reason=reason)


def _completed_since(rita, acme, wendy):
    """A request left ``requested`` on a run that completed after it was filed: not the
    approvers' work (``policy.retry_applies``), so not on the Approvals page."""
    body = envelope(payload={"phase": "charging", "order_id": "C-1"})
    put_checkpoint(wendy, acme, body)
    sweep_later()
    retry = services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                   reason="finished meanwhile")
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "completed",
                                                                "order_id": "C-1"}),
                   expected=0)
    return retry


@pytest.fixture
def login():
    """``login(user)`` -> a dashboard session of ``user`` (as ``tests/views``)."""

    def _login(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return _login


@pytest.fixture
def world(acme, rita, april, adam, wendy):
    """Requests in every situation the page and the list tell apart: a possible duplicate
    (rita's), a clean one (adam's: april decides it, adam does not), one rejected, one
    left open on a run that completed since."""
    dup = _duplicate_request(rita, acme, wendy)
    own_of_adam = _clean_request(adam, acme, wendy, reason="adam asks")
    rejected = _clean_request(rita, acme, wendy, reason="to be rejected")
    services.retry_reject(actor=april, tenant=acme, retry_id=rejected.pk, reason="no")
    completed = _completed_since(rita, acme, wendy)
    return {"dup": dup, "adam": own_of_adam, "rejected": rejected, "completed": completed}


def _page_rows(client) -> list[int]:
    """The request numbers the Approvals page lists, in its order."""
    body = client.get(reverse("approval_queue", args=["acme"])).content.decode()
    return [int(n) for n in re.findall(r'data-retry="(\d+)"', body)]


def test_the_list_shows_what_the_approvals_page_shows(api_as, login, world, april, adam):
    """The default list (``state=requested``) is the page's rows, each with what the page
    shows for it: run, kind, requester, reason, when, the preview and its possible
    duplicates, and whether it is the reader's own (not theirs to decide)."""
    for reader in (april, adam):
        answer = get(api_as(reader), "acme", "retry-requests")
        assert answer.status_code == 200, answer.content
        items = answer.json()["results"]
        page = _page_rows(login(reader))
        # The page is oldest first; the list newest first (sort=created: the page's order).
        assert [i["id"] for i in items] == page[::-1]
        assert set(page) == {world["dup"].pk, world["adam"].pk}
        oldest = get(api_as(reader), "acme", "retry-requests", sort="created").json()
        assert [i["id"] for i in oldest["results"]] == page
        queue = {row.retry.pk: row
                 for row in selectors.approval_queue(user=reader, tenant=world["dup"].tenant)
                 .rows}
        for item in items:
            row = queue[item["id"]]
            assert item["run_id"] == str(row.retry.run.uuid)
            assert item["run_kind"] == row.retry.run.kind
            assert item["requested_by"] == row.retry.requested_by.username
            assert item["reason"] == row.retry.reason
            assert item["state"] == "requested" and item["decided_by"] is None
            assert item["created_at"] == row.retry.created_at.isoformat()
            assert item["preview"] == row.preview
            assert item["possible_duplicates"] == row.duplicates
            assert item["own"] is row.own
    by_id = {i["id"]: i for i in get(api_as(april), "acme", "retry-requests").json()["results"]}
    dup = by_id[world["dup"].pk]
    assert dup["possible_duplicates"] == 1 and dup["own"] is False
    assert [p["operation_key"] for p in dup["preview"]] == ["charge:D-1"]
    assert by_id[world["adam"].pk]["preview"] == []  # no side effect: nothing sent twice
    mine = get(api_as(adam), "acme", "retry-requests").json()["results"]
    assert {i["id"]: i["own"] for i in mine} == {world["dup"].pk: False,
                                                 world["adam"].pk: True}


def test_one_request_reads_as_the_list_gives_it(api_as, world, april):
    listed = {i["id"]: i for i in get(api_as(april), "acme", "retry-requests",
                                      state="all").json()["results"]}
    for retry in world.values():
        one = get(api_as(april), "acme", f"retry-requests/{retry.pk}")
        assert one.status_code == 200, one.content
        assert one.json() == listed[retry.pk]
    rejected = listed[world["rejected"].pk]
    assert (rejected["state"], rejected["decided_by"], rejected["decision_reason"]) == (
        "rejected", "april", "no")
    assert rejected["decided_at"] is not None
    assert rejected["preview"] is None and rejected["possible_duplicates"] == 0
    # Open on a run that completed since: listed under every state, with its preview,
    # but not under requested (the page's queue).
    assert listed[world["completed"].pk]["state"] == "requested"
    assert listed[world["completed"].pk]["preview"] == []


def test_state_and_run_filter(api_as, world, april):
    def ids(**params):
        answer = get(api_as(april), "acme", "retry-requests", **params)
        assert answer.status_code == 200, answer.content
        return [i["id"] for i in answer.json()["results"]]

    assert ids(state="rejected") == [world["rejected"].pk]
    assert ids(state="approved") == []
    assert ids(state="all") == sorted((r.pk for r in world.values()), reverse=True)
    assert ids(state="requested") == ids() == [world["adam"].pk, world["dup"].pk]
    run = world["rejected"].run.uuid
    assert ids(state="all", run=str(run)) == [world["rejected"].pk]
    # One run's requests are all of them unless a state is given (the stop-38
    # newcomer's ?run= found nothing once the request was decided).
    assert ids(run=str(run)) == [world["rejected"].pk]
    assert ids(state="requested", run=str(run)) == []
    assert ids(state="all", run=str(uuid.uuid4())) == []


def test_keyset_pages_list_each_request_once(api_as, acme, rita, april, wendy):
    made = [_clean_request(rita, acme, wendy, reason=f"r{i}").pk for i in range(5)]
    for sort, order in (("-created", made[::-1]), ("created", made)):
        seen, params = [], {"limit": "2", "sort": sort}
        answer = get(api_as(april), "acme", "retry-requests", **params).json()
        seen += [i["id"] for i in answer["results"]]
        while answer["next"]:
            assert answer["next"].startswith("http://testserver/api/v1/tenants/acme/")
            answer = api_as(april).get(answer["next"]).json()
            seen += [i["id"] for i in answer["results"]]
        assert seen == order
    # A request decided while the client pages keeps its place (state=all).
    first = get(api_as(april), "acme", "retry-requests", limit="2", state="all").json()
    services.retry_reject(actor=april, tenant=acme, retry_id=made[4], reason="no")
    rest = api_as(april).get(first["next"]).json()
    assert [i["id"] for i in first["results"] + rest["results"]][:4] == made[::-1][:4]


@pytest.mark.parametrize("who,status", [("april", 200), ("adam", 200), ("rita", 403),
                                        ("vic", 403), ("wendy", 403), ("omar", 404)])
def test_the_pages_rights(request, api_as, login, world, who, status):
    """As the Approvals page: approvers and admins read it; other roles of the tenant
    403; no role in it (another tenant's reviewer) 404, as for a tenant that does not
    exist."""
    user = request.getfixturevalue(who)
    assert get(api_as(user), "acme", "retry-requests").status_code == status
    retry = world["dup"].pk
    assert get(api_as(user), "acme", f"retry-requests/{retry}").status_code == status


def test_another_tenants_request_is_not_found(api_as, world, april, globex, wes):
    """A retry request of acme read through globex (where its reader approves) is 404,
    and so is an id that is not one; globex's list holds none of acme's."""
    from tests.conftest import _person

    gabe = _person("gabe", globex, "approver")
    assert get(api_as(gabe), "globex", f"retry-requests/{world['dup'].pk}").status_code == 404
    assert get(api_as(gabe), "globex", "retry-requests", state="all").json()["results"] == []
    for bad in ("0", "-1", "x", "9" * 30, "1.0"):
        assert get(api_as(april), "acme", f"retry-requests/{bad}").status_code == 404


@pytest.mark.parametrize("params,name", [
    ({"stat": "requested"}, "stat"),
    ({"state": "pending"}, "state"),
    ({"state": ""}, "state"),
    ({"run": "not-a-uuid"}, "run"),
    ({"sort": "newest"}, "sort"),
    ({"cursor": "abc"}, "cursor"),
    ({"cursor": "0"}, "cursor"),
    ({"limit": "0"}, "limit"),
    ({"limit": "201"}, "limit"),
])
def test_bad_parameters_are_400_naming_them(api_as, world, april, params, name):
    before = snapshot()
    answer = get(api_as(april), "acme", "retry-requests", **params)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "invalid_payload"
    assert answer.json()["detail"].startswith(f"{name}:")
    assert snapshot() == before


@pytest.mark.parametrize("endpoint, params, choices", [
    ("retry-requests", {"state": "pending"}, "requested, approved, rejected"),
    ("retry-requests", {"sort": "newest"}, "-created, created"),
    ("runs", {"recovery_state": "bogus"}, "healthy, ambiguous"),
])
def test_a_refused_choice_names_the_choices(api_as, world, april, endpoint, params, choices):
    answer = get(api_as(april), "acme", endpoint, **params)
    assert answer.status_code == 400, answer.content
    detail = answer.json()["detail"]
    assert "is not a valid choice. One of: " in detail and choices in detail


def test_the_detail_takes_no_parameter(api_as, world, april):
    answer = get(api_as(april), "acme", f"retry-requests/{world['dup'].pk}", state="all")
    assert answer.status_code == 400 and answer.json()["detail"].startswith("state:")


def test_a_read_writes_nothing(api_as, login, world, april):
    """The page writes no audit event (no payload is revealed), so neither does the API."""
    before = snapshot()
    for params in ({}, {"state": "all"}, {"state": "all", "limit": "1"}):
        assert get(api_as(april), "acme", "retry-requests", **params).status_code == 200
    for retry in world.values():
        assert get(api_as(april), "acme", f"retry-requests/{retry.pk}").status_code == 200
    assert snapshot() == before


def test_a_page_costs_the_same_queries_whatever_its_rows(api_as, acme, rita, april, wendy):
    _duplicate_request(rita, acme, wendy, key="charge:Q-1")
    client = api_as(april)
    get(client, "acme", "retry-requests")
    with CaptureQueriesContext(connection) as small:
        get(client, "acme", "retry-requests")
    for i in range(3):
        _duplicate_request(rita, acme, wendy, key=f"charge:Q-{i + 2}")
    with CaptureQueriesContext(connection) as more:
        answer = get(client, "acme", "retry-requests")
    assert len(answer.json()["results"]) == 4
    assert len(more.captured_queries) == len(small.captured_queries)
