"""``RecoverySaver`` against a scripted transport (``httpx.MockTransport``): what it sends
and how it reads answers, without a server (issue 10). The live-server tests are in
``test_conformance.py``, ``test_graph.py`` and ``test_races.py``."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from recovery_client import protocol
from recovery_client.client import CheckpointError
from recovery_client.langgraph import RecoverySaver, ThreadConflict


class Script:
    """A fake server: ``answers`` is a list of ``(status, json)`` or callables taking the
    request, consumed in order; every request is kept in ``seen``."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        answer = self.answers.pop(0)
        if callable(answer):
            answer = answer(request)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx.Response(status, json=body)

    def bodies(self) -> list[dict]:
        return [json.loads(r.content) if r.content else None for r in self.seen]


def saver_for(script: Script, **kw) -> RecoverySaver:
    return RecoverySaver("http://recovery.test", "acme", "tok-1", **kw,
                         transport=httpx.MockTransport(script),
                         async_transport=httpx.MockTransport(script))


def checkpoint(cid="1f0-a", values=None, versions=None) -> dict:
    return {"v": 4, "id": cid, "ts": "2026-12-01T00:00:00+00:00",
            "channel_values": values or {}, "channel_versions": versions or {},
            "versions_seen": {}, "updated_channels": None}


def config(thread="t-1", ns="", checkpoint_id=None) -> dict:
    conf = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


PUT_OK = (201, {"thread_id": "t-1", "checkpoint_ns": "", "checkpoint_id": "1f0-a",
                "run_id": str(protocol.thread_run_id("t-1")), "revision": 0})


def test_put_sends_typed_channel_values_and_the_parent_and_returns_the_new_config():
    script = Script(PUT_OK)
    saver = saver_for(script)
    cp = checkpoint(values={"msg": b"\x00\xffbytes", "n": 3, "gone": "x"},
                    versions={"msg": 1, "n": 1})

    out = saver.put(config(checkpoint_id="1f0-parent"), cp,
                    {"source": "loop", "step": 1, "writes": {"x": 1}},
                    {"msg": 1, "n": 1})

    assert out == config(checkpoint_id="1f0-a")
    (request,) = script.seen
    assert (request.method, request.url.path) == ("POST",
                                                  "/api/v1/tenants/acme/langgraph/checkpoints")
    assert request.headers["authorization"] == "Bearer tok-1"
    body = json.loads(request.content)
    assert body["parent_checkpoint_id"] == "1f0-parent"
    values = body["checkpoint"]["channel_values"]
    # Only channels with a version travel (LangGraph drops the others when loading).
    assert set(values) == {"msg", "n"}
    kind, data = saver.serde.dumps_typed(b"\x00\xffbytes")
    assert values["msg"] == {"type": kind, "b64": base64.b64encode(data).decode()}
    assert saver.serde.loads_typed((values["n"]["type"], base64.b64decode(values["n"]["b64"]))) == 3
    # get_serializable_checkpoint_metadata: "writes" is not stored, as in PostgresSaver.
    assert body["metadata"] == {"source": "loop", "step": 1}
    assert "Fencing-Token" not in request.headers


def test_a_first_put_has_a_null_parent_and_identity_comes_from_the_config():
    script = Script(PUT_OK)
    cfg = config()
    cfg["configurable"].update(workflow="refund", definition_version="3", model=7)
    saver_for(script).put(cfg, checkpoint(), {"source": "input", "step": -1}, {})
    body = script.bodies()[0]
    assert body["parent_checkpoint_id"] is None
    assert body["identity"] == {"workflow": "refund", "definition_version": "3"}


