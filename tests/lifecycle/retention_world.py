"""A tenant's world for the retention tests: ended runs, an unended one, one with an
effect in doubt, a held one, and the ages that make each eligible (``age_world``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from checkpoints import services
from checkpoints.models import HeldRun, LegalHold, Run
from checkpoints.vocab import HoldScope
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect

DAY = 86_400


def completed_run(writer, tenant, *, order_id="A-1", effect=True) -> Run:
    """A run that wrote two revisions and confirmed one effect, then completed."""
    body = envelope(payload={"phase": "ready", "order_id": order_id})
    put_checkpoint(writer, tenant, body)
    if effect:
        walk_effect(writer, tenant, effect_body(run_id=body["run_id"],
                                                operation_key=f"charge:{uuid.uuid4()}"),
                    "submitted", "confirmed")
    put_checkpoint(writer, tenant, {**body, "revision": 1,
                                    "payload": {"phase": "completed", "order_id": order_id}},
                   expected=0)
    run = Run.objects.for_tenant(tenant).get(uuid=body["run_id"])
    assert run.recovery_state == "completed"
    return run


def unended_run(writer, tenant) -> Run:
    body = envelope(payload={"phase": "ready", "order_id": "open"})
    put_checkpoint(writer, tenant, body)
    return Run.objects.for_tenant(tenant).get(uuid=body["run_id"])


def in_doubt_run(writer, tenant) -> Run:
    """A run whose checkpoint says completed but whose effect was submitted and never
    confirmed: not ended for retention (an effect in doubt)."""
    body = envelope(payload={"phase": "ready", "order_id": "doubt"})
    put_checkpoint(writer, tenant, body)
    walk_effect(writer, tenant, effect_body(run_id=body["run_id"],
                                            operation_key=f"charge:{uuid.uuid4()}"),
                "submitted")
    return Run.objects.for_tenant(tenant).get(uuid=body["run_id"])


def hold_run(admin, tenant, run: Run) -> LegalHold:
    """A run-scoped legal hold written as its service will write it (the holds helper's
    service is not on this branch): the hold and its ``HeldRun`` row."""
    hold = LegalHold.objects.create(tenant=tenant, uuid=uuid.uuid4(), scope=HoldScope.RUNS,
                                    run_uuids=[str(run.uuid)], reason="case 1",
                                    placed_by=admin, placed_by_name=admin.username)
    HeldRun.objects.create(tenant=tenant, hold=hold, run_uuid=run.uuid)
    return hold


@dataclass
class World:
    done: list[Run]
    open: Run
    doubt: Run
    held: Run


def build(writer, admin, tenant, *, done=3) -> World:
    """``done`` completed runs, plus one unended, one in doubt and one held (completed)."""
    world = World(done=[completed_run(writer, tenant, order_id=f"A-{i}") for i in range(done)],
                  open=unended_run(writer, tenant), doubt=in_doubt_run(writer, tenant),
                  held=completed_run(writer, tenant, order_id="held"))
    hold_run(admin, tenant, world.held)
    return world


def set_policy(tenant, **fields):
    return services.data_policy_set(actor=None, tenant=tenant, **fields)[0]
