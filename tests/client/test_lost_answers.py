"""A compare-and-swap write whose answer was lost, against the real API, both clients
(issue 10, client parity; ``clients/python/recovery_client/client.py`` module docstring, "Retries").

``drivers.Interceptor`` loses answers after the server acted, or makes the first request
land after the client looked. A write the store already holds succeeds without being
resent and leaves no conflict; one that lands late is read back after its resend's 412;
one whose revision another writer took is the conflict it is.
"""

from __future__ import annotations

import uuid

import pytest

from checkpoints import services
from checkpoints.models import Conflict, Effect
from recovery_client.client import CheckpointError, HttpCheckpointStore, next_revision
from tests.client.drivers import Interceptor, Pauses, perform, real
from tests.helpers import envelope

pytestmark = pytest.mark.django_db(transaction=True)

PUT, HEAD, GET = ("PUT", "checkpoints"), ("HEAD", "checkpoints"), ("GET", "checkpoints")


@pytest.fixture
def quick(store):
    """The test's store, pausing for nothing between tries."""
    real(store)._sleep = Pauses()
    return store


def _conflicts(checkpoint_id) -> int:
    return Conflict.objects.filter(target_uuid=checkpoint_id).count()


def test_a_stored_write_whose_answer_was_lost_is_read_back_not_resent(quick):
    first = envelope()
    quick.compare_and_swap(first, None)
    second = next_revision(first, {"phase": "charging", "order_id": "A-1042"})
    lossy = Interceptor(quick, {0: "lose"})

    assert quick.compare_and_swap(second, 0) == 1

    assert lossy.seen == [PUT, HEAD, GET]
    assert _conflicts(first["id"]) == 0  # no refused resend on the dashboard
    assert [r["revision"] for r in quick.revisions(first["id"])] == [0, 1]
    assert quick.load(first["id"]) == second


def test_a_create_whose_answer_was_lost_is_read_back(quick):
    first = envelope()
    lossy = Interceptor(quick, {0: "lose"})

    assert quick.compare_and_swap(first, None) == 0

    assert lossy.seen == [PUT, HEAD, GET]
    assert _conflicts(first["id"]) == 0
    assert quick.load(first["id"]) == first


def test_a_write_landing_after_the_look_succeeds_after_its_resends_412(quick):
    first = envelope()
    quick.compare_and_swap(first, None)
    second = next_revision(first, {"phase": "charging", "order_id": "A-1042"})
    late = Interceptor(quick, {0: "drop", 1: "land"})

    assert quick.compare_and_swap(second, 0) == 1

    assert late.seen == [PUT, HEAD, PUT, GET]
    assert [r["revision"] for r in quick.revisions(first["id"])] == [0, 1]
    assert quick.load(first["id"]) == second
    assert _conflicts(first["id"]) == 1  # the refused resend, as documented


def test_a_revision_another_writer_took_meanwhile_is_a_conflict(live_server, wendy, quick):
    first = envelope()
    quick.compare_and_swap(first, None)
    ours = next_revision(first, {"phase": "charging", "order_id": "A-1042"})
    theirs = next_revision(first, {"phase": "cancelled", "order_id": "A-1042"})
    other = HttpCheckpointStore(live_server.url, "acme", services.token_issue(user=wendy))
    raced = Interceptor(quick, {0: "drop", 1: lambda: other.compare_and_swap(theirs, 0)})

    with pytest.raises(CheckpointError) as err:
        quick.compare_and_swap(ours, 0)

    assert (err.value.kind, err.value.status, err.value.current_revision) == ("conflict", 412, 1)
    assert raced.seen == [PUT, HEAD, GET, PUT, GET]
    assert quick.load(first["id"]) == theirs
    assert _conflicts(first["id"]) == 1  # ours, refused
    other.close()


def test_an_effect_walk_survives_lost_answers_and_calls_once(quick):
    run_id = str(quick_run(quick))
    calls = []
    lossy = Interceptor(quick, {0: "lose", 2: "lose"})

    receipt = perform(quick, run_id=run_id, service="refunds", operation_key="refund:A-9",
                      effect_class="idempotent", request={"order_id": "A-9"},
                      call=lambda key: calls.append(key) or {"refund_id": "re_9"})

    assert receipt == {"refund_id": "re_9"}
    assert calls == ["refund:A-9"]
    effects = ("PUT", "effects"), ("GET", "effects")
    assert lossy.seen == [effects[0], effects[1], effects[0], effects[1], effects[0]]
    effect = Effect.objects.get(operation_key="refund:A-9")
    assert (effect.state, effect.revision) == ("confirmed", 2)
    assert Conflict.objects.filter(target_uuid=effect.uuid).count() == 0


def quick_run(store) -> uuid.UUID:
    body = envelope()
    store.compare_and_swap(body, None)
    return uuid.UUID(body["run_id"])