def test_a_body_over_the_limit_is_invalid_payload_before_any_request():
    script = Script()
    saver = saver_for(script)
    big = checkpoint(values={"blob": "x" * (protocol.MAX_BODY_BYTES + 10)}, versions={"blob": 1})

    with pytest.raises(CheckpointError) as err:
        saver.put(config(), big, {}, {"blob": 1})

    assert err.value.kind == "invalid_payload"
    assert f"{protocol.MAX_BODY_BYTES:,} bytes" in err.value.message
    assert "RECOVERY_MAX_BODY_BYTES" in err.value.message
    assert script.seen == []


def test_one_write_over_the_limit_is_refused_before_any_request():
    script = Script()
    with pytest.raises(CheckpointError) as err:
        saver_for(script, max_body_bytes=4096).put_writes(
            config(checkpoint_id="1f0-a"), [("ok", "small"), ("big", "y" * 5000)], "task-1")
    assert err.value.kind == "invalid_payload"
    assert "'big'" in err.value.message
    assert script.seen == []


def test_metadata_that_is_not_json_is_invalid_payload_before_any_request():
    script = Script()
    with pytest.raises(CheckpointError) as err:
        saver_for(script).put(config(), checkpoint(), {"source": "loop", "score": float("nan")},
                              {})
    assert err.value.kind == "invalid_payload"
    assert script.seen == []


def test_put_writes_numbers_writes_by_position_and_special_channels_by_writes_idx_map():
    script = Script((200, {"stored": 3}))
    saver_for(script).put_writes(config(checkpoint_id="1f0-a"),
                                 [("a", 1), (ERROR, "boom"), (INTERRUPT, {"q": 1})],
                                 "task-1", "~__pregel_pull, charge")
    body = script.bodies()[0]
    assert [(w["idx"], w["channel"]) for w in body["writes"]] == [
        (0, "a"), (WRITES_IDX_MAP[ERROR], ERROR), (WRITES_IDX_MAP[INTERRUPT], INTERRUPT)]
    assert (body["checkpoint_id"], body["task_id"], body["task_path"]) == (
        "1f0-a", "task-1", "~__pregel_pull, charge")


def test_put_writes_over_the_body_limit_goes_in_several_requests_keeping_each_idx():
    script = Script((200, {"stored": 1}), (200, {"stored": 1}), (200, {"stored": 1}))
    writes = [(f"ch{i}", "z" * 1500) for i in range(3)]
    saver_for(script, max_body_bytes=4096).put_writes(config(checkpoint_id="1f0-a"), writes,
                                                      "task-1")
    sent = [w["idx"] for body in script.bodies() for w in body["writes"]]
    assert sent == [0, 1, 2]
    assert len(script.seen) >= 2
    assert all(len(r.content) <= 4096 for r in script.seen)


@pytest.mark.parametrize("status,error", [(412, "conflict"), (409, "fenced"),
                                          (409, "lease_held")])
def test_refusals_are_thread_conflicts(status, error):
    body = {"error": error, "current_revision": 4, "head_checkpoint_id": "1f0-z"}
    script = Script((status, body))
    with pytest.raises(ThreadConflict) as err:
        saver_for(script).put(config(checkpoint_id="1f0-y"), checkpoint(), {}, {})
    exc = err.value
    assert isinstance(exc, CheckpointError)
    assert (exc.kind, exc.status, exc.error, exc.thread_id) == ("conflict", status, error, "t-1")
    assert exc.head_checkpoint_id == "1f0-z" and exc.current_revision == 4


@pytest.mark.parametrize("answer", [(500, {"error": "oops"}), (503, None),
                                    httpx.ConnectError("refused"),
                                    httpx.ReadTimeout("slow")])
def test_server_and_network_failures_are_storage(answer):
    script = Script(answer)
    with pytest.raises(CheckpointError) as err:
        saver_for(script).put(config(), checkpoint(), {}, {})
    assert err.value.kind == "storage"


