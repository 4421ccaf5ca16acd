"""What only the async client has, against the real API (issue 10, client parity): a
coroutine ``call`` and ``on_step`` in ``perform_effect``, and tasks of one event loop
sharing one store (its pool). Every other scenario runs for both clients through
``conftest.open_store``."""

from __future__ import annotations

import asyncio

import pytest

from checkpoints import services
from checkpoints.models import Checkpoint, Effect
from recovery_client.aclient import AsyncHttpCheckpointStore, EffectFailed, perform_effect
from tests.helpers import envelope

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(wendy) -> str:
    return services.token_issue(user=wendy)


def test_perform_effect_awaits_a_coroutine_call_and_on_step(live_server, token):
    steps, calls = [], []

    async def charge(key):
        calls.append(key)
        await asyncio.sleep(0)
        return {"charge_id": "ch_1"}

    async def step(name):
        steps.append(name)

    async def refused(key):
        raise EffectFailed("card declined", {"error": "card_declined"})

    async def scenario():
        async with AsyncHttpCheckpointStore(live_server.url, "acme", token) as store:
            body = envelope()
            await store.compare_and_swap(body, None)
            kw = dict(run_id=body["run_id"], service="payments", effect_class="non_idempotent",
                      request={"amount_cents": 100})
            first = await perform_effect(store, operation_key="charge:1", call=charge,
                                         on_step=step, **kw)
            again = await perform_effect(store, operation_key="charge:1", call=charge, **kw)
            with pytest.raises(EffectFailed):
                await perform_effect(store, operation_key="charge:2", call=refused, **kw)
            return first, again

    first, again = asyncio.run(scenario())

    assert first == again == {"charge_id": "ch_1"}
    assert calls == ["charge:1"]  # the second walk replayed the receipt
    assert steps == ["submitted", "called", "confirmed"]
    states = dict(Effect.objects.values_list("operation_key", "state"))
    assert states == {"charge:1": "confirmed", "charge:2": "failed"}


def test_tasks_of_one_loop_share_one_store(live_server, token):
    bodies = [envelope() for _ in range(6)]

    async def scenario():
        async with AsyncHttpCheckpointStore(live_server.url, "acme", token,
                                            max_connections=3) as store:
            created = await asyncio.gather(*(store.compare_and_swap(b, None) for b in bodies))
            loaded = await asyncio.gather(*(store.load(b["id"]) for b in bodies))
            return created, loaded

    created, loaded = asyncio.run(scenario())

    assert created == [0] * 6
    assert loaded == bodies
    assert Checkpoint.objects.filter(uuid__in=[b["id"] for b in bodies]).count() == 6
