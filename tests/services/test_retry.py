"""Retry requests: a reviewer asks, a *different* approver decides (four eyes), in the
service and in the database (``retry_requester_is_not_approver``)."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from checkpoints import selectors, services
from checkpoints.exceptions import (
    Forbidden,
    InvalidTransition,
    NotFound,
    OwnerLive,
    ReasonRequired,
)
from checkpoints.models import AuditEvent, Effect, RetryRequest, Run
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


@pytest.mark.parametrize("decided", [False, True])
def test_a_run_that_completes_with_an_open_retry_reads_completed(acme, wendy, rita, april,
                                                                 decided):
    """(stop 33) The runtime finished on its own after a retry was requested (or
    approved): a completed run is replayed, never retried (``policy.retry_applies``), so
    the run read "retry approved, waiting for the runtime" for ever and the request sat
    in the approvers' queue, approvable for nothing. Now the run reads completed, the
    request leaves the queue and cannot be approved, and no new one is taken. The
    request stays open, not expired: when the runtime writes on (a run's phase is its
    latest write's), it counts again. The completing write is an update: PostgreSQL's
    SQL path."""
    body = envelope(payload={"phase": "charging", "order_id": "A-1042"})
    put_checkpoint(wendy, acme, body)
    sweep_later()
    run_id = uuid.UUID(body["run_id"])
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    if decided:
        services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    waiting = "retry_approved" if decided else "awaiting_approval"
    assert Run.objects.get().recovery_state == waiting
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "completed",
                                                                "order_id": "A-1042"}),
                   expected=0)
    run = Run.objects.get()
    assert (run.recovery_state, run.recovery_reason) == ("completed", "")
    assert selectors.approval_queue(user=april, tenant=acme).rows == []
    if not decided:
        with pytest.raises(InvalidTransition, match="completed"):
            services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    assert services.resume_claim(actor=wendy, tenant=acme, run_id=run_id,
                                 asked={})["action"] == "replay"
    retry.refresh_from_db()
    assert retry.state == ("approved" if decided else "requested")  # open, not consumed
    # The runtime writes on: the run is in flight again and the request counts again.
    put_checkpoint(wendy, acme, dict(body, revision=2, payload={"phase": "shipping",
                                                                "order_id": "A-1042"}),
                   expected=1)
    assert Run.objects.get().recovery_state == waiting


def test_a_completed_run_takes_no_retry_request(acme, wendy, rita, run_id):
    """A completed run (with an unknown effect, so a reviewer still decides it) is
    replayed, never retried: no request is taken, and the run page offers none."""
    Run.objects.filter(uuid=run_id).update(phase_class="completed")
    with pytest.raises(InvalidTransition, match="completed"):
        services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="again")


def test_it_walks_requested_then_approved(acme, rita, april, run_id):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    assert (retry.state, retry.requested_by) == ("requested", rita)
    assert Run.objects.get().recovery_state == "awaiting_approval"
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="looks safe")
    retry.refresh_from_db()
    assert (retry.state, retry.decided_by, retry.decision_reason) == ("approved", april,
                                                                      "looks safe")
    assert Run.objects.get().recovery_state == "retry_approved"
    actions = list(AuditEvent.objects.filter(run_uuid=run_id).order_by("seq")
                   .values_list("action", "actor_name"))
    assert actions[-2:] == [("retry.request", "rita"), ("retry.approve", "april")]


def test_it_rejects_and_closes_the_request(acme, rita, april, run_id):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    services.retry_reject(actor=april, tenant=acme, retry_id=retry.pk, reason="no")
    retry.refresh_from_db()
    assert retry.state == "rejected"
    assert Run.objects.get().recovery_state != "awaiting_approval"
    with pytest.raises(InvalidTransition):
        services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="changed mind")
    # A new request may be opened after a decision (once the run is ambiguous again).
    sweep_later()
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="again")


def test_it_refuses_a_retry_of_a_run_that_needs_no_human(acme, wendy, rita):
    """A retry fences the owner, so a run with a live worker is never retried: 409
    owner_live, as reconcile answers (CONTRACT.md 3; it was 422 "healthy" until a
    newcomer's finding, stop 39). A healthy run whose owner is gone (stable, quiet) is
    refused for its state."""
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                           owner="live-worker", ttl_s=300)
    with pytest.raises(OwnerLive):
        services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                               reason="just because")
    stable = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, stable)
    sweep_later()
    assert Run.objects.get(uuid=stable["run_id"]).recovery_state == "healthy"
    with pytest.raises(InvalidTransition) as exc:
        services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(stable["run_id"]),
                               reason="just because")
    assert "healthy" in exc.value.detail
    assert not RetryRequest.objects.exists()


def test_it_refuses_a_retry_while_an_effect_is_in_doubt(acme, wendy, rita):
    """Reconcile (or mark unknown) first, else the approval would be spent on a resume
    that must stop at the unresolved effect."""
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted")
    sweep_later()
    assert Run.objects.get().recovery_state == "ambiguous"
    with pytest.raises(InvalidTransition) as exc:
        services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                               reason="retry it")
    assert "reconcile" in exc.value.detail
    effect = Effect.objects.get()
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid,
                                 reason="no lookup")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                   reason="accept a possible duplicate")
    assert retry.state == "requested"


def test_it_refuses_the_requester_as_approver_even_with_both_rights(acme, adam, april, run_id):
    retry = services.retry_request(actor=adam, tenant=acme, run_id=run_id, reason="stuck")
    for decide in (services.retry_approve, services.retry_reject):
        with pytest.raises(Forbidden) as exc:
            decide(actor=adam, tenant=acme, retry_id=retry.pk, reason="self")
        assert "requester" in exc.value.detail
    retry.refresh_from_db()
    assert (retry.state, retry.decided_by) == ("requested", None)
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="second pair")


def test_it_refuses_decisions_without_the_approver_role(acme, rita, vic, wendy, omar, run_id):
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    for actor in (rita, vic, wendy):
        with pytest.raises(Forbidden):
            services.retry_approve(actor=actor, tenant=acme, retry_id=retry.pk, reason="x")
    with pytest.raises(NotFound):
        services.retry_approve(actor=omar, tenant=acme, retry_id=retry.pk, reason="x")
    assert RetryRequest.objects.get().state == "requested"


def test_it_refuses_requests_without_the_reviewer_role(acme, april, vic, wendy, run_id):
    for actor in (april, vic, wendy):
        with pytest.raises(Forbidden):
            services.retry_request(actor=actor, tenant=acme, run_id=run_id, reason="x")
    assert not RetryRequest.objects.exists()


def test_it_keeps_one_open_request_per_run(acme, rita, adam, run_id):
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    with pytest.raises(InvalidTransition):
        services.retry_request(actor=adam, tenant=acme, run_id=run_id, reason="me too")
    assert RetryRequest.objects.count() == 1


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_it_requires_a_reason(acme, rita, run_id, reason):
    with pytest.raises(ReasonRequired):
        services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason=reason)
    assert not RetryRequest.objects.exists()


def test_it_refuses_a_retry_of_a_completed_run(acme, wendy, rita):
    body = envelope(payload={"phase": "completed"})
    put_checkpoint(wendy, acme, body)
    before = snapshot()
    with pytest.raises(InvalidTransition):
        services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                               reason="again")
    assert snapshot() == before


def test_it_enforces_four_eyes_in_the_database(acme, rita, run_id):
    """The constraint itself, bypassing the service with a plain SQL UPDATE (PostgreSQL in
    CI; SQLite enforces the same CHECK)."""
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    table = RetryRequest._meta.db_table
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"UPDATE {table} SET decided_by_id = requested_by_id, state = 'approved' "
                    f"WHERE id = %s", [retry.pk])
    retry.refresh_from_db()
    assert retry.decided_by is None


def test_it_enforces_one_open_request_in_the_database(acme, rita, adam, run_id):
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    with pytest.raises(IntegrityError), transaction.atomic():
        RetryRequest.objects.create(tenant=acme, run=Run.objects.get(), requested_by=adam,
                                    reason="bypassing the service")


def test_it_refuses_a_reviewer_who_did_not_request_the_retry(acme, adam, rita, run_id):
    # Four eyes cannot answer for the reviewer here: adam asked, rita only holds the
    # reviewer role, which has no approve right (CONTRACT.md 4), so the role check alone
    # refuses her, with nothing changed.
    retry = services.retry_request(actor=adam, tenant=acme, run_id=run_id, reason="stuck")
    before = snapshot()
    for decide in (services.retry_approve, services.retry_reject):
        with pytest.raises(Forbidden) as exc:
            decide(actor=rita, tenant=acme, retry_id=retry.pk, reason="not mine to decide")
        assert exc.value.status == 403
        assert "requester" not in exc.value.detail
    assert snapshot() == before
    retry.refresh_from_db()
    assert (retry.state, retry.decided_by) == ("requested", None)