def test_get_tuple_is_none_for_no_result_and_a_404_is_a_missing_tenant():
    script = Script((200, {"results": [], "next_before": None}),
                    (200, {"results": [], "next_before": None}),
                    (404, {"error": "not_found", "detail": "no tenant 'acme'"}))
    saver = saver_for(script)
    assert saver.get_tuple(config()) is None
    assert saver.get_tuple(config(checkpoint_id="nope")) is None
    # The list answers 200 for a missing thread: a 404 means the tenant (or route) is
    # not there for this token, never an empty thread.
    with pytest.raises(CheckpointError) as err:
        saver.get_tuple(config())
    assert err.value.kind == "not_found" and "tenant 'acme'" in err.value.message
    first, second, _ = script.seen
    assert dict(first.url.params) == {"thread_id": "t-1", "checkpoint_ns": "", "limit": "1"}
    assert second.url.params["checkpoint_id"] == "nope"


def row(cid, parent=None, writes=()):
    serde = RecoverySaver("http://x", "acme", "t").serde

    def typed(v):
        kind, data = serde.dumps_typed(v)
        return {"type": kind, "b64": base64.b64encode(data).decode()}

    cp = checkpoint(cid, versions={"msg": 1})
    cp["channel_values"] = {"msg": typed(f"value of {cid}")}
    return {"thread_id": "t-1", "checkpoint_ns": "", "checkpoint_id": cid,
            "parent_checkpoint_id": parent, "run_id": "r", "checkpoint": cp,
            "metadata": {"step": 1},
            "pending_writes": [{"task_id": t, "channel": c, "value": typed(v), "idx": i}
                               for i, (t, c, v) in enumerate(writes)]}


def test_get_tuple_decodes_values_writes_and_the_parent_config():
    script = Script((200, {"results": [row("c2", "c1", [("task", "ch", {"a": [1]})])],
                           "next_before": None}))
    tup = saver_for(script).get_tuple(config())
    assert tup.config == config(checkpoint_id="c2")
    assert tup.parent_config == config(checkpoint_id="c1")
    assert tup.checkpoint["channel_values"] == {"msg": "value of c2"}
    assert tup.pending_writes == [("task", "ch", {"a": [1]})]
    assert tup.metadata == {"step": 1}


def test_list_follows_next_before_until_the_limit():
    script = Script((200, {"results": [row("c9"), row("c8")], "next_before": "c8"}),
                    (200, {"results": [row("c7"), row("c6")], "next_before": "c6"}))
    saver = saver_for(script)
    got = [t.checkpoint["id"] for t in saver.list(config(), limit=3,
                                                  filter={"source": "loop"},
                                                  before=config(checkpoint_id="d0"))]
    assert got == ["c9", "c8", "c7"]
    first, second = (dict(r.url.params) for r in script.seen)
    assert first == {"thread_id": "t-1", "checkpoint_ns": "", "filter": '{"source":"loop"}',
                     "before": "d0", "limit": "3"}
    assert (second["before"], second["limit"]) == ("c8", "1")


def test_list_without_a_limit_reads_every_page_and_limit_zero_asks_nothing():
    script = Script((200, {"results": [row("c9")], "next_before": "c9"}),
                    (200, {"results": [row("c8")], "next_before": None}))
    saver = saver_for(script)
    assert [t.checkpoint["id"] for t in saver.list(None)] == ["c9", "c8"]
    assert "thread_id" not in script.seen[0].url.params
    assert list(saver.list(config(), limit=0)) == []
    assert len(script.seen) == 2


def test_empty_deletes_and_prunes_send_nothing_and_bad_prune_arguments_raise():
    script = Script()
    saver = saver_for(script)
    saver.delete_for_runs([])
    saver.prune([])
    with pytest.raises(TypeError):
        saver.prune("t-1")
    with pytest.raises(ValueError):
        saver.prune(["t-1"], strategy="everything")
    assert script.seen == []


def test_delete_for_runs_sends_at_most_a_thousand_ids_per_request():
    script = Script((200, {"deleted": 0}), (200, {"deleted": 0}))
    saver_for(script).delete_for_runs([f"run-{i}" for i in range(1500)])
    assert [len(b["run_ids"]) for b in script.bodies()] == [1000, 500]


