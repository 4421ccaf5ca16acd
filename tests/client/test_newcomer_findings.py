"""The runtime SDK's faults a newcomer runtime developer found, against the real API
(``live_server``), both clients (``conftest.open_store``): one fencing token per run
(finding 1), a receipt kept when the lease ran out under a long call (2), a read-back
effect written back (5). The unit tests are ``clients/python/tests/test_newcomer_findings.py``."""

from __future__ import annotations

import asyncio

import pytest

from checkpoints import services
from checkpoints.models import Effect
from recovery_client.client import CheckpointError, next_revision
from tests.client.drivers import Driven, perform
from tests.helpers import age_world, effect_body, envelope

pytestmark = pytest.mark.django_db(transaction=True)


def create(store, **kw) -> dict:
    body = envelope(**kw)
    assert store.compare_and_swap(body, None) == 0
    return body


def test_one_store_looping_over_runs_sends_each_runs_own_token(wendy, make_store, store):
    x, y = create(store), create(store)
    other = make_store(wendy)
    assert store.lease(x["run_id"], "worker-a", ttl_s=30)["fencing_token"] == 1
    assert other.lease(y["run_id"], "worker-b", ttl_s=30)["fencing_token"] == 1

    with pytest.raises(CheckpointError) as fenced:  # A never leased Y: B's lease is live
        store.compare_and_swap(next_revision(y, {"phase": "hijacked"}), 0)
    assert (fenced.value.kind, fenced.value.error) == ("conflict", "fenced")
    # (the refused write is kept as the run's conflict, as any fenced write is)

    z = create(store)  # a fresh run: no token sent, accepted
    assert store.compare_and_swap(next_revision(x, {"phase": "charging"}), 0) == 1
    assert other.compare_and_swap(next_revision(y, {"phase": "charging"}), 0) == 1
    assert other.load(y["id"])["payload"]["phase"] == "charging"
    assert (store.fencing_token_of(x["run_id"]), store.fencing_token_of(z["run_id"])) == (1, None)


def test_an_effect_read_back_is_written_back_as_its_next_revision(store):
    first = create(store)
    effect = effect_body(run_id=first["run_id"], operation_key="charge:A-5")
    assert store.put_effect(effect, None) == 0
    assert store.put_effect(dict(effect, revision=1, state="submitted"), 0) == 1

    read = store.find_effect("payments", "charge:A-5")
    assert set(read) - set(effect)  # the server's extra fields (attempt, times, ...)
    nxt = dict(read, revision=read["revision"] + 1, state="confirmed",
               receipt={"charge_id": "ch_5"})
    assert store.put_effect(nxt, read["revision"]) == 2
    assert store.find_effect("payments", "charge:A-5")["receipt"] == {"charge_id": "ch_5"}


def _outlast_the_lease():
    age_world(3600)  # the call took longer than the lease (database clock; no sleeping)
    assert services.sweep_stale_runs()["effects_unresolved"] == 1


def test_a_call_that_outlasts_the_lease_still_records_its_receipt(store):
    first = create(store, payload={"phase": "charging", "order_id": "A-6"})
    store.lease(first["run_id"], "worker-1", ttl_s=5)

    def charge(key):
        _outlast_the_lease()
        return {"charge_id": "ch_6"}

    async def charge_async(key):  # the async store's call: the ORM off the event loop
        await asyncio.to_thread(_outlast_the_lease)
        return {"charge_id": "ch_6"}

    receipt = perform(store, run_id=first["run_id"], service="payments",
                      operation_key="charge:A-6", effect_class="non_idempotent",
                      request={"amount_cents": 6},
                      call=charge_async if isinstance(store, Driven) else charge)
    assert receipt == {"charge_id": "ch_6"}
    effect = Effect.objects.get(operation_key="charge:A-6")
    assert (effect.state, effect.receipt) == ("confirmed", {"charge_id": "ch_6"})
