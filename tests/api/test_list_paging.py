"""Keyset paging of ``GET …/runs`` (issue 8): pages follow ``-last_write_at, -id``, runs
written at the same instant included, and a cursor the API did not make is a 400 naming
``cursor``."""

from __future__ import annotations

import base64
import json

import pytest

from checkpoints.models import Run
from tests.api.apihelpers import get, new_checkpoint


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


def test_pages_keep_the_order_through_runs_written_at_the_same_instant(w, acme):
    made = [new_checkpoint(w, "acme")["run_id"] for _ in range(7)]
    same = Run.objects.for_tenant(acme).get(uuid=made[3]).last_write_at
    # Five runs share one last write; the tie is broken by id, newest first.
    Run.objects.for_tenant(acme).filter(uuid__in=made[1:6]).update(last_write_at=same)
    expected = [str(u) for u in Run.objects.for_tenant(acme)
                .order_by("-last_write_at", "-id").values_list("uuid", flat=True)]
    assert expected[0] == made[6] and expected[-1] == made[0]
    for limit in (1, 2, 3, 7):
        pages = _all_pages(w, limit=limit)
        assert [u for page in pages for u in page] == expected
        assert all(len(page) == limit for page in pages[:-1])
    state = _all_pages(w, limit=2, recovery_state="healthy")
    assert [u for page in state for u in page] == expected


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
