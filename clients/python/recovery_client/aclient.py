"""The runtime client for asyncio: ``AsyncHttpCheckpointStore`` and ``perform_effect``.

The same store as ``recovery_client.client.HttpCheckpointStore`` (issue 10, "client
parity"), with every method a coroutine, over one ``httpx.AsyncClient`` whose
connection pool is reused by every request (``async with store:`` or ``await
store.aclose()`` closes it)::

    async with AsyncHttpCheckpointStore("http://127.0.0.1:8000", "acme", token) as store:
        await store.compare_and_swap(envelope, None)
        await store.lease(run_id, "worker-7", ttl_s=5)
        receipt = await perform_effect(store, run_id=run_id, service="payments",
                                       operation_key="charge:A-1042",
                                       effect_class="non_idempotent",
                                       request={"amount_cents": 2599}, call=charge_card)

Everything but the I/O is shared rather than copied (``core.StoreCore``: URLs, headers,
the size check, answer decoding, error kinds, retries with full jitter, lost answers of
compare-and-swap writes; ``client.effect_walk``): the errors, retries and size limit are
exactly those of the module docstring of ``recovery_client/client.py`` (and
docs/client.md). ``core.py`` and ``client.py`` stay standard-library only; this module
needs httpx (``pip install 'recovery-client[async]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from .client import (
    CONFLICT,
    MAX_BODY_BYTES,
    Answer,
    Call,
    CheckpointError,
    EffectFailed,
    EffectInDoubt,
    Invoke,
    Op,
    ReceiptNotRecorded,
    Sleep,
    Steps,
    StoreCore,
    decode_answer,
    effect_fields,
    effect_walk,
    fingerprint,
    network_error,
    next_revision,
    now_ms,
)

__all__ = ["AsyncHttpCheckpointStore", "CheckpointError", "EffectFailed", "EffectInDoubt",
           "ReceiptNotRecorded", "fingerprint", "next_revision", "now_ms", "perform_effect"]

#: httpx errors raised before the request left this process: nothing reached the server.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


class AsyncHttpCheckpointStore(StoreCore):
    """``HttpCheckpointStore`` for asyncio: the same arguments, methods (coroutines),
    answers and ``CheckpointError`` kinds; see each sync method for its contract.

    ``max_connections`` bounds the pool (kept-alive connections are reused by every
    request; tasks of one event loop may share one store and its per-run fencing tokens).
    ``sleep`` is the pause coroutine function (``asyncio.sleep``; tests pass their own),
    ``transport`` an httpx transport (e.g. ``httpx.MockTransport`` in tests; default:
    httpx's own, which honours ``HTTP_PROXY`` and friends as ``urllib`` does). Use the
    store in one event loop; close it with ``aclose()`` or ``async with``.
    """

    def __init__(self, base_url: str, tenant: str, token: str, timeout_s: float = 10, *,
                 retries: int = 3, backoff_s: float = 0.2, max_backoff_s: float = 5.0,
                 max_body_bytes: int | None = MAX_BODY_BYTES, max_connections: int = 10,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(base_url, tenant, token, timeout_s=timeout_s, retries=retries,
                         backoff_s=backoff_s, max_backoff_s=max_backoff_s,
                         max_body_bytes=max_body_bytes)
        self._sleep = sleep
        self._client = httpx.AsyncClient(
            timeout=timeout_s, transport=transport,
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))

    async def aclose(self) -> None:
        """Close the connection pool (the store cannot be used afterwards)."""
        await self._client.aclose()

    async def __aenter__(self) -> AsyncHttpCheckpointStore:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # --- plumbing ---------------------------------------------------------------------

    async def _drive(self, op: Op) -> Any:
        """Run operation ``op`` to its end, awaiting its steps; returns its value."""
        steps = Steps(op)
        for step in steps:
            try:
                steps.reply = await self._do(step)
            except Exception as exc:  # handed to op, which raises what it does not handle
                steps.error = exc
        return steps.value

    async def _do(self, step: Call | Sleep | Invoke) -> Any:
        if isinstance(step, Call):
            return await self._exchange(step)
        if isinstance(step, Sleep):
            return await self._sleep(step.seconds)
        reply = step.fn(*step.args)  # the caller's function, or coroutine function
        return await reply if inspect.isawaitable(reply) else reply

    async def _exchange(self, call: Call) -> Answer:
        """One exchange on the pool, no retry."""
        try:
            resp = await self._client.request(call.method, call.url, content=call.data,
                                              headers=call.headers)
        except _UNSENT as exc:
            raise network_error(call, exc, sent=False) from None
        except httpx.HTTPError as exc:  # timeouts, resets, protocol errors after sending
            raise network_error(call, exc, sent=True) from None
        return decode_answer(call, resp.status_code, resp.headers, resp.content)

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict | None = None, query: dict | None = None) -> Answer:
        """As ``HttpCheckpointStore.request``: ``(status, headers, decoded JSON)``."""
        return await self._drive(self._op_request(method, path, body, headers, query))

    # --- checkpoints --------------------------------------------------------------------

    async def load(self, checkpoint_id: str) -> dict | None:
        """As ``HttpCheckpointStore.load``: the latest envelope, or ``None``."""
        return await self._drive(self._op_load(checkpoint_id))

    async def revision(self, checkpoint_id: str) -> int | None:
        """As ``HttpCheckpointStore.revision``: the current revision (a ``HEAD``)."""
        return await self._drive(self._op_revision(checkpoint_id))

    async def compare_and_swap(self, checkpoint: dict, expected_revision: int | None) -> int:
        """As ``HttpCheckpointStore.compare_and_swap``: the stored revision."""
        return await self._drive(self._op_write(f"checkpoints/{checkpoint['id']}", checkpoint,
                                                expected_revision, look_with_head=True))

    async def revisions(self, checkpoint_id: str) -> list[dict]:
        """As ``HttpCheckpointStore.revisions``: every revision, oldest first."""
        return await self._drive(self._op_revisions(checkpoint_id))

    # --- leases and resume --------------------------------------------------------------

    async def lease(self, run_id: str, owner: str, ttl_s: int) -> dict:
        """As ``HttpCheckpointStore.lease``: ``{"fencing_token", "expires_at"}``."""
        return await self._drive(self._op_lease(run_id, owner, ttl_s))

    @contextlib.asynccontextmanager
    async def keep_leased(self, run_id: str, owner: str, ttl_s: int, *,
                          every_s: float | None = None):
        """As ``HttpCheckpointStore.keep_leased``, for ``async with``: the renewals are a
        task of this event loop on this store's pool; the same yielded ``{"error"}``."""
        await self.lease(run_id, owner, ttl_s)
        state: dict = {"error": None}

        async def renew() -> None:
            while True:
                await asyncio.sleep(ttl_s / 3 if every_s is None else every_s)
                if self.fencing_token_of(run_id) is None:  # released or fenced: stay so
                    return
                try:
                    await self.lease(run_id, owner, ttl_s)
                    state["error"] = None
                except CheckpointError as exc:
                    state["error"] = exc
                    if exc.kind == CONFLICT:
                        return

        task = asyncio.create_task(renew())
        try:
            yield state
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def revoke_lease(self, run_id: str, reason: str, *, owner: str | None = None,
                           fencing_token: int | None = None) -> dict:
        """As ``HttpCheckpointStore.revoke_lease``: ends the run's live lease (reviewer);
        ``{"owner", "fencing_token", "expires_at"}``."""
        return await self._drive(self._op_revoke_lease(run_id, reason, owner,
                                                       fencing_token))

    async def release_lease(self, run_id: str, owner: str) -> dict:
        """As ``HttpCheckpointStore.release_lease``: gives back the lease this store holds
        (writer); ``{"owner", "fencing_token", "expires_at"}``."""
        return await self._drive(self._op_release_lease(run_id, owner))

    async def resume_preview(self, run_id: str, *, agent: str | None = None,
                             model: str | None = None, workflow: str | None = None,
                             definition_version: str | int | None = None) -> dict:
        """As ``HttpCheckpointStore.resume_preview``: looks, claims nothing."""
        identity = self._identity(agent, model, workflow, definition_version)
        return await self._drive(self._op_resume_preview(run_id, identity))

    async def resume(self, run_id: str, *, agent: str | None = None, model: str | None = None,
                     workflow: str | None = None, definition_version: str | int | None = None,
                     usage: dict[str, int] | None = None) -> dict:
        """As ``HttpCheckpointStore.resume``: claims the decision (``retry`` fences;
        ``usage`` must suit it)."""
        identity = self._identity(agent, model, workflow, definition_version)
        return await self._drive(self._op_resume(run_id, identity, usage))

    async def list_runs(self, *, recovery_state: str | None = None,
                        limit: int = 50) -> AsyncIterator[dict]:
        """As ``HttpCheckpointStore.list_runs``: ``async for`` over every page."""
        query: dict | None = self._runs_query(recovery_state, limit)
        while query is not None:
            results, query = await self._drive(self._op_page("runs", query))
            for run in results:
                yield run

    # --- effects ------------------------------------------------------------------------

    async def put_effect(self, effect: dict, expected_revision: int | None) -> int:
        """As ``HttpCheckpointStore.put_effect``: the stored revision (only the writable
        fields are sent, ``effect_fields``)."""
        return await self._drive(self._op_write(f"effects/{effect['id']}",
                                                effect_fields(effect), expected_revision,
                                                look_with_head=False))

    async def find_effect(self, service: str, operation_key: str) -> dict | None:
        """As ``HttpCheckpointStore.find_effect``: the record, or ``None``."""
        return await self._drive(self._op_find_effect(service, operation_key))


async def perform_effect(
    store: AsyncHttpCheckpointStore,
    *,
    run_id: str,
    service: str,
    operation_key: str,
    effect_class: str,
    request: Any,
    call: Callable[[str], dict | Awaitable[dict]],
    effect_id: str | None = None,
    on_step: Callable[[str], None | Awaitable[None]] | None = None,
    retry: bool = False,
    store_request: bool | None = None,
    fencing_token: int | None = None,
) -> dict:
    """``recovery_client.client.perform_effect`` for ``AsyncHttpCheckpointStore``: the same
    steps, answers and errors (planned -> submitted -> ``call`` -> confirmed; replay of
    a confirmed receipt; ``EffectFailed``, ``EffectInDoubt``, ``CheckpointError``).
    ``call`` and ``on_step`` may be plain functions or coroutine functions."""
    return await store._drive(effect_walk(
        store, run_id=run_id, service=service, operation_key=operation_key,
        effect_class=effect_class, request=request, call=call, effect_id=effect_id,
        on_step=on_step, retry=retry, store_request=store_request,
        fencing_token=fencing_token))
