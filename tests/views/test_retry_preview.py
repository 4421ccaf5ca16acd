"""The retry preview: before a reviewer requests a retry and before an approver approves
it, the run page says what an approved retry will do to each effect, and marks the
possible duplicates the approver accepts."""

from __future__ import annotations

import html
import uuid

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import Run
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect

pytestmark = pytest.mark.django_db


def _page(client, run_id):
    response = client.get(reverse("run_detail", args=["acme", run_id]))
    assert response.status_code == 200
    return response, html.unescape(response.content.decode())


def _preview_rows(body: str) -> list[str]:
    """The ``<tr>`` elements of the preview table."""
    section = body[body.index('id="retry-preview"'):]
    section = section[:section.index("</section>")]
    return [chunk.split("</tr>")[0] for chunk in section.split("<tr")[2:]]


def _mixed_run(acme, wendy):
    """An in-flight run with a confirmed charge and an unknown CRM note, after the sweep:
    a retry replays the one and submits the other again (a possible duplicate)."""
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging",
                                                                  "order_id": "M-1"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:M-1"),
                "submitted", "confirmed")
    note = walk_effect(wendy, acme, effect_body(run_id=run_id, service="crm",
                                                operation_key="note:M-1"), "submitted")
    sweep_later()
    return run_id, note


def test_it_shows_the_reviewer_what_a_retry_will_do_before_requesting_it(
        login, rita, wendy, acme):
    run_id, note = _mixed_run(acme, wendy)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=note.uuid,
                                 reason="the CRM has no look-up")
    response, body = _page(login(rita), run_id)
    assert 'id="f-retry"' in body and 'id="retry-preview"' in body
    run = Run.objects.get(uuid=run_id)
    assert response.context["preview"] == services.retry_preview(run)
    assert response.context["preview_duplicates"] == 1
    rows = _preview_rows(body)
    assert len(rows) == 2
    charge, crm = rows
    assert 'data-outcome="replay_receipt"' in charge and "charge:M-1" in charge
    assert "replays the confirmed receipt" in charge and "row-duplicate" not in charge
    assert 'data-outcome="possible_duplicate"' in crm and 'class="row-duplicate"' in crm
    assert "note:M-1" in crm and "possible duplicate" in crm
    assert "1 effect is submitted again although nobody can tell whether it already" in body
    assert "The approver accepts a possible duplicate." in body


def test_it_shows_the_approver_the_possible_duplicates_before_approving(
        login, rita, april, vic, unknown, acme):
    services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                           reason="worker died mid-charge")
    response, body = _page(login(april), unknown.run_id)
    assert ">Approve<" in body and 'id="retry-preview"' in body
    [row] = _preview_rows(body)
    assert 'class="row-duplicate"' in row and "charge:A-1042" in row
    assert "Approving accepts a possible duplicate." in body
    assert "Approving accepts 1 possible duplicate" in body  # beside the Approve button
    # The preview is shown before a decision, not to whoever has none to make.
    for user in (rita, vic):
        assert 'id="retry-preview"' not in _page(login(user), unknown.run_id)[1], user


def test_it_lists_no_duplicate_when_every_effect_is_settled(login, rita, wendy, acme):
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging",
                                                                  "order_id": "S-1"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:S-1"),
                "submitted", "confirmed")
    sweep_later()
    response, body = _page(login(rita), run_id)
    assert response.context["preview_duplicates"] == 0
    assert "row-duplicate" not in body and "possible duplicate" not in body
    assert [p["outcome"] for p in response.context["preview"]] == ["replay_receipt"]


def test_it_says_a_retry_calls_nothing_twice_for_a_run_without_effects(login, rita, wendy, acme):
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging",
                                                                  "order_id": "N-1"}))
    sweep_later()
    _, body = _page(login(rita), run_id)
    assert 'id="f-retry"' in body
    assert "This run recorded no side effects: a retry re-runs the step" in body


def test_a_completed_run_offers_no_retry_and_no_approval(login, acme, wendy, rita, april,
                                                         unknown):
    """(stop 33, the second attack's finding) A completed run is replayed, never retried
    (``policy.retry_applies``): the run page offered "Request retry" (and its next step
    suggested one) that the service then refused, and an approver was offered an
    Approve that could never be consumed. A request still open on it may be rejected."""
    page_url = reverse("run_detail", args=["acme", unknown.run_id])
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                   reason="stuck")
    put_checkpoint(wendy, acme, envelope(unknown.checkpoint_id, unknown.run_id, 2,
                                         payload={"phase": "completed", "order_id": "A-1042"}),
                   expected=1)
    page = html.unescape(login(april).get(page_url).content.decode())
    assert f'id="f-decide-{retry.pk}"' in page and ">Approve</button>" not in page
    assert "the run completed: replayed, never retried" in page and ">Reject</button>" in page
    services.retry_reject(actor=april, tenant=acme, retry_id=retry.pk, reason="moot")
    page = html.unescape(login(rita).get(page_url).content.decode())
    assert Run.objects.get(uuid=unknown.run_id).recovery_state == "unknown_outcome"
    assert 'id="f-retry"' not in page
    assert "No retry: the run completed; a completed run is replayed, never retried." in page
    assert "find out with the service, then close the run" in page
    assert "request a retry (accepts a possible duplicate)" not in page
