"""The run page reads one moment (``selectors.consistent_read`` around the run page's
context): a reconcile job that a worker finished while the page was being read must not
show "done" in the Reconciliation section beside an effect still in doubt and a next
step of "Reconcile first" (the recon newcomer's finding: the reconcile action's answer
with a real Celery worker; a reload fixed it). The worker is a thread on its own
connection, committing between the page's queries (SQLite: trying to). SQLite and
PostgreSQL."""

from __future__ import annotations

import html
import re
import threading

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from checkpoints import selectors
from checkpoints.jobs import reconciliation
from checkpoints.models import Effect, ReconcileRequest
from checkpoints.services import reconcile_requests
from tests.faults import stubs
from tests.faults.conftest import in_doubt_run
from tests.helpers import age_world

pytestmark = pytest.mark.django_db(transaction=True)
#: How long the page waits for the worker to finish before reading the requests: ample
#: for it to commit when nothing holds it out (it took ~0.1 s here).
WAIT_S = 5


def _worker(pk: int) -> threading.Thread:
    """The Celery worker: the job on its own connection, committed when it ends."""
    def run():
        try:
            reconciliation.execute(pk)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_job_finishing_between_the_pages_reads_shows_one_moment(acme, wendy, rita,
                                                                   monkeypatch):
    stubs.use_plugin(acme, "payments", "tests.faults.stubs.CountingPlugin")
    monkeypatch.setattr(stubs.CountingPlugin, "lookups", {})
    run = in_doubt_run(wendy, acme, keys=("charge:snap-1",))
    age_world(3600)
    # The broker takes the job (nothing runs in this process) ...
    monkeypatch.setattr(reconcile_requests, "dispatch",
                        lambda pks, **kw: reconcile_requests.Sent(True, ""))
    # ... and its worker finishes it after the page read the effects, before the requests.
    # On PostgreSQL the page's snapshot does not stop the worker, which commits; on
    # SQLite the page's read transaction holds the writer out until it ends (the wait).
    read_requests = selectors.reconcile_requests
    workers = []

    def worker_finishes_first(**kwargs):
        for req in ReconcileRequest.objects.filter(run__uuid=run.run_id, state="queued"):
            workers.append(_worker(req.pk))
            workers[-1].join(timeout=WAIT_S)
        return read_requests(**kwargs)

    monkeypatch.setattr(selectors, "reconcile_requests", worker_finishes_first)
    client = Client()
    client.force_login(rita)
    response = client.post(reverse("run_reconcile", args=["acme", str(run.run_id)]),
                           {"reason": "worker died"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    for worker in workers:
        worker.join(timeout=60)
        assert not worker.is_alive(), "the worker is stuck"
    assert len(workers) == 1
    effect = Effect.objects.get(uuid=run.effects["charge:snap-1"])
    assert effect.state == "confirmed"  # the worker did finish, during the page
    body = html.unescape(response.content.decode())
    request_state = re.search(r'class="reconcile-request" id="reconcile-\d+" data-state="(\w+)"',
                              body).group(1)
    row = body[body.index(f'id="effect-{effect.uuid}"'):]
    effect_shown = re.search(r'<span class="badge badge-\w+">([^<]+)</span>', row).group(1)
    step = "Reconcile first" in body  # the next step (the run body's header)
    # One moment: the job queued, the effect in doubt, reconcile pending; or all done.
    # Before the snapshot: "done" beside "submitted" and "Reconcile first".
    if request_state == "done":
        assert effect_shown == "confirmed" and not step, (effect_shown, step)
    else:
        assert effect_shown != "confirmed", (request_state, effect_shown, step)
    assert request_state != "done"  # the page's snapshot is the one before the worker's
