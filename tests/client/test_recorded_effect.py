"""``@recorded_effect`` (clients/python/recovery_client/effects.py, issue 10 item 2) against the
real API (``live_server``): a new effect is called once and confirmed, a confirmed one
replays its receipt without calling, one in doubt raises ``EffectInDoubt`` (never an
automatic duplicate), a refused one raises ``EffectFailed`` again; inside a LangGraph node
the run is the thread's and writes carry the saver's fencing token; nothing is written
when the call cannot be recorded."""

from __future__ import annotations

import asyncio
import uuid
from typing import TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from checkpoints import services
from checkpoints.models import Effect
from recovery_client import effects
from recovery_client.client import (
    CheckpointError,
    EffectFailed,
    EffectInDoubt,
    HttpCheckpointStore,
    fingerprint,
)
from recovery_client.effects import EffectNotConfigured, recorded_effect
from recovery_client.protocol import thread_run_id
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect, sweep_later

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "refund:LG-1"
REQUEST = {"order_id": "LG-1", "amount_cents": 2599}


@pytest.fixture
def store(live_server, wendy) -> HttpCheckpointStore:
    """``@recorded_effect`` drives a sync ``HttpCheckpointStore`` (the conftest's
    ``store`` also runs each test with the async store, which the decorator does not
    take): tenant acme, as wendy (writer)."""
    with HttpCheckpointStore(live_server.url, "acme", services.token_issue(user=wendy)) as s:
        yield s


@pytest.fixture(autouse=True)
def no_default_store():
    """Each test sets the module default it needs; none leaks into the next."""
    effects.set_default_store(None)
    yield
    effects.set_default_store(None)


class Provider:
    """The external service: counts calls and the keys it was sent."""

    def __init__(self, answer=None, error: Exception | None = None):
        self.keys: list[str] = []
        self.answer = answer
        self.error = error

    def __call__(self, order_id: str, amount_cents: int, idempotency_key: str):
        self.keys.append(idempotency_key)
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            return self.answer
        return {"charge_id": f"ch_{order_id}", "amount_cents": amount_cents}


def refund_tool(provider, store, run_id, **kw):
    return recorded_effect(service="payments", key=lambda order_id, **_: f"refund:{order_id}",
                           store=store, run_id=run_id, **kw)(provider)


def existing(wendy, acme, run_id, *states, receipt=None):
    """An effect record for KEY already walked through ``states`` (as an earlier process,
    or reconciliation, left it)."""
    body = effect_body(run_id=run_id, operation_key=KEY, fingerprint=fingerprint(REQUEST))
    effect = put_effect(wendy, acme, body)
    for revision, state in enumerate(states, start=1):
        effect = put_effect(wendy, acme, dict(body, revision=revision, state=state,
                                              receipt=receipt if state == "confirmed" else None),
                            expected=revision - 1)
    return effect


def test_it_calls_a_new_effect_once_with_its_key_then_replays_the_receipt(store):
    provider, run_id = Provider(), str(uuid.uuid4())
    charge = refund_tool(provider, store, run_id)

    first = charge(order_id="LG-1", amount_cents=2599)
    again = charge("LG-1", 2599)

    assert first == again == {"charge_id": "ch_LG-1", "amount_cents": 2599}
    assert provider.keys == [KEY]
    effect = Effect.objects.get(operation_key=KEY)
    assert (effect.state, str(effect.run.uuid), effect.receipt) == ("confirmed", run_id, first)
    assert effect.request_fingerprint == fingerprint(REQUEST)


def test_it_replays_a_confirmed_receipt_without_calling(store, wendy, acme):
    run_id = uuid.uuid4()
    existing(wendy, acme, run_id, "submitted", "confirmed",
             receipt={"charge_id": "ch_found_by_reconciliation", "status": "succeeded"})
    provider = Provider()

    answer = refund_tool(provider, store, run_id)(order_id="LG-1", amount_cents=2599)

    assert answer == {"charge_id": "ch_found_by_reconciliation", "status": "succeeded"}
    assert provider.keys == []


@pytest.mark.parametrize("states", [("submitted",), ("submitted", "unresolved")])
def test_it_raises_in_doubt_and_never_calls_again(store, wendy, acme, states):
    run_id = uuid.uuid4()
    existing(wendy, acme, run_id, *states)
    provider = Provider()

    with pytest.raises(EffectInDoubt) as raised:
        refund_tool(provider, store, run_id)(order_id="LG-1", amount_cents=2599)

    assert raised.value.effect["state"] == states[-1]
    assert provider.keys == []
    assert Effect.objects.get(operation_key=KEY).state == states[-1]


def test_it_calls_a_planned_effect_once(store, wendy, acme):
    """The process died after planning, before sending: nothing went out, so the next
    attempt sends it (once) under the same record."""
    run_id = uuid.uuid4()
    planned = existing(wendy, acme, run_id)
    provider = Provider()

    answer = refund_tool(provider, store, run_id)(order_id="LG-1", amount_cents=2599)

    assert provider.keys == [KEY]
    effect = Effect.objects.get(operation_key=KEY)
    assert (effect.uuid, effect.state, effect.receipt) == (planned.uuid, "confirmed", answer)


