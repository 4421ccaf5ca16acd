"""Fixtures for the dashboard tests: a run stuck in an ambiguous place, built through the
real services (a writer's checkpoints and effect, then the stale-run sweep)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from django.test import Client

from checkpoints import services
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect


@dataclass
class Stuck:
    run_id: uuid.UUID
    checkpoint_id: uuid.UUID
    effect_id: uuid.UUID


def make_stuck_run(writer, tenant, *, order_id="A-1042", key="charge:A-1042") -> Stuck:
    """A run whose worker died after ``submitted``: checkpoint r0 ready, r1 charging
    (in flight), one effect submitted, then the sweep with a ``now`` an hour ahead makes
    the effect ``unresolved`` and the run ``ambiguous``."""
    run_id, cp_id, effect_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    put_checkpoint(writer, tenant, envelope(cp_id, run_id, 0,
                                            payload={"phase": "ready", "order_id": order_id}))
    put_checkpoint(writer, tenant, envelope(
        cp_id, run_id, 1,
        payload={"phase": "charging", "order_id": order_id, "amount_cents": 2599}), expected=0)
    walk_effect(writer, tenant, effect_body(effect_id, run_id, operation_key=key), "submitted")
    sweep_later()
    return Stuck(run_id, cp_id, effect_id)


@pytest.fixture
def stuck(acme, wendy) -> Stuck:
    return make_stuck_run(wendy, acme)


@pytest.fixture
def unknown(stuck, acme, rita) -> Stuck:
    """The stuck run after a reviewer marked its effect's outcome unknown: nothing is in
    doubt any more and the run is ``unknown_outcome``, so a retry may be requested."""
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="gateway has no lookup")
    return stuck


@pytest.fixture
def login():
    """``login(user, csrf=False)`` -> a session ``django.test.Client`` logged in as user."""

    def _login(user, csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return _login
