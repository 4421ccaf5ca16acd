"""The I/O-free core, ``recovery_client.core`` (shared by ``client`` and ``aclient`` and,
for the error kinds and the JSON encoder, with ``RecoverySaver``): error kinds, what is
retried, the size check before sending, answer decoding, the retry pauses. No server.
Reached through ``recovery_client.client``, which re-exports it, as callers do."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest

from recovery_client import client, core
from recovery_client.client import (
    CONFLICT,
    INVALID_PAYLOAD,
    NOT_FOUND,
    STORAGE,
    CheckpointError,
    HttpCheckpointStore,
)

CALL = client.Call("PUT", "checkpoints/c1", "http://x/api/v1/tenants/acme/checkpoints/c1",
                   b"{}", {})


@pytest.mark.parametrize(("status", "kind"), [
    (404, NOT_FOUND), (409, CONFLICT), (412, CONFLICT), (400, INVALID_PAYLOAD),
    (413, INVALID_PAYLOAD), (422, INVALID_PAYLOAD), (428, INVALID_PAYLOAD),
    (401, STORAGE), (403, STORAGE), (429, STORAGE), (500, STORAGE), (503, STORAGE)])
def test_kind_for_status(status, kind):
    assert client.kind_for_status(status) == kind


@pytest.mark.parametrize(("status", "sent", "retry", "acted"), [
    (0, False, True, False), (0, True, True, True), (429, True, True, False),
    (503, True, True, False), (500, True, True, True), (401, True, False, True)])
def test_what_is_retried_and_what_may_have_acted(status, sent, retry, acted):
    exc = CheckpointError(client.kind_for_status(status) if status else STORAGE, "x",
                          status=status, sent=sent)
    assert client.retryable(exc) is retry
    assert client.may_have_acted(exc) is acted


def test_other_kinds_are_never_retried():
    for kind in (NOT_FOUND, CONFLICT, INVALID_PAYLOAD):
        assert not client.retryable(CheckpointError(kind, "x", status=0))


def test_the_fingerprint_is_the_sha256_of_canonical_json():
    request = {"b": 1, "a": "é", "c": [1, {"z": None}]}
    canonical = '{"a":"é","b":1,"c":[1,{"z":null}]}'.encode()
    assert client.fingerprint(request) == hashlib.sha256(canonical).hexdigest()
    assert client.fingerprint(dict(reversed(request.items()))) == client.fingerprint(request)


def test_a_body_over_the_limit_is_refused_before_sending():
    body = {"payload": "é" * 10}  # 20 bytes of UTF-8 for 10 characters
    exact = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    data = client.encode_body(body, exact, "PUT", "checkpoints/c1")  # at the limit: sent
    assert data == '{"payload":"éééééééééé"}'.encode()
    with pytest.raises(CheckpointError) as err:
        client.encode_body(body, len(data) - 1, "PUT", "checkpoints/c1")
    assert (err.value.kind, err.value.error, err.value.sent, err.value.status) == (
        INVALID_PAYLOAD, "payload_too_large", False, 0)
    assert f"body is {len(data)} bytes" in err.value.message
    assert client.encode_body(body, None, "PUT", "p") == data  # None: no check


@pytest.mark.parametrize(("value", "where"), [
    ({"a": float("nan")}, "not JSON"), ({"a": {1, 2}}, "not JSON"),
    ({"a": ["ok", "\ud800"]}, "body.a[1]: an unpaired surrogate")])
def test_a_body_that_cannot_be_sent_is_invalid_payload(value, where):
    with pytest.raises(CheckpointError) as err:
        client.encode_body(value, None, "PUT", "p")
    assert err.value.kind == INVALID_PAYLOAD and not err.value.sent
    assert where in err.value.message


def test_the_store_checks_its_settings_and_defaults_to_the_servers_limit():
    store = HttpCheckpointStore("http://127.0.0.1:9/", "acme", "t")
    assert (store.base_url, store.max_body_bytes) == ("http://127.0.0.1:9", 1024 * 1024)
    for bad in ({"retries": -1}, {"backoff_s": 2, "max_backoff_s": 1}, {"max_body_bytes": 0}):
        with pytest.raises(ValueError):
            HttpCheckpointStore("http://x", "acme", "t", **bad)


def test_a_2xx_answer_is_decoded_and_an_error_answer_raised_with_its_kind():
    answer = client.decode_answer(CALL, 200, {"ETag": '"3"'}, b'{"revision": 3}')
    assert answer.body == {"revision": 3} and client.etag_revision(answer.headers) == 3
    assert client.decode_answer(CALL, 204, {}, b"").body is None
    with pytest.raises(CheckpointError) as err:
        client.decode_answer(CALL, 412, {"Retry-After": "2"},
                             b'{"error": "conflict", "current_revision": 4}')
    assert (err.value.kind, err.value.error, err.value.current_revision,
            err.value.retry_after_s) == (CONFLICT, "conflict", 4, 2.0)
    with pytest.raises(CheckpointError) as err:
        client.decode_answer(CALL, 200, {}, b"<html>")
    assert err.value.kind == STORAGE and "unreadable answer" in err.value.message
    with pytest.raises(CheckpointError) as err:
        client.decode_answer(CALL, 502, {}, b"<html>")
    assert (err.value.kind, err.value.body) == (STORAGE, {})


def test_retry_after_and_headers_are_read_whatever_the_case():
    assert client.retry_after_seconds({"retry-after": "7"}) == 7.0
    assert client.retry_after_seconds({"Retry-After": "Thu, 01 Jan 1970 00:00:00 GMT"}) == 0.0
    assert client.retry_after_seconds({"Retry-After": "soon"}) is None
    assert client.retry_after_seconds({}) is None
    assert client.header({"etag": '"1"'}, "ETag") == '"1"'


def test_a_read_is_retried_with_capped_full_jitter_then_gives_up(monkeypatch):
    """The retry core as steps: no I/O, each exchange answered by the test."""
    store = HttpCheckpointStore("http://127.0.0.1:9", "acme", "t", retries=2, backoff_s=1,
                                max_backoff_s=1.5)
    monkeypatch.setattr(core.random, "uniform", lambda low, high: high)
    steps = client.Steps(store._op_load("c1"))
    seen = []
    with pytest.raises(CheckpointError, match="down"):  # the last try's error
        for step in steps:
            seen.append(step)
            if isinstance(step, client.Call):
                steps.error = CheckpointError(STORAGE, "down", status=503)
    calls = [s for s in seen if isinstance(s, client.Call)]
    pauses = [s for s in seen if isinstance(s, client.Sleep)]
    assert pauses == [client.Sleep(1.0), client.Sleep(1.5)]
    assert len(calls) == 3 and calls[0].method == "GET"
    assert calls[0].headers["Authorization"] == "Bearer t"


def test_the_next_revision_keeps_the_identity_and_counts_up():
    envelope = {"id": "c1", "run_id": "r1", "kind": "k", "schema_version": 1, "revision": 4,
                "payload": {"a": 1}, "updated_at_ms": 0}
    after = client.next_revision(envelope, {"a": 2})
    assert after["revision"] == 5 and after["payload"] == {"a": 2}
    assert {k: after[k] for k in ("id", "run_id", "kind")} == {"id": "c1", "run_id": "r1",
                                                              "kind": "k"}
    assert after["updated_at_ms"] > 0 and envelope["revision"] == 4


def test_client_re_exports_every_public_name_of_the_core():
    """``from recovery_client.client import X`` works for every public ``X`` of the core
    (the import path callers had before the core was split off), and is the same object."""
    tree = ast.parse(Path(core.__file__).read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.add(name.id)
    public = {name for name in defined if not name.startswith("_")}
    assert {"StoreCore", "CheckpointError", "MAX_BODY_BYTES", "Op"} <= public
    assert public <= set(client.__all__), sorted(public - set(client.__all__))
    for name in public:
        assert getattr(client, name) is getattr(core, name), name


def _walk(op, answers):
    """Drive ``op`` answering each ``Call`` from ``answers`` (an exception is thrown in,
    anything else is the reply); the ``(calls, sleeps, value)`` seen."""
    steps, calls, sleeps = client.Steps(op), [], []
    answers = iter(answers)
    for step in steps:
        if isinstance(step, client.Call):
            calls.append(step)
            answer = next(answers)
            if isinstance(answer, BaseException):
                steps.error = answer
            else:
                steps.reply = answer
        else:
            sleeps.append(step)
    return calls, sleeps, steps.value


LEASE_STATE = {"owner": "worker-7", "fencing_token": 4, "expires_at": "2026-01-02T03:04:05+00:00"}


@pytest.mark.parametrize(("kwargs", "body"), [
    ({}, {"reason": "worker-7 died"}),
    ({"owner": " worker-7 "}, {"reason": "worker-7 died", "owner": " worker-7 "}),
    ({"owner": "worker-7", "fencing_token": 0},
     {"reason": "worker-7 died", "owner": "worker-7", "fencing_token": 0}),
])
def test_revoke_lease_posts_the_reason_and_only_the_lease_it_was_given(kwargs, body):
    store = HttpCheckpointStore("http://127.0.0.1:9", "acme", "t")
    store.fencing_token = 2
    calls, _, value = _walk(store._op_revoke_lease("r1", "worker-7 died",
                                                   kwargs.get("owner"),
                                                   kwargs.get("fencing_token")),
                            [client.Answer(200, {}, LEASE_STATE)])
    [call] = calls
    assert (call.method, call.url) == (
        "POST", "http://127.0.0.1:9/api/v1/tenants/acme/runs/r1/lease/revoke")
    assert json.loads(call.data) == body  # owner and a token of 0 sent as given
    assert call.headers["Content-Type"] == "application/json"
    assert "Fencing-Token" not in call.headers
    assert value == LEASE_STATE
    assert store.fencing_token == 2  # the store's own token is not the revoked lease's


def test_revoke_lease_is_resent_only_when_the_server_surely_did_nothing(monkeypatch):
    store = HttpCheckpointStore("http://127.0.0.1:9", "acme", "t", retries=3)
    monkeypatch.setattr(core.random, "uniform", lambda low, high: 0.0)
    # 503 (it says it did nothing) and a connection never opened: resent.
    calls, sleeps, value = _walk(store._op_revoke_lease("r1", "why", None, None), [
        CheckpointError(STORAGE, "down", status=503),
        CheckpointError(STORAGE, "refused", sent=False),
        client.Answer(200, {}, LEASE_STATE)])
    assert (len(calls), len(sleeps), value) == (3, 2, LEASE_STATE)
    # A timeout after sending, or a 500: the lease may be ended; not resent.
    for failure in (CheckpointError(STORAGE, "timeout", sent=True),
                    CheckpointError(STORAGE, "boom", status=500)):
        with pytest.raises(CheckpointError) as err:
            _walk(store._op_revoke_lease("r1", "why", None, None), [failure])
        assert err.value is failure


@pytest.mark.parametrize("error", ["no_live_lease", "lease_held", "run_deleted"])
def test_revoke_lease_409s_are_conflicts_naming_the_servers_word(error):
    store = HttpCheckpointStore("http://127.0.0.1:9", "acme", "t", retries=3)
    steps = client.Steps(store._op_revoke_lease("r1", "why", None, None))
    calls = []
    with pytest.raises(CheckpointError) as err:
        for step in steps:
            calls.append(step)
            steps.error = _raised(client.decode_answer, step, 409, {}, json.dumps(
                {"error": error, "detail": "run: it holds no live lease"}).encode())
    assert len(calls) == 1  # a conflict is never resent
    assert (err.value.kind, err.value.status, err.value.error) == (CONFLICT, 409, error)


def _raised(fn, *args):
    try:
        fn(*args)
    except CheckpointError as exc:
        return exc
    raise AssertionError("no error")


def test_both_stores_offer_revoke_lease_with_the_same_signature():
    import inspect

    pytest.importorskip("httpx")
    from recovery_client.aclient import AsyncHttpCheckpointStore

    sync = inspect.signature(HttpCheckpointStore.revoke_lease)
    asynchronous = inspect.signature(AsyncHttpCheckpointStore.revoke_lease)
    assert sync == asynchronous
    assert list(sync.parameters) == ["self", "run_id", "reason", "owner", "fencing_token"]
    assert all(sync.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
               for name in ("owner", "fencing_token"))
    assert inspect.iscoroutinefunction(AsyncHttpCheckpointStore.revoke_lease)
