"""The runtime SDK's faults a newcomer runtime developer found, each against the sans-IO
core with scripted answers (``_walk``; no server): one fencing token per run, not per
store (finding 1); a receipt kept when the lease ran out under a long call (2); a unique
owner name (3); a write the server could not read made visible (4); a read-back effect
written back (5); ``definition_version`` as an integer and 403 as ``forbidden`` (7)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from recovery_client import client, core
from recovery_client.client import CheckpointError, HttpCheckpointStore


def _walk(op, answers):
    """Drive ``op`` answering each ``Call`` from ``answers`` (an exception is thrown in,
    a callable is called with the ``Call``, anything else is the reply); ``(calls,
    value)``."""
    steps, calls = client.Steps(op), []
    answers = iter(answers)
    for step in steps:
        if isinstance(step, client.Call):
            calls.append(step)
            answer = next(answers)
            if callable(answer) and not isinstance(answer, client.Answer):
                answer = answer(step)
            if isinstance(answer, BaseException):
                steps.error = answer
            else:
                steps.reply = answer
        elif isinstance(step, client.Invoke):
            steps.reply = step.fn(*step.args)
    return calls, steps.value


def _store():
    return HttpCheckpointStore("http://127.0.0.1:9", "acme", "t", retries=0)


def _cas(store, run_id, expected=None):
    envelope = {"id": f"c-{run_id}", "run_id": run_id, "revision": 0 if expected is None
                else expected + 1, "kind": "k", "schema_version": 1, "payload": {}}
    return store._op_write(f"checkpoints/{envelope['id']}", envelope, expected,
                           look_with_head=True)


def _lease(token):
    return client.Answer(200, {}, {"fencing_token": token, "expires_at": "x"})


PUT_OK = client.Answer(201, {"ETag": '"0"'}, {})


def test_each_write_sends_the_token_of_its_own_run_and_none_for_a_run_never_leased():
    store = _store()
    _walk(store._op_lease("run-x", "a", 30), [_lease(1)])
    _walk(store._op_lease("run-y", "a", 30), [_lease(4)])
    calls = []
    for run_id in ("run-x", "run-y", "run-z"):
        calls += _walk(_cas(store, run_id), [PUT_OK])[0]
    assert [c.headers.get("Fencing-Token") for c in calls] == ["1", "4", None]
    assert (store.fencing_token_of("run-x"), store.fencing_token_of("run-z")) == (1, None)
    assert store.fencing_token == 4  # deprecated: the last lease's


def test_a_claimed_retry_and_a_fenced_answer_change_only_that_runs_token():
    store = _store()
    _walk(store._op_lease("run-x", "a", 30), [_lease(1)])
    _walk(store._op_resume("run-y", {}), [client.Answer(
        200, {}, {"action": "retry", "fencing_token": 3})])
    _walk(store._op_resume("run-z", {}), [client.Answer(  # another owner's token: not ours
        200, {}, {"action": "continue", "fencing_token": 9})])
    fenced = CheckpointError(core.CONFLICT, "fenced", status=409,
                             body={"error": "fenced", "fencing_token": 5})
    with pytest.raises(CheckpointError):
        _walk(_cas(store, "run-y", 0), [fenced])
    assert [store.fencing_token_of(r) for r in ("run-x", "run-y", "run-z")] == [1, None, None]
    [call], _ = _walk(_cas(store, "run-y", 0), [PUT_OK])
    assert "Fencing-Token" not in call.headers  # never the newer token it was told


def test_the_store_remembers_a_bounded_number_of_runs(monkeypatch):
    monkeypatch.setattr(core, "MAX_RUN_TOKENS", 2)
    store = _store()
    for i, run_id in enumerate(("r1", "r2", "r3"), start=1):
        _walk(store._op_lease(run_id, "a", 30), [_lease(i)])
    assert [store.fencing_token_of(r) for r in ("r1", "r2", "r3")] == [None, 2, 3]


class _Transport(list):
    """A fake exchange for a sync store (``store._exchange``): records each ``Call`` and
    answers from ``answers`` (an exception is raised)."""

    def __init__(self, store, answers):
        super().__init__()
        self.answers = iter(answers)
        store._exchange = self

    def __call__(self, call):
        self.append(call)
        answer = next(self.answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer


READ_BACK = {"id": "e1", "run_id": "r1", "revision": 1, "operation_key": "charge:A-1",
             "service": "payments", "effect_class": "non_idempotent",
             "request_fingerprint": "f" * 64, "state": "submitted", "receipt": None,
             "attempt": 1, "created_at": "2026-01-01T00:00:00Z", "source": "runtime"}


def test_a_read_back_effect_is_written_back_with_only_its_writable_fields():
    store = _store()
    sent = _Transport(store, [client.Answer(200, {"ETag": '"2"'}, {})])
    nxt = dict(READ_BACK, revision=2, state="confirmed", receipt={"charge_id": "ch_1"})
    assert store.put_effect(nxt, 1) == 2
    assert json.loads(sent[0].data) == {k: nxt[k] for k in client._EFFECT_FIELDS}
    assert client.effect_fields(dict(nxt, request={"a": 1}))["request"] == {"a": 1}


def _put(revision):
    return client.Answer(200, {"ETag": f'"{revision}"'}, {})


def _refused(status, error, **body):
    return CheckpointError(core.kind_for_status(status), error, status=status,
                           body={"error": error, **body})


def _effect_steps(store, answers):
    sent = _Transport(store, answers)
    calls = []
    receipt = client.perform_effect(
        store, run_id="r1", service="payments", operation_key="charge:A-1",
        effect_class="non_idempotent", request={"amount_cents": 5}, effect_id="e1",
        call=lambda key: calls.append(key) or {"charge_id": "ch_1"})
    return sent, calls, receipt


def _swept(revision=2):
    record = dict(READ_BACK, revision=revision, state="unresolved")
    return client.Answer(200, {}, {"results": [record]})


def test_a_confirm_refused_because_the_sweep_moved_the_effect_is_recorded_from_unresolved():
    store = _store()
    sent, calls, receipt = _effect_steps(store, [
        _put(0), _put(1), _refused(412, "conflict", current_revision=2), _swept(), _put(3)])
    assert (calls, receipt) == (["charge:A-1"], {"charge_id": "ch_1"})
    last = sent[-1]
    assert (last.method, last.headers["If-Match"]) == ("PUT", '"2"')
    assert {k: json.loads(last.data)[k] for k in ("revision", "state", "receipt")} == {
        "revision": 3, "state": "confirmed", "receipt": {"charge_id": "ch_1"}}
    assert sent[3].method == "GET"  # the call is never made again


@pytest.mark.parametrize("after_412", [
    [_swept(), _refused(422, "invalid_transition")],  # refused from unresolved too
    [client.Answer(200, {}, {"results": [dict(READ_BACK, revision=2, state="unknown")]})],
])
def test_a_receipt_that_cannot_be_recorded_is_raised_with_the_receipt(after_412):
    store = _store()
    with pytest.raises(client.ReceiptNotRecorded) as err:
        _effect_steps(store, [_put(0), _put(1), _refused(412, "conflict", current_revision=2),
                              *after_412])
    assert err.value.receipt == {"charge_id": "ch_1"}
    assert isinstance(err.value, CheckpointError) and err.value.status in (412, 422)
    assert err.value.effect["id"] == "e1"


def test_keep_leased_renews_the_lease_on_its_own_thread_until_the_block_ends(monkeypatch):
    leases, renewed = [], threading.Event()

    def exchange(self, call):
        leases.append((call.method, call.path, json.loads(call.data)))
        if len(leases) >= 3:
            renewed.set()
        return _lease(4)

    monkeypatch.setattr(HttpCheckpointStore, "_exchange", exchange)
    store = _store()
    with store.keep_leased("r1", "w-1", 30, every_s=0.01) as kept:
        assert store.fencing_token_of("r1") == 4  # taken before the block runs
        assert renewed.wait(5)
    count = len(leases)
    time.sleep(0.05)
    assert len(leases) == count  # stopped with the block
    assert all(lease == ("POST", "runs/r1/lease", {"owner": "w-1", "ttl_s": 30})
               for lease in leases)
    assert kept["error"] is None


def test_keep_leased_stops_renewing_once_another_owner_holds_the_run(monkeypatch):
    answers = iter([_lease(4), _refused(409, "lease_held")])
    seen = []

    def exchange(self, call):
        seen.append(call)
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(HttpCheckpointStore, "_exchange", exchange)
    with _store().keep_leased("r1", "w-1", 30, every_s=0.01) as kept:
        time.sleep(0.2)
    assert (len(seen), kept["error"].error) == (2, "lease_held")


def test_the_async_store_keeps_the_lease_with_a_task():
    httpx = pytest.importorskip("httpx")
    import asyncio

    from recovery_client.aclient import AsyncHttpCheckpointStore

    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"fencing_token": 2, "expires_at": "x"})

    async def main():
        store = AsyncHttpCheckpointStore("http://x", "acme", "t",
                                         transport=httpx.MockTransport(handler))
        async with store.keep_leased("r1", "w-1", 30, every_s=0.01) as kept:
            await asyncio.sleep(0.1)
        count = len(seen)
        await asyncio.sleep(0.05)
        await store.aclose()
        return kept, count, store.fencing_token_of("r1")

    kept, count, token = asyncio.run(main())
    assert count >= 3 and len(seen) == count and token == 2 and kept["error"] is None


def test_owner_names_are_unique_per_process_lifetime_and_fit_the_servers_column():
    import os
    import socket

    first, second = client.owner_name("order-worker"), client.owner_name("order-worker")
    assert first != second  # a restarted worker never leases as its zombie
    prefix, host, pid, _ = first.split(":")
    assert (prefix, host, pid) == ("order-worker", socket.gethostname()[:150], str(os.getpid()))
    assert client.owner_name().count(":") == 2 and len(client.owner_name("x" * 40)) <= 256
    with pytest.raises(ValueError, match="prefix"):
        client.owner_name("x" * 250)


def test_a_write_the_server_cannot_read_returns_its_revision_and_warns(recwarn):
    store = _store()
    unreadable = {"phase_class": "unsupported", "phase_label": "kind acme.x is not registered"}
    _Transport(store, [client.Answer(201, {"ETag": '"0"'}, unreadable),
                       client.Answer(201, {"ETag": '"0"'}, {"phase_class": "stable"})])
    envelope = {"id": "c1", "run_id": "r1", "revision": 0, "kind": "acme.x",
                "schema_version": 1, "payload": {}}
    with pytest.warns(client.UnreadableWrite, match="kind acme.x is not registered"):
        assert store.compare_and_swap(envelope, None) == 0
    assert store.compare_and_swap(dict(envelope, id="c2"), None) == 0
    assert not [w for w in recwarn if issubclass(w.category, client.UnreadableWrite)]


@pytest.mark.parametrize("version", [3, "3"])
def test_resume_takes_the_definition_version_as_an_int_or_a_str(version):
    store = _store()
    decision = {"action": "continue", "reason": "stable", "fencing_token": 1}
    calls, _ = _walk(store._op_resume("r1", store._identity(None, None, None, version)),
                     [client.Answer(200, {}, decision)])
    assert json.loads(calls[0].data) == {"definition_version": "3"}
    calls, _ = _walk(store._op_resume_preview("r1", store._identity(None, None, None, version)),
                     [client.Answer(200, {}, decision)])
    assert calls[0].url.endswith("/runs/r1/resume?definition_version=3")


@pytest.mark.parametrize(("status", "forbidden"), [(401, True), (403, True), (500, False),
                                                   (404, False)])
def test_a_refused_token_or_role_says_so_and_keeps_its_kind(status, forbidden):
    exc = CheckpointError(core.kind_for_status(status), "x", status=status)
    assert exc.forbidden is forbidden
    assert exc.kind == ("not_found" if status == 404 else "storage")  # compatible


def test_new_checkpoint_builds_the_first_envelope_of_the_contract():
    import uuid

    first = client.new_checkpoint("acme.order", 1, {"phase": "ready"})
    assert set(first) == {"id", "run_id", "revision", "kind", "schema_version", "payload",
                          "updated_at_ms"}
    assert (first["revision"], first["kind"], first["schema_version"]) == (0, "acme.order", 1)
    uuid.UUID(first["id"]), uuid.UUID(first["run_id"])
    assert first["id"] != first["run_id"]
    again = client.new_checkpoint("acme.order", 1, {}, run_id=first["run_id"], checkpoint_id="c")
    assert (again["run_id"], again["id"]) == (first["run_id"], "c")
    assert client.next_revision(first, {"phase": "charging"})["revision"] == 1
