"""Query budgets: the inbox, the run page and the API run list cost the same number of
queries whatever the number of runs, effects, revisions or reconcile look-ups (no N+1)."""

from __future__ import annotations

import uuid

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from checkpoints.models import ReconcileAttempt
from checkpoints.reconcile import Answer
from tests.conftest import bearer_client
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, walk_effect
from tests.views.conftest import make_stuck_run, reconcile


def _queries(fetch) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = fetch()
    assert response.status_code == 200
    return len(ctx.captured_queries)


def _grow_run(writer, tenant, run_id, n):
    """Add ``n`` checkpoints (two revisions each) and ``n`` effects to one run."""
    for _ in range(n):
        cp = uuid.uuid4()
        put_checkpoint(writer, tenant, envelope(cp, run_id, 0))
        put_checkpoint(writer, tenant, envelope(cp, run_id, 1, payload={"phase": "charged"}),
                       expected=0)
        walk_effect(writer, tenant, effect_body(run_id=run_id, operation_key=f"k-{uuid.uuid4()}"),
                    "submitted")


def test_it_renders_the_inbox_and_the_api_list_in_constant_queries(acme, wendy, rita):
    client = Client()
    client.force_login(rita)
    api = bearer_client(rita)
    make_stuck_run(wendy, acme, order_id="A-1", key="charge:A-1")
    client.get("/t/acme/")  # the first request of a session does its own bookkeeping
    api.get("/api/v1/tenants/acme/report")  # ... and of a token (its last_used_at)
    inbox = _queries(lambda: client.get("/t/acme/?state=ambiguous"))
    listing = _queries(lambda: api.get("/api/v1/tenants/acme/runs?recovery_state=ambiguous"))
    for i in range(2, 12):
        make_stuck_run(wendy, acme, order_id=f"A-{i}", key=f"charge:A-{i}")
    assert _queries(lambda: client.get("/t/acme/?state=ambiguous")) == inbox
    assert _queries(lambda: api.get(
        "/api/v1/tenants/acme/runs?recovery_state=ambiguous")) == listing


def test_it_renders_the_run_page_in_constant_queries(acme, wendy, rita):
    client = Client()
    client.force_login(rita)
    stuck = make_stuck_run(wendy, acme)
    _grow_run(wendy, acme, stuck.run_id, 1)
    client.get("/t/acme/")
    page = _queries(lambda: client.get(f"/t/acme/runs/{stuck.run_id}/"))
    _grow_run(wendy, acme, stuck.run_id, 6)
    assert _queries(lambda: client.get(f"/t/acme/runs/{stuck.run_id}/")) == page


def test_it_renders_the_run_page_in_constant_queries_whatever_its_reconcile_history(
        acme, wendy, rita, scripted):
    client = Client()
    client.force_login(rita)
    stuck = make_stuck_run(wendy, acme)
    scripted.answers = [Answer.cannot_tell("payments: HTTP 503")]
    reconcile(rita, acme, stuck.run_id)
    client.get("/t/acme/")
    page = _queries(lambda: client.get(f"/t/acme/runs/{stuck.run_id}/"))
    _grow_run(wendy, acme, stuck.run_id, 4)  # four more in-doubt effects...
    age_world(3600)
    for _ in range(3):  # ...each reconciled, and every request asked again, three times
        reconcile(rita, acme, stuck.run_id)
    assert ReconcileAttempt.objects.count() > 10
    assert _queries(lambda: client.get(f"/t/acme/runs/{stuck.run_id}/")) == page


def _revise(writer, tenant, cp, run_id, upto: int) -> None:
    """Write revisions of checkpoint ``cp`` until its latest is ``upto`` (from 0)."""
    from checkpoints.models import Checkpoint

    latest = (Checkpoint.objects.for_tenant(tenant).filter(uuid=cp)
              .values_list("revision", flat=True).first())
    start = 0 if latest is None else latest + 1
    for rev in range(start, upto + 1):
        put_checkpoint(writer, tenant, envelope(cp, run_id, rev, payload={"phase": "ready",
                                                                         "n": rev}),
                       expected=rev - 1 if rev else None)


def test_a_run_page_costs_the_same_with_3_revisions_and_with_300(acme, wendy, rita):
    """Issue 8: the run page reads one page of history, not all of it; the API's run
    detail reads none."""
    client = Client()
    client.force_login(rita)
    api = bearer_client(rita)
    run_id, cp, eid = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    _revise(wendy, acme, cp, run_id, 2)
    walk_effect(wendy, acme, effect_body(eid, run_id), "submitted")
    client.get("/t/acme/")
    api.get("/api/v1/tenants/acme/report")
    page = f"/t/acme/runs/{run_id}/"
    detail = f"/api/v1/tenants/acme/runs/{run_id}"
    history = f"/t/acme/checkpoints/{cp}/revisions/"
    small = {url: _queries(lambda u=url, c=c: c.get(u))
             for url, c in ((page, client), (detail, api), (history, client),
                            (history + "?before=2", client))}
    _revise(wendy, acme, cp, run_id, 299)
    big = {url: _queries(lambda u=url, c=c: c.get(u))
           for url, c in ((page, client), (detail, api), (history, client),
                          (history + "?before=250", client))}
    assert {u.replace("?before=250", "?before=2"): n for u, n in big.items()} == small
    body = client.get(page).content.decode()
    assert "r299" in body and "r250" in body and "r249<" not in body


