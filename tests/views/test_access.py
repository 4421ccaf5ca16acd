"""Tenant isolation and roles on every dashboard URL (CONTRACT.md 3 and 4).

omar (reviewer of globex) gets 404 for every acme page and action and changes nothing;
vic (viewer of acme) sees pages, no action buttons, and gets 403 on every action.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import (
    AuditEvent,
    Conflict,
    Effect,
    ReconcileAttempt,
    ReconcileRequest,
    RetryRequest,
    Run,
)

pytestmark = pytest.mark.django_db

REASON = {"reason": "looked at it"}


@pytest.fixture
def retry(unknown, acme, rita):
    return services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                  reason="worker died mid-charge")


def _pages(slug, stuck):
    return [
        reverse("run_list", args=[slug]),
        reverse("run_counts", args=[slug]),
        reverse("report", args=[slug]),
        reverse("audit_log", args=[slug]),
        reverse("kind_list", args=[slug]),
        reverse("run_detail", args=[slug, stuck.run_id]),
        reverse("run_audit", args=[slug, stuck.run_id]),
    ]


def _actions(slug, stuck, retry):
    return [
        (reverse("run_retry_request", args=[slug, stuck.run_id]), REASON),
        (reverse("run_reconcile", args=[slug, stuck.run_id]), REASON),
        (reverse("conflicts_acknowledge", args=[slug, stuck.run_id]), REASON),
        (reverse("retry_approve", args=[slug, retry.pk]), REASON),
        (reverse("retry_reject", args=[slug, retry.pk]), REASON),
        (reverse("effect_mark_unknown", args=[slug, stuck.effect_id]),
         {**REASON, "confirm": "yes"}),
        (reverse("checkpoint_reveal", args=[slug, stuck.checkpoint_id]), REASON),
        (reverse("checkpoint_diff", args=[slug, stuck.checkpoint_id]),
         {**REASON, "from_rev": 0, "to_rev": 1}),
        (reverse("run_close", args=[slug, stuck.run_id]), {**REASON, "confirm": "yes"}),
    ]


def _snapshot(acme):
    return (
        AuditEvent.objects.filter(tenant=acme).count(),
        list(RetryRequest.objects.values_list("pk", "state")),
        list(Effect.objects.values_list("pk", "state", "revision")),
        list(Run.objects.values_list("pk", "recovery_state", "fencing_token", "closed_at")),
        list(Conflict.objects.values_list("pk", "acknowledged_at")),
        list(ReconcileRequest.objects.values_list("pk", "state", "attempts")),
        ReconcileAttempt.objects.count(),
    )


def test_it_answers_404_for_every_acme_page_to_another_tenants_reviewer(login, omar, stuck, retry):
    client = login(omar)
    for url in _pages("acme", stuck):
        assert client.get(url).status_code == 404, url
        assert client.get(url, HTTP_HX_REQUEST="true").status_code == 404, url


def test_it_answers_404_for_acme_objects_under_omars_own_tenant(login, omar, stuck, retry):
    client = login(omar)
    for url in _pages("globex", stuck)[5:]:  # the object pages (past the tenant pages)
        assert client.get(url).status_code == 404, url
    for url, data in _actions("globex", stuck, retry):
        # omar may not approve in globex at all: the role check (403) comes before any
        # lookup, so the answer still says nothing about acme's retry request.
        expected = 403 if "/retry-requests/" in url else 404
        assert client.post(url, data).status_code == expected, url


def test_it_answers_404_and_changes_nothing_for_every_acme_action_by_omar(
        login, omar, stuck, retry, acme):
    before = _snapshot(acme)
    client = login(omar)
    for url, data in _actions("acme", stuck, retry):
        assert client.post(url, data).status_code == 404, url
        assert client.post(url, data, HTTP_HX_REQUEST="true").status_code == 404, url
    assert _snapshot(acme) == before


def test_it_shows_the_viewer_pages_but_no_action_buttons(login, vic, stuck, retry):
    client = login(vic)
    for url in _pages("acme", stuck):
        assert client.get(url).status_code == 200, url
    body = client.get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    for word in ("Request retry", "Approve", "Reject", "Mark outcome unknown", "Reconcile",
                 "Acknowledge", "Reveal payload", "Show diff", "Close run",
                 'method="post" action="/t/'):
        assert word not in body, word
    assert "can look but not act" in body


def test_it_answers_403_to_the_viewer_on_every_action_and_changes_nothing(
        login, vic, stuck, retry, acme):
    before = _snapshot(acme)
    client = login(vic)
    for url, data in _actions("acme", stuck, retry):
        response = client.post(url, data)
        assert response.status_code == 403, url
        assert b"does not allow" in response.content
    assert _snapshot(acme) == before


def test_it_refuses_get_on_actions(login, rita, acme, stuck, retry):
    client = login(rita)
    before = _snapshot(acme)
    for url, _ in _actions("acme", stuck, retry):
        assert client.get(url).status_code == 405, url
    assert _snapshot(acme) == before


def test_it_shows_reviewers_their_buttons_and_not_the_approvers(login, rita, stuck, acme):
    client = login(rita)
    body = client.get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    assert "Reconcile" in body and "Mark outcome unknown" in body
    assert "Reveal payload" in body and "Show diff" in body
    assert ">Approve<" not in body
    # An effect is in doubt: no retry until it is reconciled or marked unknown.
    assert "Request retry" not in body
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    body = client.get(reverse("run_detail", args=["acme", stuck.run_id])).content.decode()
    assert "Request retry" in body


def test_it_hides_approve_from_the_requester_even_when_they_can_approve(
        login, adam, april, unknown, acme):
    services.retry_request(actor=adam, tenant=acme, run_id=unknown.run_id, reason="admin asks")
    url = reverse("run_detail", args=["acme", unknown.run_id])
    own = login(adam).get(url).content.decode()
    assert ">Approve<" not in own and "another approver decides" in own
    assert ">Approve<" in login(april).get(url).content.decode()


def test_it_refuses_an_approval_of_ones_own_request_even_when_posted(login, adam, unknown, acme):
    retry = services.retry_request(actor=adam, tenant=acme, run_id=unknown.run_id,
                                   reason="admin asks")
    response = login(adam).post(reverse("retry_approve", args=["acme", retry.pk]), REASON)
    assert response.status_code == 403
    retry.refresh_from_db()
    assert retry.state == "requested"


def test_it_enforces_csrf_on_session_posts(login, rita, april, stuck, retry, acme):
    before = _snapshot(acme)
    for user, (url, data) in [(rita, _actions("acme", stuck, retry)[0]),
                              (april, _actions("acme", stuck, retry)[3]),
                              (rita, _actions("acme", stuck, retry)[6])]:
        response = login(user, csrf=True).post(url, data)
        assert response.status_code == 403, url
    assert _snapshot(acme) == before


# --- migrations (issue 19, item 2): the preview and its confirm are the tenant admin's --------


@pytest.fixture
def migration_job(acme, adam, stuck):
    import uuid

    job, _ = services.migration_job_submit(actor=adam, tenant=acme, kind="acme.order",
                                           to_version=2, client_token=uuid.uuid4())
    return job


def test_the_migration_preview_and_confirm_are_the_admins_and_the_job_any_roles(
        login, adam, rita, april, vic, omar, acme, migration_job):
    import uuid

    preview = reverse("migration_preview", args=["acme", "acme.order"]) + "?to=2"
    confirm = reverse("migration_submit", args=["acme", "acme.order"])
    job = reverse("migration_detail", args=["acme", "acme.order", migration_job.uuid])
    form = {"to": "2", "client_token": str(uuid.uuid4())}
    clients = {user: login(user) for user in (adam, rita, april, vic, omar)}
    before = _snapshot(acme)
    for user in (rita, april, vic):
        response = clients[user].get(preview)
        assert response.status_code == 403 and b"does not allow" in response.content
        assert clients[user].post(confirm, form).status_code == 403
        assert clients[user].get(job).status_code == 200
    for url in (preview, job):
        assert clients[omar].get(url).status_code == 404, url
        assert clients[omar].get(url, HTTP_HX_REQUEST="true").status_code == 404, url
    assert clients[omar].post(confirm, form).status_code == 404
    assert clients[adam].get(confirm).status_code == 405
    assert _snapshot(acme) == before
    assert clients[adam].get(preview).status_code == 200
    assert clients[adam].get(job).status_code == 200
    assert clients[adam].post(confirm, form).status_code == 303
