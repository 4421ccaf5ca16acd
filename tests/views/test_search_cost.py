"""Issue 17, item 7: the cost of every search a viewer can send is bounded.

- A ``q`` without ``SEARCH_SUBSTRING_MIN`` letters or digits in a row (``-``, ``ab``,
  ``%%``) reads no substring branch (no ``LIKE``, no effect table): pg_trgm has no
  trigram to look up for it, so it would read every run and effect of the tenant. It
  still finds run and checkpoint id prefixes, however short.
- The filtered tab counts and a page's position count at most ``SEARCH_COUNT_CAP``
  matching runs; past it the page says "1,000+".
- The inbox and the API list the same runs for the same ``q`` (one search builder).
"""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints import selectors
from checkpoints.dashboard import inbox as inbox_views
from tests.conftest import bearer_client
from tests.helpers import envelope, put_checkpoint
from tests.views.test_search import Found


@pytest.fixture
def found(acme, wendy):
    return Found(acme, wendy)


def _search(user, tenant, q, **filters) -> set[uuid.UUID]:
    page = selectors.run_list(user=user, tenant=tenant, limit=200,
                              filters=selectors.RunFilters(q=q, **filters))
    return {row["uuid"] for row in page.rows}


#: A substring branch (``selectors.Contains``): ``[I]LIKE '%…%' ESCAPE '\'`` (a prefix
#: ``LIKE 'tenant:acme:%'``, the role lookup's, is no substring search).
_PATTERN = re.compile(r"LIKE\s+'%")

SHORT = ["-", "--", "a", "ab", "7f", "%%", "...", "a-b", "_-_", "é", "ab cd", "a1-b2"]


@pytest.mark.parametrize("q", SHORT)
def test_a_short_search_reads_no_substring_branch(found, rita, acme, q):
    """Every query a page with a short ``q`` sends (list, counts, position, audit log)
    is free of ``LIKE`` and of the effect table: only index lookups and ranges."""
    assert not selectors.search_substring(q)
    filters = selectors.RunFilters(q=q)
    with CaptureQueriesContext(connection) as ctx:
        selectors.run_list(user=rita, tenant=acme, filters=filters)
        selectors.run_state_counts(user=rita, tenant=acme, filters=filters)
        selectors.run_position(user=rita, tenant=acme, filters=filters, sort=None, pk=2**40)
        selectors.audit_list(user=rita, tenant=acme, q=q)
    sql = "\n".join(x["sql"] for x in ctx.captured_queries).upper()
    assert len(ctx.captured_queries) >= 4
    assert not _PATTERN.search(sql), sql
    assert "CHECKPOINTS_EFFECT" not in sql, sql


def test_the_inbox_page_with_a_short_search_reads_no_substring_branch(login, rita, found):
    client = login(rita)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("run_list", args=["acme"]), {"q": "-"})
    assert response.status_code == 200
    assert not any(_PATTERN.search(x["sql"].upper()) for x in ctx.captured_queries)
    assert "id prefixes" in response.content.decode()  # says what it searched


@pytest.mark.parametrize("q", ["bil", "a-1003", "hipp", "7f", "café"])
def test_three_letters_or_digits_in_a_row_search_the_text(q):
    assert selectors.search_substring(q) == (q != "7f")


def test_a_short_search_still_finds_id_prefixes_and_no_text(found, rita, acme):
    assert found.order in _search(rita, acme, str(found.order)[:2])
    assert found.order in _search(rita, acme, str(found.order_cp)[:1].upper())
    assert found.agent not in _search(rita, acme, "bi")  # "Billing-Bot": too short
    assert _search(rita, acme, "bil") == {found.agent}
    assert _search(rita, acme, "-") == set()  # not an id prefix, and no text searched


def test_the_inbox_and_the_api_list_the_same_runs_for_the_same_q(login, rita, found):
    client, api = login(rita), bearer_client(rita)
    inbox = reverse("run_list", args=["acme"])
    for q in ["-", "a", "ab", "bi", "bil", "billing-bot", "A-1003", "charge:a-10", "hipp",
              "worker_7", "%", "a-b", str(found.order)[:1], str(found.order)[:8],
              str(found.order_cp)[:3], "acme", "zzz-no-such-thing"]:
        page = client.get(inbox, {"q": q, "state": "all"})
        assert page.status_code == 200, q
        web = [str(r["uuid"]) for r in page.context["rows"]]
        listed = api.get("/api/v1/tenants/acme/runs", {"q": q, "limit": 200})
        assert listed.status_code == 200, (q, listed.content)
        assert web == [r["run_id"] for r in listed.json()["results"]], q
        assert page.context["total"] == len(web), q  # the counts follow the same search


