"""Fixtures for the dashboard tests: a run stuck in an ambiguous place, built through the
real services (a writer's checkpoints and effect, then the stale-run sweep), and a
payment service whose reconciler answers what a test scripts."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from django.test import Client, TestCase

from checkpoints import services
from checkpoints.reconcile import Answer
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect
from tests.views.reconcilers import Scripted

#: What the scripted payment service answers by default: the charge exists. The evidence
#: carries a field (``gateway_ref``) that appears nowhere else, to see where it shows.
FOUND = Answer.found({"charge_id": "ch_9"}, "payments: charge ch_9 succeeded",
                     evidence={"status": "succeeded", "charge_id": "ch_9",
                               "gateway_ref": "gw-777"})


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


@pytest.fixture
def scripted(acme):
    """``payments`` in acme is reconciled by ``Scripted`` (answers: ``[FOUND]``)."""
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="tests.views.reconcilers.Scripted")
    Scripted.answers, Scripted.asked = [FOUND], []
    yield Scripted
    Scripted.answers, Scripted.asked = [], []


def reconcile(reviewer, tenant, run_id, reason="ask the payment service"):
    """A reviewer's reconcile through the service, with its after-commit dispatch run (in
    this process, as the embedded default does)."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return services.run_reconcile(actor=reviewer, tenant=tenant, run_id=run_id,
                                      reason=reason)
