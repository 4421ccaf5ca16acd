"""``@recorded_effect``: a LangGraph tool (or any function) with an external side effect,
walked through the effect API so a crash inside it is reconcilable (issue 10, item 2).

::

    from recovery_client.client import HttpCheckpointStore
    from recovery_client import effects

    effects.set_default_store(HttpCheckpointStore(base_url, "acme", token))

    @effects.recorded_effect(service="payments", key=lambda order_id, **_: f"refund:{order_id}")
    def charge_card(order_id: str, amount_cents: int, idempotency_key: str) -> dict:
        return payments.post("/charges", {...}, headers={"Idempotency-Key": idempotency_key})

    def charge(state):                    # a LangGraph node; the tool may also be a
        receipt = charge_card(order_id=state["order_id"],   # LangChain @tool over it
                              amount_cents=state["amount_cents"])
        return {"charge_id": receipt["charge_id"]}

Each call is one effect record of the run of the LangGraph thread it runs in, keyed by
``(service, key(arguments))``, and goes through ``recovery_client.client.perform_effect``
(CONTRACT.md 3 "Effects", DESIGN.md 4):

- **new** (or ``planned``, the process died before sending): ``planned`` -> ``submitted``
  -> the function is called once, with the operation key as its ``idempotency_key`` ->
  ``confirmed`` with what it returned (the receipt), which is returned;
- **confirmed** (an earlier attempt, or reconciliation, confirmed it): the recorded
  receipt is returned and the function is **not** called: this is what a LangGraph
  resume needs, since LangGraph re-runs a node that was interrupted;
- **submitted / unresolved** (a call went out and nobody knows what happened) or
  **unknown / not_executed** (reconciliation could not tell, or the service never saw
  it): ``EffectInDoubt`` is raised and the function is not called: never an automatic
  duplicate. Reconciliation, or a retry two people approved, decides;
- **failed**: ``EffectFailed`` is raised again with the recorded receipt.

Errors the wrapped function raises: ``EffectFailed(message, receipt)`` means the service
refused for good (the record becomes ``failed``); any other exception leaves the record
``submitted`` (in doubt) and propagates, as does a return value that is not a JSON object
(the call happened, but there is no receipt to record). Store errors are
``recovery_client.client.CheckpointError`` (``invalid_payload`` 422 ``idempotency_key_reuse``
when the key already holds another request; ``conflict`` when fenced or raced;
``storage``).

A replayed receipt is what was recorded: the function's return value, or, when
reconciliation confirmed the effect, the service's status look-up answer
(``checkpoints.reconcile``). Code after the call should read fields both carry (the demo
payment service answers the same object to ``POST /charges`` and
``GET /operations/{key}``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from recovery_client.client import Call, HttpCheckpointStore, Steps, perform_effect
from recovery_client.protocol import thread_run_id

# The parameter through which the wrapped function receives the operation key.
KEY_PARAMETER = "idempotency_key"
# ``configurable`` key of a LangGraph invocation that consumed an approved retry (the
# resume claim answered ``retry``): ``unknown``/``not_executed`` effects go back to
# ``planned`` and are called again with the same operation key.
RETRY_CONFIG_KEY = "recovery_effect_retry"
# Where LangGraph puts the invocation's checkpointer in a node's config
# (``langgraph._internal._constants.CONFIG_KEY_CHECKPOINTER``).
CHECKPOINTER_CONFIG_KEY = "__pregel_checkpointer"
EFFECT_CLASSES = ("read_only", "idempotent", "non_idempotent")

_default_store: HttpCheckpointStore | None = None
_store_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_store_locks_guard = threading.Lock()


class EffectNotConfigured(RuntimeError):
    """``@recorded_effect`` cannot tell where to record: no store (neither ``store=`` nor
    ``set_default_store``), or no run (not inside a LangGraph node and no ``run_id=``).
    Raised before anything is written or called."""


def set_default_store(store: HttpCheckpointStore | None) -> None:
    """Set (or clear, with ``None``) the store every ``@recorded_effect`` without its own
    ``store=`` uses: an ``HttpCheckpointStore`` of the app's tenant with a writer token.
    The store may be shared by threads (LangGraph runs parallel tasks in a pool): each
    request to it holds a per-store lock, the external call runs outside the lock."""
    global _default_store
    _default_store = store


def default_store() -> HttpCheckpointStore | None:
    """The store set by ``set_default_store``, or ``None``."""
    return _default_store


def _lock_of(store: HttpCheckpointStore) -> threading.Lock:
    with _store_locks_guard:
        lock = _store_locks.get(store)
        if lock is None:
            lock = _store_locks[store] = threading.Lock()
        return lock


class _SharedStore:
    """``store`` as ``perform_effect`` drives it when threads share it: each HTTP request
    holds the store's lock (it keeps one connection), the decorated function's call and
    the pauses between retries run outside it. Everything else is the store's own."""

    def __init__(self, store: HttpCheckpointStore):
        self.store = store
        self.lock = _lock_of(store)

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def _drive(self, op) -> Any:
        steps = Steps(op)
        for step in steps:
            try:
                if isinstance(step, Call):
                    with self.lock:
                        steps.reply = self.store._do(step)
                else:
                    steps.reply = self.store._do(step)
            except Exception as exc:  # handed to op, which raises what it does not handle
                steps.error = exc
        return steps.value