def test_get_next_version_is_postgres_savers():
    saver = saver_for(Script())
    first = saver.get_next_version(None)
    assert first.startswith("0" * 31 + "1.")
    assert saver.get_next_version(first).startswith("0" * 31 + "2.")
    assert saver.get_next_version(7).startswith("0" * 30 + "08.")
    assert len(first.split(".")[0]) == 32


# --- leases ------------------------------------------------------------------------------

RUN = protocol.thread_run_id("t-1")


def test_with_a_lease_ttl_it_leases_before_the_first_write_and_sends_the_fencing_token():
    script = Script((200, {"fencing_token": 7, "expires_at": "x"}), PUT_OK, PUT_OK)
    saver = saver_for(script, lease_ttl_s=60, owner="worker-1")
    saver.put(config(), checkpoint("c1"), {}, {})
    saver.put(config(checkpoint_id="c1"), checkpoint("c2"), {}, {})
    lease, put1, put2 = script.seen
    assert lease.url.path == f"/api/v1/tenants/acme/runs/{RUN}/lease"
    assert json.loads(lease.content) == {"owner": "worker-1", "ttl_s": 60}
    assert put1.headers["Fencing-Token"] == put2.headers["Fencing-Token"] == "7"


def test_a_thread_without_a_run_is_written_first_then_leased():
    script = Script((404, {"error": "not_found"}), PUT_OK,
                    (200, {"fencing_token": 1, "expires_at": "x"}), PUT_OK)
    saver = saver_for(script, lease_ttl_s=60)
    saver.put(config(), checkpoint("c1"), {}, {})
    saver.put(config(checkpoint_id="c1"), checkpoint("c2"), {}, {})
    paths = [r.url.path.rsplit("/", 1)[-1] for r in script.seen]
    assert paths == ["lease", "checkpoints", "lease", "checkpoints"]
    assert "Fencing-Token" not in script.seen[1].headers
    assert script.seen[3].headers["Fencing-Token"] == "1"


def test_it_renews_the_lease_once_half_the_ttl_has_passed(monkeypatch):
    from recovery_client import _saverwire as module  # the leases' clock is read there

    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    script = Script((200, {"fencing_token": 3, "expires_at": "x"}), PUT_OK, PUT_OK,
                    (200, {"fencing_token": 3, "expires_at": "x"}), PUT_OK)
    saver = saver_for(script, lease_ttl_s=10)
    saver.put(config(), checkpoint("c1"), {}, {})
    clock[0] += 4.9
    saver.put(config(checkpoint_id="c1"), checkpoint("c2"), {}, {})
    clock[0] += 0.2  # 5.1 s since the lease: renew first
    saver.put(config(checkpoint_id="c2"), checkpoint("c3"), {}, {})
    paths = [r.url.path.rsplit("/", 1)[-1] for r in script.seen]
    assert paths == ["lease", "checkpoints", "checkpoints", "lease", "checkpoints"]


def test_a_lease_held_by_another_owner_is_a_thread_conflict_and_nothing_is_written():
    script = Script((409, {"error": "lease_held", "detail": "owner: leased"}))
    with pytest.raises(ThreadConflict) as err:
        saver_for(script, lease_ttl_s=30).put(config(), checkpoint(), {}, {})
    assert err.value.error == "lease_held"
    assert len(script.seen) == 1


def test_after_a_conflict_the_next_write_asks_for_the_lease_again():
    script = Script((200, {"fencing_token": 2, "expires_at": "x"}),
                    (409, {"error": "fenced", "fencing_token": 3}),
                    (409, {"error": "lease_held"}))
    saver = saver_for(script, lease_ttl_s=30)
    with pytest.raises(ThreadConflict):
        saver.put(config(), checkpoint("c1"), {}, {})
    with pytest.raises(ThreadConflict) as err:
        saver.put(config(), checkpoint("c1"), {}, {})
    assert err.value.error == "lease_held"


