"""Keyset paging of ``GET …/runs`` (issues 8 and 9): pages follow the run's creation
order (``-id``, or ``id`` with ``sort=created``), which no write changes, so runs written
at the same instant, or while a client pages, are each listed exactly once; ``previous``
goes back; a cursor the API did not make, or made for another list, is a 400 naming
``cursor``."""

from __future__ import annotations

import base64
import json

import pytest

from checkpoints.models import Run
from tests.api.apihelpers import get, new_checkpoint, put_cp


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


def _all_pages(client, **params) -> list[list[str]]:
    pages, r = [], get(client, "acme", "runs", **params)
    while True:
        assert r.status_code == 200, r.content
        pages.append([row["run_id"] for row in r.json()["results"]])
        if r.json()["next"] is None:
            return pages
        r = client.get(r.json()["next"])


def test_pages_follow_the_creation_order_whatever_the_last_writes(w, acme):
    made = [new_checkpoint(w, "acme")["run_id"] for _ in range(7)]
    same = Run.objects.for_tenant(acme).get(uuid=made[3]).last_write_at
    # Five runs share one last write, and the oldest wrote last: neither moves a run.
    Run.objects.for_tenant(acme).filter(uuid__in=made[1:6]).update(last_write_at=same)
    Run.objects.for_tenant(acme).filter(uuid=made[0]).update(
        last_write_at=same.replace(year=same.year + 1))
    for limit in (1, 2, 3, 7):
        pages = _all_pages(w, limit=limit)
        assert [u for page in pages for u in page] == made[::-1]
        assert all(len(page) == limit for page in pages[:-1])
    state = _all_pages(w, limit=2, recovery_state="healthy")
    assert [u for page in state for u in page] == made[::-1]
    assert [u for page in _all_pages(w, limit=3, sort="created") for u in page] == made


def test_a_run_written_while_a_client_pages_is_listed_exactly_once(w, acme):
    made = [new_checkpoint(w, "acme") for _ in range(7)]
    first = get(w, "acme", "runs", limit=3).json()
    seen = [row["run_id"] for row in first["results"]]
    # The oldest run (on the last page) and one already seen write again between pages:
    # ordered by last write, the first would be skipped and the second listed twice.
    for body in (made[0], next(b for b in made if b["run_id"] == seen[1])):
        assert put_cp(w, "acme", dict(body, revision=1), match=0).status_code == 200
    r = w.get(first["next"])
    while True:
        assert r.status_code == 200, r.content
        seen += [row["run_id"] for row in r.json()["results"]]
        if r.json()["next"] is None:
            break
        r = w.get(r.json()["next"])
    assert sorted(seen) == sorted(b["run_id"] for b in made) and len(set(seen)) == 7


def test_previous_goes_back_page_by_page_to_the_first(w, acme):
    made = [new_checkpoint(w, "acme")["run_id"] for _ in range(7)][::-1]
    first = get(w, "acme", "runs", limit=3).json()
    assert first["previous"] is None
    second = w.get(first["next"]).json()
    third = w.get(second["next"]).json()
    assert [r["run_id"] for r in third["results"]] == made[6:] and third["next"] is None
    back = w.get(third["previous"]).json()
    assert [r["run_id"] for r in back["results"]] == made[3:6]
    top = w.get(back["previous"]).json()
    assert [r["run_id"] for r in top["results"]] == made[:3] and top["previous"] is None
    assert [r["run_id"] for r in w.get(top["next"]).json()["results"]] == made[3:6]


def _cursor(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize("value", [
    [None, 5],                          # no last write: there is no such run
    ["2026-01-01T00:00:00", 5],         # no time zone
    ["2026-01-01T00:00:00+00:00", "5"],  # id not an integer
    ["not a time", 5],
    ["9999-12-31T23:59:59-14:00", 1],  # past the last date once in UTC
    ["0001-01-01T00:00:00+14:00", 1],  # before the first
    [5],
    {"a": 1},
])
def test_a_cursor_the_api_did_not_make_is_a_400_naming_it(w, acme, value):
    new_checkpoint(w, "acme")
    r = get(w, "acme", "runs", cursor=_cursor(value))
    assert r.status_code == 400
    assert r.json()["detail"].startswith("cursor:")


def test_a_cursor_made_for_another_list_is_a_400_naming_it(w, acme):
    for _ in range(3):
        new_checkpoint(w, "acme")
    cursor = get(w, "acme", "runs", limit=1).json()["next"].split("cursor=")[1]
    for other in ({"sort": "created"}, {"q": "a"}, {"recovery_state": "healthy"},
                  {"kind": "acme.order"}, {"age_s_min": "5"}):
        r = get(w, "acme", "runs", limit=1, cursor=cursor, **other)
        assert r.status_code == 400 and r.json()["detail"].startswith("cursor:"), other
    assert get(w, "acme", "runs", limit=1, cursor=cursor).status_code == 200
