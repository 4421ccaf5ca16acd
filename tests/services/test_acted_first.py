"""Issue 9, item 4 and 5 (services): a review action refused because someone acted
first says who and when (``AlreadyDone``, read inside the refusing transaction, nothing
written); and a reviewer may withdraw their own open retry request."""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.exceptions import AlreadyDone, Forbidden, InvalidTransition, ReasonRequired
from checkpoints.models import AuditEvent, Conflict, RetryRequest, Run
from tests.api.apihelpers import snapshot
from tests.helpers import (
    ambiguous_run,
    effect_body,
    envelope,
    put_checkpoint,
    sweep_later,
    walk_effect,
)


@pytest.fixture
def run_id(acme, wendy):
    return ambiguous_run(wendy, acme)


@pytest.fixture
def retry(acme, rita, run_id):
    return services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")


def _refused(call, acme) -> AlreadyDone:
    """Run ``call``; it must raise ``AlreadyDone`` (a 422 ``InvalidTransition``) and write
    nothing."""
    before = snapshot()
    with pytest.raises(AlreadyDone) as caught:
        call()
    assert snapshot() == before
    assert isinstance(caught.value, InvalidTransition) and caught.value.status == 422
    return caught.value


def test_approving_a_decided_request_names_the_approver_and_when(acme, rita, april, adam,
                                                                 retry, run_id):
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    decided_at = RetryRequest.objects.get().decided_at
    for decide in (services.retry_approve, services.retry_reject):
        exc = _refused(lambda d=decide: d(actor=adam, tenant=acme, retry_id=retry.pk,
                                          reason="me too"), acme)
        assert (exc.what, exc.by, exc.at, exc.run_id) == ("approved", "april", decided_at,
                                                          run_id)
        assert exc.body() == {"error": "invalid_transition",
                              "detail": f"state: already approved by april at "
                                        f"{decided_at.isoformat()}"}


def test_a_rejected_request_names_who_rejected_it(acme, rita, april, adam, retry):
    services.retry_reject(actor=april, tenant=acme, retry_id=retry.pk, reason="no")
    exc = _refused(lambda: services.retry_approve(actor=adam, tenant=acme, retry_id=retry.pk,
                                                  reason="yes"), acme)
    assert (exc.what, exc.by) == ("rejected", "april")


def test_a_second_retry_request_names_the_open_one(acme, rita, adam, retry, run_id):
    exc = _refused(lambda: services.retry_request(actor=adam, tenant=acme, run_id=run_id,
                                                  reason="again"), acme)
    assert (exc.what, exc.by, exc.at) == ("requested", "rita", retry.created_at)
    assert "a retry request is already open, requested by rita" in exc.detail


def test_closing_a_closed_run_names_who_closed_it(acme, rita, adam, run_id):
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="by phone")
    closed_at = Run.objects.get().closed_at
    exc = _refused(lambda: services.run_close(actor=adam, tenant=acme, run_id=run_id,
                                              reason="also"), acme)
    assert (exc.what, exc.by, exc.at) == ("closed", "rita", closed_at)


def test_an_expired_request_names_who_closed_the_run(acme, rita, april, adam, retry, run_id):
    services.run_close(actor=adam, tenant=acme, run_id=run_id, reason="by phone")
    exc = _refused(lambda: services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk,
                                                  reason="ok"), acme)
    assert exc.what.startswith("expired") and exc.by == "adam"


def _conflicted_run(acme, wendy):
    body = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(services.StaleRevision):
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    return Run.objects.get().uuid


def test_acknowledging_acknowledged_conflicts_only_open_names_who(acme, wendy, rita, adam):
    rid = _conflicted_run(acme, wendy)
    assert services.conflicts_acknowledge(actor=rita, tenant=acme, run_id=rid, reason="seen",
                                          only_open=True) == 1
    acked_at = Conflict.objects.get().acknowledged_at
    exc = _refused(lambda: services.conflicts_acknowledge(
        actor=adam, tenant=acme, run_id=rid, reason="seen too", only_open=True), acme)
    assert (exc.what, exc.by, exc.at) == ("acknowledged", "rita", acked_at)
    # The API's call stays idempotent (0 acknowledged, audited as before).
    assert services.conflicts_acknowledge(actor=adam, tenant=acme, run_id=rid,
                                          reason="api") == 0


def test_marking_a_settled_effect_unknown_names_who_settled_it(acme, wendy, rita, adam):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    effect = walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted")
    sweep_later()
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid, reason="?")
    exc = _refused(lambda: services.effect_mark_unknown(
        actor=adam, tenant=acme, effect_id=effect.uuid, reason="??"), acme)
    assert (exc.what, exc.by) == ("marked unknown", "rita") and exc.at is not None


# --------------------------------------------------------------------------------------
# Withdraw (item 5)
# --------------------------------------------------------------------------------------

def test_the_requester_withdraws_an_open_request_and_the_run_leaves_awaiting_approval(
        acme, rita, retry, run_id):
    assert Run.objects.get().recovery_state == "awaiting_approval"
    out = services.retry_withdraw(actor=rita, tenant=acme, retry_id=retry.pk,
                                  reason="handled by phone")
    row = RetryRequest.objects.get()
    assert (out.state, row.state, row.decided_by, row.decision_reason) == (
        "withdrawn", "withdrawn", None, "handled by phone")
    assert row.decided_at is not None
    assert Run.objects.get().recovery_state == "ambiguous"
    event = AuditEvent.objects.get(action="retry.withdraw")
    assert (event.actor_name, event.target_ref, event.reason) == ("rita", str(retry.pk),
                                                                 "handled by phone")
    assert event.before == {"state": "requested", "recovery_state": "awaiting_approval"}
    assert event.after == {"state": "withdrawn", "recovery_state": "ambiguous"}
    # A new request may follow (the open-request constraint counts only open ones).
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="again")


def test_only_the_requester_may_withdraw(acme, adam, april, retry):
    before = snapshot()
    with pytest.raises(Forbidden):  # an admin (reviewer rights) but not the requester
        services.retry_withdraw(actor=adam, tenant=acme, retry_id=retry.pk, reason="x")
    with pytest.raises(Forbidden):  # an approver has no reviewer right at all
        services.retry_withdraw(actor=april, tenant=acme, retry_id=retry.pk, reason="x")
    assert snapshot() == before


def test_a_decided_or_withdrawn_request_cannot_be_withdrawn(acme, rita, april, retry):
    with pytest.raises(ReasonRequired):
        services.retry_withdraw(actor=rita, tenant=acme, retry_id=retry.pk, reason="  ")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    exc = _refused(lambda: services.retry_withdraw(actor=rita, tenant=acme,
                                                   retry_id=retry.pk, reason="x"), acme)
    assert (exc.what, exc.by) == ("approved", "april")


def test_withdrawing_twice_names_the_first_withdrawal(acme, rita, april, retry):
    services.retry_withdraw(actor=rita, tenant=acme, retry_id=retry.pk, reason="x")
    exc = _refused(lambda: services.retry_withdraw(actor=rita, tenant=acme,
                                                   retry_id=retry.pk, reason="x"), acme)
    assert (exc.what, exc.by) == ("withdrawn", "rita")
    # and an approver arriving late is told too
    exc = _refused(lambda: services.retry_approve(actor=april, tenant=acme,
                                                  retry_id=retry.pk, reason="ok"), acme)
    assert (exc.what, exc.by) == ("withdrawn", "rita")
