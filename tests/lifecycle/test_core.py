"""The core of every deletion (``services.lifecycle``): what blocks a run, and what a
purge deletes, blanks and keeps (issue 20)."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from checkpoints import locks, services
from checkpoints.dbclock import db_now
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Effect,
    HeldRun,
    LegalHold,
    Run,
    Tombstone,
)
from checkpoints.vocab import HoldScope
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect

pytestmark = pytest.mark.django_db


def _completed_run(wendy, acme):
    body = envelope(payload={"phase": "ready", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"], operation_key=f"charge:{uuid.uuid4()}"), "submitted", "confirmed")
    put_checkpoint(wendy, acme, {**body, "revision": 1,
                                 "payload": {"phase": "completed", "order_id": "A-1"}},
                   expected=0)
    run = Run.objects.for_tenant(acme).get(uuid=body["run_id"])
    assert run.recovery_state == "completed"
    return run


def _purge(acme, run):
    with transaction.atomic():
        locked = locks.lock_run(acme, run.uuid)
        return services.purge_run_payloads(actor=None, tenant=acme, run=locked, now=db_now(),
                                           cause="retention",
                                           policy={"payload_retention_days": 30})


def test_a_purge_deletes_payloads_blanks_receipts_and_leaves_a_tombstone(acme, wendy):
    run = _completed_run(wendy, acme)
    assert services.run_blockers(run) == []
    purged = _purge(acme, run)
    assert not Checkpoint.objects.for_tenant(acme).filter(run=run).exists()
    assert not CheckpointRevision.objects.for_tenant(acme).filter(checkpoint__run=run).exists()
    effect = Effect.objects.for_tenant(acme).get(run=run)
    assert effect.receipt_ciphertext == "" and effect.operation_key  # key kept
    stone = Tombstone.objects.for_tenant(acme).get(run_uuid=run.uuid)
    assert stone == purged.tombstone and stone.final_state == "completed"
    assert stone.counts["checkpoints"] == 1 and stone.counts["revisions"] == 2
    event = AuditEvent.objects.for_tenant(acme).filter(action="run.purge").get()
    assert event.after["tombstone"] == stone.pk and "A-1" not in str(event.after)
    run.refresh_from_db()
    assert run.payloads_deleted_at is not None
    assert services.run_blockers(run) == ["already_deleted"]


def test_blockers_name_an_unended_run_an_effect_in_doubt_and_a_hold(acme, wendy, adam):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"], operation_key=f"charge:{uuid.uuid4()}"), "submitted")
    run = Run.objects.for_tenant(acme).get(uuid=body["run_id"])
    assert services.run_blockers(run) == ["not_ended", "effect_in_doubt"]
    done = _completed_run(wendy, acme)
    hold = LegalHold.objects.create(tenant=acme, uuid=uuid.uuid4(), scope=HoldScope.RUNS,
                                    run_uuids=[str(done.uuid)], reason="case 1",
                                    placed_by=adam, placed_by_name="adam")
    HeldRun.objects.create(tenant=acme, hold=hold, run_uuid=done.uuid)
    assert services.run_blockers(done) == ["legal_hold"]
    LegalHold.objects.for_tenant(acme).update(released_at=db_now())
    assert services.run_blockers(done) == []
    LegalHold.objects.create(tenant=acme, uuid=uuid.uuid4(), scope=HoldScope.TENANT,
                             reason="litigation", placed_by=adam, placed_by_name="adam")
    assert services.run_blockers(done) == ["legal_hold"]
