"""Issue 9, find anything and page without skipping: the search ``q`` (selectors and the
inbox), keyset pages on a key no write changes, "51-100 of 121", tab counts that follow
the filters, and the landing tab of each role."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from checkpoints import selectors, services
from checkpoints.dashboard import inbox as inbox_views
from checkpoints.exceptions import InvalidPayload
from checkpoints.models import AuditEvent, Run
from tests.helpers import envelope, put_checkpoint
from tests.kind_fixtures import payload as fixture_payload
from tests.views.conftest import make_stuck_run


def _agent_payload(name: str) -> dict:
    payload = fixture_payload("runifold.agent/v1/ready_for_turn")
    payload["agent"] = name
    return payload


class Found:
    """Runs each findable by one field only (names below are in no other field)."""

    def __init__(self, acme, wendy):
        stuck = make_stuck_run(wendy, acme, order_id="A-1003", key="charge:A-1003")
        self.order, self.order_cp = stuck.run_id, stuck.checkpoint_id
        self.agent = uuid.uuid4()
        put_checkpoint(wendy, acme, envelope(run_id=self.agent, kind="runifold.agent",
                                             payload=_agent_payload("Billing-Bot")))
        self.workflow = uuid.uuid4()
        put_checkpoint(wendy, acme, envelope(run_id=self.workflow, payload={
            "phase": "ready", "workflow": "acme.refunds"}))
        self.phase = uuid.uuid4()
        put_checkpoint(wendy, acme, envelope(run_id=self.phase, payload={"phase": "shipping"}))
        self.leased = uuid.uuid4()
        put_checkpoint(wendy, acme, envelope(run_id=self.leased, payload={"phase": "ready"}))
        services.lease_acquire(actor=wendy, tenant=acme, run_id=self.leased,
                               owner="worker_7f", ttl_s=600)


@pytest.fixture
def found(acme, wendy, globex, wes):
    # The twin tenant holds the same order: a search never reaches it.
    make_stuck_run(wes, globex, order_id="A-1003", key="charge:A-1003")
    return Found(acme, wendy)


def _search(user, tenant, q, **filters) -> set[uuid.UUID]:
    page = selectors.run_list(user=user, tenant=tenant, limit=200,
                              filters=selectors.RunFilters(q=q, **filters))
    return {row["uuid"] for row in page.rows}


@pytest.mark.parametrize("field, q", [
    ("order", "a-1003"),           # operation key charge:A-1003, substring, any case
    ("order", "CHARGE:A-10"),
    ("agent", "billing-b"),        # agent, substring
    ("agent", "ING-BOT"),
    ("workflow", "REFUNDS"),       # workflow, substring
    ("phase", "hipp"),             # phase label "shipping", substring
    ("leased", "worker_7"),        # lease owner, substring; "_" matched literally
])
def test_a_search_finds_a_run_by_each_text_field(found, rita, acme, field, q):
    assert _search(rita, acme, q) == {getattr(found, field)}


def test_a_search_finds_a_run_by_its_full_or_short_id_in_any_case(found, rita, acme):
    full = str(found.agent)
    for q in (full, full.upper(), full[:8], full[:13], full.replace("-", "")[:20],
              f"  {full[:10]}  "):
        assert _search(rita, acme, q) == {found.agent}, q


def test_a_search_finds_a_run_by_a_checkpoint_id_prefix(found, rita, acme):
    assert _search(rita, acme, str(found.order_cp)) == {found.order}
    assert _search(rita, acme, str(found.order_cp)[:9].upper()) == {found.order}


def test_wildcards_and_odd_text_are_matched_literally(found, rita, acme):
    assert _search(rita, acme, "a_1003") == set()     # "_" is no wildcard
    assert _search(rita, acme, "%") == set()          # nor "%"
    assert _search(rita, acme, "\\") == set()
    assert _search(rita, acme, "café ☕") == set()     # non-ASCII: searched, not refused
    assert _search(rita, acme, "12345678-9") == set()  # misplaced dash: not an id prefix
    assert _search(rita, acme, "   ") == {found.order, found.agent, found.workflow,
                                          found.phase, found.leased}  # blank: no search


@pytest.mark.parametrize("q, why", [("x" * 513, "at most"), ("a\x01b", "control"),
                                    ("a\x1fb", "control"), ("a\x00b", "control")])
def test_a_search_no_column_can_hold_is_refused_naming_q(found, rita, acme, q, why):
    with pytest.raises(InvalidPayload, match=f"^q: .*{why}"):
        _search(rita, acme, q)


def test_a_search_combines_with_the_state_and_other_filters(found, rita, acme):
    assert _search(rita, acme, "a-1003", recovery_state="ambiguous") == {found.order}
    assert _search(rita, acme, "a-1003", recovery_state="healthy") == set()
    assert _search(rita, acme, "a-1003", kind="runifold.agent") == set()


def test_the_audit_search_lists_the_events_of_the_runs_found(found, rita, acme):
    events = selectors.audit_list(user=rita, tenant=acme, q="A-1003")
    assert events and {e.run_uuid for e in events} == {found.order}
    assert len(events) == AuditEvent.objects.filter(tenant=acme, run_uuid=found.order).count()


# --- the inbox -------------------------------------------------------------------------

def test_the_inbox_search_lands_on_the_tab_holding_what_it_found(login, rita, found):
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    response = client.get(url, {"q": "A-1003"})
    assert response.status_code == 200
    assert response.context["state"] == "ambiguous"
    assert [r["uuid"] for r in response.context["rows"]] == [found.order]
    # A healthy run is in none of the reviewer's tabs: the search lands on "all".
    response = client.get(url, {"q": "billing"})
    assert response.context["state"] == "all"
    assert [r["uuid"] for r in response.context["rows"]] == [found.agent]
    assert 'value="billing"' in response.content.decode()


def test_tab_counts_follow_the_filters(login, rita, found):
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    plain = {v: n for v, _, n in client.get(url).context["tabs"]}
    assert plain["ambiguous"] == 1 and plain["healthy"] == 4
    searched = client.get(url, {"q": "acme.refunds", "state": "ambiguous"})
    tabs = {v: n for v, _, n in searched.context["tabs"]}
    assert tabs["healthy"] == 1 and sum(tabs.values()) == 1 == searched.context["total"]
    assert searched.context["rows"] == []
    assert "1 in other tabs" in searched.content.decode()
    polled = client.get(reverse("run_counts", args=["acme"]), {"q": "billing"}).content
    shown = dict(re.findall(r'<a href="[^"]*state=(\w+)"[^>]*>.*?<span class="count[^"]*">(\d+)</span>',
                            polled.decode(), re.S))
    assert shown["healthy"] == "1" and shown["ambiguous"] == "0"


def test_the_inbox_refuses_a_bad_search_or_sort_naming_it(login, rita, acme):
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    for params, name in (({"q": "x" * 513}, "q"), ({"q": "a\x07"}, "q"),
                         ({"sort": "last_write"}, "sort"), ({"sort": "-id"}, "sort")):
        response = client.get(url, params)
        assert response.status_code == 400, params
        assert f"{name}:" in response.content.decode()


def test_the_audit_log_searches(login, rita, found):
    response = login(rita).get(reverse("audit_log", args=["acme"]), {"q": "a-1003"})
    assert response.status_code == 200
    assert {e.run_uuid for e in response.context["events"]} == {found.order}
    assert login(rita).get(reverse("audit_log", args=["acme"]),
                           {"q": "x" * 513}).status_code == 400


# --- paging ----------------------------------------------------------------------------

def _runs(wendy, acme, n) -> list[uuid.UUID]:
    """``n`` healthy runs, oldest first."""
    made = []
    for _ in range(n):
        made.append(uuid.uuid4())
        put_checkpoint(wendy, acme, envelope(uuid.uuid4(), made[-1], 0))
    return made


def _range(response) -> str:
    return re.search(r"(\d+-\d+ of \d+)", response.content.decode()).group(1)


def test_the_pager_shows_where_the_page_sits_and_goes_both_ways(login, rita, wendy, acme):
    made = _runs(wendy, acme, 121)
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    first = client.get(url, {"state": "healthy"})
    assert _range(first) == "1-50 of 121" and first.context["previous_cursor"] is None
    second = client.get(url, {"state": "healthy", "cursor": first.context["next_cursor"]})
    assert _range(second) == "51-100 of 121"
    third = client.get(url, {"state": "healthy", "cursor": second.context["next_cursor"]})
    assert _range(third) == "101-121 of 121" and third.context["next_cursor"] is None
    back = client.get(url, {"state": "healthy", "cursor": third.context["previous_cursor"]})
    assert _range(back) == "51-100 of 121"
    assert [r["uuid"] for r in back.context["rows"]] == made[::-1][50:100]
    top = client.get(url, {"state": "healthy", "cursor": back.context["previous_cursor"]})
    assert _range(top) == "1-50 of 121" and top.context["previous_cursor"] is None
    assert [r["uuid"] for r in top.context["rows"]] == made[::-1][:50]
    oldest = client.get(url, {"state": "healthy", "sort": "created"})
    assert [r["uuid"] for r in oldest.context["rows"]] == made[:50]
    following = re.search(r'rel="next" href="([^"]+)"', oldest.content.decode()).group(1)
    assert "sort=created" in following and "state=healthy" in following


def test_a_run_written_between_two_pages_is_listed_exactly_once(
        login, rita, wendy, acme, monkeypatch):
    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 3)
    made = _runs(wendy, acme, 8)
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    page = client.get(url, {"state": "all"})
    seen = [r["uuid"] for r in page.context["rows"]]
    # Between pages the runtime writes the oldest run (last on the last page) and one
    # already seen: with the old order (last write first) the first would be skipped
    # and the second listed twice.
    for run_id in (made[0], seen[1]):
        cp = Run.objects.for_tenant(acme).get(uuid=run_id).latest_checkpoint
        put_checkpoint(wendy, acme, envelope(cp.uuid, run_id, 1), expected=0)
    while page.context["next_cursor"]:
        page = client.get(url, {"state": "all", "cursor": page.context["next_cursor"]})
        seen += [r["uuid"] for r in page.context["rows"]]
    assert sorted(seen) == sorted(made) and len(seen) == len(set(seen))


def test_a_cursor_is_valid_only_with_its_sort_and_filters(login, rita, wendy, acme):
    _runs(wendy, acme, 4)
    page = selectors.run_list(user=rita, tenant=acme, filters=selectors.RunFilters(), limit=2)
    cursor = page.next_cursor
    for sort, filters in (("created", selectors.RunFilters()),
                          (None, selectors.RunFilters(q="x")),
                          (None, selectors.RunFilters(recovery_state="healthy")),
                          (None, selectors.RunFilters(kind="acme.order"))):
        with pytest.raises(InvalidPayload, match="^cursor: made for another sort"):
            selectors.run_list(user=rita, tenant=acme, filters=filters, sort=sort,
                               cursor=cursor)
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    for params in ({"state": "all", "cursor": cursor, "sort": "created"},
                   {"state": "all", "cursor": cursor, "q": "x"},
                   {"state": "all", "cursor": "é" * 10},
                   {"state": "all", "cursor": "x" * 513}):
        response = client.get(url, params)
        assert response.status_code == 400 and b"cursor:" in response.content, params
    assert client.get(url, {"state": "all", "cursor": cursor}).status_code == 200


# --- the landing tab ---------------------------------------------------------------------

def test_each_role_lands_on_the_first_state_it_acts_on(login, rita, april, vic, wendy, acme):
    url = reverse("run_list", args=["acme"])
    stuck = make_stuck_run(wendy, acme)
    assert login(rita).get(url).context["state"] == "ambiguous"
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="gateway has no lookup")
    assert login(rita).get(url).context["state"] == "unknown_outcome"
    assert login(vic).get(url).context["state"] == "unknown_outcome"
    services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id, reason="again")
    assert login(april).get(url).context["state"] == "awaiting_approval"
    assert login(vic).get(url).context["state"] == "awaiting_approval"
    # Nothing a reviewer acts on: the "ambiguous" tab, which says nothing is in doubt.
    assert login(rita).get(url).context["state"] == "ambiguous"
    # A tab asked for is kept.
    assert login(april).get(url, {"state": "healthy"}).context["state"] == "healthy"


# --- cost ----------------------------------------------------------------------------------

def _queries(client, url, params=None) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, params or {})
    assert response.status_code == 200, response.content[:300]
    return len(ctx.captured_queries)


def test_a_search_costs_the_same_queries_whatever_the_number_of_runs(
        login, rita, wendy, acme, monkeypatch):
    from tests.conftest import bearer_client

    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 2)
    client, api = login(rita), bearer_client(rita)
    inbox, runs = reverse("run_list", args=["acme"]), "/api/v1/tenants/acme/runs"

    def costs():
        page = client.get(inbox, {"q": "charge:a-", "state": "ambiguous"})
        searched = [
            _queries(client, inbox, {"q": "charge:a-"}),
            _queries(client, inbox, {"q": "charge:a-", "state": "ambiguous",
                                     "cursor": page.context["next_cursor"]}),
            _queries(client, reverse("run_counts", args=["acme"]), {"q": "charge:a-"}),
            _queries(client, reverse("audit_log", args=["acme"]), {"q": "charge:a-"}),
            _queries(api, runs, {"q": "charge:a-", "limit": 2}),
        ]
        return searched

    for i in range(3):
        make_stuck_run(wendy, acme, order_id=f"A-{i}", key=f"charge:A-{i}")
    client.get(inbox)
    api.get("/api/v1/tenants/acme/report")  # a session's and a token's first use
    before = costs()
    for i in range(3, 12):
        make_stuck_run(wendy, acme, order_id=f"A-{i}", key=f"charge:A-{i}")
    assert costs() == before