def test_the_api_run_detail_reads_no_history(acme, wendy, rita):
    run_id, cp = uuid.uuid4(), uuid.uuid4()
    _revise(wendy, acme, cp, run_id, 3)
    walk_effect(wendy, acme, effect_body(run_id=run_id), "submitted")
    api = bearer_client(rita)
    api.get("/api/v1/tenants/acme/report")
    with CaptureQueriesContext(connection) as ctx:
        response = api.get(f"/api/v1/tenants/acme/runs/{run_id}")
    assert response.status_code == 200
    read = " ".join(q["sql"] for q in ctx.captured_queries).lower()
    for table in ("checkpointrevision", "effectrevision", "auditevent"):
        assert f"checkpoints_{table}" not in read


def _runs(writer, tenant, n: int) -> None:
    for _ in range(n):
        put_checkpoint(writer, tenant, envelope())


def test_lists_and_counts_cost_the_same_with_5_runs_and_with_200(acme, wendy, rita):
    client = Client()
    client.force_login(rita)
    api = bearer_client(rita)
    _runs(wendy, acme, 5)
    client.get("/t/acme/")
    api.get("/api/v1/tenants/acme/report")
    urls = [(client, "/t/acme/?state=all"), (client, "/t/acme/?state=healthy"),
            (client, "/t/acme/counts/?state=healthy"), (client, "/t/acme/report/"),
            (client, "/t/acme/audit/"), (api, "/api/v1/tenants/acme/runs"),
            (api, "/api/v1/tenants/acme/runs?recovery_state=healthy&limit=3"),
            (api, "/api/v1/tenants/acme/report"), (api, "/api/v1/tenants/acme/audit-events"),
            (api, "/api/v1/tenants/acme/effects"), (client, "/t/acme/kinds/"),
            (api, "/api/v1/tenants/acme/kinds")]
    few = [_queries(lambda c=c, u=u: c.get(u)) for c, u in urls]
    _runs(wendy, acme, 195)
    assert [_queries(lambda c=c, u=u: c.get(u)) for c, u in urls] == few


def _mismatched(writer, tenant, n: int) -> None:
    """``n`` runs of ``acme.order`` v9 (``schema_mismatch``) and ``n`` of v1 (which a
    registered step leads up to v2: the migration offer)."""
    for _ in range(n):
        put_checkpoint(writer, tenant, envelope(schema_version=9))
        put_checkpoint(writer, tenant, envelope())


#: What the schema-mismatch tab's "Migrate to vN" costs the admin
#: (``inbox._migration_offers``: ``selectors.kind_usage``'s grouped queries and the
#: tenant's declared kinds), and nothing for anyone else or on any other tab.
MIGRATION_OFFER_QUERIES = 3


def test_the_migration_offer_costs_the_admin_a_fixed_number_of_queries_on_one_tab(
        acme, wendy, rita, adam):
    """Issue 19, item 2: the offer needs ``kind_usage``; only the admin's
    ``schema_mismatch`` tab computes it, in a number of queries that does not grow with
    the runs (pages and fragments alike)."""
    admin, reviewer = Client(), Client()
    admin.force_login(adam)
    reviewer.force_login(rita)
    _mismatched(wendy, acme, 3)
    tab = "/t/acme/?state=schema_mismatch"
    for c in (admin, reviewer):
        c.get("/t/acme/")
    asks = (("admin", admin, tab, {}), ("reviewer", reviewer, tab, {}),
            ("admin-htmx", admin, tab, {"HTTP_HX_REQUEST": "true"}),
            ("admin-all", admin, "/t/acme/?state=all", {}),
            ("reviewer-all", reviewer, "/t/acme/?state=all", {}))
    few = {name: _queries(lambda c=c, u=u, x=x: c.get(u, **x)) for name, c, u, x in asks}
    assert "Migrate to v2" in admin.get(tab).content.decode()
    _mismatched(wendy, acme, 40)
    many = {name: _queries(lambda c=c, u=u, x=x: c.get(u, **x)) for name, c, u, x in asks}
    assert many == few
    assert few["admin"] - few["reviewer"] == MIGRATION_OFFER_QUERIES, few
    assert few["admin-all"] == few["reviewer-all"], few
    print(f"\ninbox queries: {few}")
