"""Leases and fencing tokens through ``services.lease_acquire`` and the write services
(CONTRACT.md 1 "fencing token", 3 "lease"). Time moves with the ``clock`` fixture."""

from __future__ import annotations

import uuid

import pytest

from checkpoints import services
from checkpoints.exceptions import Fenced, InvalidPayload, LeaseHeld, NotFound
from checkpoints.models import AuditEvent, Checkpoint, Conflict, Effect, Run
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect


@pytest.fixture
def run_body(acme, wendy):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    return body


def lease(acme, wendy, body, owner, ttl_s=30):
    return services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                  owner=owner, ttl_s=ttl_s)


def test_it_bumps_the_token_for_a_new_owner_and_keeps_it_on_renewal(acme, wendy, run_body, clock):
    first = lease(acme, wendy, run_body, "worker-1")
    assert (first.fencing_token, first.lease_owner) == (1, "worker-1")
    clock.advance(10)
    renewed = lease(acme, wendy, run_body, "worker-1", ttl_s=60)
    assert renewed.fencing_token == 1
    assert renewed.lease_expires_at > first.lease_expires_at
    assert AuditEvent.objects.filter(action="lease.acquire").count() == 2


def test_it_refuses_another_owner_while_the_lease_is_live(acme, wendy, run_body, clock):
    lease(acme, wendy, run_body, "worker-1", ttl_s=30)
    clock.advance(29)
    with pytest.raises(LeaseHeld) as exc:
        lease(acme, wendy, run_body, "worker-2")
    assert exc.value.status == 409
    run = Run.objects.get()
    assert (run.lease_owner, run.fencing_token) == ("worker-1", 1)


def test_it_hands_an_expired_lease_to_a_new_owner_with_a_new_token(acme, wendy, run_body, clock):
    lease(acme, wendy, run_body, "worker-1", ttl_s=30)
    clock.advance(31)
    taken = lease(acme, wendy, run_body, "worker-2")
    assert (taken.lease_owner, taken.fencing_token) == ("worker-2", 2)


def test_it_bumps_the_token_when_the_same_owner_returns_after_expiry(acme, wendy, run_body,
                                                                     clock):
    lease(acme, wendy, run_body, "worker-1", ttl_s=5)
    clock.advance(6)
    assert lease(acme, wendy, run_body, "worker-1").fencing_token == 2


def test_it_fences_writes_with_a_stale_or_missing_token(acme, wendy, run_body, clock):
    lease(acme, wendy, run_body, "worker-1", ttl_s=5)
    clock.advance(6)
    lease(acme, wendy, run_body, "worker-2")  # token 2; worker-1 still believes in 1
    with pytest.raises(Fenced) as exc:
        put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0, token=1)
    assert exc.value.body() == {"error": "fenced", "fencing_token": 2}
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0, token=None)
    with pytest.raises(Fenced):
        put_effect(wendy, acme, effect_body(run_id=run_body["run_id"]), token=1)
    assert Checkpoint.objects.get().revision == 0
    cp = put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0, token=2)
    assert cp.revision == 1
    put_effect(wendy, acme, effect_body(run_id=run_body["run_id"]), token=2)


def test_it_keeps_each_fenced_write_as_a_conflict_of_the_run(acme, wendy, run_body, clock):
    lease(acme, wendy, run_body, "worker-1", ttl_s=5)
    clock.advance(6)
    lease(acme, wendy, run_body, "worker-2")  # token 2: worker-1 is now a zombie
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0, token=1)
    effect = effect_body(run_id=run_body["run_id"])
    with pytest.raises(Fenced):
        put_effect(wendy, acme, effect, token=1)
    conflicts = {c.target_type: c for c in Conflict.objects.all()}
    cp = conflicts["checkpoint"]
    assert (cp.reason, cp.expected_revision, cp.actual_revision, cp.attempted_revision) == (
        "fenced", 0, 0, 1)
    assert (cp.fencing_token_sent, cp.fencing_token_current) == (1, 2)
    assert (conflicts["effect"].reason, conflicts["effect"].actual_revision) == ("fenced", None)
    run = Run.objects.get()
    assert (run.unacknowledged_conflicts, run.recovery_state) == (2, "conflicted")
    assert not Effect.objects.exists()
    assert AuditEvent.objects.filter(action__endswith=".conflict").count() == 2


def test_it_refuses_an_old_token_even_after_the_lease_expired(acme, wendy, run_body, clock):
    lease(acme, wendy, run_body, "worker-1", ttl_s=5)
    lease(acme, wendy, run_body, "worker-1", ttl_s=5)
    clock.advance(6)
    lease(acme, wendy, run_body, "worker-2", ttl_s=5)
    clock.advance(6)
    conflicts = Conflict.objects.count()
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0, token=1)
    # Once the run has had an owner, leaving the token out is refused too (a zombie
    # cannot slip past the fence by omitting the header); the current token is accepted.
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0)
    # Each refusal is kept as a fenced conflict (CONTRACT.md 3) and writes nothing else.
    assert Checkpoint.objects.get().revision == 0
    assert list(Conflict.objects.order_by("pk").values_list("reason", "fencing_token_sent"))[
        conflicts:] == [("fenced", 1), ("fenced", None)]
    assert Run.objects.get().fencing_token == 2
    assert put_checkpoint(wendy, acme, dict(run_body, revision=1), expected=0,
                          token=2).revision == 1


@pytest.mark.parametrize(("owner", "ttl_s", "field"), [
    ("", 30, "owner"), ("x" * 257, 30, "owner"), (7, 30, "owner"),
    ("w", 0, "ttl_s"), ("w", 86401, "ttl_s"), ("w", 1.5, "ttl_s"), ("w", True, "ttl_s"),
])
def test_it_refuses_a_bad_owner_or_ttl(acme, wendy, run_body, owner, ttl_s, field):
    with pytest.raises(InvalidPayload) as exc:
        lease(acme, wendy, run_body, owner, ttl_s)
    assert exc.value.detail.startswith(field)
    assert Run.objects.get().fencing_token == 0


def test_it_answers_not_found_for_a_lease_on_an_unknown_run(acme, wendy):
    with pytest.raises(NotFound):
        lease(acme, wendy, envelope(), "worker-1")
    assert not Run.objects.exists()