def test_fencing_token_is_the_token_its_writes_carry_and_none_without_a_lease():
    script = Script(PUT_OK, (200, {"fencing_token": 7, "expires_at": "x"}), PUT_OK,
                    (409, {"error": "fenced", "fencing_token": 8}),
                    (200, {"fencing_token": 9, "expires_at": "x"}), PUT_OK,
                    (200, {"deleted": 2}))
    unleased = saver_for(script)
    unleased.put(config(), checkpoint("c1"), {}, {})
    assert unleased.fencing_token("t-1") is None

    saver = saver_for(script, lease_ttl_s=60)
    assert saver.fencing_token("t-1") is None  # nothing written yet: no lease
    saver.put(config(), checkpoint("c1"), {}, {})
    assert saver.fencing_token("t-1") == 7
    assert script.seen[2].headers["Fencing-Token"] == "7"
    assert saver.fencing_token("t-2") is None  # the lease is per thread
    with pytest.raises(ThreadConflict):  # someone else took the run: the lease is dropped
        saver.put(config(checkpoint_id="c1"), checkpoint("c2"), {}, {})
    assert saver.fencing_token("t-1") is None
    saver.put(config(checkpoint_id="c1"), checkpoint("c2"), {}, {})
    assert saver.fencing_token("t-1") == 9
    assert script.seen[5].headers["Fencing-Token"] == "9"
    saver.delete_thread("t-1")
    assert saver.fencing_token("t-1") is None
    assert len(script.seen) == 7  # fencing_token itself never asks the server


def test_fencing_token_is_none_while_a_new_threads_first_write_is_out():
    during: list = []

    def first_put(request):
        during.append(saver.fencing_token("t-1"))
        return PUT_OK

    script = Script((404, {"error": "not_found"}), first_put,
                    (200, {"fencing_token": 1, "expires_at": "x"}))
    saver = saver_for(script, lease_ttl_s=60)
    saver.put(config(), checkpoint("c1"), {}, {})
    assert during == [None]  # the run did not exist: no token yet, and no waiting
    assert saver.fencing_token("t-1") == 1


def test_lease_ttl_must_be_whole_seconds_in_range():
    for bad in (0, 1.5, 86401, "30"):
        with pytest.raises(ValueError):
            RecoverySaver("http://x", "acme", "t", lease_ttl_s=bad)


# --- async -------------------------------------------------------------------------------

def test_the_async_methods_send_the_same_requests():
    script = Script((200, {"fencing_token": 5, "expires_at": "x"}), PUT_OK,
                    (200, {"stored": 1}),
                    (200, {"results": [row("c2", "c1")], "next_before": None}),
                    (200, {"results": [row("c2", "c1")], "next_before": None}),
                    (200, {"deleted": 2}), (200, {"copied": 1}), (200, {"deleted": 0}),
                    (200, {"deleted": 1}))
    saver = saver_for(script, lease_ttl_s=60)

    async def go():
        async with saver:
            out = await saver.aput(config(), checkpoint("c2"), {"step": 0}, {})
            await saver.aput_writes(out, [("ch", 1)], "task")
            tup = await saver.aget_tuple(out)
            listed = [t async for t in saver.alist(config(), limit=5)]
            await saver.adelete_thread("t-1")
            await saver.acopy_thread("t-1", "t-2")
            await saver.aprune(["t-1"], strategy="delete")
            await saver.adelete_for_runs(["r-1"])
            return tup, listed

    tup, listed = asyncio.run(go())
    assert tup.checkpoint["id"] == "c2" and [t.checkpoint["id"] for t in listed] == ["c2"]
    paths = [r.url.path.split("/tenants/acme/")[1] for r in script.seen]
    assert paths == [f"runs/{RUN}/lease", "langgraph/checkpoints", "langgraph/writes",
                     "langgraph/checkpoints", "langgraph/checkpoints",
                     "langgraph/threads/delete", "langgraph/threads/copy",
                     "langgraph/threads/prune", "langgraph/runs/delete"]
    assert script.seen[2].headers["Fencing-Token"] == "5"
    assert script.bodies()[7] == {"thread_ids": ["t-1"], "strategy": "delete"}


