"""The wire of ``RecoverySaver`` (``recovery_client.langgraph``): its requests as data,
the sync and async drivers that send them, its leases and fencing tokens, and the writes
it holds for a put still in flight. ``RecoverySaver`` is the one subclass; its public
API, its encoding of LangGraph's types and its operations (plans) stay in
``langgraph.py``, whose module docstring says what is raised.

Shapes: an operation of the saver is a plan, a generator that yields ``_Call`` (one
request, answered with an ``_Answer`` sent back in, or a ``CheckpointError`` thrown in),
``_Wait`` (wait for an event) or, for ``list``, results for the caller; ``_drive`` /
``_adrive`` (and ``_run`` / ``_arun``) walk it with ``core.Steps`` on the sync
``httpx.Client`` or the running loop's ``httpx.AsyncClient``. A conflict answer (412, 409)
is raised as ``ThreadConflict``, every other failure as ``core.CheckpointError``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from recovery_client import protocol
from recovery_client.core import (
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
from recovery_client.effects import RETRY_CONFIG_KEY

#: Checkpoints remembered as stored, and checkpoints with held writes (``_hold_locked``).
HELD_MAX = 1024
#: The resume actions after which a graph is invoked again (``RecoverySaver.resume``).
RESUME_INVOKES = frozenset({"continue", "retry"})
#: Seconds writes on a checkpoint not stored yet wait for its put to reach this saver
#: when none of its puts on the thread is in flight (``RecoverySaver._await_put``): the
#: moment between one put's answer and the next put's start, generous for a loaded machine.
PUT_GRACE_S = 5.0


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

    # Named by where callers import it from (tracebacks, pickling), not by this module.
    __module__ = "recovery_client.langgraph"

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


class _SaverWire:
    """Transport, leases and held writes of ``RecoverySaver`` (its only subclass, whose
    ``__init__`` sets what these methods use: ``base_url``, ``tenant``, ``owner``,
    ``lease_ttl_s``, ``timeout_s``, ``max_body_bytes``, ``_root``, ``_headers``,
    ``_transport``, ``_async_transport``, ``_client``, ``_aclients``, ``_lock``,
    ``_leases``, ``_stored``, ``_held``, ``_putting``, ``_last_put``, ``_put_changed``).
    No ``__init__`` of its own: ``RecoverySaver``'s ``super().__init__`` goes on to
    LangGraph's ``BaseCheckpointSaver``."""

    # --- the httpx clients --------------------------------------------------------------

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

    def _resume_plan(self, config: dict, usage: dict[str, int] | None):
        """Plan of ``RecoverySaver.resume``: the claim, then the saver's lease forgotten."""
        configurable = (config or {}).get("configurable") or {}
        if "thread_id" not in configurable:
            raise ValueError("config: configurable.thread_id is required")
        thread_id = str(configurable["thread_id"])
        body: dict[str, Any] = dict(self._identity(config) or {})
        if usage is not None:
            body["usage"] = usage
        answer = yield _Call("POST", f"runs/{protocol.thread_run_id(thread_id)}/resume",
                             self._body(body, "resume"),
                             headers={"Content-Type": "application/json"}, what="resume",
                             thread_id=thread_id)
        # A consumed retry fenced every earlier owner, this saver's lease too: the next
        # write leases the run again.
        self._forget_lease(thread_id)
        decision = dict(answer.body)
        action = decision.get("action")
        # Marked for a retry this claim consumed, and only then (a config kept from an
        # earlier retry must not carry its mark into a ``continue``).
        resumed = {**config, "configurable": {
            **{k: v for k, v in configurable.items() if k != RETRY_CONFIG_KEY},
            **({RETRY_CONFIG_KEY: True} if action == "retry" else {})}}
        return {**decision, "invoke": action in RESUME_INVOKES, "config": resumed}

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

    # --- puts in flight and the writes held for them ------------------------------------

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
