"""Stop 39's attack: one input of each fault kind against the stop's new code (the bulk
actions list, the lease's state words, the jobs' incident, the retry's owner_live
order). Each finding is a test of what SHOULD hold, ``xfail(strict=True)`` until fixed."""

from __future__ import annotations

import uuid

import pytest

from checkpoints.models import Run
from tests.api.test_bulk_list import submit
from tests.conftest import bearer_client
from tests.helpers import ambiguous_run
from tests.views.test_bulk import logged_in
from tests.views.test_lease_state import _leased

pytestmark = pytest.mark.django_db
API = "/api/v1/tenants/acme/bulk-actions"
PAGE = "/t/acme/bulk-actions/"

#: (query string, the parameter a 400 must name; None: 200)
QUERIES = [
    ("state=finished&state=running", "state"),
    ("action=close&action=close", "action"),
    ("requested_by=rita&requested_by=rita", "requested_by"),
    ("cursor=5&cursor=6", "cursor"),
    ("limit=1&limit=2", "limit"),
    ("state=bogus", "state"),
    ("action=%00", "action"),
    ("requested_by=a%00b", "requested_by"),
    ("requested_by=%ED%A0%80", "requested_by"),
    ("requested_by=%", None),  # a literal "%" (only non-UTF-8 bytes are refused)
    ("requested_by=" + "r" * 151, "requested_by"),
    ("requested_by=" + "r" * 150, None),
    ("requested_by=" + "\u00e9" * 151, "requested_by"),
    ("requested_by=" + "%F0%9F%98%80" * 150, None),
    ("cursor=-1", "cursor"),
    ("cursor=0", "cursor"),
    ("cursor=abc", "cursor"),
    ("cursor=1.5", "cursor"),
    ("cursor=%EF%BC%91", "cursor"),
    ("cursor=" + str(2**63), "cursor"),
    ("cursor=" + str(2**63 - 1), None),
    ("cursor=" + "9" * 5000, "cursor"),
    ("limit=0", "limit"),
    ("limit=-1", "limit"),
    ("limit=201", "limit"),
    ("limit=" + "9" * 5000, "limit"),
    ("limit=", "limit"),
    ("cursor=", "cursor"),
    ("bogus=1", "bogus"),
    ("requested_by=a%09b", "requested_by"),
    ("requested_by=%E2%80%AErita", "requested_by"),
    ("requested_by=%0A", "requested_by"),
    ("requested_by=%C2%85", "requested_by"),
]


# PASS (kept: the list's parameters had no table of their own on both surfaces).
@pytest.mark.parametrize("query,name", QUERIES)
def test_api_list_query_table(acme, wendy, rita, query, name):
    submit(rita, [ambiguous_run(wendy, acme)])
    r = bearer_client(rita).get(f"{API}?{query}")
    if name is None:
        assert r.status_code == 200, r.content
    else:
        assert r.status_code == 400, (r.status_code, r.content[:300])
        assert name in r.content.decode()


@pytest.mark.parametrize("query,name", QUERIES)
def test_page_query_table(acme, wendy, rita, query, name):
    submit(rita, [ambiguous_run(wendy, acme)])
    r = logged_in(rita).get(f"{PAGE}?{query}")
    if name is None:
        assert r.status_code == 200, r.content[:300]
    else:
        assert r.status_code == 400, (r.status_code, r.content[:300])
        assert name in r.content.decode()


# FIXED FINDING: GET …/bulk-actions refused the blank action/state the page's own filter
# form sends (400), the page took them.
@pytest.mark.parametrize("query", ["action=&state=&requested_by=", "state=", "action="])
def test_the_api_takes_the_query_string_the_page_sends(acme, wendy, rita, query):
    """Two code paths for one rule: the page (``BulkListForm``) and the API
    (``BulkListParams``) are "the same filters", and ``requested_by=`` (blank: everyone's)
    is taken by both; the page's form submits ``action=&state=`` for "any", which the
    page lists and the API answers 400 (``state: "" is not a valid choice``)."""
    submit(rita, [ambiguous_run(wendy, acme)])
    page = logged_in(rita).get(f"{PAGE}?{query}")
    api = bearer_client(rita).get(f"{API}?{query}")
    assert page.status_code == 200
    assert api.status_code == page.status_code, api.content


# FIXED FINDING: the run page still said 'No retry: ... this one is healthy' where
# retry_request answers 409 owner_live.
def test_the_run_page_says_why_no_retry_as_the_service_refuses_it(acme, wendy, rita):
    """Two code paths for one rule: ``dashboard.run._retry_blocked`` "mirrors
    ``services.retry_request``'s refusals", but stop 39 moved the owner-live refusal
    before the state in the service only. A run whose runtime holds a live lease reads
    healthy: the API says 409 owner_live (who, until when, how to end the lease), the
    run page says "it is for ambiguous or unknown-outcome runs, and this one is
    healthy", the very words the newcomer's finding was about."""
    run_id = _leased(wendy, acme, owner="worker-1")
    assert Run.objects.get(uuid=run_id).recovery_state == "healthy"
    api = bearer_client(rita).post(f"/api/v1/tenants/acme/runs/{run_id}/retry-requests",
                                   {"reason": "retry it"}, format="json")
    assert api.status_code == 409 and api.json()["error"] == "owner_live", api.content
    page = logged_in(rita).get(f"/t/acme/runs/{run_id}/").content.decode()
    assert "this one is healthy" not in page
    assert "worker-1 is live" in page or "owner is live" in page


# PASS (kept: the list reads the owner with KT, as bulk_get does since stop 38).
@pytest.mark.parametrize("owner", ["1e3", "true", "null", "[1]", "00", " w 1", "é-7"])
def test_the_list_and_the_single_get_say_the_same_end_lease_owner(acme, rita, owner):
    r = bearer_client(rita).post(API, {
        "action": "end_lease", "reason": "the worker died", "lease_owner": owner,
        "run_ids": [str(uuid.uuid4())], "client_token": str(uuid.uuid4())}, format="json")
    if r.status_code == 400:  # a name the API refuses is refused for both
        return
    assert r.status_code == 201, r.content
    row = bearer_client(rita).get(API).json()["results"][0]
    single = bearer_client(rita).get(f"{API}/{r.json()['id']}").json()
    assert row["lease_owner"] == single["lease_owner"] == owner
    page = logged_in(rita).get(PAGE).content.decode()
    assert r.json()["id"] in page