# --- writes that arrive before their checkpoint ------------------------------------------

NO_CHECKPOINT = (404, {"error": "not_found", "detail": "checkpoint_id: no such checkpoint"})


def writes_meanwhile(saver, checkpoint_id, out: list, *, wait=True):
    """An answer that, while a put is on the wire, has another thread send writes on
    ``checkpoint_id`` (as LangGraph's tasks do beside the put of their step)."""
    import threading

    def answer(request):
        def run():
            try:
                out.append(saver.put_writes(config(checkpoint_id=checkpoint_id),
                                            [("ch", "v")], "task-1"))
            except CheckpointError as exc:
                out.append(exc)
        worker = threading.Thread(target=run)
        worker.start()
        if wait:
            worker.join(timeout=30)
        out.append(worker)
        return PUT_OK
    return answer


def test_writes_on_a_checkpoint_whose_put_is_in_flight_are_sent_right_after_it():
    done: list = []
    script = Script(PUT_OK, NO_CHECKPOINT, (200, {"stored": 1}), PUT_OK)
    saver = saver_for(script)
    script.answers[0] = writes_meanwhile(saver, "1f0-a", done)
    saver.put(config(), checkpoint("1f0-a"), {}, {})
    assert done[0] is None  # held, and acknowledged: the put that carries them is out
    saver.put(config(checkpoint_id="1f0-a"), checkpoint("1f0-b"), {}, {})
    paths = [r.url.path.rsplit("/", 1)[-1] for r in script.seen]
    assert paths == ["checkpoints", "writes", "writes", "checkpoints"]
    assert script.bodies()[2] == script.bodies()[1]


def test_writes_whose_put_comes_behind_an_earlier_put_in_flight_wait_for_it():
    """LangGraph chains its puts: the put of "b" starts only once the put of "a" is
    answered, and the writes on "b" may reach the server before either."""
    done: list = []
    script = Script(PUT_OK, NO_CHECKPOINT, PUT_OK, (200, {"stored": 1}))
    saver = saver_for(script)
    script.answers[0] = writes_meanwhile(saver, "1f0-b", done, wait=False)
    saver.put(config(), checkpoint("1f0-a"), {}, {})
    saver.put(config(checkpoint_id="1f0-a"), checkpoint("1f0-b"), {}, {})
    done[0].join(timeout=30)
    assert done[1:] == [None]
    paths = [r.url.path.rsplit("/", 1)[-1] for r in script.seen]
    assert paths == ["checkpoints", "writes", "checkpoints", "writes"]


def test_writes_on_a_checkpoint_this_saver_is_not_putting_raise():
    script = Script(NO_CHECKPOINT)
    saver = saver_for(script)
    with pytest.raises(CheckpointError) as err:
        saver.put_writes(config(checkpoint_id="1f0-a"), [("ch", "v")], "task-1")
    assert err.value.kind == "not_found" and "'1f0-a'" in err.value.message
    assert saver._held == {}


def test_writes_refused_for_a_missing_tenant_raise_at_once():
    script = Script((404, {"error": "not_found", "detail": "no tenant 'acme'"}))
    saver = saver_for(script)
    with pytest.raises(CheckpointError) as err:
        saver.put_writes(config(checkpoint_id="1f0-a"), [("ch", "v")], "task-1")
    assert err.value.kind == "not_found" and "tenant 'acme'" in err.value.message


