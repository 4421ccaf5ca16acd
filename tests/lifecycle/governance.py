"""What the tombstone-governance tests share: ended runs purged by retention (their
tombstones), a data policy with a tombstone retention, legal holds placed as rows."""

from __future__ import annotations

import uuid

from django.db import transaction

from checkpoints import locks, services
from checkpoints.dbclock import db_now
from checkpoints.models import DataPolicy, HeldRun, LegalHold, Run
from checkpoints.vocab import HoldScope
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect

DAY = 86_400


def completed_run(writer, tenant) -> Run:
    """A run with a checkpoint written twice and a confirmed effect, now ``completed``."""
    body = envelope(payload={"phase": "ready", "order_id": "A-1"})
    put_checkpoint(writer, tenant, body)
    walk_effect(writer, tenant, effect_body(run_id=body["run_id"],
                                            operation_key=f"charge:{uuid.uuid4()}"),
                "submitted", "confirmed")
    put_checkpoint(writer, tenant, {**body, "revision": 1,
                                    "payload": {"phase": "completed", "order_id": "A-1"}},
                   expected=0)
    return Run.objects.for_tenant(tenant).get(uuid=body["run_id"])


def purge(tenant, run: Run):
    """Retention's deletion of ``run`` (the one deletion core); returns its tombstone."""
    with transaction.atomic():
        locked = locks.lock_run(tenant, run.uuid)
        return services.purge_run_payloads(
            actor=None, tenant=tenant, run=locked, now=db_now(), cause="retention",
            policy={"payload_retention_days": 30}).tombstone


def purged_runs(writer, tenant, n: int = 2) -> list:
    """``n`` completed runs purged by retention; returns their tombstones."""
    return [purge(tenant, completed_run(writer, tenant)) for _ in range(n)]


def keep_tombstones(tenant, days: int | None) -> None:
    DataPolicy.objects.update_or_create(tenant=tenant,
                                        defaults={"tombstone_retention_days": days})


def hold(tenant, by, *, runs=(), whole=False) -> LegalHold:
    """An active legal hold on ``runs`` (their UUIDs) or on the whole tenant."""
    h = LegalHold.objects.create(tenant=tenant, uuid=uuid.uuid4(),
                                 scope=HoldScope.TENANT if whole else HoldScope.RUNS,
                                 run_uuids=[str(r) for r in runs], reason="litigation",
                                 placed_by=by, placed_by_name=by.get_username())
    for r in runs:
        HeldRun.objects.create(tenant=tenant, hold=h, run_uuid=r)
    return h
