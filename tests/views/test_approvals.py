"""The approver's queue (issue 21, item 9): open retry requests with their preview, one
decision per row through the services, bulk approve that skips a possible duplicate,
the requester never deciding their own, "next request", and a rejection shown in the
run's header and the inbox."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints import services
from checkpoints.exceptions import PossibleDuplicate
from checkpoints.models import AuditEvent, RetryRequest
from checkpoints.vocab import AuditAction, RetryState
from tests.helpers import ambiguous_run
from tests.views.conftest import make_stuck_run

pytestmark = pytest.mark.django_db


def _duplicate_request(rita, acme, wendy, key="charge:D-1"):
    """A retry request whose retry sends again an effect nobody can tell happened."""
    stuck = make_stuck_run(wendy, acme, order_id=key, key=key)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    return services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id,
                                  reason="charge unconfirmed")


def _clean_request(requester, acme, wendy):
    """A retry request of a run with no side effect: nothing can be sent twice."""
    return services.retry_request(actor=requester, tenant=acme,
                                  run_id=ambiguous_run(wendy, acme), reason="re-run the step")


def test_the_queue_lists_open_requests_with_their_preview_and_duplicates(
        login, acme, rita, april, wendy):
    dup = _duplicate_request(rita, acme, wendy)
    clean = _clean_request(rita, acme, wendy)
    client = login(april)
    client.get("/t/acme/")
    with CaptureQueriesContext(connection) as small:
        page = client.get(reverse("approval_queue", args=["acme"]))
    body = page.content.decode()
    assert page.status_code == 200 and "HX-Request" in page["Vary"]
    assert f'id="retry-{dup.pk}"' in body and f'id="retry-{clean.pk}"' in body
    assert body.index(f'id="retry-{dup.pk}"') < body.index(f'id="retry-{clean.pk}"')  # oldest first
    assert "approval-duplicate" in body and "1 possible duplicate" in body
    assert "charge:D-1" in body  # the preview, folded in
    assert 'href="/t/acme/approvals/"' in body  # the nav link, for an approver
    # Two more requests cost no more queries.
    for i in range(2):
        _duplicate_request(rita, acme, wendy, key=f"charge:D-{i + 2}")
    with CaptureQueriesContext(connection) as more:
        client.get(reverse("approval_queue", args=["acme"]))
    assert len(more.captured_queries) == len(small.captured_queries)


def test_bulk_approve_skips_a_possible_duplicate_and_says_so(login, acme, rita, april, wendy):
    dup = _duplicate_request(rita, acme, wendy)
    clean = _clean_request(rita, acme, wendy)
    response = login(april).post(reverse("approval_bulk", args=["acme"]),
                                 {"retry": [dup.pk, clean.pk], "reason": "outage fixed"},
                                 follow=True)
    body = response.content.decode()
    assert response.status_code == 200
    assert f"Approved 1 request: #{clean.pk}" in body
    assert f"#{dup.pk} (possible duplicate: approve it on its own row)" in body
    assert RetryRequest.objects.get(pk=clean.pk).state == RetryState.APPROVED
    assert RetryRequest.objects.get(pk=dup.pk).state == RetryState.REQUESTED
    assert AuditEvent.objects.filter(action=AuditAction.RETRY_APPROVE).count() == 1
    # On its own row it is approved, accepting the duplicate.
    response = login(april).post(reverse("approval_decide", args=["acme", dup.pk]),
                                 {"decision": "approve", "reason": "gateway dedupes"})
    assert response.status_code == 303
    assert RetryRequest.objects.get(pk=dup.pk).state == RetryState.APPROVED


def test_the_service_refuses_a_duplicate_when_asked_to_under_the_lock(acme, rita, april, wendy):
    dup = _duplicate_request(rita, acme, wendy)
    before = AuditEvent.objects.count()
    with pytest.raises(PossibleDuplicate):
        services.retry_approve(actor=april, tenant=acme, retry_id=dup.pk, reason="x",
                               refuse_duplicate=True)
    assert RetryRequest.objects.get(pk=dup.pk).state == RetryState.REQUESTED
    assert AuditEvent.objects.count() == before


def test_the_requester_cannot_approve_their_own_request(login, acme, adam, april, wendy):
    own = _clean_request(adam, acme, wendy)  # the admin reviews and approves
    client = login(adam)
    body = client.get(reverse("approval_queue", args=["acme"])).content.decode()
    assert "Your own request: another approver decides" in body
    assert f'id="f-queue-{own.pk}"' not in body and f'value="{own.pk}" form="bulk-approve"' not in body
    before = AuditEvent.objects.count()
    refused = client.post(reverse("approval_decide", args=["acme", own.pk]),
                          {"decision": "approve", "reason": "mine"})
    assert refused.status_code == 403
    response = client.post(reverse("approval_bulk", args=["acme"]),
                           {"retry": [own.pk], "reason": "mine"}, follow=True)
    assert "may not decide their own" in response.content.decode()
    assert RetryRequest.objects.get(pk=own.pk).state == RetryState.REQUESTED
    assert AuditEvent.objects.count() == before
    # Another approver may.
    login(april).post(reverse("approval_decide", args=["acme", own.pk]),
                      {"decision": "approve", "reason": "fine"})
    assert RetryRequest.objects.get(pk=own.pk).state == RetryState.APPROVED


def test_after_a_decision_the_queue_points_at_the_next_request(login, acme, rita, april, wendy):
    first = _clean_request(rita, acme, wendy)
    second = _clean_request(rita, acme, wendy)
    client = login(april)
    response = client.post(reverse("approval_decide", args=["acme", first.pk]),
                           {"decision": "reject", "reason": "not yet"})
    assert response["Location"] == f"/t/acme/approvals/#retry-{second.pk}"
    body = client.get(response["Location"]).content.decode()
    assert f"Retry request #{first.pk} rejected. Next request: #{second.pk}." in body
    response = client.post(reverse("approval_decide", args=["acme", second.pk]),
                           {"decision": "approve", "reason": "ok"})
    assert response["Location"] == "/t/acme/approvals/"
    body = client.get(response["Location"]).content.decode()
    assert "No other request awaits your decision." in body
    assert "No retry request awaits a decision." in body


def test_a_rejection_shows_in_the_run_header_and_the_inbox(login, acme, rita, april, wendy):
    retry = _duplicate_request(rita, acme, wendy)
    login(april).post(reverse("approval_decide", args=["acme", retry.pk]),
                      {"decision": "reject", "reason": "refund by hand instead"})
    client = login(rita)
    run = retry.run
    body = client.get(reverse("run_detail", args=["acme", run.uuid])).content.decode()
    assert 'id="retry-rejected"' in body and "rejected by <strong>april</strong>" in body
    assert "refund by hand instead" in body
    inbox = client.get(reverse("run_list", args=["acme"]), {"state": "unknown_outcome"})
    assert "retry rejected" in inbox.content.decode() and "by april" in inbox.content.decode()
    # A newer request replaces the note.
    services.retry_request(actor=rita, tenant=acme, run_id=run.uuid, reason="again")
    body = client.get(reverse("run_detail", args=["acme", run.uuid])).content.decode()
    assert 'id="retry-rejected"' not in body


@pytest.mark.parametrize("who,status", [("rita", 403), ("vic", 403), ("omar", 404)])
def test_only_approvers_see_the_queue(request, login, who, status, april):
    user = request.getfixturevalue(who)
    assert login(user).get(reverse("approval_queue", args=["acme"])).status_code == status


def test_the_decision_forms_check_their_fields(login, acme, rita, april, wendy):
    retry = _clean_request(rita, acme, wendy)
    client = login(april)
    url = reverse("approval_decide", args=["acme", retry.pk])
    for data, name in (({"decision": "approve"}, "reason"),
                       ({"decision": "maybe", "reason": "x"}, "decision")):
        response = client.post(url, data)
        assert response.status_code == 400 and name in response.content.decode()
    bulk = reverse("approval_bulk", args=["acme"])
    for data in ({"reason": "x"}, {"retry": ["abc"], "reason": "x"},
                 {"retry": ["1"] * 0, "reason": "x"}):
        response = client.post(bulk, data)
        assert response.status_code == 400 and "retry" in response.content.decode()
    assert RetryRequest.objects.get(pk=retry.pk).state == RetryState.REQUESTED


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_request_decided_first_by_someone_else_says_so_on_the_queue(
        login, acme, rita, april, adam, wendy, decision):
    """(stop 36's newcomer) A decision posted for a request another approver decided
    meanwhile: 422, the queue as it is now with the run page's sentence ("Not done:
    already approved by adam … ago"), not the generic error page with the refusal's raw
    ISO time; nothing written."""
    retry = _clean_request(rita, acme, wendy)
    services.retry_approve(actor=adam, tenant=acme, retry_id=retry.pk, reason="first")
    events = AuditEvent.objects.count()
    response = login(april).post(reverse("approval_decide", args=["acme", retry.pk]),
                                 {"decision": decision, "reason": "second"})
    assert response.status_code == 422
    body = response.content.decode()
    assert 'id="refusal"' in body and "Retry requests to decide" in body
    assert "Not done: already approved by adam" in body and "s ago" in body
    assert "The queue below is as it is now." in body
    assert "T0" not in body.split('id="refusal"')[1].split("</div>")[0]  # no ISO time
    assert AuditEvent.objects.count() == events
    assert RetryRequest.objects.get(pk=retry.pk).state == RetryState.APPROVED
