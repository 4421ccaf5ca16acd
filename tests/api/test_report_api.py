"""``GET …/report`` over a range (issue 9, item 6): the same figures as the page, its
parameters checked like every query (400 naming the parameter), its answer in the schema
(the autouse closed-world check validates every answer here), viewer and up, and a cost in
queries that does not grow with rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import reports, services
from tests.api.apihelpers import get, url
from tests.helpers import ambiguous_run, envelope, put_checkpoint

pytestmark = pytest.mark.django_db


def test_the_api_answers_the_figures_of_the_range(api_as, vic, wendy, rita, acme):
    run_id = ambiguous_run(wendy, acme)
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="by phone")
    services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    r = get(api_as(vic), "acme", "report", range="24h")
    assert r.status_code == 200
    data = r.json()
    assert data["range"]["name"] == "24h" and data["range"]["bucket"] == "hour"
    assert len(data["buckets"]) == 25
    assert {k: sum(v) for k, v in data["runs_entering"].items() if sum(v)} == {
        "healthy": 1, "ambiguous": 1, "closed": 1}
    assert data["time_to_resolve_s"]["n"] == 1
    assert data["resume_age_ms"]["reject"]["n"] == 1
    assert data["checkpoint_size_bytes"]["acme.order"]["n"] == 1
    assert set(data) >= {"runs", "effects", "retry_requests", "open_conflicts", *reports.FIGURES}
    page = reports.figures(user=vic, tenant=acme, range_name="24h")
    assert data["runs_entering"] == page["runs_entering"]
    # (stop 34, an attack's finding) the page's credentials and large payloads too.
    assert data["flagged"] == {"runs": 0, "checkpoints": 0, "effects": 0, "large_payloads": 0}


def test_the_api_counts_what_screening_flagged_as_the_page_does(api_as, vic, wendy, acme):
    from checkpoints.selectors.audit import flagged_counts

    put_checkpoint(wendy, acme, envelope(payload={"phase": "ready",
                                                  "api_key": "sk_live_51HxQ2abcdefghijkl"}))
    data = get(api_as(vic), "acme", "report", range="24h").json()
    assert data["flagged"] == flagged_counts(acme)
    assert data["flagged"]["checkpoints"] == 1 and data["flagged"]["runs"] == 1


def test_a_custom_range(api_as, vic):
    r = get(api_as(vic), "acme", "report", **{"from": "2026-11-01", "to": "2026-11-30"})
    assert r.status_code == 200
    assert r.json()["range"] == {"name": "custom", "from": "2026-11-01T00:00:00+00:00",
                                 "to": "2026-12-01T00:00:00+00:00", "bucket": "day"}


@pytest.mark.parametrize(("query", "field"), [
    ({"range": "1y"}, "range"),
    ({"range": "custom"}, "from"),
    ({"from": "2026-11-01", "to": "2028-11-01"}, "to"),
    ({"from": "2026-11-01"}, "to"),
    ({"to": "x" * 33}, "to"),
    ({"range": "7d", "to": "2026-11-01"}, "to"),
    ({"limit": "5"}, "limit"),
    ({"from": "2026-01-01T00:00Z ", "to": "2026-12-31"}, "from"),  # the page stripped it
    ({"from": "２０２６-01-01", "to": "2026-12-31"}, "from"),  # full-width digits
])
def test_a_bad_range_is_a_400_naming_the_parameter(api_as, vic, query, field):
    r = get(api_as(vic), "acme", "report", **query)
    assert r.status_code == 400
    assert r.json()["detail"].startswith(f"{field}: "), r.json()


@pytest.mark.parametrize(("query", "field"), [
    ({"range": "custom", "from": "9999-01-01", "to": "9999-12-31"}, "from"),
    ({"from": "9999-12-01", "to": "9999-12-31T23:59"}, "from"),
    ({"from": "9999-12-31T20:00", "to": "9999-12-31T23:30"}, "from"),
    ({"from": "0001-01-01T00:00+01:00", "to": "2001-01-01"}, "from"),
    ({"from": "2020-01-01", "to": "9999-12-31T23:00-05:00"}, "to"),
])
def test_a_range_at_the_calendar_edges_is_a_400_naming_the_parameter(api_as, vic, query,
                                                                     field):
    r = get(api_as(vic), "acme", "report", **query)
    assert r.status_code == 400
    assert r.json()["detail"].startswith(f"{field}: "), r.json()


def test_the_twin_and_strangers_see_nothing(api_as, omar, vic):
    assert get(api_as(omar), "acme", "report", range="24h").status_code == 404


def test_the_report_costs_the_same_with_few_and_many_rows(api_as, vic, wendy, acme):
    api = api_as(vic)
    put_checkpoint(wendy, acme, envelope())
    api.get(url("acme", "report"))

    def cost():
        with CaptureQueriesContext(connection) as ctx:
            assert api.get(url("acme", "report") + "?range=30d").status_code == 200
        return len(ctx)

    few = cost()
    for i in range(15):
        put_checkpoint(wendy, acme, envelope(kind=f"acme.k{i}"))
    ambiguous_run(wendy, acme)
    assert cost() == few
