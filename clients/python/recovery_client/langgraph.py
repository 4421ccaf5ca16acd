"""``RecoverySaver``: a LangGraph checkpointer that keeps its checkpoints in the recovery
service (issue 10; mapping and HTTP API in docs/langgraph.md).

    pip install './clients/python[langgraph]'   # recovery-client, from a checkout

    from recovery_client.langgraph import RecoverySaver

    with RecoverySaver("https://recovery.example", "acme", token) as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "order-A-1042"}})

Its requests, drivers, leases and held writes are its base class's, ``_SaverWire`` in
``recovery_client/_saverwire.py``; this module holds the API, the encoding and the plans.

A LangGraph thread is one recovery run, each (thread, ``checkpoint_ns``) one checkpoint
envelope whose revisions follow the thread's head (``recovery_client.protocol``).
Every put names its parent (the checkpoint LangGraph resumed from); the server accepts it
only if that parent is still the head of (thread, namespace), by compare-and-swap. So two
graphs resuming one thread cannot both win: the loser's put is refused (412), kept as a
conflict of the run (the dashboard shows it), and raised here as ``ThreadConflict``, which
ends the loser's ``invoke`` (LangGraph's own error path for a failing checkpointer).

Channel values and pending writes are the serializer's output
(``serde.dumps_typed(v) -> (type, bytes)``), carried losslessly as
``{"type": str, "b64": str}`` (standard base64) and never decoded by the server. The rest of
a checkpoint (``v``, ``id``, ``ts``, ``channel_versions``, ``versions_seen``,
``updated_channels``, ``pending_sends``) and the metadata travel as plain JSON.

Errors are ``recovery_client.client.CheckpointError`` with runifold's kinds:

- ``conflict``: ``ThreadConflict`` (412 stale head or an id stored with other content;
  409 ``fenced``; 409 ``lease_held``);
- ``invalid_payload``: a request body over ``max_body_bytes`` (the server's 1 MiB limit,
  CONTRACT.md section 6, ``RECOVERY_MAX_BODY_BYTES``), raised before anything is sent; a
  value the JSON body cannot carry (metadata that is not JSON, NaN, an unpaired
  surrogate), also before sending; the server's 400/413/422;
- ``not_found``: a 404: the tenant is not there for this token (no role in it) or
  ``base_url``/``tenant`` is wrong (every method; ``get_tuple`` answers ``None`` only
  for a thread or checkpoint that is not there, which the server answers 200 with no
  result); ``put_writes`` on a checkpoint the server does not have and this saver is
  not putting (a put in flight, or about to reach it behind another of its puts on
  the thread: the writes are held until it is answered, ``RecoverySaver._await_put``);
- ``storage``: network failures, timeouts, 5xx, 401/403, an unreadable answer.
"""

from __future__ import annotations

import asyncio
import base64
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import httpx
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import TASKS

from recovery_client import protocol
from recovery_client._saverwire import ThreadConflict, _Call, _encode_json, _Lease, _SaverWire
from recovery_client.client import owner_name
from recovery_client.core import NOT_FOUND, CheckpointError, Steps

__all__ = ["RecoverySaver", "ThreadConflict"]

#: The identity parts a run carries (CONTRACT.md 3, ``resume``); taken from the config.
IDENTITY_KEYS = ("agent", "model", "workflow", "definition_version")
PRUNE_STRATEGIES = ("keep_latest", "delete")


def _no_such_checkpoint(exc: CheckpointError) -> bool:
    """Whether a 404 is the server's "no such checkpoint" (``POST …/langgraph/writes``),
    not a tenant the token has no role in or a wrong route."""
    detail = exc.body.get("detail")
    return isinstance(detail, str) and detail.startswith("checkpoint_id:")


