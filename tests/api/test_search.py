"""``GET …/runs?q=`` and ``GET …/audit-events?q=`` (issue 9): the dashboard's search on
the API, its parameters checked like any other (400 naming ``q``/``sort``)."""

from __future__ import annotations

import pytest

from tests.api.apihelpers import get, url
from tests.views.test_search import Found


@pytest.fixture
def found(acme, wendy):
    return Found(acme, wendy)


@pytest.fixture
def v(api_as, vic):
    return api_as(vic)


@pytest.mark.parametrize("field, q", [
    ("order", "A-1003"), ("agent", "billing"), ("workflow", "Refunds"), ("phase", "SHIPP"),
    ("leased", "worker_7f"),
])
def test_the_run_list_searches_each_field(v, found, field, q):
    r = get(v, "acme", "runs", q=q)
    assert r.status_code == 200, r.content
    assert [row["run_id"] for row in r.json()["results"]] == [str(getattr(found, field))]


def test_the_run_list_searches_run_and_checkpoint_id_prefixes(v, found):
    for q, run in ((str(found.agent)[:8].upper(), found.agent),
                   (str(found.order_cp)[:13], found.order)):
        r = get(v, "acme", "runs", q=q)
        assert [row["run_id"] for row in r.json()["results"]] == [str(run)]


def test_the_search_pages_like_any_list(v, found):
    first = get(v, "acme", "runs", q="acme", limit=1).json()  # workflows acme.order/refunds
    assert len(first["results"]) == 1 and "q=acme" in first["next"]
    second = v.get(first["next"]).json()
    assert second["results"] and second["results"] != first["results"]
    assert v.get(second["previous"]).json()["results"] == first["results"]


@pytest.mark.parametrize("query, name", [
    ("q=a&q=b", "q"), ("q=" + "x" * 513, "q"), ("q=a%01", "q"), ("q=%00", "q"),
    ("q=%ED%A0%80", "q"), ("sort=last_write", "sort"), ("sort=", "sort"),
    ("sort=created&sort=created", "sort"),
])
def test_a_bad_search_or_sort_is_a_400_naming_it(v, found, query, name):
    r = v.get(url("acme", "runs") + "?" + query)
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith(f"{name}:")


def test_an_empty_or_non_ascii_search_is_answered(v, found):
    assert len(get(v, "acme", "runs", q="").json()["results"]) == 5
    assert get(v, "acme", "runs", q="café").json()["results"] == []


def test_the_audit_events_search(v, found):
    r = get(v, "acme", "audit-events", q="a-1003")
    assert r.status_code == 200, r.content
    assert r.json()["results"]
    assert {e["run_id"] for e in r.json()["results"]} == {str(found.order)}
    assert get(v, "acme", "audit-events", q="a\x01").status_code == 400


def test_a_langgraph_thread_id_finds_its_run_exactly(v, acme, wendy):
    """A LangGraph thread's run id is derived from the thread id (issue 10), so the thread
    id a runtime logs finds its run; a part of it does not."""
    from recovery_client.protocol import thread_run_id
    from tests.helpers import graph_put, lg_put

    graph_put(wendy, acme, lg_put("refund-NC-1", "1f0c-0001", nodes=["charge"]))
    r = get(v, "acme", "runs", q="refund-NC-1")
    assert [row["run_id"] for row in r.json()["results"]] == [str(thread_run_id("refund-NC-1"))]
    assert get(v, "acme", "runs", q="refund-NC-2").json()["results"] == []
