"""The stale-run sweep (``services.sweep_stale_runs``; DESIGN.md 4): runs whose owner went
quiet become ambiguous, their submitted effects unresolved; a second sweep changes nothing."""

from __future__ import annotations

import uuid

from checkpoints import services
from checkpoints.models import AuditEvent, Effect, EffectRevision, Run
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect


def _state():
    return (list(Run.objects.order_by("pk").values_list("recovery_state", "recovery_reason")),
            list(Effect.objects.order_by("pk").values_list("state", "revision")),
            AuditEvent.objects.count(), EffectRevision.objects.count())


def test_it_leaves_fresh_runs_alone(acme, wendy):
    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging"}))
    stats = services.sweep_stale_runs()
    assert stats["runs_ambiguous"] == 0
    assert Run.objects.get().recovery_state == "healthy"


def test_it_marks_a_quiet_in_flight_run_ambiguous_once(acme, wendy, clock):
    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging"}))
    put_checkpoint(wendy, acme, envelope(payload={"phase": "charged"}))  # stable: not a candidate
    clock.advance(301)
    stats = services.sweep_stale_runs()
    assert stats == {"examined": 1, "effects_unresolved": 0, "runs_ambiguous": 1,
                     "reconcile_redriven": 0, "migrations_redriven": 0,
                     "bulk_jobs_redriven": 0, "counters_compacted": 0}
    assert sorted(Run.objects.values_list("recovery_state", flat=True)) == ["ambiguous",
                                                                            "healthy"]
    event = AuditEvent.objects.get(action="run.ambiguous")
    assert event.actor_name == "system"
    before = _state()
    again = services.sweep_stale_runs()
    assert again["runs_ambiguous"] == again["effects_unresolved"] == 0
    assert _state() == before


def test_it_honours_the_tenants_threshold(acme, wendy, clock):
    acme.ambiguity_threshold_s = 30
    acme.save()
    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging"}))
    clock.advance(31)
    assert services.sweep_stale_runs()["runs_ambiguous"] == 1


def test_it_unresolves_submitted_effects_only_when_the_owner_is_gone(acme, wendy, clock):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w1", ttl_s=60)
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted", token=1)
    clock.advance(59)
    services.sweep_stale_runs()
    assert Effect.objects.get().state == "submitted"  # the lease is live: the owner waits
    assert Run.objects.get().recovery_state == "healthy"
    clock.advance(2)
    stats = services.sweep_stale_runs()
    assert stats["effects_unresolved"] == 1
    effect = Effect.objects.get()
    assert (effect.state, effect.revision) == ("unresolved", 2)
    assert EffectRevision.objects.get(effect=effect, revision=2).source == "sweep"
    assert Run.objects.get().recovery_state == "ambiguous"
    before = _state()
    assert services.sweep_stale_runs()["effects_unresolved"] == 0
    assert _state() == before


def test_it_does_not_touch_settled_effects_or_schema_mismatches(acme, wendy, clock):
    body = envelope(payload={"phase": "charged"})
    put_checkpoint(wendy, acme, body)
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted", "confirmed")
    put_checkpoint(wendy, acme, envelope(kind="acme.order", schema_version=9))
    clock.advance(3600)
    before = _state()
    services.sweep_stale_runs()
    assert _state() == before
