"""A legal hold names the runs it holds now (the newcomer's finding: a hold on
``order=A-1001`` found its run, yet the API answered ``"runs": [], "runs_held": 1`` and
the Legal holds page said "(1 run now)" without naming it). ``runs_now``: the first
``HOLD_RUNS_SHOWN`` run ids, read by the coverage rule's home
(``selectors.lifecycle.holds_runs_now``, made of the parts of ``hold_covers_q`` and
``held_runs_q``), in a fixed number of queries whatever the number of holds."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import selectors, services
from checkpoints.models import DataPolicy, Run
from checkpoints.selectors.lifecycle import covering_holds
from tests.api.apihelpers import get, post
from tests.helpers import envelope, put_checkpoint

pytestmark = pytest.mark.django_db


def _order_run(writer, tenant, order_id) -> Run:
    body = envelope(payload={"phase": "ready", "order_id": order_id})
    put_checkpoint(writer, tenant, body)
    return Run.objects.for_tenant(tenant).get(uuid=body["run_id"])


@pytest.fixture
def orders(acme, wendy, globex, wes):
    for tenant in (acme, globex):
        DataPolicy.objects.create(tenant=tenant, subject_fields={"order": "/order_id"})
    _order_run(wes, globex, "A-1001")  # another tenant's run of the same order: never named
    held = sorted(str(_order_run(wendy, acme, "A-1001").uuid) for _ in range(2))
    other = _order_run(wendy, acme, "A-1002")
    return held, other


def _place(client, body):
    r = post(client, "acme", "legal-holds", dict(body, reason="litigation A-1001"))
    assert r.status_code == 201, r.content
    return r.json()


def test_a_subject_hold_names_the_runs_it_holds(api_as, adam, vic, orders):
    held, _ = orders
    answer = _place(api_as(adam), {"subject": {"field": "order", "value": "A-1001"}})
    assert answer["runs_now"] == held and answer["runs_held"] == 2
    assert answer["runs"] == []  # the runs named at placement: none for a subject
    one = get(api_as(vic), "acme", f"legal-holds/{answer['id']}").json()
    assert one["runs_now"] == held
    listed = get(api_as(vic), "acme", "legal-holds").json()["results"]
    assert [h["runs_now"] for h in listed] == [held]


def test_the_list_is_bounded_and_counted(api_as, adam, orders, monkeypatch):
    held, _ = orders
    monkeypatch.setattr("checkpoints.selectors.lifecycle_requests.HOLD_RUNS_SHOWN", 1)
    answer = _place(api_as(adam), {"subject": {"field": "order", "value": "A-1001"}})
    assert answer["runs_now"] == held[:1] and answer["runs_held"] == 2


def test_each_scope_and_a_released_hold(api_as, adam, orders, acme):
    held, other = orders
    runs = _place(api_as(adam), {"runs": [str(other.uuid), held[1]]})
    assert runs["runs_now"] == sorted([str(other.uuid), held[1]])
    whole = _place(api_as(adam), {"tenant": True})
    assert whole["runs_now"] is None and whole["runs_held"] is None
    subject = _place(api_as(adam), {"subject": {"field": "order", "value": "A-1001"}})
    r = post(api_as(adam), "acme", f"legal-holds/{subject['id']}/release", {"reason": "done"})
    assert r.status_code == 200, r.content
    assert r.json()["runs_now"] == []  # a released hold holds nothing


def test_it_names_exactly_what_the_coverage_rule_covers(adam, orders, acme):
    held, other = orders
    holds = [services.legal_hold_place(actor=adam, tenant=acme, reason="r", **kw) for kw in (
        {"subject": {"field": "order", "value": "A-1001"}},
        {"subject": {"field": "order", "value": "A-1002"}},
        {"subject": {"field": "order", "value": "A-404"}},
        {"runs": [held[0], str(other.uuid)]})]
    listed = {h.pk: h.runs_now for h in selectors.legal_hold_list(user=adam, tenant=acme)}
    covered = {h.pk: [] for h in holds}
    for run in Run.objects.for_tenant(acme).order_by("uuid"):
        for hold in covering_holds(run):
            covered[hold.pk].append(run.uuid)
    assert listed == covered
    assert [len(listed[h.pk]) for h in holds] == [2, 1, 0, 2]


def test_naming_the_runs_costs_no_query_per_hold(adam, orders, acme):
    held, other = orders

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            rows = selectors.legal_hold_list(user=adam, tenant=acme)
        return len(ctx.captured_queries), rows

    services.legal_hold_place(actor=adam, tenant=acme, reason="r", runs=[held[0]])
    services.legal_hold_place(actor=adam, tenant=acme, reason="r",
                              subject={"field": "order", "value": "A-1001"})
    few, _ = queries()
    for value in ("A-1002", "A-1003", "A-1004"):
        services.legal_hold_place(actor=adam, tenant=acme, reason="r",
                                  subject={"field": "order", "value": value})
    services.legal_hold_place(actor=adam, tenant=acme, reason="r", runs=[str(other.uuid)])
    many, rows = queries()
    assert many == few and len(rows) == 6


def test_the_pages_link_the_runs_a_subject_hold_holds(client, adam, orders, acme):
    held, _ = orders
    services.legal_hold_place(actor=adam, tenant=acme, reason="r",
                              subject={"field": "order", "value": "A-1001"})
    client.force_login(adam)
    for page in ("/t/acme/legal-holds/", "/t/acme/data/"):
        body = client.get(page).content.decode()
        assert "(2 runs now)" in body, page
        for rid in held:
            assert f'href="/t/acme/runs/{rid}/"' in body, page