def test_writes_refused_before_a_put_answered_meanwhile_are_sent_again_at_once():
    script = Script(PUT_OK, NO_CHECKPOINT, (200, {"stored": 1}))
    saver = saver_for(script)
    saver.put(config(), checkpoint("1f0-a"), {}, {})
    saver.put_writes(config(checkpoint_id="1f0-a"), [("ch", "v")], "task-1")
    assert [r.url.path.rsplit("/", 1)[-1] for r in script.seen] == [
        "checkpoints", "writes", "writes"]


def test_held_writes_go_when_their_checkpoint_is_refused():
    done: list = []
    script = Script(PUT_OK, NO_CHECKPOINT, PUT_OK)
    saver = saver_for(script)

    def refused(request):
        writes_meanwhile(saver, "1f0-a", done)(request)
        return (412, {"error": "conflict", "current_revision": 2})
    script.answers[0] = refused
    with pytest.raises(ThreadConflict):
        saver.put(config(checkpoint_id="1f0-old"), checkpoint("1f0-a"), {}, {})
    assert done[0] is None and saver._held == {}
    saver.put(config(), checkpoint("1f0-c"), {}, {})
    assert [r.url.path.rsplit("/", 1)[-1] for r in script.seen] == [
        "checkpoints", "writes", "checkpoints"]


def test_while_a_new_threads_first_write_is_out_other_writes_wait_for_its_lease():
    """Without waiting, a task's writes sent beside the first put would go without a
    token and be fenced by the lease taken right after that put."""
    import threading

    second: list = []

    def first_put(request):
        # The put is on the wire: start a second write on the same thread. It must not
        # send anything (no token yet, and no lease to ask for) until the lease is taken.
        worker = threading.Thread(target=lambda: second.append(saver.put_writes(
            config(checkpoint_id="c1"), [("ch", 1)], "task-1")))
        worker.start()
        worker.join(timeout=0.3)
        second.append(worker)
        return PUT_OK

    script = Script((404, {"error": "not_found"}), first_put,
                    (200, {"fencing_token": 1, "expires_at": "x"}), (200, {"stored": 1}))
    saver = saver_for(script, lease_ttl_s=60)
    saver.put(config(), checkpoint("c1"), {}, {})
    second[0].join(timeout=30)

    paths = [r.url.path.rsplit("/", 1)[-1] for r in script.seen]
    assert paths == ["lease", "checkpoints", "lease", "writes"]
    assert "Fencing-Token" not in script.seen[1].headers
    assert script.seen[3].headers["Fencing-Token"] == "1"


def test_if_the_first_write_fails_the_waiting_writes_ask_for_the_lease_themselves():
    script = Script((404, {"error": "not_found"}), (500, {"error": "boom"}),
                    (404, {"error": "not_found"}), PUT_OK,
                    (200, {"fencing_token": 1, "expires_at": "x"}))
    saver = saver_for(script, lease_ttl_s=60)
    with pytest.raises(CheckpointError) as err:
        saver.put(config(), checkpoint("c1"), {}, {})
    assert err.value.kind == "storage"
    saver.put(config(), checkpoint("c1"), {}, {})  # a pending lease was not left behind
    assert [r.url.path.rsplit("/", 1)[-1] for r in script.seen] == [
        "lease", "checkpoints", "lease", "checkpoints", "lease"]


