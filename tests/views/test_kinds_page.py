"""The Kinds page (``/t/<slug>/kinds/``; docs/kinds.md): the same selector as ``GET …/kinds``
(``selectors.kind_usage``), so it shows per kind and schema version the tenant's
checkpoints, runs and ``schema_mismatch`` runs, the registry's kinds with zeros, and
nothing of another tenant; a link in the navigation of every tenant page."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from tests.helpers import envelope, put_checkpoint


@pytest.fixture
def used(acme, globex, wendy, wes):
    """acme: acme.order v1 in two runs (three checkpoints), one acme.order v9 run
    (schema_mismatch); globex: a ``globex.secret`` v7 run."""
    first = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, first)
    put_checkpoint(wendy, acme, envelope(run_id=first["run_id"]))
    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging"}))
    put_checkpoint(wendy, acme, envelope(schema_version=9))
    put_checkpoint(wes, globex, envelope(kind="globex.secret", schema_version=7, payload={}))


def _rows(body: str) -> list[list[str]]:
    """The text of each table row's cells (tags dropped, whitespace folded)."""
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)
        rows.append([" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split())
                     for c in cells])
    return rows


def test_it_shows_each_version_with_its_counts(login, vic, used):
    response = login(vic).get(reverse("kind_list", args=["acme"]))
    assert response.status_code == 200
    rows = _rows(response.content.decode())
    start = rows.index(next(r for r in rows if r and r[0].startswith("acme.order registered")))
    assert "supports v1, v2; newest v2" in rows[start][0]
    # v1 leads up to the newest (the registered step), which the page says.
    assert rows[start + 1] == ["", "v1 supported migrates to v2", "3", "2", "0"]
    assert rows[start + 2] == ["", "v2 supported", "0", "0", "0"]
    assert rows[start + 3] == ["", "v9 unsupported", "1", "1", "1"]
    workflow = next(i for i, r in enumerate(rows) if r and r[0].startswith("runifold.workflow"))
    assert rows[workflow + 1:workflow + 3] == [["", "v3 supported migrates to v4", "0", "0", "0"],
                                               ["", "v4 supported", "0", "0", "0"]]
    assert "1 run in" in response.content.decode()  # the schema_mismatch summary


def test_it_shows_nothing_of_another_tenant(login, vic, omar, used):
    acme_page = login(vic).get(reverse("kind_list", args=["acme"])).content.decode()
    assert "globex.secret" not in acme_page
    globex_page = login(omar).get(reverse("kind_list", args=["globex"])).content.decode()
    assert "globex.secret" in globex_page
    rows = _rows(globex_page)
    secret = next(i for i, r in enumerate(rows) if r and r[0].startswith("globex.secret"))
    assert "not registered" in rows[secret][0]
    assert rows[secret + 1] == ["", "v7 unsupported", "1", "1", "1"]


def test_another_tenants_account_gets_404(login, omar, used):
    assert login(omar).get(reverse("kind_list", args=["acme"])).status_code == 404


def test_it_links_the_inbox_filtered_by_kind_and_state(login, vic, used):
    body = login(vic).get(reverse("kind_list", args=["acme"])).content.decode()
    assert 'href="/t/acme/?state=schema_mismatch&amp;kind=acme.order"' in body
    assert 'href="/t/acme/?state=all&amp;kind=acme.order"' in body


def test_it_is_in_the_navigation(login, vic, acme):
    body = login(vic).get(reverse("run_list", args=["acme"])).content.decode()
    assert f'<a href="{reverse("kind_list", args=["acme"])}">Kinds</a>' in body
    page = login(vic).get(reverse("kind_list", args=["acme"])).content.decode()
    assert f'<a href="{reverse("kind_list", args=["acme"])}" aria-current="page">Kinds</a>' \
        in page


def test_it_takes_no_query_parameter(login, vic, acme):
    response = login(vic).get(reverse("kind_list", args=["acme"]), {"kind": "acme.order"})
    assert response.status_code == 400