def test_it_leaves_an_effect_in_doubt_when_the_call_breaks(store):
    provider, run_id = Provider(error=TimeoutError("no answer")), str(uuid.uuid4())
    charge = refund_tool(provider, store, run_id)

    with pytest.raises(TimeoutError):
        charge(order_id="LG-1", amount_cents=2599)
    provider.error = None
    with pytest.raises(EffectInDoubt):
        charge(order_id="LG-1", amount_cents=2599)

    assert provider.keys == [KEY]
    assert Effect.objects.get(operation_key=KEY).state == "submitted"


def test_it_leaves_an_effect_in_doubt_when_the_answer_is_no_receipt(store):
    provider, run_id = Provider(answer=["not", "an", "object"]), str(uuid.uuid4())

    with pytest.raises(TypeError, match="not a JSON object"):
        refund_tool(provider, store, run_id)(order_id="LG-1", amount_cents=2599)

    assert Effect.objects.get(operation_key=KEY).state == "submitted"


def test_it_records_a_refusal_and_raises_it_again_without_calling(store):
    refusal = EffectFailed("card declined", {"error": "card_declined"})
    provider, run_id = Provider(error=refusal), str(uuid.uuid4())
    charge = refund_tool(provider, store, run_id)

    with pytest.raises(EffectFailed):
        charge(order_id="LG-1", amount_cents=2599)
    with pytest.raises(EffectFailed) as again:
        charge(order_id="LG-1", amount_cents=2599)

    assert again.value.receipt == {"error": "card_declined"}
    assert provider.keys == [KEY]
    assert Effect.objects.get(operation_key=KEY).state == "failed"


def test_it_refuses_another_request_under_a_used_key_before_calling(store):
    provider, run_id = Provider(), str(uuid.uuid4())
    charge = refund_tool(provider, store, run_id)
    charge(order_id="LG-1", amount_cents=2599)

    with pytest.raises(CheckpointError) as refused:
        charge(order_id="LG-1", amount_cents=1)

    assert (refused.value.status, refused.value.error) == (422, "idempotency_key_reuse")
    assert provider.keys == [KEY]


def test_it_takes_the_key_from_a_format_string_and_the_request_from_a_callable(store):
    seen: list[str] = []

    @recorded_effect(service="crm", key="note:{order_id}", store=store, run_id=uuid.uuid4(),
                     request=lambda order_id, **_: {"order_id": order_id})
    def note(order_id: str, text: object, idempotency_key: str) -> dict:
        seen.append(idempotency_key)
        return {"note_id": "n1"}

    assert note("LG-7", text=object()) == {"note_id": "n1"}  # text is not fingerprinted
    effect = Effect.objects.get(service="crm")
    assert (seen, effect.operation_key) == (["note:LG-7"], "note:LG-7")
    assert effect.request_fingerprint == fingerprint({"order_id": "LG-7"})


def test_it_works_for_async_functions(store):
    calls: list[str] = []

    @recorded_effect(service="payments", key="refund:{order_id}", store=store,
                     run_id=uuid.uuid4())
    async def charge(order_id: str, amount_cents: int, idempotency_key: str) -> dict:
        await asyncio.sleep(0)
        calls.append(idempotency_key)
        return {"charge_id": "ch_async"}

    async def twice():
        return [await charge("LG-1", 2599), await charge("LG-1", 2599)]

    assert asyncio.run(twice()) == [{"charge_id": "ch_async"}] * 2
    assert calls == [KEY]


def test_it_writes_nothing_when_the_call_cannot_be_recorded(store):
    provider = Provider()
    no_store = recorded_effect(service="payments", key="refund:{order_id}",
                               run_id=uuid.uuid4())(provider)
    no_run = recorded_effect(service="payments", key="refund:{order_id}", store=store)(provider)
    bad_key = recorded_effect(service="payments", key=lambda **_: None, store=store,
                              run_id=uuid.uuid4())(provider)
    with_key = refund_tool(provider, store, uuid.uuid4())
    not_json = refund_tool(provider, store, uuid.uuid4())

    with pytest.raises(EffectNotConfigured, match="no store"):
        no_store(order_id="LG-1", amount_cents=1)
    with pytest.raises(EffectNotConfigured, match="no run"):
        no_run(order_id="LG-1", amount_cents=1)
    with pytest.raises(TypeError, match="non-empty string"):
        bad_key(order_id="LG-1", amount_cents=1)
    with pytest.raises(TypeError, match="not an argument"):
        recorded_effect(service="payments", key="refund:{order}", store=store,
                        run_id=uuid.uuid4())(provider)(order_id="LG-1", amount_cents=1)
    with pytest.raises(TypeError, match="given by @recorded_effect"):
        with_key(order_id="LG-1", amount_cents=1, idempotency_key="mine")
    with pytest.raises(TypeError, match="not JSON"):
        not_json(order_id="LG-1", amount_cents=object())

    assert provider.keys == []
    assert not Effect.objects.exists()


