"""``RecoverySaver``: a LangGraph checkpointer that keeps its checkpoints in the recovery
service (issue 10; mapping and HTTP API in docs/langgraph.md).

    pip install './clients/python[langgraph]'   # recovery-client, from a checkout

    from recovery_client.langgraph import RecoverySaver

    with RecoverySaver("https://recovery.example", "acme", token) as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "order-A-1042"}})

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
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
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
from recovery_client.client import (
    CONFLICT,
    INVALID_PAYLOAD,
    NOT_FOUND,
    STORAGE,
    Call,
    CheckpointError,
    Steps,
    decode_answer,
    encode_json,
)

__all__ = ["RecoverySaver", "ThreadConflict"]

#: The identity parts a run carries (CONTRACT.md 3, ``resume``); taken from the config.
IDENTITY_KEYS = ("agent", "model", "workflow", "definition_version")
PRUNE_STRATEGIES = ("keep_latest", "delete")
#: Checkpoints remembered as stored, and checkpoints with held writes (``_hold_locked``).
HELD_MAX = 1024
#: Seconds writes on a checkpoint not stored yet wait for its put to reach this saver
#: when none of its puts on the thread is in flight (``RecoverySaver._await_put``): the
#: moment between one put's answer and the next put's start, generous for a loaded machine.
PUT_GRACE_S = 5.0


def _no_such_checkpoint(exc: CheckpointError) -> bool:
    """Whether a 404 is the server's "no such checkpoint" (``POST …/langgraph/writes``),
    not a tenant the token has no role in or a wrong route."""
    detail = exc.body.get("detail")
    return isinstance(detail, str) and detail.startswith("checkpoint_id:")


class ThreadConflict(CheckpointError):
    """The server refused a write on a thread because someone else holds it (kind
    ``conflict``, issue 10).

    ``error`` is the server's word: ``conflict`` (412: the put's parent is no longer the
    head of (thread, namespace), another graph wrote first; or the checkpoint id is stored
    with other content; or copy_thread's target has checkpoints), ``fenced`` (409: the run
    has a newer fencing token than this saver sent, another owner took it over), or
    ``lease_held`` (409: another owner's lease on the run is live). ``thread_id`` and
    ``checkpoint_ns`` name the thread; ``head_checkpoint_id`` is the head the server holds
    (412 only, else ``None``), ``current_revision`` the envelope's revision (412).

    Raised out of ``graph.invoke``: the checkpointer's exception ends the invocation.
    Re-read the thread (``graph.get_state``) before deciding anything.
    """

    def __init__(self, message: str, *, status: int, body: dict | None,
                 thread_id: str | None = None, checkpoint_ns: str | None = None):
        super().__init__(CONFLICT, message, status=status, body=body)
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns

    @property
    def head_checkpoint_id(self) -> str | None:
        return self.answered("head_checkpoint_id", str)


# --------------------------------------------------------------------------------------
# Requests as data: each operation is a generator of _Call that the sync and the async
# driver send (one implementation, two transports).
# --------------------------------------------------------------------------------------


@dataclass
class _Call:
    method: str
    path: str  # relative to …/api/v1/tenants/{tenant}/
    body: bytes | None = None
    params: dict | None = None
    headers: dict = field(default_factory=dict)
    what: str = ""  # for messages: "put", "get_tuple", ...
    thread_id: str | None = None
    checkpoint_ns: str | None = None


@dataclass
class _Answer:
    status: int
    body: Any  # decoded JSON, or None


@dataclass
class _Lease:
    fencing_token: int | None = None
    taken_at: float = 0.0  # time.monotonic() just before the lease request was sent
    pending: bool = False  # the run did not exist (404): take it right after the first write
    settled: threading.Event = field(default_factory=threading.Event)  # pending is over


@dataclass
class _Wait:
    """Yielded by a plan: wait (at most ``timeout_s``) until ``event`` is set."""

    event: threading.Event
    timeout_s: float


def _encode_json(value: Any, what: str) -> bytes:
    """Compact UTF-8 JSON (``recovery_client.client.encode_json``, the clients' own encoder, so
    the saver and the clients measure a body alike), or ``invalid_payload`` naming what
    could not be encoded (not JSON, NaN, an unpaired surrogate)."""
    return encode_json(value, what)


class RecoverySaver(BaseCheckpointSaver[str]):
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
        self.owner = owner or (f"{socket.gethostname()[:150]}:{os.getpid()}:"
                               f"{uuid.uuid4()}")
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

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(base_url=self._root, headers=self._headers,
                                            timeout=self.timeout_s, transport=self._transport)
            return self._client

    def _async_client(self) -> httpx.AsyncClient:
        """The running loop's client (an ``AsyncClient`` is bound to the loop that first
        used it; a saver used from several loops keeps one per loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for key, (other, _) in list(self._aclients.items()):
                if other.is_closed():
                    del self._aclients[key]
            entry = self._aclients.get(id(loop))
            if entry is None or entry[0] is not loop:
                client = httpx.AsyncClient(base_url=self._root, headers=self._headers,
                                           timeout=self.timeout_s,
                                           transport=self._async_transport)
                entry = self._aclients[id(loop)] = (loop, client)
            return entry[1]

    # --- transport ----------------------------------------------------------------------

    def _send(self, call: _Call) -> _Answer:
        try:
            resp = self._sync_client().request(**self._request(call))
        except httpx.HTTPError as exc:
            raise self._no_answer(call, exc) from None
        return self._answer(call, resp)

    async def _asend(self, call: _Call) -> _Answer:
        try:
            resp = await self._async_client().request(**self._request(call))
        except httpx.HTTPError as exc:
            raise self._no_answer(call, exc) from None
        return self._answer(call, resp)

    @staticmethod
    def _request(call: _Call) -> dict:
        """The arguments of ``httpx.Client.request`` / ``AsyncClient.request`` for ``call``
        (its path is relative to the client's ``base_url``, the tenant's API root)."""
        return {"method": call.method, "url": call.path, "content": call.body,
                "params": call.params, "headers": call.headers}

    @staticmethod
    def _no_answer(call: _Call, exc: httpx.HTTPError) -> CheckpointError:
        """The ``storage`` error of a request that got no answer (network, timeout)."""
        return CheckpointError(STORAGE, f"{call.what}: {call.method} {call.path}: "
                                        f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _answer(call: _Call, resp: httpx.Response) -> _Answer:
        """The decoded 2xx answer, or the error its status says (module docstring): the
        clients' own parser (``decode_answer``: JSON, error kinds, messages), each
        message led by the operation, and a conflict raised as ``ThreadConflict``."""
        try:
            answer = decode_answer(Call(call.method, call.path, call.path, call.body,
                                        call.headers),
                                   resp.status_code, resp.headers, resp.content)
        except CheckpointError as exc:
            message = f"{call.what}: {exc.message}"
            if exc.kind == CONFLICT:
                raise ThreadConflict(message, status=exc.status, body=exc.body,
                                     thread_id=call.thread_id,
                                     checkpoint_ns=call.checkpoint_ns) from None
            raise CheckpointError(exc.kind, message, status=exc.status, body=exc.body,
                                  retry_after_s=exc.retry_after_s) from None
        return _Answer(answer.status, answer.body)

    # Drivers (``Steps`` as the clients use it): each ``_Call`` a plan yields is sent and
    # its ``_Answer`` sent back in (a ``CheckpointError`` thrown in, so the plan can turn
    # a 404 into ``None``); a ``_Wait`` is waited for; anything else is for the caller
    # (``list``'s tuples).

    def _run(self, steps: Steps) -> Iterator:
        """Generator: ``steps`` done on the sync client, yielding what is for the caller."""
        for step in steps:
            if isinstance(step, _Wait):
                step.event.wait(step.timeout_s)
            elif not isinstance(step, _Call):
                yield step
            else:
                try:
                    steps.reply = self._send(step)
                except CheckpointError as exc:
                    steps.error = exc

    async def _arun(self, steps: Steps) -> AsyncIterator:
        """``_run`` on the async client (a ``_Wait`` in a worker thread: the loop runs on)."""
        for step in steps:
            if isinstance(step, _Wait):
                await asyncio.get_running_loop().run_in_executor(
                    None, step.event.wait, step.timeout_s)
            elif not isinstance(step, _Call):
                yield step
            else:
                try:
                    steps.reply = await self._asend(step)
                except CheckpointError as exc:
                    steps.error = exc

    def _drive(self, plan):
        """Run an operation's plan on the sync client; returns the plan's return value."""
        steps = Steps(plan)
        for item in self._run(steps):
            raise TypeError(f"{item!r}: only list's plan yields results")
        return steps.value

    async def _adrive(self, plan):
        """``_drive`` on the async client."""
        steps = Steps(plan)
        async for item in self._arun(steps):
            raise TypeError(f"{item!r}: only list's plan yields results")
        return steps.value

    def _body(self, value: Any, what: str) -> bytes:
        """``value`` as the JSON body, refused before sending when over the limit."""
        data = _encode_json(value, what)
        if len(data) > self.max_body_bytes:
            raise CheckpointError(
                INVALID_PAYLOAD,
                f"{what}: the request body is {len(data):,} bytes, over the server's limit "
                f"of {self.max_body_bytes:,} bytes (RECOVERY_MAX_BODY_BYTES); not sent")
        return data

    # --- leases and fencing -------------------------------------------------------------

    def _write(self, call: _Call):
        """Generator: send a write on ``call.thread_id`` (with ``lease_ttl_s``: its lease
        taken or renewed first, ``Fencing-Token`` sent); its answer. A conflict forgets
        the lease, so the next write asks for it again.

        A thread whose run does not exist yet (the lease is 404) has one first write,
        sent without a token, after which its lease is taken; the thread's other writes
        meanwhile wait for that (``_Wait``) instead of going without a token and being
        fenced by the lease taken under them."""
        if self.lease_ttl_s is None:
            call.headers = {"Content-Type": "application/json"}
            return (yield call)
        lease = yield from self._lease_for(call.thread_id)
        call.headers = {"Content-Type": "application/json"}
        if lease.fencing_token is not None:
            call.headers["Fencing-Token"] = str(lease.fencing_token)
        if not lease.pending:
            try:
                return (yield call)
            except ThreadConflict:
                self._forget_lease(call.thread_id)
                raise
        done = False
        try:
            answer = yield call
            yield from self._take_lease(call.thread_id, missing_ok=False)
            done = True
            return answer
        finally:
            if not done:
                self._forget_lease(call.thread_id)
            lease.settled.set()

    def _lease_for(self, thread_id: str):
        """Generator: the lease to write ``thread_id`` under: the current one, renewed
        once half the ttl has passed (by this process's monotonic clock), or a new one; a
        ``pending`` lease makes the caller the thread's first writer."""
        while True:
            with self._lock:
                lease = self._leases.get(thread_id)
                if lease is not None and lease.pending:
                    wait = lease.settled
                else:
                    wait = None
                    due = lease is None or (time.monotonic() - lease.taken_at
                                            >= self.lease_ttl_s / 2)
            if wait is not None:
                yield _Wait(wait, self.timeout_s * 3)
                if not wait.is_set():
                    raise CheckpointError(STORAGE, f"lease: the first write on thread "
                                                   f"{thread_id!r} did not finish in time")
                continue
            if not due:
                return lease
            lease = yield from self._take_lease(thread_id, missing_ok=True)
            if lease is not None:
                return lease

    def _take_lease(self, thread_id: str, *, missing_ok: bool):
        """Generator: take or renew the lease of ``thread_id``'s run; the new ``_Lease``.
        A run that does not exist yet (404) with ``missing_ok`` gives a ``pending`` lease
        (the caller writes first), or ``None`` when another write already holds one."""
        run_id = protocol.thread_run_id(thread_id)
        started = time.monotonic()
        try:
            answer = yield _Call("POST", f"runs/{run_id}/lease",
                                 self._body({"owner": self.owner, "ttl_s": self.lease_ttl_s},
                                            "lease"),
                                 headers={"Content-Type": "application/json"}, what="lease",
                                 thread_id=thread_id)
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND and missing_ok:
                with self._lock:
                    current = self._leases.get(thread_id)
                    if current is not None and current.pending:
                        return None
                    lease = self._leases[thread_id] = _Lease(pending=True)
                return lease
            if exc.kind == CONFLICT:
                self._forget_lease(thread_id)
            raise
        token = (answer.body or {}).get("fencing_token")
        if type(token) is not int:
            raise CheckpointError(STORAGE, f"lease: no fencing token in the answer for run "
                                           f"{run_id}")
        lease = _Lease(fencing_token=token, taken_at=started)
        with self._lock:
            self._leases[thread_id] = lease
        return lease

    def _forget_lease(self, thread_id: str) -> None:
        with self._lock:
            self._leases.pop(thread_id, None)

    def fencing_token(self, thread_id: str) -> int | None:
        """The fencing token this saver currently sends (``Fencing-Token``) with its writes
        on ``thread_id`` (an int, the run's token from its last lease answer), or ``None``
        when it holds no lease on the thread's run: no ``lease_ttl_s``; no write on the
        thread yet; the thread's first write still out (a new run, leased right after
        it); or the lease forgotten after a refusal (409/412) or ``delete_thread``. Never
        sends a request or waits.

        For code writing to the same run beside the graph, so its writes are not fenced
        by this very saver's lease (CONTRACT.md 3, fencing; docs/langgraph.md "Side
        effects inside a graph"): ``@recorded_effect``
        (``recovery_client.effects``) finds the saver in the node's config and
        sends this token with its effect writes. The token is the one held, not checked:
        if another owner or an approved retry took the run since, the server answers
        409 ``fenced``."""
        with self._lock:
            lease = self._leases.get(str(thread_id))
            return None if lease is None else lease.fencing_token

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

    def _put_started(self, key: tuple) -> None:
        with self._lock:
            self._putting[key] = self._putting.get(key, 0) + 1
            self._put_changed, changed = threading.Event(), self._put_changed
        changed.set()

    def _put_ended(self, key: tuple, ok: bool) -> list[_Call]:
        """Record the end of this saver's put of ``key``; the writes held for it, to send
        now (accepted), or none (refused: they are dropped)."""
        with self._lock:
            left = self._putting.pop(key, 1) - 1
            if left:
                self._putting[key] = left
            held = self._held.pop(key, []) if ok or not left else []
            if ok:
                self._stored[key] = None
                while len(self._stored) > HELD_MAX:
                    del self._stored[next(iter(self._stored))]
            line = key[:2]
            self._last_put.pop(line, None)
            self._last_put[line] = (key[2], ok)
            while len(self._last_put) > HELD_MAX:
                del self._last_put[next(iter(self._last_put))]
            self._put_changed, changed = threading.Event(), self._put_changed
        changed.set()
        return held if ok else []

    def _await_put(self, key: tuple, calls: list[_Call], refusal: CheckpointError):
        """Generator, after the server answered "no such checkpoint" to writes on ``key``
        (thread, ns, checkpoint id): ``True`` once they are held for this saver's put of
        exactly that checkpoint (in flight: ``_hold_locked``), ``False`` if this saver has stored
        it meanwhile (send them again); raises ``CheckpointError`` ``not_found`` when no
        such put is coming (issue 10: writes are never acknowledged and then lost).

        LangGraph's loop submits the put of a checkpoint before any write on it, but
        chained after its previous put (``pregel/_loop.py``), so the put may not have
        reached this saver yet. While a put of this saver on the same (thread, ns) is in
        flight, the writes wait for the put of ``key`` to start (at most ``3 *
        timeout_s``); with none in flight they wait at most ``PUT_GRACE_S`` (the moment
        between one put's answer and the next put's start), and only when that put
        could still come: no put of this saver on the (thread, ns) yet, or the last one
        accepted and older than ``key``. A refused last put, or a stored checkpoint not
        found again, raises at once."""
        line, checkpoint_id = key[:2], key[2]
        started = time.monotonic()
        quiet_since: float | None = None
        while True:
            with self._lock:
                if key in self._stored:
                    return False
                if key in self._putting:
                    return self._hold_locked(key, calls)
                busy = any(k[:2] == line for k in self._putting)
                last = self._last_put.get(line)
                changed = self._put_changed
            now = time.monotonic()
            if busy:
                quiet_since = None
                deadline = started + 3 * self.timeout_s
            else:
                may_come = last is None or (last[1] and last[0] < checkpoint_id)
                if not may_come:
                    break
                quiet_since = quiet_since if quiet_since is not None else now
                deadline = min(started + 3 * self.timeout_s, quiet_since + PUT_GRACE_S)
            if now >= deadline:
                break
            yield _Wait(changed, deadline - now)
        thread_id, ns = line
        raise CheckpointError(
            NOT_FOUND,
            f"put_writes: checkpoint {checkpoint_id!r} of thread {thread_id!r} (namespace "
            f"{ns!r}) is not stored in tenant {self.tenant!r} and this saver has no put of "
            f"it in flight; the writes were not stored ({refusal.message})",
            status=refusal.status, body=refusal.body)

    def _no_tenant(self, exc: CheckpointError) -> CheckpointError:
        """A 404 that is not "no such checkpoint": the tenant is not there for this token
        (no role in it) or ``base_url`` does not lead to this service's API."""
        return CheckpointError(
            NOT_FOUND,
            f"tenant {self.tenant!r} not found at {self.base_url} for this token (the "
            f"token's account has no role in it, or base_url/tenant is wrong): "
            f"{exc.message}", status=exc.status, body=exc.body)

    def _hold_locked(self, key: tuple, calls: list[_Call]) -> bool:
        """Keep ``calls`` (writes on checkpoint ``key`` that the server does not have yet)
        to be sent right after this saver's put of that checkpoint, which is in flight
        (called under ``_lock`` by ``_await_put``); ``True``.

        LangGraph's loop (``pregel/_loop.py``) chains its puts but sends each task's
        ``put_writes`` on its own, so the writes of a step can arrive before the put of
        the checkpoint they belong to (LangGraph's own savers store writes without
        checking the checkpoint). If the put is refused, the held writes go with it (the
        put raises); more than ``HELD_MAX`` checkpoints with held writes drop the oldest."""
        self._held.setdefault(key, []).extend(calls)
        while len(self._held) > HELD_MAX:
            del self._held[next(iter(self._held))]
        return True

    def _send_held(self, held: list[_Call]):
        """Generator: after this saver's put of a checkpoint was accepted, send the writes
        held for it (``_hold_locked``)."""
        for call in held:
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
