"""Ending a dead owner's lease: ``services.lease_revoke`` (a reviewer who knows the owner
is gone does not wait out a long lease). The old token is fenced from then on, and
reconcile is no longer refused ``owner_live`` for the lease. Time moves with the
``clock`` fixture."""

from __future__ import annotations

import uuid

import pytest

from checkpoints import services
from checkpoints.exceptions import (
    Fenced,
    Forbidden,
    InvalidPayload,
    LeaseHeld,
    NoLiveLease,
    NotFound,
    OwnerLive,
    ReasonRequired,
)
from checkpoints.models import AuditEvent, Checkpoint, Conflict, Run
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect


def _leased_in_flight(wendy, acme, owner="worker-1", ttl_s=3600):
    """A run whose runtime took a long lease, wrote an in-flight checkpoint and a
    submitted effect with its token, then died: ``(body, effect id, token)``."""
    run_id, cp_id, effect_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    body = envelope(cp_id, run_id, 0, payload={"phase": "ready", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner=owner,
                                   ttl_s=ttl_s).fencing_token
    body = dict(body, revision=1, payload={"phase": "charging", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body, expected=0, token=token)
    walk_effect(wendy, acme, effect_body(effect_id, run_id, operation_key=f"charge:{run_id}"),
                "submitted", token=token)
    return body, effect_id, token


def revoke(actor, tenant, body, reason="worker-1's host was terminated", **kw):
    return services.lease_revoke(actor=actor, tenant=tenant, run_id=uuid.UUID(body["run_id"]),
                                 reason=reason, **kw)


def test_it_ends_the_lease_now_and_bumps_the_token_keeping_the_owner(acme, wendy, rita, clock):
    body, _, token = _leased_in_flight(wendy, acme)
    clock.advance(60)
    run = revoke(rita, acme, body)
    assert (run.lease_owner, run.fencing_token) == ("worker-1", token + 1)
    stored = Run.objects.get()
    assert (stored.lease_owner, stored.fencing_token) == ("worker-1", token + 1)
    assert stored.lease_expires_at == run.lease_expires_at
    assert services.run_facts(stored).lease_live is False
    assert services.run_facts(stored).owner_gone is True
    [event] = AuditEvent.objects.filter(action="lease.revoke")
    assert (event.actor_name, event.reason) == ("rita", "worker-1's host was terminated")
    assert event.before["owner"] == "worker-1"
    assert event.before["fencing_token"] == token
    assert event.after == {"fencing_token": token + 1,
                           "expires_at": stored.lease_expires_at.isoformat()}
    assert event.before["expires_at"] > event.after["expires_at"]


def test_the_old_owners_writes_are_refused_as_fenced_and_kept(acme, wendy, rita, clock):
    body, _, token = _leased_in_flight(wendy, acme)
    revoke(rita, acme, body)
    with pytest.raises(Fenced) as exc:
        put_checkpoint(wendy, acme, dict(body, revision=2), expected=1, token=token)
    assert exc.value.body() == {"error": "fenced", "fencing_token": token + 1}
    assert Checkpoint.objects.get().revision == 1
    [conflict] = Conflict.objects.all()
    assert (conflict.reason, conflict.fencing_token_sent, conflict.fencing_token_current) == (
        "fenced", token, token + 1)


def test_reconcile_is_no_longer_refused_for_the_lease(acme, wendy, rita, clock, settings):
    body, _, _ = _leased_in_flight(wendy, acme)
    run_id = uuid.UUID(body["run_id"])
    clock.advance(600)  # quiet longer than the ambiguity threshold, lease still live
    with pytest.raises(OwnerLive) as exc:
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="look")
    assert exc.value.error == "owner_live"
    revoke(rita, acme, body)
    queued = services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="look")
    assert len(queued.requests) == 1


def test_a_run_that_wrote_a_moment_ago_is_reconcilable_once_its_lease_ended(acme, wendy, rita):
    # The lease is what kept the owner live; kept as the record, its expiry (now) is the
    # owner's end, not the quiet time after the last write (policy.RunFacts.owner_gone_at).
    body, _, _ = _leased_in_flight(wendy, acme)
    revoke(rita, acme, body)
    queued = services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                    reason="look")
    assert len(queued.requests) == 1


