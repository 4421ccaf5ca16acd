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