def test_it_refuses_a_bad_declaration():
    with pytest.raises(ValueError, match="service"):
        recorded_effect(service="", key="k")
    with pytest.raises(ValueError, match="effect_class"):
        recorded_effect(service="payments", key="k", effect_class="risky")
    with pytest.raises(ValueError, match="key"):
        recorded_effect(service="payments", key="")


# --- inside a LangGraph graph ---------------------------------------------------------------

class Order(TypedDict, total=False):
    order_id: str
    charge_id: str


class LeasingSaver(InMemorySaver):
    """An in-memory saver that, like ``RecoverySaver`` with a lease, says which fencing
    token it sends for a thread."""

    def __init__(self, tokens: dict[str, int]):
        super().__init__()
        self.tokens = tokens

    def fencing_token(self, thread_id: str) -> int | None:
        return self.tokens.get(thread_id)


def one_node_graph(tool, saver):
    def charge(state: Order) -> dict:
        return {"charge_id": tool(order_id=state["order_id"], amount_cents=2599)["charge_id"]}

    graph = StateGraph(Order)
    graph.add_node("charge", charge)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    return graph.compile(checkpointer=saver)


def test_it_records_in_the_threads_run_with_the_savers_fencing_token(store, wendy, acme):
    """Once the run is leased (token 1), a write without the token is fenced; the
    decorator sends the token the graph's saver holds for the thread."""
    thread = "refund-thread-1"
    run_id = thread_run_id(thread)
    existing(wendy, acme, run_id)  # the run exists (planned effect), so it can be leased
    store.lease(str(run_id), "saver-owner", ttl_s=60)
    effects.set_default_store(HttpCheckpointStore(store.base_url, "acme", store.token))
    provider = Provider()
    tool = recorded_effect(service="payments", key="refund:{order_id}")(provider)
    config = {"configurable": {"thread_id": thread}}

    with pytest.raises(CheckpointError) as fenced:
        one_node_graph(tool, InMemorySaver()).invoke({"order_id": "LG-1"}, config)
    assert (fenced.value.status, fenced.value.error) == (409, "fenced")
    assert provider.keys == []

    state = one_node_graph(tool, LeasingSaver({thread: store.fencing_token})).invoke(
        {"order_id": "LG-1"}, config)

    assert state["charge_id"] == "ch_LG-1"
    assert provider.keys == [KEY]
    effect = Effect.objects.get(operation_key=KEY)
    assert (effect.run.uuid, effect.state) == (run_id, "confirmed")


def test_it_calls_an_unknown_effect_again_only_in_an_invocation_that_consumed_a_retry(
        store, wendy, rita, april, acme):
    """``unknown`` (the service could not be asked) is never re-sent by itself; after two
    people approved a retry and the resume claim consumed it, the invocation whose
    config says so calls it once more, with the same key."""
    thread = "refund-thread-retry"
    run_id = thread_run_id(thread)
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging",
                                                                 "order_id": "LG-1"}))
    existing(wendy, acme, run_id, "submitted")
    services.reconciler_configure(actor=None, tenant=acme, service="payments", plugin="none")
    sweep_later()
    services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="lost the answer")
    assert Effect.objects.get(operation_key=KEY).state == "unknown"
    effects.set_default_store(store)
    provider = Provider()
    graph = one_node_graph(recorded_effect(service="payments", key="refund:{order_id}")(provider),
                           InMemorySaver())

    with pytest.raises(EffectInDoubt):
        graph.invoke({"order_id": "LG-1"}, {"configurable": {"thread_id": thread}})
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="resend")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="dedupes by key")
    assert store.resume(str(run_id))["action"] == "retry"
    state = graph.invoke({"order_id": "LG-1"},
                         {"configurable": {"thread_id": thread, "recovery_effect_retry": True}})

    assert provider.keys == [KEY]
    assert state["charge_id"] == "ch_LG-1"
    effect = Effect.objects.get(operation_key=KEY)
    assert (effect.state, effect.attempt) == ("confirmed", 2)


def test_in_a_graph_checkpointed_by_a_leasing_recovery_saver_it_sends_the_savers_token(
        store):
    """``RecoverySaver`` leases the thread's run before the node runs; the effect writes
    carry its token (``RecoverySaver.fencing_token``), so its own lease does not fence
    them (without it: 409 ``fenced`` before the provider is called)."""
    from checkpoints.models import Run
    from recovery_client.langgraph import RecoverySaver

    thread = "refund-thread-saver"
    effects.set_default_store(store)
    provider = Provider()
    tool = recorded_effect(service="payments", key="refund:{order_id}")(provider)

    with RecoverySaver(store.base_url, "acme", store.token, lease_ttl_s=60) as saver:
        state = one_node_graph(tool, saver).invoke(
            {"order_id": "LG-1"}, {"configurable": {"thread_id": thread}}, durability="sync")
        token = saver.fencing_token(thread)

    assert state["charge_id"] == "ch_LG-1"
    assert provider.keys == [KEY]
    run = Run.objects.get(uuid=thread_run_id(thread))
    assert (run.lease_owner, run.fencing_token) == (saver.owner, token)
    assert token >= 1
    effect = Effect.objects.get(operation_key=KEY)
    assert (effect.run_id, effect.state) == (run.pk, "confirmed")
