"""Migrations raced on real PostgreSQL (issue 19, item 2; docs/migrations.md): the run
lock and the compare-and-swap decide, so several migrations at once migrate each
checkpoint exactly once, and an ousted owner racing a migration loses nothing: its write
lands first (and is migrated) or is fenced (and kept as a conflict).

SQLite has one writer at a time and no row locks: these skip there (``postgres`` mark).
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from checkpoints import services
from checkpoints.exceptions import Fenced
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Conflict, Run
from tests.helpers import age_world, put_checkpoint
from tests.services.test_migrations import order
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

MIGRATIONS = 4
ROUNDS = 4


def test_migrations_racing_each_other_migrate_each_checkpoint_once(acme, wendy):
    bodies = [order(wendy, acme, revisions=1 + i % 3) for i in range(12)]
    age_world(3600)
    reports = race(MIGRATIONS, lambda i: services.checkpoints_migrate(
        actor=None, tenant=acme, kind="acme.order", to_version=2, batch_size=3))
    assert not [r for r in reports if isinstance(r, Exception)], reports
    outcomes = Counter(item.outcome for r in reports for item in r.items)
    assert outcomes["migrated"] == len(bodies) and not outcomes["refused"]
    assert not outcomes["conflict"]
    events = Counter(AuditEvent.objects.filter(action="checkpoint.migrate")
                     .values_list("target_ref", flat=True))
    assert events == Counter({b["id"]: 1 for b in bodies})
    for body in bodies:
        cp = Checkpoint.objects.select_related("run").get(uuid=body["id"])
        assert (cp.revision, cp.schema_version, cp.run.fencing_token) == (
            body["revision"] + 1, 2, 1)
        assert CheckpointRevision.objects.filter(checkpoint=cp, schema_version=2).count() == 1
    assert services.audit_verify(tenant=acme)[0]


def test_a_zombie_owner_racing_a_migration_loses_nothing(acme, wendy):
    seen = Counter()
    for rnd in range(ROUNDS):
        body = order(wendy, acme, "charging", order_id=f"A-{rnd}")
        run_id = uuid.UUID(body["run_id"])
        token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w1",
                                       ttl_s=60).fencing_token
        age_world(120)  # the lease expired: the owner counts as gone, but it still writes
        late = dict(body, revision=1, payload={"phase": "charged", "order_id": f"A-{rnd}",
                                               "amount_cents": 1})

        def act(i, late=late, token=token, run_id=run_id):
            if i == 0:
                return services.checkpoints_migrate(actor=None, tenant=acme,
                                                    kind="acme.order", to_version=2,
                                                    run_ids=[run_id])
            return put_checkpoint(wendy, acme, late, expected=0, token=token)

        report, zombie = race(2, act)
        cp = Checkpoint.objects.get(uuid=body["id"])
        assert cp.schema_version == 2
        if isinstance(zombie, Fenced):  # the migration first: the late write is kept
            seen["fenced"] += 1
            assert cp.revision == 1
            assert Conflict.objects.get(target_uuid=body["id"]).reason == "fenced"
        else:  # the late write first: the migration took its revision
            seen["landed"] += 1
            assert not isinstance(zombie, Exception), zombie
            assert cp.revision == 2
            assert report.items[0].revision == 1
        assert report.counts["migrated"] == 1
        assert Run.objects.get(uuid=run_id).fencing_token == token + 1
    assert sum(seen.values()) == ROUNDS
    assert services.audit_verify(tenant=acme)[0]
