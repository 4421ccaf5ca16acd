"""Every GET of the dashboard is write-free, whoever asks and whatever the run's state
(reconcile history, gave up, owner live, closed, awaiting approval); and every response
that depends on ``HX-Request`` says so with ``Vary: HX-Request``."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints import services
from checkpoints.models import ReconcileAttempt, ReconcileRequest
from checkpoints.reconcile import Answer
from tests.views.conftest import make_stuck_run, reconcile
from tests.views.test_access import REASON, _snapshot

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "f-x"}
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


@pytest.fixture
def world(acme, rita, april, wendy, scripted, settings):
    """Runs in every state the new sections show; returns their ids."""
    settings.RECOVERY_RECONCILE_MAX_FAILURES = 1
    # Every stuck run first: each one's sweep ages the whole world by an hour.
    reconciled, gave_up, owned, closed, awaiting = (
        make_stuck_run(wendy, acme, order_id=f"{p}-1", key=f"charge:{p}-1") for p in "RGOCW")
    reconcile(rita, acme, reconciled.run_id)  # found: confirmed, with evidence
    scripted.answers = [Answer.cannot_tell("payments: HTTP 503")]
    reconcile(rita, acme, gave_up.run_id)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=owned.run_id, owner="worker-7",
                           ttl_s=600)
    services.run_close(actor=rita, tenant=acme, run_id=closed.run_id, reason="by hand")
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=awaiting.effect_id,
                                 reason="no lookup")
    services.retry_request(actor=rita, tenant=acme, run_id=awaiting.run_id, reason="retry")
    states = dict(ReconcileRequest.objects.values_list("run__uuid", "state"))
    assert states == {reconciled.run_id: "done", gave_up.run_id: "gave_up"}
    return [s.run_id for s in (reconciled, gave_up, owned, closed, awaiting)]


def _pages(run_ids):
    urls = [reverse("run_list", args=["acme"]), reverse("run_counts", args=["acme"]),
            reverse("report", args=["acme"]), reverse("audit_log", args=["acme"]),
            reverse("kind_list", args=["acme"])]
    urls += [reverse("run_list", args=["acme"]) + f"?state={s}"
             for s in ("closed", "ambiguous", "awaiting_approval", "all")]
    for run_id in run_ids:
        urls += [reverse("run_detail", args=["acme", run_id]),
                 reverse("run_audit", args=["acme", run_id])]
    return urls


def test_it_writes_nothing_on_any_get_for_any_role(login, rita, april, vic, adam, acme, world):
    clients = [login(user) for user in (rita, april, vic, adam)]
    for client in clients:  # a session's first request may do its own bookkeeping
        client.get(reverse("run_list", args=["acme"]))
    before = _snapshot(acme)
    for client in clients:
        for url in _pages(world):
            for extra in ({}, HTMX):
                with CaptureQueriesContext(connection) as ctx:
                    response = client.get(url, **extra)
                assert response.status_code == 200, url
                writes = [q["sql"] for q in ctx.captured_queries
                          if q["sql"].lstrip().upper().startswith(WRITES)]
                assert writes == [], (url, writes)
    assert _snapshot(acme) == before


def test_it_varies_every_page_and_fragment_on_hx_request(login, rita, vic, world):
    for client in (login(rita), login(vic)):
        for url in _pages(world):
            for extra in ({}, HTMX):
                response = client.get(url, **extra)
                assert "HX-Request" in response.get("Vary", ""), url


def test_it_varies_action_answers_and_errors_on_hx_request(login, rita, vic, acme, world):
    reconciled, gave_up, owned, closed, awaiting = world
    evidence = ReconcileAttempt.objects.filter(answer="found").first()
    reveal = reverse("reconcile_evidence_reveal", args=["acme", evidence.pk])
    answers = [  # (user, url, data, status)
        (rita, reveal, REASON, 200),
        (vic, reveal, REASON, 403),
        (rita, reverse("run_reconcile", args=["acme", owned]), REASON, 409),
        (rita, reverse("run_close", args=["acme", closed]), {**REASON, "confirm": "yes"}, 422),
        (rita, reverse("run_close", args=["acme", reconciled]), {"reason": "x"}, 400),
    ]
    for user, url, data, status in answers:
        for extra in ({}, HTMX):
            response = login(user).post(url, data, **extra)
            assert response.status_code == status, (url, extra)
            assert "HX-Request" in response.get("Vary", ""), (url, extra)
    # Successful actions: the run body for htmx, a redirect otherwise.
    close = {"reason": "done", "confirm": "yes"}
    response = login(rita).post(reverse("run_close", args=["acme", reconciled]), close, **HTMX)
    assert response.status_code == 200 and "HX-Request" in response["Vary"]
    response = login(rita).post(reverse("run_close", args=["acme", gave_up]), close)
    assert response.status_code == 303 and "HX-Request" in response["Vary"]


def test_it_varies_the_expired_session_answers_on_hx_request(client, acme):
    url = reverse("run_list", args=["acme"])
    assert "HX-Request" in client.get(url)["Vary"]  # 302 to the login page
    assert "HX-Request" in client.get(url, HTTP_HX_REQUEST="true")["Vary"]  # HX-Redirect


def test_the_migration_pages_write_nothing_for_any_role(login, rita, april, vic, adam, acme,
                                                        world):
    """The Kinds page, a declaration, the admin's preview (a dry run: no lock, no audit
    event) and a job's page, page and htmx fragment: write-free, and ``Vary``."""
    import uuid

    from tests.twinworld import declared_kind

    services.kind_declare(actor=None, tenant=acme, kind="acme.ticket", version=1,
                          body=declared_kind("reads"))
    job, _ = services.migration_job_submit(actor=adam, tenant=acme, kind="acme.order",
                                           to_version=2, client_token=uuid.uuid4())
    urls = [reverse("kind_list", args=["acme"]),
            reverse("kind_version", args=["acme", "acme.ticket", 1]),
            reverse("migration_detail", args=["acme", "acme.order", job.uuid]),
            reverse("migration_preview", args=["acme", "acme.order"]) + "?to=2",
            reverse("migration_preview", args=["acme", "acme.order"]) + "?to=1&reverse=1"]
    clients = {user: login(user) for user in (rita, april, vic, adam)}
    for client in clients.values():
        client.get(reverse("run_list", args=["acme"]))
    before = _snapshot(acme)
    for user, client in clients.items():
        for url in urls:
            for extra in ({}, HTMX):
                with CaptureQueriesContext(connection) as ctx:
                    response = client.get(url, **extra)
                admin_only = "/migrate/" in url
                assert response.status_code == (200 if user == adam or not admin_only
                                                else 403), (user, url)
                assert "HX-Request" in response.get("Vary", ""), url
                writes = [q["sql"] for q in ctx.captured_queries
                          if q["sql"].lstrip().upper().startswith(WRITES)]
                assert writes == [], (url, writes)
    assert _snapshot(acme) == before
