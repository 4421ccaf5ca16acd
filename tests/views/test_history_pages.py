"""Paged history on the dashboard (issue 8): the run page shows each checkpoint's and each
effect's newest ``HISTORY_PAGE`` revisions, newest first, and "Load older" pages back by
keyset (``?before=N``): with htmx only the list items (which replace the link), without
it a history page; a bad ``before`` is a 400 naming it."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from checkpoints import selectors
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect

HTMX = {"HTTP_HX_REQUEST": "true"}


def _revisions(body: str) -> list[int]:
    """The checkpoint revisions a page lists, in the page's order."""
    return [int(n) for n in re.findall(r'<span class="mono tl-rev">r(\d+)</span>', body)]


def _effect_revisions(body: str) -> list[int]:
    return [int(n) for n in re.findall(r'<li><span class="mono">r(\d+)</span>', body)]


def _older_link(body: str) -> str | None:
    found = re.findall(r'hx-get="([^"]*/revisions/\?before=\d+)"', body)
    return found[0] if found else None


@pytest.fixture
def long_checkpoint(acme, wendy):
    """One run with one checkpoint of 12 revisions (r0..r11); pages of 5."""
    cp, run = uuid.uuid4(), uuid.uuid4()
    for rev in range(12):
        put_checkpoint(wendy, acme, envelope(cp, run, rev, payload={"phase": "ready", "n": rev}),
                       expected=rev - 1 if rev else None)
    return run, cp


@pytest.fixture
def small_pages(monkeypatch):
    monkeypatch.setattr(selectors.runs, "HISTORY_PAGE", 5)


def test_it_pages_a_checkpoints_history_newest_first(login, rita, long_checkpoint, small_pages):
    run, cp = long_checkpoint
    client = login(rita)
    page = client.get(reverse("run_detail", args=["acme", run])).content.decode()
    assert _revisions(page) == [11, 10, 9, 8, 7]
    link = _older_link(page)
    assert link == reverse("checkpoint_history", args=["acme", cp]) + "?before=7"
    fragment = client.get(link, **HTMX)
    assert fragment.status_code == 200
    assert fragment["Vary"] and "HX-Request" in fragment["Vary"]
    body = fragment.content.decode()
    assert "<html" not in body and _revisions(body) == [6, 5, 4, 3, 2]
    last = client.get(_older_link(body), **HTMX).content.decode()
    assert _revisions(last) == [1, 0] and _older_link(last) is None


def test_the_history_page_works_without_javascript(login, rita, long_checkpoint, small_pages):
    run, cp = long_checkpoint
    url = reverse("checkpoint_history", args=["acme", cp])
    response = login(rita).get(url + "?before=7")
    body = response.content.decode()
    assert response.status_code == 200 and "<html" in body
    assert _revisions(body) == [6, 5, 4, 3, 2]
    assert f'href="{url}?before=2"' in body
    assert reverse("run_detail", args=["acme", run]) in body
    # The reveal and diff forms cover the revisions listed (a reviewer may reveal).
    assert re.findall(r'<option value="(\d+)"', body)[:5] == ["6", "5", "4", "3", "2"]
    # Without ``before``: the newest page, as on the run page.
    assert _revisions(login(rita).get(url).content.decode()) == [11, 10, 9, 8, 7]


def test_the_run_page_shows_a_short_history_whole_without_a_link(login, rita, stuck):
    body = login(rita).get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    assert _revisions(body) == [1, 0]
    assert _effect_revisions(body) == [2, 1, 0]  # planned, submitted, unresolved (sweep)
    assert _older_link(body) is None


def test_it_pages_an_effects_history(login, rita, acme, wendy, monkeypatch):
    monkeypatch.setattr(selectors.runs, "HISTORY_PAGE", 2)
    run, eid = uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run))
    walk_effect(wendy, acme, effect_body(eid, run), "submitted", "confirmed")
    client = login(rita)
    body = client.get(reverse("run_detail", args=["acme", run])).content.decode()
    assert _effect_revisions(body) == [2, 1]
    assert "3 revisions" in body
    link = _older_link(body)
    assert link == reverse("effect_history", args=["acme", eid]) + "?before=1"
    older = client.get(link, **HTMX).content.decode()
    assert _effect_revisions(older) == [0] and _older_link(older) is None
    page = client.get(link).content.decode()
    assert "<html" in page and _effect_revisions(page) == [0]


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "", str(2**63), "\u0661",
                                   "99999999999999999999999", ["1", "2"]])
@pytest.mark.parametrize("htmx", [False, True])
def test_a_bad_before_is_a_400_naming_it(login, rita, stuck, acme, value, htmx):
    from checkpoints.models import Effect

    effect = Effect.objects.for_tenant(acme).get(uuid=stuck.effect_id)
    extra = HTMX if htmx else {}
    for url in (reverse("checkpoint_history", args=["acme", stuck.checkpoint_id]),
                reverse("effect_history", args=["acme", effect.uuid])):
        response = login(rita).get(url, {"before": value}, **extra)
        assert response.status_code == 400, (url, value)
        assert "before:" in response.content.decode()
        assert "HX-Request" in response["Vary"]


def test_history_pages_are_tenant_scoped(login, omar, stuck):
    """Another tenant's reviewer: 404 under their own tenant, 404 under ours."""
    for slug in ("globex", "acme"):
        url = reverse("checkpoint_history", args=[slug, stuck.checkpoint_id])
        assert login(omar).get(url).status_code == 404
        url = reverse("effect_history", args=[slug, stuck.effect_id])
        assert login(omar).get(url).status_code == 404


def test_a_before_past_the_latest_is_the_newest_page(login, rita, long_checkpoint, small_pages):
    _, cp = long_checkpoint
    url = reverse("checkpoint_history", args=["acme", cp])
    body = login(rita).get(url, {"before": 10**6}).content.decode()
    assert _revisions(body) == [11, 10, 9, 8, 7]