def _langgraph_config() -> dict | None:
    """The running node's config, or ``None`` outside a LangGraph node (or without
    LangGraph installed)."""
    try:
        # Imported only here: langgraph is an optional extra, and only a call inside a
        # graph has a config to read.
        from langgraph.config import get_config
    except ImportError:
        return None
    try:
        return get_config()
    except RuntimeError:
        return None


def _saver_token(configurable: dict, thread_id: Any) -> int | None:
    """The fencing token the invocation's saver sends for ``thread_id``
    (``RecoverySaver.fencing_token``), or ``None`` (another saver, or no lease yet)."""
    saver = configurable.get(CHECKPOINTER_CONFIG_KEY)
    getter = getattr(saver, "fencing_token", None)
    if not callable(getter) or not isinstance(thread_id, str):
        return None
    token = getter(thread_id)
    return token if type(token) is int else None


def recorded_effect(
    *,
    service: str,
    key: str | Callable[..., str],
    effect_class: str = "non_idempotent",
    store: HttpCheckpointStore | None = None,
    request: Callable[..., Any] | None = None,
    run_id: str | uuid.UUID | Callable[..., Any] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorate a function with one external side effect so each call is one recorded
    effect (module docstring: states, errors, replay).

    - ``service``: the service's name (<= 200 chars), as the reconciler is configured
      for it (``payments``).
    - ``key``: the operation key (<= 512 chars), also sent as the idempotency key: a
      callable taking the call's arguments as keywords
      (``lambda order_id, **_: f"refund:{order_id}"``), or a format string over them
      (``"refund:{order_id}"``). The same logical operation must give the same key on a
      resume, so build it from the arguments, never from time or randomness.
    - ``effect_class``: ``non_idempotent`` (default), ``idempotent`` (the request is then
      also stored, encrypted, for the replay reconciler) or ``read_only``.
    - ``store``: an ``HttpCheckpointStore``; default: ``set_default_store``'s.
    - ``request``: what the request fingerprint is computed over (a callable of the
      arguments as keywords, returning JSON); default: the arguments themselves, which
      must then be JSON. A resume with other arguments under the same key is refused
      (422 ``idempotency_key_reuse``) before anything is called.
    - ``run_id``: the recovery run the effect belongs to (a UUID, or a callable of the
      arguments); default: the run of the LangGraph thread the call runs in
      (``thread_run_id(configurable.thread_id)`` from ``langgraph.config.get_config()``).

    The function receives the operation key in its ``idempotency_key`` parameter if it
    has one (a caller must not pass it); it returns the receipt, a JSON object. ``async
    def`` functions are supported (the store calls run in a worker thread). When the
    call runs inside a LangGraph node whose checkpointer offers ``fencing_token(thread_id)``
    (``RecoverySaver`` with a lease), effect writes carry that token; when the
    invocation's ``configurable`` has ``recovery_effect_retry: True`` (its resume claim
    consumed an approved retry), ``unknown``/``not_executed`` effects are re-planned.

    Raises at decoration ``ValueError`` (bad ``service``/``effect_class``/``key``), at
    call time ``EffectNotConfigured`` and ``TypeError`` (arguments that do not bind, are
    not JSON, or a key that is not a non-empty string) before any write, then
    ``EffectInDoubt``, ``EffectFailed``, ``CheckpointError`` or the function's own error.
    """
    # Long on purpose: a decorator factory; its length is ``decorate``, the closure the
    # sync and async wrappers share.
    if not isinstance(service, str) or not service:
        raise ValueError("service: a non-empty string")
    if effect_class not in EFFECT_CLASSES:
        raise ValueError(f"effect_class: one of {', '.join(EFFECT_CLASSES)}")
    if not (callable(key) or (isinstance(key, str) and key)):
        raise ValueError("key: a callable of the arguments or a non-empty format string")

    def decorate(fn: Callable) -> Callable:
        # Long on purpose: the sync and async wrappers share one closure (the store, the
        # key format, the per-request lock).
        signature = inspect.signature(fn)
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        takes_key = KEY_PARAMETER in signature.parameters

        def prepare(args: tuple, kwargs: dict) -> dict:
            """Everything ``perform_effect`` needs, checked before any write."""
            if takes_key and KEY_PARAMETER in kwargs:
                raise TypeError(f"{name}: {KEY_PARAMETER} is given by "
                                f"@recorded_effect, not by the caller")
            bound = signature.bind(*args, **kwargs, **({KEY_PARAMETER: ""} if takes_key else {}))
            bound.apply_defaults()
            arguments = {k: v for k, v in bound.arguments.items() if k != KEY_PARAMETER}
            try:
                operation_key = key(**arguments) if callable(key) else key.format(**arguments)
            except (KeyError, IndexError) as exc:
                raise TypeError(f"{name}: the key {key!r} names {exc}, which is not an "
                                f"argument") from None
            if not isinstance(operation_key, str) or not operation_key:
                raise TypeError(f"{name}: the key must be a non-empty string, "
                                f"not {operation_key!r}")
            body = request(**arguments) if request is not None else arguments
            try:
                json.dumps(body, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{name}: the request fingerprinted is not JSON "
                                f"({exc}); pass request= to choose what identifies the "
                                f"call") from None
            target = _default_store if store is None else store
            if target is None:
                raise EffectNotConfigured("no store: pass store= or call "
                                          "effects.set_default_store(...) first")
            config = _langgraph_config() or {}
            configurable = config.get("configurable") or {}
            thread_id = configurable.get("thread_id")
            if run_id is not None:
                run = run_id(**arguments) if callable(run_id) else run_id
            elif thread_id is not None:
                thread_id = str(thread_id)  # as RecoverySaver and LangGraph's savers do
                run = thread_run_id(thread_id)
            else:
                raise EffectNotConfigured(f"{name}: no run: call it inside a "
                                          f"LangGraph node (configurable.thread_id) or pass "
                                          f"run_id=")
            return {
                "store": _SharedStore(target),
                "fencing_token": _saver_token(configurable, thread_id),
                "run_id": str(uuid.UUID(str(run))),
                "service": service,
                "operation_key": operation_key,
                "effect_class": effect_class,
                "request": body,
                "retry": configurable.get(RETRY_CONFIG_KEY) is True,
                "bound": bound,
            }

        def receipt_of(result: Any) -> dict:
            if not isinstance(result, dict):
                raise TypeError(f"{name} returned {type(result).__name__}, not a "
                                f"JSON object: the call happened but has no receipt to record "
                                f"(the effect stays submitted, in doubt)")
            return result

        def arguments_for(bound: inspect.BoundArguments, operation_key: str):
            if takes_key:
                bound.arguments[KEY_PARAMETER] = operation_key
            return bound.args, bound.kwargs

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                spec = prepare(args, kwargs)
                bound = spec.pop("bound")
                loop = asyncio.get_running_loop()

                def call(operation_key: str) -> dict:
                    a, k = arguments_for(bound, operation_key)
                    result = asyncio.run_coroutine_threadsafe(fn(*a, **k), loop).result()
                    return receipt_of(result)

                return await asyncio.to_thread(perform_effect, call=call, **spec)

            wrapper = async_wrapper
        else:
            @functools.wraps(fn)
            def sync_wrapper(*args, **kwargs):
                spec = prepare(args, kwargs)
                bound = spec.pop("bound")

                def call(operation_key: str) -> dict:
                    a, k = arguments_for(bound, operation_key)
                    return receipt_of(fn(*a, **k))

                return perform_effect(call=call, **spec)

            wrapper = sync_wrapper

        if takes_key:
            # Tools built over the wrapper (LangChain's @tool) must not ask for the key.
            wrapper.__signature__ = signature.replace(parameters=[
                p for name, p in signature.parameters.items() if name != KEY_PARAMETER])
        wrapper.recorded_effect = {"service": service, "effect_class": effect_class}
        return wrapper

    return decorate
