"""Short run ids in run page URLs (the newcomer's finding: the inbox shows 8 hex digits,
``/t/acme/runs/b2418a1d/`` answered 404 while the search found it). A unique prefix of at
least 8 hex digits redirects to the run's full URL in the same tenant; an ambiguous one
lists the matches; too short, not hex or another tenant's: 404 in words. A GET writes
nothing. The API takes whole UUIDs only and says so in its 404."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import AuditEvent
from tests.helpers import envelope, put_checkpoint

pytestmark = pytest.mark.django_db

ONE = uuid.UUID("b2418a1d-0000-4000-8000-000000000001")
TWIN_A = uuid.UUID("c0ffee12-0000-4000-8000-00000000000a")
TWIN_B = uuid.UUID("c0ffee12-0000-4000-8000-0000000000b0")


def _run(writer, tenant, run_id):
    put_checkpoint(writer, tenant, envelope(run_id=run_id))
    return run_id


@pytest.fixture
def runs(acme, wendy):
    for rid in (ONE, TWIN_A, TWIN_B):
        _run(wendy, acme, rid)


def _page(client, text, query=""):
    before = AuditEvent.objects.count()
    response = client.get(f"/t/acme/runs/{text}/{query}")
    assert AuditEvent.objects.count() == before  # a GET writes nothing
    return response


@pytest.mark.parametrize("text", ["b2418a1d", "B2418A1D", "b2418a1d-00", "b2418a1d0000"])
def test_a_unique_prefix_redirects_to_the_full_run_url(login, rita, runs, text):
    response = _page(login(rita), text)
    assert response.status_code == 302
    assert response["Location"] == reverse("run_detail", args=["acme", str(ONE)])
    assert login(rita).get(response["Location"]).status_code == 200


def test_the_redirect_keeps_the_back_link(login, rita, runs):
    response = _page(login(rita), "b2418a1d", "?back=/t/acme/%3Fstate%3Dall")
    assert response.status_code == 302
    assert response["Location"] == f"/t/acme/runs/{ONE}/?back=/t/acme/%3Fstate%3Dall"


def test_an_ambiguous_prefix_lists_the_runs_it_matches(login, rita, runs):
    response = _page(login(rita), "c0ffee12")
    assert response.status_code == 200
    body = response.content.decode()
    assert "More than one run starts with" in body
    assert f'href="/t/acme/runs/{TWIN_A}/"' in body
    assert f'href="/t/acme/runs/{TWIN_B}/"' in body
    assert str(ONE) not in body
    assert "/t/acme/?state=all&amp;q=c0ffee12" in body  # the search for it
    # one digit more decides it
    assert _page(login(rita), "c0ffee12-0000-4000-8000-00000000000")["Location"] \
        == f"/t/acme/runs/{TWIN_A}/"


def test_another_tenants_run_is_never_found_by_its_prefix(login, rita, runs, globex, wes):
    theirs = _run(wes, globex, uuid.UUID("deadbeef-0000-4000-8000-000000000001"))
    services.role_grant(actor=None, tenant=globex, user=rita, role="viewer")
    client = login(rita)
    response = _page(client, "deadbeef")
    assert response.status_code == 404
    assert "No run of Acme Corp has an id starting with “deadbeef”" in response.content.decode()
    # in its own tenant it resolves; acme's run does not resolve in globex
    assert client.get("/t/globex/runs/deadbeef/")["Location"] == f"/t/globex/runs/{theirs}/"
    assert client.get("/t/globex/runs/b2418a1d/").status_code == 404


def test_a_tenant_without_a_role_is_a_404_before_any_prefix(login, omar, runs):
    assert _page(login(omar), "b2418a1d").status_code == 404


@pytest.mark.parametrize("text", ["b2418a1", "b2", "b241-8a1d"])
def test_a_prefix_too_short_or_misdashed_is_a_404_in_words(login, rita, runs, text):
    response = _page(login(rita), text)
    assert response.status_code == 404
    body = response.content.decode()
    if "-" in text:
        assert "a run id is hex digits" in body
    else:
        assert "too short to name a run: a short run id needs at least 8 hex digits" in body
        assert f"/t/acme/?state=all&amp;q={text}" in body


@pytest.mark.parametrize("text", ["b2418a1z", "not-a-run-id", "A-1042", "b2418a1d%20"])
def test_a_text_that_is_not_hex_is_a_404(login, rita, runs, text):
    response = _page(login(rita), text)
    assert response.status_code == 404
    assert "a run id is hex digits" in response.content.decode()


def test_the_api_takes_whole_uuids_and_says_so(api_as, wendy, runs):
    client = api_as(wendy)
    response = client.get("/api/v1/tenants/acme/runs/b2418a1d")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert "whole UUID" in response.json()["detail"]
    assert client.get(f"/api/v1/tenants/acme/runs/{ONE}").status_code == 200
