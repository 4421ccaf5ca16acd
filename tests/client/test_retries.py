"""Retries, the size check and connection reuse of both clients (issue 10, client parity).

Against ``drivers.FakeServer`` (a scripted HTTP/1.1 server: each test says what the
server answers and counts what it was sent), with an injected ``sleep`` that records the
pauses and waits for none. A ``storage`` failure that retrying can cure (no answer, 5xx,
429) is tried again at most ``retries`` times after a full-jitter pause or the server's
``Retry-After`` (capped); a conflict, a bad payload, a missing object or a refused token
never is; a claim is resent only when the server surely did nothing; a body over the
limit is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from recovery_client.aclient import AsyncHttpCheckpointStore
from recovery_client.client import CheckpointError, HttpCheckpointStore, encode_body, next_revision
from tests.client.drivers import FakeServer, Pauses, perform, real
from tests.helpers import envelope

DROP = FakeServer.DROP
UNAVAILABLE = {"error": "unavailable"}
RUN = str(uuid.uuid4())


def ok(body=None, etag=None, status=200):
    return status, ({"ETag": f'"{etag}"'} if etag is not None else {}), body


def test_it_retries_a_read_after_503s_honouring_retry_after(fake_server, open_store):
    server = fake_server([(503, {"Retry-After": "1"}, UNAVAILABLE)] * 2 + [ok({"id": "x"})])
    pauses = Pauses()
    store = open_store(server.url, "acme", "t", sleep=pauses)

    assert store.load("x") == {"id": "x"}
    assert server.methods() == ["GET", "GET", "GET"]
    assert pauses == [1.0, 1.0]


def test_it_caps_retry_after_and_gives_up_after_the_retries(fake_server, open_store):
    server = fake_server(default=(503, {"Retry-After": "120"}, UNAVAILABLE))
    pauses = Pauses()
    store = open_store(server.url, "acme", "t", retries=2, max_backoff_s=3.0, sleep=pauses)

    with pytest.raises(CheckpointError) as err:
        store.revision("x")

    assert (err.value.kind, err.value.status, err.value.retry_after_s) == ("storage", 503, 120)
    assert server.methods() == ["HEAD"] * 3
    assert pauses == [3.0, 3.0]


def test_it_pauses_with_capped_full_jitter_without_retry_after(fake_server, open_store):
    server = fake_server(default=(500, {}, {"error": "internal"}))
    pauses = Pauses()
    store = open_store(server.url, "acme", "t", retries=5, backoff_s=0.5, max_backoff_s=1.5,
                       sleep=pauses)

    with pytest.raises(CheckpointError) as err:
        store.load("x")

    assert (err.value.kind, err.value.status) == ("storage", 500)
    assert len(server.requests) == 6
    ceilings = [0.5, 1.0, 1.5, 1.5, 1.5]  # min(cap, backoff * 2**(n-1))
    assert len(pauses) == len(ceilings)
    assert all(0 <= p <= c for p, c in zip(pauses, ceilings, strict=True))


def test_it_retries_after_a_dropped_answer_and_a_429(fake_server, open_store):
    server = fake_server([(200, {}, DROP), (429, {"Retry-After": "0"}, {"error": "x"}),
                          ok({"results": [], "next": None})])
    pauses = Pauses()
    store = open_store(server.url, "acme", "t", sleep=pauses)

    assert store.find_effect("payments", "charge:1") is None
    assert server.methods() == ["GET"] * 3
    assert len(pauses) == 2 and pauses[1] == 0


@pytest.mark.parametrize(("status", "error", "kind"), [
    (412, "conflict", "conflict"), (409, "fenced", "conflict"),
    (409, "lease_held", "conflict"), (400, "invalid_payload", "invalid_payload"),
    (413, "payload_too_large", "invalid_payload"), (422, "invalid_transition", "invalid_payload"),
    (404, "not_found", "not_found"), (401, "not_authenticated", "storage"),
    (403, "permission_denied", "storage"),
])
def test_it_never_retries_an_answer_retrying_cannot_change(fake_server, open_store, status,
                                                           error, kind):
    answer = {"error": error, "detail": "x"}
    if status == 412:
        answer["current_revision"] = 4
    server = fake_server(default=(status, {}, answer))
    pauses = Pauses()
    store = open_store(server.url, "acme", "t", sleep=pauses)

    with pytest.raises(CheckpointError) as put:
        store.compare_and_swap(envelope(revision=5), 4)
    with pytest.raises(CheckpointError) as lease:
        store.lease(RUN, "worker-1", ttl_s=5)

    assert (put.value.kind, put.value.status, put.value.error) == (kind, status, error)
    assert (lease.value.kind, lease.value.status) == (kind, status)
    assert server.methods() == ["PUT", "POST"]  # one request each
    assert pauses == []


def test_a_claim_is_resent_only_when_the_server_surely_did_nothing(fake_server, open_store):
    decision = {"action": "continue", "reason": "stable", "checkpoint_id": None,
                "revision": None, "fencing_token": 1}
    server = fake_server([(503, {"Retry-After": "0"}, UNAVAILABLE), ok(decision),
                          (200, {}, DROP)])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    assert store.resume(RUN)["action"] == "continue"  # 503: nothing was done; resent
    with pytest.raises(CheckpointError) as lost:  # the answer was lost: it may have
        store.resume(RUN)                           # consumed an approval, so not resent
    assert (lost.value.kind, lost.value.status, lost.value.sent) == ("storage", 0, True)
    assert server.methods() == ["POST"] * 3


def test_a_lease_whose_answer_was_lost_is_taken_again(fake_server, open_store):
    server = fake_server([(200, {}, DROP),
                          ok({"fencing_token": 3, "expires_at": "2026-01-01T00:00:00Z"})])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    assert store.lease(RUN, "worker-1", ttl_s=5)["fencing_token"] == 3
    assert store.fencing_token == 3
    assert server.methods() == ["POST", "POST"]


def test_a_write_after_a_503_is_resent_without_looking(fake_server, open_store):
    body = envelope()
    server = fake_server([(503, {"Retry-After": "0"}, UNAVAILABLE), ok({}, etag=0, status=201)])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    assert store.compare_and_swap(body, None) == 0
    assert server.methods() == ["PUT", "PUT"]


def test_a_write_whose_answer_was_lost_is_read_back_instead_of_resent(fake_server,
                                                                       open_store):
    body = next_revision(envelope(), {"phase": "charging"})
    server = fake_server([(200, {}, DROP), ok(None, etag=1), ok(body, etag=1)])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    assert store.compare_and_swap(body, 0) == 1
    assert server.methods() == ["PUT", "HEAD", "GET"]  # stored: not resent


def test_a_write_whose_answer_was_lost_is_resent_when_it_was_not_stored(fake_server,
                                                                        open_store):
    body = next_revision(envelope(), {"phase": "charging"})
    server = fake_server([(200, {}, DROP), ok(None, etag=0), ok({}, etag=1)])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    assert store.compare_and_swap(body, 0) == 1
    assert server.methods() == ["PUT", "HEAD", "PUT"]


def test_a_resent_write_refused_by_its_own_first_request_succeeds(fake_server, open_store):
    body = next_revision(envelope(), {"phase": "charging"})
    stale = (412, {}, {"error": "conflict", "current_revision": 1})
    server = fake_server([(200, {}, DROP), ok(None, etag=0), stale, ok(body, etag=1)])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    assert store.compare_and_swap(body, 0) == 1
    assert server.methods() == ["PUT", "HEAD", "PUT", "GET"]


def test_a_resent_write_refused_by_another_writer_raises_the_conflict(fake_server, open_store):
    body = next_revision(envelope(), {"phase": "charging"})
    theirs = dict(body, payload={"phase": "cancelled"})
    stale = (412, {}, {"error": "conflict", "current_revision": 1})
    server = fake_server([(200, {}, DROP), ok(None, etag=1), ok(theirs, etag=1), stale,
                          ok(theirs, etag=1)])
    store = open_store(server.url, "acme", "t", sleep=Pauses())

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(body, 0)

    assert (err.value.kind, err.value.status, err.value.current_revision) == ("conflict", 412, 1)
    assert server.methods() == ["PUT", "HEAD", "GET", "PUT", "GET"]


def test_retries_zero_sends_each_request_once(fake_server, open_store):
    server = fake_server(default=(503, {}, UNAVAILABLE))
    store = open_store(server.url, "acme", "t", retries=0, sleep=Pauses())

    with pytest.raises(CheckpointError):
        store.load("x")
    with pytest.raises(CheckpointError):
        store.compare_and_swap(envelope(), None)
    assert server.methods() == ["GET", "PUT"]


# --- the size check ---------------------------------------------------------------------

def _sized(total: int) -> dict:
    """An envelope whose JSON body is exactly ``total`` bytes."""
    body = envelope(payload={"pad": ""})
    body["payload"]["pad"] = "x" * (total - len(encode_body(body, None, "PUT", "p")))
    return body


def test_it_refuses_a_body_over_the_limit_without_sending_anything(fake_server, open_store):
    server = fake_server(default=ok({}, etag=0, status=201))
    store = open_store(server.url, "acme", "t", max_body_bytes=4096, sleep=Pauses())
    at_limit, over = _sized(4096), _sized(4097)

    assert store.compare_and_swap(at_limit, None) == 0
    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(over, None)
    with pytest.raises(CheckpointError) as effect:
        # (put_effect sends only an effect's fields: the padding rides in the receipt)
        store.put_effect(dict(over, state="planned", receipt={"pad": "x" * 4097}), None)

    assert (err.value.kind, err.value.status, err.value.sent) == ("invalid_payload", 0, False)
    assert err.value.error == "payload_too_large"
    assert "4097 bytes" in err.value.message and "limit of 4096 bytes" in err.value.message
    assert effect.value.kind == "invalid_payload"
    assert len(server.requests) == 1  # only the body at the limit was sent


def test_the_default_limit_is_the_servers_one_mib(fake_server, open_store):
    server = fake_server()
    store = open_store(server.url, "acme", "t")

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(_sized(1024 * 1024 + 1), None)

    assert err.value.kind == "invalid_payload" and "limit of 1048576 bytes" in err.value.message
    assert server.requests == []


def test_an_effect_call_over_the_limit_calls_nothing(fake_server, open_store):
    server = fake_server()
    store = open_store(server.url, "acme", "t", max_body_bytes=2048)

    with pytest.raises(CheckpointError) as err:
        perform(store, run_id=RUN, service="payments", operation_key="charge:1",
                effect_class="idempotent", request={"note": "x" * 4096},
                call=lambda key: pytest.fail("must not call"))

    assert err.value.kind == "invalid_payload"
    assert server.requests == []


def test_a_body_that_is_not_json_is_invalid_payload_and_not_sent(fake_server, open_store):
    server = fake_server()
    store = open_store(server.url, "acme", "t")

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(envelope(payload={"amount": float("nan")}), None)

    assert (err.value.kind, err.value.sent) == ("invalid_payload", False)
    assert server.requests == []


def test_a_body_is_sent_as_utf8_and_measured_so(fake_server, open_store):
    server = fake_server(default=ok({}, etag=0, status=201))
    store = open_store(server.url, "acme", "t", max_body_bytes=4096)
    body = envelope(payload={"note": "\u4e2d" * 1000})  # 3,000 bytes as UTF-8

    assert store.compare_and_swap(body, None) == 0

    assert "\u4e2d".encode() * 1000 in server.requests[0][2]


def test_an_unpaired_surrogate_is_invalid_payload_naming_the_field(fake_server, open_store):
    server = fake_server()
    store = open_store(server.url, "acme", "t")

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(envelope(payload={"note": "a\ud800b"}), None)

    assert (err.value.kind, err.value.sent) == ("invalid_payload", False)
    assert "body.payload.note: an unpaired surrogate" in err.value.message
    assert server.requests == []


@pytest.mark.django_db(transaction=True)
def test_the_servers_own_413_is_invalid_payload_and_not_retried(settings, store):
    settings.RECOVERY_MAX_BODY_BYTES = 8192  # the live server runs in this process
    real(store).max_body_bytes = None  # the client does not check: the server refuses

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(_sized(9000), None)

    assert (err.value.kind, err.value.status, err.value.error) == (
        "invalid_payload", 413, "payload_too_large")


def test_settings_out_of_range_are_refused():
    for bad in ({"retries": -1}, {"backoff_s": 9.0}, {"max_body_bytes": 0}):
        with pytest.raises(ValueError):
            HttpCheckpointStore("http://h", "acme", "t", **bad)
        with pytest.raises(ValueError):
            AsyncHttpCheckpointStore("http://h", "acme", "t", **bad)


# --- connections ------------------------------------------------------------------------

def test_both_clients_send_every_request_on_one_connection(fake_server, open_store):
    server = fake_server(default=ok({"id": "x"}, etag=0))
    store = open_store(server.url, "acme", "t")

    for _ in range(5):
        store.load("x")
        store.revision("x")

    assert (len(server.requests), server.connections) == (10, 1)


def test_the_async_store_closes_its_pool_with_async_with(fake_server):
    server = fake_server(default=ok({"id": "x"}, etag=0))

    async def scenario():
        async with AsyncHttpCheckpointStore(server.url, "acme", "t") as store:
            await asyncio.gather(*(store.load("x") for _ in range(3)))
            await store.revision("x")
        return store

    store = asyncio.run(scenario())
    assert store._client.is_closed
    assert 1 <= server.connections <= 3 and len(server.requests) == 4


def test_the_sync_store_closes_its_connection_with_with(fake_server):
    server = fake_server(default=ok({"id": "x"}, etag=0))
    with HttpCheckpointStore(server.url, "acme", "t") as store:
        store.load("x")
        assert store._conn is not None
    assert store._conn is None


# --- the async client's transport errors (httpx.MockTransport) ----------------------------

def _mock_store(errors: list, *, answer=None, **kw) -> tuple[AsyncHttpCheckpointStore, list]:
    """An async store over a MockTransport that raises ``errors`` in turn, then answers
    ``answer``; returns it and the list of requests it saw."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        if errors:
            raise errors.pop(0)
        return httpx.Response(200, json=answer or {"id": "x"}, headers={"ETag": '"0"'})

    store = AsyncHttpCheckpointStore("http://h", "acme", "t", transport=httpx.MockTransport(handler),
                                     sleep=Pauses(), **kw)
    return store, seen


def test_async_reads_are_retried_after_timeouts_and_resets():
    store, seen = _mock_store([httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("reset")])

    assert asyncio.run(store.load("x")) == {"id": "x"}
    assert seen == ["GET"] * 3


def test_async_claim_is_resent_after_a_connect_error_but_not_a_timeout():
    decision = {"action": "continue", "reason": "stable", "fencing_token": 1}
    store, seen = _mock_store([httpx.ConnectError("refused")], answer=decision)
    assert asyncio.run(store.resume(RUN))["action"] == "continue"
    assert seen == ["POST", "POST"]

    store, seen = _mock_store([httpx.ReadTimeout("slow")], answer=decision)
    with pytest.raises(CheckpointError) as err:
        asyncio.run(store.resume(RUN))
    assert (err.value.kind, err.value.status, err.value.sent) == ("storage", 0, True)
    assert seen == ["POST"]


def test_async_gives_up_after_the_retries():
    store, seen = _mock_store([httpx.ConnectError("refused")] * 5, retries=2)

    with pytest.raises(CheckpointError) as err:
        asyncio.run(store.load("x"))

    assert (err.value.kind, err.value.sent) == ("storage", False)
    assert seen == ["GET"] * 3
