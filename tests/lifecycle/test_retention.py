"""Retention per tenant (issue 20, item 1): the data policy's rules and the scheduled
purge, on SQLite and PostgreSQL, with ages moved by ``age_world`` (never a sleep)."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command

from checkpoints import services
from checkpoints.exceptions import Forbidden, InvalidPayload, OperationExists, RunDeleted
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CleanupLease,
    DataPolicy,
    Effect,
    LegalHold,
    Run,
    RunTransition,
    Tombstone,
)
from checkpoints.services import retention
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect
from tests.services.test_state_counts import assert_counts

from .retention_world import DAY, build, completed_run, hold_run, set_policy

pytestmark = pytest.mark.django_db


# --- the policy -------------------------------------------------------------------------

def test_an_admin_sets_the_policy_once_and_an_unchanged_put_writes_nothing(acme, adam):
    row, changed = services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=30,
                                            effect_retention_days=90,
                                            subject_fields={"customer": "/customer/id"})
    assert changed and row.payload_retention_days == 30 and row.updated_by_name == "adam"
    event = AuditEvent.objects.for_tenant(acme).get(action="data_policy.set")
    assert event.before is None and event.after["payload_retention_days"] == 30
    row, changed = services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=30)
    assert not changed
    assert AuditEvent.objects.for_tenant(acme).filter(action="data_policy.set").count() == 1
    services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=7)
    second = AuditEvent.objects.for_tenant(acme).filter(action="data_policy.set").order_by("seq").last()
    assert second.before["payload_retention_days"] == 30
    assert second.after["payload_retention_days"] == 7
    assert second.after["effect_retention_days"] == 90  # a field left out keeps its value
    assert DataPolicy.objects.for_tenant(acme).count() == 1


@pytest.mark.parametrize("who", ["vic", "rita", "april", "wendy"])
def test_only_the_admin_sets_the_policy(request, acme, who):
    user = request.getfixturevalue(who)
    with pytest.raises(Forbidden):
        services.data_policy_set(actor=user, tenant=acme, payload_retention_days=30)
    assert not DataPolicy.objects.for_tenant(acme).exists()


@pytest.mark.parametrize("fields, named", [
    ({"payload_retention_days": 0}, "payload_retention_days"),
    ({"payload_retention_days": 36_501}, "payload_retention_days"),
    ({"payload_retention_days": True}, "payload_retention_days"),
    ({"payload_retention_days": "30"}, "payload_retention_days"),
    ({"effect_retention_days": 2.5}, "effect_retention_days"),
    ({"tombstone_retention_days": -1}, "tombstone_retention_days"),
    ({"restart_interval_s": 0}, "restart_interval_s"),
    ({"restart_interval_s": None}, "restart_interval_s"),
    ({"restart_interval_s": 366 * DAY + 1}, "restart_interval_s"),
    ({"effect_retention_days": 1, "restart_interval_s": DAY + 1}, "effect_retention_days"),
    ({"secrets_policy": "ignore"}, "secrets_policy"),
    ({"payload_flag_bytes": 2**31}, "payload_flag_bytes"),
    ({"payload_flag_bytes": 0}, "payload_flag_bytes"),
    ({"subject_fields": []}, "subject_fields"),
    ({"subject_fields": {"Customer": "/c"}}, "subject_fields"),
    ({"subject_fields": {"c": "c"}}, "subject_fields.c"),
    ({"subject_fields": {"c": ""}}, "subject_fields.c"),
    ({"subject_fields": {"c": "/a~2"}}, "subject_fields.c"),
    ({"subject_fields": {"c": "/" + "a" * 512}}, "subject_fields.c"),
    ({"subject_fields": {"c": "/a\x00"}}, "subject_fields.c"),
    ({"subject_fields": {"c": 1}}, "subject_fields.c"),
    ({"subject_fields": {f"f{i}": "/x" for i in range(17)}}, "subject_fields"),
    ({"payload_days": 1}, "payload_days"),
])
def test_a_bad_policy_is_refused_naming_the_field_and_writes_nothing(acme, adam, fields,
                                                                     named):
    with pytest.raises(InvalidPayload) as exc:
        services.data_policy_set(actor=adam, tenant=acme, **fields)
    assert exc.value.detail.startswith(f"{named}:"), exc.value.detail
    assert not DataPolicy.objects.for_tenant(acme).exists()
    assert not AuditEvent.objects.for_tenant(acme).filter(action="data_policy.set").exists()


def test_the_idempotency_window_rule_holds_against_the_stored_interval(acme, adam):
    services.data_policy_set(actor=adam, tenant=acme, restart_interval_s=3 * DAY)
    with pytest.raises(InvalidPayload, match="^effect_retention_days: 2 day"):
        services.data_policy_set(actor=adam, tenant=acme, effect_retention_days=2)
    services.data_policy_set(actor=adam, tenant=acme, effect_retention_days=3)
    with pytest.raises(InvalidPayload, match="^effect_retention_days"):
        services.data_policy_set(actor=adam, tenant=acme, restart_interval_s=3 * DAY + 1)


# --- the purge --------------------------------------------------------------------------

def test_exactly_the_eligible_runs_go_each_with_a_tombstone(acme, globex, wendy, wes, adam):
    world = build(wendy, adam, acme)
    other = completed_run(wes, globex)  # globex has no policy: kept
    set_policy(acme, payload_retention_days=30)
    age_world(29 * DAY)
    assert services.retention_purge(tenant=acme)["purged"] == 0  # not old enough yet
    fresh = completed_run(wendy, acme, order_id="fresh")  # ended just now
    age_world(2 * DAY)
    stats = services.retention_purge(tenant=acme)
    assert stats["purged"] == 3 and stats["lease"] == "taken" and not stats["fenced"]
    gone = {r.uuid for r in world.done}
    assert set(Tombstone.objects.for_tenant(acme).values_list("run_uuid", flat=True)) == gone
    assert set(Run.objects.for_tenant(acme).filter(payloads_deleted_at__isnull=False)
               .values_list("uuid", flat=True)) == gone
    for kept in (world.open, world.doubt, world.held, fresh):
        assert Checkpoint.objects.for_tenant(acme).filter(run_id=kept.pk).exists()
    assert Checkpoint.objects.for_tenant(globex).filter(run_id=other.pk).exists()
    assert not Tombstone.objects.for_tenant(globex).exists()
    stone = Tombstone.objects.for_tenant(acme).first()
    assert stone.cause == "retention" and stone.policy == {"payload_retention_days": 30}
    events = AuditEvent.objects.for_tenant(acme).filter(action="run.purge")
    assert events.count() == 3 and all(e.actor_id is None for e in events)
    assert "A-0" not in str(list(events.values_list("after", flat=True)))
    ok, *problem = services.audit_verify(tenant=acme)
    assert ok, problem
    # Idempotent: a second purge finds nothing and writes nothing.
    before = AuditEvent.objects.for_tenant(acme).count()
    assert services.retention_purge(tenant=acme)["purged"] == 0
    assert AuditEvent.objects.for_tenant(acme).count() == before
    assert_counts(acme, globex)


def test_a_released_hold_lets_the_run_go_and_a_tenant_hold_stops_everything(acme, wendy,
                                                                            adam):
    run = completed_run(wendy, acme)
    hold = hold_run(adam, acme, run)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    assert services.retention_purge(tenant=acme)["purged"] == 0
    LegalHold.objects.for_tenant(acme).filter(pk=hold.pk).update(released_at=hold.placed_at)
    LegalHold.objects.create(tenant=acme, uuid=uuid.uuid4(), scope="tenant", reason="case",
                             placed_by=adam, placed_by_name="adam")
    assert services.retention_purge(tenant=acme)["purged"] == 0
    LegalHold.objects.for_tenant(acme).update(released_at=hold.placed_at)
    assert services.retention_purge(tenant=acme)["purged"] == 1


def test_effect_records_stay_inside_the_idempotency_window_then_the_run_expires(
        acme, wendy, adam):
    run = completed_run(wendy, acme)
    effect = Effect.objects.for_tenant(acme).get(run=run)
    set_policy(acme, payload_retention_days=1, effect_retention_days=10,
               restart_interval_s=10 * DAY)
    age_world(2 * DAY)
    assert services.retention_purge(tenant=acme) | {"tenant": "", "lease": ""} == {
        "tenant": "", "purged": 1, "expired": 0, "skipped": 0, "batches": 1,
        "kept_by_hold": 0, "fenced": False, "lease": ""}
    # Inside the window the key still answers: the same operation on a new run is the
    # effect already recorded, not a second charge.
    body = effect_body(run_id=uuid.uuid4(), operation_key=effect.operation_key)
    with pytest.raises(OperationExists):
        put_effect(wendy, acme, body)
    age_world(7 * DAY)  # 9 days since the run ended
    assert services.retention_purge(tenant=acme)["expired"] == 0
    age_world(2 * DAY)
    assert services.retention_purge(tenant=acme)["expired"] == 1
    assert not Run.objects.for_tenant(acme).filter(pk=run.pk).exists()
    assert not Effect.objects.for_tenant(acme).filter(pk=effect.pk).exists()
    assert not RunTransition.objects.for_tenant(acme).filter(run_id=run.pk).exists()
    assert Tombstone.objects.for_tenant(acme).filter(run_uuid=run.uuid).exists()  # kept
    event = AuditEvent.objects.for_tenant(acme).get(action="run.expire")
    assert event.after["counts"]["effects"] == 1 and event.target_ref == str(run.uuid)
    assert_counts(acme)
    ok, *problem = services.audit_verify(tenant=acme)
    assert ok, problem
    put_effect(wendy, acme, body)  # the key left with its window: a new effect now


def test_without_an_effect_retention_effect_records_are_kept_forever(acme, wendy):
    run = completed_run(wendy, acme)
    set_policy(acme, payload_retention_days=1)
    age_world(36_500 * DAY)
    stats = services.retention_purge(tenant=acme)
    assert stats["purged"] == 1 and stats["expired"] == 0
    age_world(36_500 * DAY)
    assert services.retention_purge(tenant=acme)["expired"] == 0
    assert Effect.objects.for_tenant(acme).filter(run=run).exists()


def test_batches_are_bounded_and_every_run_is_still_reached(acme, wendy):
    runs = [completed_run(wendy, acme, order_id=f"B-{i}", effect=False) for i in range(5)]
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    stats = services.retention_purge(tenant=acme, batch_size=2)
    assert stats["purged"] == 5 and stats["batches"] == 3
    assert Tombstone.objects.for_tenant(acme).count() == len(runs)
    with pytest.raises(InvalidPayload, match="^batch_size"):
        services.retention_purge(tenant=acme, batch_size=1001)


def test_a_dry_run_counts_and_writes_nothing(acme, wendy):
    completed_run(wendy, acme)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    events = AuditEvent.objects.count()
    stats = services.retention_purge(tenant=acme, dry_run=True)
    assert stats["eligible_payloads"] == 1 and stats["purged"] == 0
    assert AuditEvent.objects.count() == events and not CleanupLease.objects.exists()


# --- the fenced cleanup lease ------------------------------------------------------------

def test_a_live_lease_keeps_a_second_purger_out_and_a_stale_one_is_fenced(acme, wendy):
    runs = [completed_run(wendy, acme, order_id=f"L-{i}", effect=False) for i in range(2)]
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    first = retention._lease_take(acme, "first")
    assert first == 1 and retention._lease_take(acme, "second") is None
    assert services.retention_purge(tenant=acme) == {
        "tenant": "acme", "purged": 0, "expired": 0, "skipped": 0, "batches": 0,
        "kept_by_hold": 0, "fenced": False, "lease": "held"}
    age_world(retention.LEASE_TTL_S + 1)  # the first purger stalled past its lease
    second = retention._lease_take(acme, "second")
    assert second == 2
    # The stalled purger wakes up: its fencing check refuses, nothing is written.
    assert retention._purge_one(acme, runs[0].pk, first, DataPolicy.objects.get()) == "fenced"
    assert not Tombstone.objects.exists()
    assert retention._purge_one(acme, runs[0].pk, second, DataPolicy.objects.get()) == "purged"


# --- writes to a deleted run ------------------------------------------------------------

def test_a_deleted_run_refuses_writes_and_never_gets_its_checkpoint_back(acme, wendy):
    body = envelope(payload={"phase": "ready", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, {**body, "revision": 1,
                                 "payload": {"phase": "completed", "order_id": "A-1"}},
                   expected=0)
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)
    services.retention_purge(tenant=acme)
    run_id = uuid.UUID(body["run_id"])
    attempts = [
        lambda: put_checkpoint(wendy, acme, {**body, "revision": 2}, expected=1),
        lambda: put_checkpoint(wendy, acme, {**body, "revision": 0}),
        lambda: put_checkpoint(wendy, acme, envelope(run_id=run_id)),
        lambda: put_effect(wendy, acme, effect_body(run_id=run_id, operation_key="new:1")),
        lambda: services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w",
                                       ttl_s=30),
        lambda: services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={}),
        lambda: services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={}),
    ]
    for attempt in attempts:
        with pytest.raises(RunDeleted, match="run_id: the payloads of run"):
            attempt()
    assert not Checkpoint.objects.for_tenant(acme).exists()
    assert not Effect.objects.for_tenant(acme).exists()


def test_the_command_purges_every_tenant_or_one_and_says_what_it_did(acme, globex, wendy,
                                                                     wes, capsys):
    completed_run(wendy, acme)
    completed_run(wes, globex)
    set_policy(acme, payload_retention_days=1)
    set_policy(globex, payload_retention_days=1)
    age_world(2 * DAY)
    call_command("purge_expired", "--tenant", "acme", "--dry-run")
    assert "acme: 1 run(s) eligible for payload deletion" in capsys.readouterr().out
    assert not Tombstone.objects.exists()
    call_command("purge_expired", "--tenant", "acme")
    assert Tombstone.objects.count() == 1
    call_command("purge_expired")
    assert Tombstone.objects.count() == 2
    assert "globex: 1 run(s)' payloads deleted" in capsys.readouterr().out