@pytest.mark.parametrize("who", ["vic", "wendy", "april"])
def test_only_a_reviewer_may_end_a_lease(acme, wendy, vic, april, who):
    body, _, token = _leased_in_flight(wendy, acme)
    with pytest.raises(Forbidden):
        revoke({"vic": vic, "wendy": wendy, "april": april}[who], acme, body)
    run = Run.objects.get()
    assert (run.fencing_token, run.lease_owner) == (token, "worker-1")
    assert not AuditEvent.objects.filter(action="lease.revoke").exists()


def test_an_admin_may_end_a_lease(acme, wendy, adam):
    body, _, token = _leased_in_flight(wendy, acme)
    assert revoke(adam, acme, body).fencing_token == token + 1


def test_it_refuses_a_run_without_a_live_lease(acme, wendy, rita, clock):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    with pytest.raises(NoLiveLease) as exc:  # never leased
        revoke(rita, acme, body)
    assert (exc.value.status, exc.value.error) == (409, "no_live_lease")
    leased, _, token = _leased_in_flight(wendy, acme, ttl_s=30)
    revoke(rita, acme, leased)
    with pytest.raises(NoLiveLease):  # already ended
        revoke(rita, acme, leased)
    clock.advance(31)
    other, _, _ = _leased_in_flight(wendy, acme, owner="worker-2", ttl_s=30)
    clock.advance(31)
    with pytest.raises(NoLiveLease):  # expired
        revoke(rita, acme, other)
    assert AuditEvent.objects.filter(action="lease.revoke").count() == 1


def test_it_refuses_when_another_owner_holds_the_lease_now(acme, wendy, rita, clock):
    body, _, token = _leased_in_flight(wendy, acme, ttl_s=30)
    clock.advance(31)
    run_id = uuid.UUID(body["run_id"])
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="worker-2", ttl_s=600)
    with pytest.raises(LeaseHeld) as exc:  # the reviewer looked while worker-1 held it
        revoke(rita, acme, body, expected_owner="worker-1")
    assert exc.value.status == 409 and exc.value.detail.startswith("owner: ")
    run = Run.objects.get()
    assert (run.lease_owner, run.fencing_token) == ("worker-2", token + 1)
    assert revoke(rita, acme, body, expected_owner="worker-2").fencing_token == token + 2


@pytest.mark.parametrize(("reason", "error"), [
    ("", ReasonRequired), ("   ", ReasonRequired), (None, ReasonRequired),
    (7, InvalidPayload), ("x" * 4001, InvalidPayload), ("a\x00b", InvalidPayload),
])
def test_it_refuses_a_bad_reason_naming_it(acme, wendy, rita, reason, error):
    body, _, token = _leased_in_flight(wendy, acme)
    with pytest.raises(error) as exc:
        revoke(rita, acme, body, reason=reason)
    assert exc.value.status == 400 and exc.value.detail.startswith("reason: ")
    assert Run.objects.get().fencing_token == token


@pytest.mark.parametrize("owner", ["", 7, "x" * 257])
def test_it_refuses_a_bad_expected_owner_naming_it(acme, wendy, rita, owner):
    body, _, token = _leased_in_flight(wendy, acme)
    with pytest.raises(InvalidPayload) as exc:
        revoke(rita, acme, body, expected_owner=owner)
    assert exc.value.detail.startswith("owner: ")
    assert Run.objects.get().fencing_token == token


def test_another_tenants_run_is_not_found(acme, globex, wendy, omar):
    body, _, token = _leased_in_flight(wendy, acme)
    with pytest.raises(NotFound):
        revoke(omar, globex, body)
    with pytest.raises(NotFound):  # omar has no role in acme: 404, as for any run
        revoke(omar, acme, body)
    assert Run.objects.get().fencing_token == token


def test_an_unknown_run_is_not_found(acme, rita):
    with pytest.raises(NotFound):
        revoke(rita, acme, envelope())


def test_owner_live_says_how_to_end_a_lease_and_only_for_a_lease(acme, wendy, rita):
    # The stop-38 newcomer: the API's 409 owner_live gave no way out.
    body, _, _ = _leased_in_flight(wendy, acme)
    with pytest.raises(OwnerLive) as exc:
        services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                               reason="look it up")
    assert "if you know it is gone, end its lease (POST" in str(exc.value.detail)
    # A run that only wrote recently holds no lease to end: no such words.
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(uuid.uuid4(), run_id, 0,
                                         payload={"phase": "charging", "order_id": "B-1"}))
    walk_effect(wendy, acme, effect_body(uuid.uuid4(), run_id, operation_key="charge:B-1"),
                "submitted")
    with pytest.raises(OwnerLive) as exc:
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="look it up")
    assert "end its lease" not in str(exc.value.detail)
