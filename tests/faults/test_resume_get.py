"""Issue 5, fault 7: ``GET …/resume`` changes nothing.

After an approved retry, a GET (the runtime's bearer token, or a browser session: a
link, a prefetch, a navigation from another site) answers ``retry`` but consumes no
approval, bumps no fencing token and writes no audit event. Claiming is ``POST …/resume``
with a writer's bearer token, exactly once; a browser session's POST is refused (403)
even with a valid CSRF token.
"""

from __future__ import annotations

import pytest
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from checkpoints import services
from checkpoints.models import AuditEvent, RetryRequest, Run
from tests.api.apihelpers import get, post, snapshot
from tests.helpers import ambiguous_run


@pytest.fixture
def approved(acme, wendy, rita, april):
    """A run swept ambiguous (in flight, owner gone) with a retry approved."""
    run_id = ambiguous_run(wendy, acme)
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="rerun")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    return run_id, retry.pk


def _session(user, csrf_token: str | None = None) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    if csrf_token:
        client.cookies["csrftoken"] = csrf_token
        client.credentials(HTTP_X_CSRFTOKEN=csrf_token)
    return client


def _state(run_id, retry_pk):
    run = Run.objects.get(uuid=run_id)
    return (RetryRequest.objects.get(pk=retry_pk).state, run.fencing_token,
            run.recovery_state, AuditEvent.objects.count())


def test_get_resume_previews_the_retry_and_changes_nothing(approved, api_as, wendy, adam):
    run_id, retry_pk = approved
    before, counts = _state(run_id, retry_pk), snapshot()
    assert before[0] == "approved" and before[2] == "retry_approved"
    prefetch = {"HTTP_SEC_PURPOSE": "prefetch", "HTTP_SEC_FETCH_SITE": "cross-site"}
    for client, extra in ((api_as(wendy), {}), (_session(adam), {}), (_session(adam), prefetch)):
        for _ in range(2):
            r = client.get(f"/api/v1/tenants/acme/runs/{run_id}/resume", **extra)
            assert r.status_code == 200, r.content
            assert (r.json()["action"], r.json()["reason"]) == ("retry", "retry_approved")
            assert r.json()["fencing_token"] == before[1]
    assert _state(run_id, retry_pk) == before
    assert snapshot() == counts


def test_a_browser_sessions_post_resume_is_refused_even_with_csrf(approved, adam):
    run_id, retry_pk = approved
    before, counts = _state(run_id, retry_pk), snapshot()
    token = get_random_string(32)
    r = post(_session(adam, token), "acme", f"runs/{run_id}/resume", {})
    assert r.status_code == 403, r.content
    assert "bearer" in r.json()["detail"]
    assert _state(run_id, retry_pk) == before
    assert snapshot() == counts


def test_the_writers_bearer_post_claims_the_retry_exactly_once(approved, api_as, wendy):
    run_id, retry_pk = approved
    _, token_before, _, events = _state(run_id, retry_pk)
    client = api_as(wendy)

    r = post(client, "acme", f"runs/{run_id}/resume", {})

    assert r.status_code == 200, r.content
    assert (r.json()["action"], r.json()["fencing_token"]) == ("retry", token_before + 1)
    retry = RetryRequest.objects.get(pk=retry_pk)
    assert (retry.state, retry.consumed_fencing_token) == ("consumed", token_before + 1)
    assert AuditEvent.objects.filter(action="retry.consume").count() == 1
    assert AuditEvent.objects.count() == events + 1
    # A second claim (or a preview) finds nothing left to consume.
    again = post(client, "acme", f"runs/{run_id}/resume", {}).json()
    preview = get(client, "acme", f"runs/{run_id}/resume").json()
    assert again["action"] != "retry" and preview["action"] != "retry"
    assert again["fencing_token"] == token_before + 1
    assert AuditEvent.objects.filter(action="retry.consume").count() == 1
