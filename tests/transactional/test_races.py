"""Races on real PostgreSQL: N threads, each on its own database connection, released
together on a ``threading.Barrier``, all writing the same thing at once.

Exactly one writer wins per revision; the others get ``StaleRevision`` (or
``OperationExists`` for a claimed operation key); history has no gap and no duplicate;
every loser is recorded as a conflict; the audit chain stays intact.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from django.db import connection

from checkpoints import services
from checkpoints.exceptions import OperationExists, StaleRevision
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    Run,
)
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WRITERS = 8
ROUNDS = 4


def race(n: int, write) -> list:
    """Run ``write(i)`` in ``n`` threads released together; returns each result or exception.

    Each thread uses its own connection (Django connections are per thread) and closes it
    at the end so the test database can be dropped.
    """
    barrier = threading.Barrier(n, timeout=30)
    results: list = [None] * n

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = write(i)
        except Exception as exc:  # collected and asserted on by the caller
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer is stuck"
    return results


def kinds_of(results) -> Counter:
    return Counter(type(r).__name__ for r in results)


def test_it_lets_exactly_one_writer_win_each_revision(acme, wendy):
    body = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, body)
    for rnd in range(ROUNDS):
        results = race(WRITERS, lambda i, rnd=rnd: put_checkpoint(
            wendy, acme, dict(body, revision=rnd + 1, payload={"phase": "charged",
                                                               "order_id": f"w{i}"}),
            expected=rnd))
        assert kinds_of(results) == {"Checkpoint": 1, "StaleRevision": WRITERS - 1}, results
        assert {r.current_revision for r in results if isinstance(r, StaleRevision)} == {rnd + 1}
    cp = Checkpoint.objects.get()
    assert cp.revision == ROUNDS
    revisions = list(CheckpointRevision.objects.filter(checkpoint=cp)
                     .order_by("revision").values_list("revision", flat=True))
    assert revisions == list(range(ROUNDS + 1))  # no gap, no duplicate
    losers = ROUNDS * (WRITERS - 1)
    assert Conflict.objects.count() == losers
    assert Run.objects.get().unacknowledged_conflicts == losers
    assert AuditEvent.objects.filter(action="checkpoint.conflict").count() == losers
    assert AuditEvent.objects.filter(action="checkpoint.write").count() == ROUNDS + 1
    assert services.audit_verify(tenant=acme)[0]


def test_it_lets_exactly_one_create_of_a_checkpoint_id_win(acme, wendy):
    body = envelope()
    for _ in range(ROUNDS):
        body = envelope(run_id=body["run_id"])
        results = race(WRITERS, lambda i, body=body: put_checkpoint(wendy, acme, dict(
            body, payload={"phase": "ready", "order_id": f"w{i}"})))
        assert kinds_of(results) == {"Checkpoint": 1, "StaleRevision": WRITERS - 1}, results
        assert {r.current_revision for r in results if isinstance(r, StaleRevision)} == {0}
    assert Checkpoint.objects.count() == ROUNDS
    assert CheckpointRevision.objects.count() == ROUNDS
    assert Run.objects.count() == 1
    assert Conflict.objects.filter(expected_revision__isnull=True).count() == ROUNDS * (
        WRITERS - 1)
    assert services.audit_verify(tenant=acme)[0]


def test_it_lets_exactly_one_create_win_when_each_writer_names_its_own_run(acme, wendy):
    cid = uuid.uuid4()
    results = race(WRITERS, lambda i: put_checkpoint(wendy, acme, envelope(checkpoint_id=cid)))
    assert kinds_of(results) == {"Checkpoint": 1, "StaleRevision": WRITERS - 1}, results
    assert Checkpoint.objects.count() == 1
    assert Conflict.objects.count() == WRITERS - 1


@pytest.mark.parametrize("same_run", [True, False], ids=["same-run", "separate-runs"])
def test_it_lets_exactly_one_effect_claim_an_operation_key(acme, wendy, same_run):
    run_id = uuid.uuid4()
    for rnd in range(ROUNDS):
        key = f"charge:order-{rnd}"
        results = race(WRITERS, lambda i, key=key: put_effect(wendy, acme, effect_body(
            run_id=run_id if same_run else uuid.uuid4(), operation_key=key)))
        assert kinds_of(results) == {"Effect": 1, "OperationExists": WRITERS - 1}, results
        winner = next(r for r in results if isinstance(r, Effect))
        assert {r.extra["effect_id"] for r in results if isinstance(r, OperationExists)} == {
            str(winner.uuid)}
    assert Effect.objects.count() == ROUNDS
    assert EffectRevision.objects.count() == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_it_lets_exactly_one_writer_move_an_effect(acme, wendy):
    body = effect_body()
    put_effect(wendy, acme, body)
    results = race(WRITERS, lambda i: put_effect(
        wendy, acme, dict(body, revision=1, state="submitted"), expected=0))
    assert kinds_of(results) == {"Effect": 1, "StaleRevision": WRITERS - 1}, results
    effect = Effect.objects.get()
    assert (effect.state, effect.revision) == ("submitted", 1)
    assert list(EffectRevision.objects.order_by("revision").values_list("revision", flat=True)) \
        == [0, 1]
    assert Conflict.objects.count() == WRITERS - 1


def test_it_sweeps_once_when_many_workers_sweep_at_once(acme, wendy):
    for _ in range(3):
        body = envelope(payload={"phase": "charging"})
        put_checkpoint(wendy, acme, body)
        eb = effect_body(run_id=body["run_id"], operation_key=f"k-{body['id']}")
        put_effect(wendy, acme, eb)
        put_effect(wendy, acme, dict(eb, revision=1, state="submitted"), expected=0)
    age_world(3600)
    results = race(4, lambda i: services.sweep_stale_runs())
    assert all(isinstance(r, dict) for r in results), results
    assert sum(r["effects_unresolved"] for r in results) == 3
    assert sum(r["runs_ambiguous"] for r in results) == 3
    assert set(Effect.objects.values_list("state", flat=True)) == {"unresolved"}
    assert AuditEvent.objects.filter(action="run.ambiguous").count() == 3
    assert AuditEvent.objects.filter(action="effect.unresolved").count() == 3
    assert services.audit_verify(tenant=acme)[0]