def _runs(wendy, acme, n, workflow="bulk.sweep") -> list[uuid.UUID]:
    made = []
    for _ in range(n):
        made.append(uuid.uuid4())
        put_checkpoint(wendy, acme, envelope(uuid.uuid4(), made[-1], 0,
                                             payload={"phase": "ready", "workflow": workflow}))
    return made


def test_filtered_counts_stop_at_the_cap_and_say_so(login, rita, wendy, acme, monkeypatch):
    monkeypatch.setattr(selectors.inbox, "SEARCH_COUNT_CAP", 3)
    _runs(wendy, acme, 5)
    filters = selectors.RunFilters(q="bulk.sweep")
    counts = selectors.run_state_counts(user=rita, tenant=acme, filters=filters)
    assert counts.capped and sum(counts.values()) == 4  # the cap + 1 counted, no more
    exact = selectors.run_state_counts(user=rita, tenant=acme,
                                       filters=selectors.RunFilters(q="no-such-run"))
    assert not exact.capped and sum(exact.values()) == 0
    # Unfiltered: the tenant's counters, exact whatever the cap.
    plain = selectors.run_state_counts(user=rita, tenant=acme, filters=selectors.RunFilters())
    assert not plain.capped and sum(plain.values()) == 5

    page = login(rita).get(reverse("run_list", args=["acme"]), {"q": "bulk.sweep"})
    html = page.content.decode()
    assert page.context["counts_capped"]
    assert "3+ runs match" in html and re.search(r'all <span class="count">3\+</span>', html)
    assert "1-5 of 5+" in html  # the page shows what it holds; the count is a bound
    assert page.context["bulk"]["matching"] is None  # "all runs matching", no number


def test_a_page_position_past_the_cap_is_not_counted(login, rita, wendy, acme, monkeypatch):
    monkeypatch.setattr(selectors.inbox, "SEARCH_COUNT_CAP", 2)
    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 2)
    made = _runs(wendy, acme, 7)
    client, inbox = login(rita), reverse("run_list", args=["acme"])
    params = {"q": "bulk.sweep", "state": "all"}
    second = client.get(inbox, params | {"cursor": client.get(inbox, params)
                                         .context["next_cursor"]})
    third = client.get(inbox, params | {"cursor": second.context["next_cursor"]})
    assert [r["uuid"] for r in third.context["rows"]] == made[::-1][4:6]
    assert second.context["first"] == 3  # two before it: within the cap
    assert third.context["first"] is None  # four before it: not counted
    assert "after the first 2+ matches" in third.content.decode()
    # Without a search the position is exact (an index range count, no cap).
    plain = {"state": "all"}
    page2 = client.get(inbox, plain | {"cursor": client.get(inbox, plain)
                                       .context["next_cursor"]})
    page3 = client.get(inbox, plain | {"cursor": page2.context["next_cursor"]})
    assert page3.context["first"] == 5


@pytest.mark.postgres
def test_the_search_plans_use_the_indexes_on_postgresql(found, rita, acme):
    """EXPLAIN of the run list's query: a short ``q`` reads no effect and applies no
    pattern; a long one's substring branches are there (``~~*``, ILIKE)."""
    def plan(q: str) -> str:
        qs = (selectors._filtered_runs(acme, selectors.RunFilters(q=q)).order_by("-id")
              .values(*selectors.RUN_LIST_FIELDS)[:51])
        sql, params = qs.query.sql_with_params()
        with connection.cursor() as cur:
            cur.execute("EXPLAIN " + sql, params)
            return "\n".join(row[0] for row in cur.fetchall())

    short = plan("-")
    assert "~~*" not in short and "checkpoints_effect" not in short, short
    long = plan("a-1003")
    assert "~~*" in long and "checkpoints_effect" in long, long