def test_put_counts_pending_sends_and_carries_the_graphs_static_breakpoints():
    """Issue 17: the server cannot count ``Send`` packets inside a serialized value, nor
    see a static breakpoint (LangGraph writes nothing there): the saver tells it."""
    from langgraph.types import Send

    script = Script(PUT_OK, PUT_OK, PUT_OK)
    saver = saver_for(script, interrupt_before=("charge",), interrupt_after="*")
    saver.put(config(), checkpoint(values={"__pregel_tasks": [Send("w", 1), Send("w", 2)]},
                                   versions={"__pregel_tasks": 1}), {"step": 1}, {})
    saver.put(config(), checkpoint(cid="1f0-b", values={"x": 1}, versions={"x": 1}),
              {"step": 2}, {})
    saver.put(config(ns="review:1"), checkpoint(cid="1f0-c"), {"step": 0}, {})
    first, second, subgraph = script.bodies()
    assert (first["sends"], first["interrupt_before"], first["interrupt_after"]) == (
        2, ["charge"], "*")
    assert "sends" not in second and second["interrupt_before"] == ["charge"]
    # compile()'s breakpoints are the root graph's: a subgraph's puts do not carry them.
    assert "interrupt_before" not in subgraph and "interrupt_after" not in subgraph
    no_breakpoints = Script(PUT_OK)
    saver_for(no_breakpoints).put(config(), checkpoint(), {"step": 1}, {})
    assert "interrupt_before" not in no_breakpoints.bodies()[0]


@pytest.mark.parametrize("bad", ["charge", ["charge", 1], b"x"])
def test_breakpoints_must_be_star_or_node_names(bad):
    with pytest.raises(ValueError, match="interrupt_before"):
        saver_for(Script(), interrupt_before=bad)


@pytest.mark.parametrize(("action", "reason", "invoke"), [
    ("continue", "stable", True), ("retry", "retry_approved", True),
    ("replay", "completed", False), ("reject", "in_flight", False),
    ("reconcile", "effects_in_doubt", False)])
def test_resume_claims_with_the_configs_identity_and_says_whether_to_invoke(action, reason,
                                                                          invoke):
    decision = {"action": action, "reason": reason, "checkpoint_id": "c", "revision": 3,
                "fencing_token": 4}
    script = Script((200, decision), (200, decision))
    saver = saver_for(script)
    conf = {"configurable": {"thread_id": "t-1", "workflow": "refund",
                             "definition_version": "7"}}
    answer = saver.resume(conf, usage={"tokens": 12})
    assert asyncio.run(saver.aresume(conf)) == answer | {"config": answer["config"]}
    run_id = protocol.thread_run_id("t-1")
    assert [(r.method, r.url.path) for r in script.seen] == [
        ("POST", f"/api/v1/tenants/acme/runs/{run_id}/resume")] * 2
    assert script.bodies() == [{"workflow": "refund", "definition_version": "7",
                                "usage": {"tokens": 12}},
                               {"workflow": "refund", "definition_version": "7"}]
    assert answer["invoke"] is invoke and answer["action"] == action
    flagged = answer["config"]["configurable"].get("recovery_effect_retry", False)
    assert flagged is (action == "retry")
    assert conf["configurable"].get("recovery_effect_retry") is None  # not changed


def test_resume_needs_a_thread_and_a_missing_run_is_not_found():
    with pytest.raises(ValueError, match="thread_id"):
        saver_for(Script()).resume({"configurable": {}})
    script = Script((404, {"error": "not_found", "detail": "no such run"}))
    with pytest.raises(CheckpointError) as caught:
        saver_for(script).resume(config())
    assert caught.value.kind == "not_found"


def test_a_continue_after_a_retry_drops_the_retry_mark():
    """(stop 32, the second attack) A config kept from an earlier retry claim must not
    carry its mark into a later ``continue``: only the claim that consumed a retry
    marks the config it returns."""
    retry = {"action": "retry", "reason": "retry_approved", "checkpoint_id": "c",
             "revision": 3, "fencing_token": 4}
    going_on = {"action": "continue", "reason": "stable", "checkpoint_id": "c",
                "revision": 5, "fencing_token": 5}
    saver = saver_for(Script((200, retry), (200, going_on)))
    first = saver.resume(config())
    assert first["config"]["configurable"]["recovery_effect_retry"] is True
    second = saver.resume(first["config"])
    assert "recovery_effect_retry" not in second["config"]["configurable"]