class RecoverySaver(_SaverWire, BaseCheckpointSaver[str]):
    """A LangGraph ``BaseCheckpointSaver`` over the recovery service's HTTP API (issue 10).

    ``base_url``: the server root (``http://127.0.0.1:8000``); ``tenant``: the tenant's
    slug; ``token``: a bearer token of an account with the tenant's ``writer`` role;
    ``serde``: LangGraph's serializer (default ``JsonPlusSerializer``); ``timeout_s``:
    seconds per request (connect, read, write and pool each).

    ``lease_ttl_s`` (int, 1..86400 seconds): before its first write on a thread this saver
    takes the run's lease (``POST …/runs/{run_id}/lease``) as ``owner`` (default
    ``host:pid:uuid4``, one per saver) and from then on sends ``Fencing-Token`` with every
    write on that thread; it renews the lease before a write once half the ttl has passed
    since it was last taken. A thread whose run does not exist yet is written once without
    a token and leased right after (its other writes wait for that). Another owner's live lease (409 ``lease_held``) and a
    newer token (409 ``fenced``) raise ``ThreadConflict``. Without ``lease_ttl_s`` no
    lease is taken: a thread whose run has had an owner refuses this saver's writes
    (``fenced``), so use leases for a thread either always or never.
    ``fencing_token(thread_id)`` says which token the saver sends for a thread (``None``
    without a lease), for effect writes made from inside the graph (``@recorded_effect``).

    ``max_body_bytes``: the largest request body sent (default 1 MiB, the server's
    ``RECOVERY_MAX_BODY_BYTES`` default); a larger one raises ``CheckpointError``
    ``invalid_payload`` before sending.

    ``interrupt_before`` / ``interrupt_after``: the root graph's static breakpoints, as
    given to ``compile()`` (``"*"`` or node names; ``ValueError`` otherwise). LangGraph
    writes nothing when it stops at one, so the saver sends them with each root put and
    the server reads such a pause as ``stable`` ("paused before b") by LangGraph's own
    ``should_interrupt`` rule, not as a node in flight (docs/langgraph.md, "Static
    breakpoints"). Each put of a checkpoint holding ``Send`` packets also carries their
    count (``sends``): the server never decodes a value.

    Sync methods use one ``httpx.Client``, async ones one ``httpx.AsyncClient`` per event
    loop (each keeps its connections open); ``close()`` / ``aclose()`` or ``with`` /
    ``async with`` close them. Safe to share between threads (the lease table is locked).

    Versions: ``get_next_version`` gives ``"{n:032}.{random:016}"`` strings as LangGraph's
    PostgreSQL saver does.
    """

    def __init__(self, base_url: str, tenant: str, token: str, *,
                 serde: SerializerProtocol | None = None, lease_ttl_s: int | None = None,
                 owner: str | None = None, timeout_s: float = 10,
                 max_body_bytes: int = protocol.MAX_BODY_BYTES,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None,
                 interrupt_before: str | Sequence[str] | None = None,
                 interrupt_after: str | Sequence[str] | None = None) -> None:
        super().__init__(serde=serde)
        self._breakpoints = {}
        for name, nodes in (("interrupt_before", interrupt_before),
                            ("interrupt_after", interrupt_after)):
            if nodes is None:
                continue
            if nodes != "*" and (isinstance(nodes, str | bytes)
                                 or not all(isinstance(n, str) for n in nodes)):
                raise ValueError(f'{name}: "*" or a sequence of node names, as compile()')
            self._breakpoints[name] = nodes if nodes == "*" else list(nodes)
        if lease_ttl_s is not None and (type(lease_ttl_s) is not int
                                        or not 1 <= lease_ttl_s <= 86400):
            raise ValueError("lease_ttl_s: an integer number of seconds in 1..86400, or None")
        self.base_url = base_url.rstrip("/")
        self.tenant = tenant
        self.lease_ttl_s = lease_ttl_s
        self.owner = owner or owner_name()
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._root = f"{self.base_url}/api/v1/tenants/{quote(tenant, safe='')}/"
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._transport = transport
        self._async_transport = async_transport
        self._client: httpx.Client | None = None
        self._aclients: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}
        # (thread, ns, checkpoint id): checkpoints this saver stored, and writes held for
        # checkpoints whose put has not been answered yet (``_hold_locked``); oldest first.
        self._stored: dict[tuple, None] = {}
        self._held: dict[tuple, list[_Call]] = {}
        # Puts of this saver between their start and their answer (``_put_writes_plan``
        # holds writes only for these), the last put's outcome per (thread, ns), and an
        # event set (and replaced) whenever a put starts or ends.
        self._putting: dict[tuple, int] = {}
        self._last_put: dict[tuple, tuple[str, bool]] = {}
        self._put_changed = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> RecoverySaver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> RecoverySaver:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def close(self) -> None:
        """Close the sync client's connections (the next call opens new ones)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the async client of the running loop, and the sync client."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._aclients.pop(id(loop), None)
        if entry is not None:
            await entry[1].aclose()
        self.close()


    # --- encoding -----------------------------------------------------------------------

    def _typed(self, value: Any) -> dict:
        kind, data = self.serde.dumps_typed(value)
        return {"type": kind, "b64": base64.b64encode(data).decode("ascii")}

    def _untyped(self, typed: dict) -> Any:
        return self.serde.loads_typed((typed["type"], base64.b64decode(typed["b64"])))

    @staticmethod
    def _is_typed(value: Any) -> bool:
        return isinstance(value, dict) and set(value) == {"type", "b64"}

    def _tuple(self, row: dict) -> CheckpointTuple:
        """A server tuple (docs/langgraph.md, ``GET checkpoints``) as LangGraph's."""
        thread_id, ns = row["thread_id"], row.get("checkpoint_ns", "")
        checkpoint = dict(row["checkpoint"])
        checkpoint["channel_values"] = {k: self._untyped(v) for k, v in
                                        (checkpoint.get("channel_values") or {}).items()}
        if checkpoint.get("pending_sends"):
            checkpoint["pending_sends"] = [self._untyped(s) if self._is_typed(s) else s
                                           for s in checkpoint["pending_sends"]]
        parent = row.get("parent_checkpoint_id")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                     "checkpoint_id": row["checkpoint_id"]}},
            checkpoint=checkpoint,
            metadata=row.get("metadata") or {},
            parent_config=({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                             "checkpoint_id": parent}} if parent else None),
            pending_writes=[(w["task_id"], w["channel"], self._untyped(w["value"]))
                            for w in row.get("pending_writes") or []],
        )

    @staticmethod
    def _identity(config: RunnableConfig) -> dict | None:
        """The run identity parts found (as strings) in ``configurable`` or ``metadata``."""
        found: dict[str, str] = {}
        for source in (config.get("configurable") or {}, config.get("metadata") or {}):
            for key in IDENTITY_KEYS:
                if key not in found and isinstance(source.get(key), str):
                    found[key] = source[key]
        return found or None

    # --- operations as plans ------------------------------------------------------------

    def _put_plan(self, config: RunnableConfig, checkpoint: Checkpoint,
                  metadata: CheckpointMetadata, new_versions: ChannelVersions):
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns") or ""
        parent = configurable.get("checkpoint_id") or None
        body_checkpoint = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        versions = checkpoint.get("channel_versions") or {}
        body_checkpoint["channel_values"] = {
            k: self._typed(v) for k, v in checkpoint.get("channel_values", {}).items()
            if k in versions}
        if body_checkpoint.get("pending_sends"):
            body_checkpoint["pending_sends"] = [self._typed(s)
                                                for s in body_checkpoint["pending_sends"]]
        body = {"thread_id": thread_id, "checkpoint_ns": ns, "parent_checkpoint_id": parent,
                "checkpoint": body_checkpoint,
                "metadata": get_serializable_checkpoint_metadata(config, metadata)}
        identity = self._identity(config)
        if identity:
            body["identity"] = identity
        sends = checkpoint.get("channel_values", {}).get(TASKS)
        if TASKS in versions and isinstance(sends, list):
            body["sends"] = len(sends)  # the server cannot count inside the serialized value
        if not ns:  # compile()'s breakpoints are the root graph's, not a subgraph's
            body.update(self._breakpoints)
        key = (thread_id, ns, checkpoint["id"])
        self._put_started(key)
        ok = False
        try:
            call = _Call("POST", "langgraph/checkpoints", self._body(body, "put"), what="put",
                         thread_id=thread_id, checkpoint_ns=ns)
            yield from self._write(call)
            ok = True
        finally:  # refused: the writes held for it go with it
            held = self._put_ended(key, ok)
        yield from self._send_held(held)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def _put_writes_plan(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                         task_id: str, task_path: str):
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns") or ""
        head = {"thread_id": thread_id, "checkpoint_ns": ns,
                "checkpoint_id": configurable["checkpoint_id"], "task_id": task_id,
                "task_path": task_path}
        items = [{"idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel,
                  "value": self._typed(value)} for idx, (channel, value) in enumerate(writes)]
        # Bodies within the count and size limits; each write is stored idempotently by
        # (task_id, idx), so a call cut in several requests is safe to repeat.
        fixed = len(_encode_json(dict(head, writes=[]), "put_writes"))
        batch: list[dict] = []
        size = fixed
        batches: list[list[dict]] = []
        for item in items:
            item_size = len(_encode_json(item, f"put_writes: write to {item['channel']}")) + 1
            if fixed + item_size > self.max_body_bytes:
                self._body(dict(head, writes=[item]), f"put_writes: write to "
                                                      f"{item['channel']!r}")
            if batch and (size + item_size > self.max_body_bytes
                          or len(batch) >= protocol.MAX_WRITES):
                batches.append(batch)
                batch, size = [], fixed
            batch.append(item)
            size += item_size
        if batch:
            batches.append(batch)
        calls = [_Call("POST", "langgraph/writes",
                       self._body(dict(head, writes=part), "put_writes"), what="put_writes",
                       thread_id=thread_id, checkpoint_ns=ns) for part in batches]
        key = (thread_id, ns, head["checkpoint_id"])
        for i, call in enumerate(calls):
            try:
                yield from self._write(call)
            except CheckpointError as exc:
                if exc.kind != NOT_FOUND:
                    raise
                if not _no_such_checkpoint(exc):
                    raise self._no_tenant(exc) from None
                if (yield from self._await_put(key, calls[i:], exc)):
                    return
                # This saver stored it (the 404 was read before its put committed).
                yield from self._write(call)


    def _get_tuple_plan(self, config: RunnableConfig):
        configurable = config["configurable"]
        params = {"thread_id": str(configurable["thread_id"]),
                  "checkpoint_ns": configurable.get("checkpoint_ns") or "", "limit": 1}
        if checkpoint_id := get_checkpoint_id(config):
            params["checkpoint_id"] = checkpoint_id
        try:
            answer = yield _Call("GET", "langgraph/checkpoints", params=params,
                                 what="get_tuple", thread_id=params["thread_id"],
                                 checkpoint_ns=params["checkpoint_ns"])
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND:  # the list answers 200 for a missing thread
                raise self._no_tenant(exc) from None
            raise
        results = (answer.body or {}).get("results") or []
        return self._tuple(results[0]) if results else None

    def _list_plan(self, config: RunnableConfig | None, filter: dict | None,
                   before: RunnableConfig | None, limit: int | None):
        """Generator of ``_Call`` (sent, answered with ``_Answer``) and ``CheckpointTuple``
        (yielded to the caller): pages of ``GET checkpoints`` until ``limit`` or the end."""
        if limit is not None and limit <= 0:
            return
        params: dict[str, Any] = {}
        if config is not None:
            configurable = config["configurable"]
            params["thread_id"] = str(configurable["thread_id"])
            if configurable.get("checkpoint_ns") is not None:
                params["checkpoint_ns"] = configurable["checkpoint_ns"]
            if checkpoint_id := get_checkpoint_id(config):
                params["checkpoint_id"] = checkpoint_id
        if filter:
            params["filter"] = _encode_json(filter, "list: filter").decode("utf-8")
        if before is not None and (before_id := get_checkpoint_id(before)):
            params["before"] = before_id
        remaining = limit
        while True:
            page = protocol.DEFAULT_LIMIT if remaining is None else min(remaining,
                                                                        protocol.MAX_LIMIT)
            try:
                answer = yield _Call("GET", "langgraph/checkpoints",
                                     params=dict(params, limit=page), what="list",
                                     thread_id=params.get("thread_id"))
            except CheckpointError as exc:
                if exc.kind == NOT_FOUND:
                    raise self._no_tenant(exc) from None
                raise
            body = answer.body or {}
            for row in body.get("results") or []:
                yield self._tuple(row)
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return
            cursor = body.get("next_before")
            if not cursor:
                return
            params["before"] = cursor

    def _simple_plan(self, path: str, body: dict, what: str, thread_id: str | None = None):
        answer = yield _Call("POST", path, self._body(body, what),
                             headers={"Content-Type": "application/json"}, what=what,
                             thread_id=thread_id)
        return answer.body

    def _delete_thread_plan(self, thread_id: str):
        thread_id = str(thread_id)
        yield from self._simple_plan("langgraph/threads/delete", {"thread_id": thread_id},
                                     "delete_thread", thread_id)
        self._forget_lease(thread_id)

    def _delete_for_runs_plan(self, run_ids: Sequence[str]):
        ids = [str(r) for r in run_ids]
        for start in range(0, len(ids), protocol.MAX_RUN_IDS):
            yield from self._simple_plan("langgraph/runs/delete",
                                         {"run_ids": ids[start:start + protocol.MAX_RUN_IDS]},
                                         "delete_for_runs")

    def _copy_thread_plan(self, source_thread_id: str, target_thread_id: str):
        yield from self._simple_plan(
            "langgraph/threads/copy", {"source_thread_id": str(source_thread_id),
                                       "target_thread_id": str(target_thread_id)},
            "copy_thread", str(target_thread_id))

    def _prune_plan(self, thread_ids: Sequence[str], strategy: str):
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        ids = [str(t) for t in thread_ids]
        for start in range(0, len(ids), protocol.MAX_THREAD_IDS):
            yield from self._simple_plan(
                "langgraph/threads/prune",
                {"thread_ids": ids[start:start + protocol.MAX_THREAD_IDS],
                 "strategy": strategy}, "prune")

    # --- BaseCheckpointSaver: sync ------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (``checkpoint_id``), or the head of (thread,
        namespace) without one; ``None`` if there is none. Pending writes are ordered by
        (task_path, task_id, idx). Raises ``CheckpointError``: ``not_found`` when the
        tenant is not there for this token or base_url is wrong (the server answers a
        missing thread with no result, never 404), ``storage``, ``invalid_payload``."""
        return self._drive(self._get_tuple_plan(config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (checkpoint id descending): of ``config``'s thread (and
        namespace, if it names one; and checkpoint id), whose metadata has every key of
        ``filter`` equal (JSON equality), older than ``before``'s checkpoint id, at most
        ``limit``. Fetched a page at a time (``next_before``) as the iterator is read."""
        yield from self._run(Steps(self._list_plan(config, filter, before, limit)))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        """Store ``checkpoint`` as the new head of (thread, namespace) after its parent
        ``config["configurable"]["checkpoint_id"]`` (compare-and-swap; no parent: appended
        after the current head). Returns the config of the stored checkpoint. The same id
        with the same content again is accepted (a retry). Raises ``ThreadConflict`` (the
        parent is no longer the head; fenced; lease held), ``CheckpointError``
        ``invalid_payload`` (over the body limit, not JSON) or ``storage``."""
        return self._drive(self._put_plan(config, checkpoint, metadata, new_versions))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Store a task's pending writes on the checkpoint ``config`` names. A write's idx is
        its position, or ``WRITES_IDX_MAP``'s negative index for the special channels
        (error, interrupt, ...); (task_id, idx) already stored is kept for idx >= 0 and
        replaced for idx < 0. Writes on a checkpoint the server does not have yet (404:
        LangGraph sends them while the checkpoint's put may still be on its way) are held
        and sent right after this saver's put of it is accepted, if that put is in flight
        or about to come (``_await_put``); otherwise, and for a tenant this token has no
        role in, they raise ``CheckpointError`` ``not_found``: writes are never
        acknowledged without being stored or held for a put that will carry them. Held
        writes whose put is refused are dropped (the put raises).
        Raises ``ThreadConflict``, ``CheckpointError`` ``not_found``, ``invalid_payload``,
        ``storage``."""
        self._drive(self._put_writes_plan(config, writes, task_id, task_path))

    def resume(self, config: RunnableConfig, *,
               usage: dict[str, int] | None = None) -> dict:
        """After a restart, claim the resume decision of ``config``'s thread before
        invoking its graph again (``POST …/runs/{run_id}/resume``, CONTRACT.md 3;
        docs/langgraph.md, "Resuming"). LangGraph re-runs an interrupted node as soon as
        ``invoke(None, config)`` starts, before this saver writes anything, so only this
        claim can stop a crashed run from running again without a person's approval.

        The run identity (``workflow``, ``definition_version``, ``agent``, ``model``) is
        read from ``config`` as the saver's writes read it; ``usage`` (the runtime's
        counters) is sent when given. Returns the service's decision ``{"action",
        "reason", "checkpoint_id", "revision", "fencing_token"}`` and two keys for the
        caller: ``"invoke"`` (``True`` for ``continue`` and ``retry``: run
        ``graph.invoke(None, decision["config"])``; ``False`` for ``replay``, where
        ``graph.get_state`` holds the recorded result, and for ``reject`` and
        ``reconcile``, where nothing may run) and ``"config"`` (``config``, with
        ``recovery_effect_retry: True`` when this claim consumed an approved retry, so
        the re-run node's recorded effects may be executed again). Raises ``ValueError``
        without ``configurable.thread_id``, ``CheckpointError`` ``not_found`` when the
        thread has no run, ``storage`` and ``invalid_payload`` as the other calls."""
        return self._drive(self._resume_plan(config, usage))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and pending write of ``thread_id`` (all namespaces); a
        thread that does not exist is no error. Effect records stay (docs/langgraph.md)."""
        self._drive(self._delete_thread_plan(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose ``metadata["run_id"]`` is one of
        ``run_ids`` (LangGraph run ids), in requests of at most 1,000 ids."""
        self._drive(self._delete_for_runs_plan(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another, which must have none
        (else ``ThreadConflict``, 412)."""
        self._drive(self._copy_thread_plan(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep only each namespace's head and its writes; ``delete``:
        delete everything of the threads. Raises ``TypeError`` for a single str and
        ``ValueError`` for another strategy, as LangGraph's PostgreSQL saver."""
        self._drive(self._prune_plan(thread_ids, strategy))

    # --- BaseCheckpointSaver: async -----------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple`` on the async client."""
        return await self._adrive(self._get_tuple_plan(config))

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        """``list`` on the async client."""
        async for item in self._arun(Steps(self._list_plan(config, filter, before, limit))):
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """``put`` on the async client."""
        return await self._adrive(self._put_plan(config, checkpoint, metadata, new_versions))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        """``put_writes`` on the async client."""
        await self._adrive(self._put_writes_plan(config, writes, task_id, task_path))

    async def aresume(self, config: RunnableConfig, *,
                      usage: dict[str, int] | None = None) -> dict:
        """``resume`` on the async client."""
        return await self._adrive(self._resume_plan(config, usage))

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread`` on the async client."""
        await self._adrive(self._delete_thread_plan(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """``delete_for_runs`` on the async client."""
        await self._adrive(self._delete_for_runs_plan(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """``copy_thread`` on the async client."""
        await self._adrive(self._copy_thread_plan(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``prune`` on the async client."""
        await self._adrive(self._prune_plan(thread_ids, strategy))

    # --- versions -----------------------------------------------------------------------

    def get_next_version(self, current: str | int | None, channel: None = None) -> str:
        """The version after ``current``: ``"{n+1:032}.{random:016}"``, where ``n`` is the
        integer part of ``current`` (0 for none), exactly as LangGraph's PostgreSQL saver,
        so versions sort as strings and compare by their integer prefix."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"
