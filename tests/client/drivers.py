"""Test helpers for both runtime clients (issue 10, client parity).

- ``Driven``: an ``AsyncHttpCheckpointStore`` whose coroutine methods are run to their
  end on one event loop (``asyncio.Runner``), so a scenario written for the sync store
  runs unchanged against the async one, with Django's ORM used between calls (no loop
  is running then).
- ``perform``: ``perform_effect`` of whichever client the store is.
- ``FakeServer``: a scripted HTTP/1.1 server on a thread that records requests and
  counts connections (retries, size check, connection reuse).
- ``Pauses``: a ``sleep`` for either store that records the pauses and waits for none.
- ``Interceptor``: wraps a store's ``_exchange`` to lose answers at chosen exchanges
  (the server acted, the client saw a network error) or to make a request land late.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from recovery_client import aclient, client


class Driven:
    """``store``'s coroutine methods as plain calls, run on ``runner``'s loop; an async
    generator (``list_runs``) comes back as a list; attributes pass through."""

    def __init__(self, store: aclient.AsyncHttpCheckpointStore, runner: asyncio.Runner):
        self.store, self.runner = store, runner

    def run(self, awaitable):
        return self.runner.run(awaitable)

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            result = attr(*args, **kwargs)
            if inspect.isasyncgen(result):
                return self.run(_collect(result))
            return self.run(result) if inspect.isawaitable(result) else result

        return call

    def close(self) -> None:
        self.run(self.store.aclose())


async def _collect(agen) -> list:
    return [item async for item in agen]


def perform(store, **kwargs):
    """``perform_effect`` of the store's client (sync, or async run to its end)."""
    if isinstance(store, Driven):
        return store.run(aclient.perform_effect(store.store, **kwargs))
    return client.perform_effect(store, **kwargs)


def real(store):
    """The store object itself (``Driven`` unwrapped)."""
    return store.store if isinstance(store, Driven) else store


class Pauses(list):
    """A ``sleep`` for either store: records each pause in seconds, waits for none (for
    the async store it returns an awaitable that is done at once)."""

    def __call__(self, seconds: float):
        self.append(seconds)
        return _NoWait()


class _NoWait:
    def __await__(self):
        return iter(())


class FakeServer:
    """Answers each request with the next ``(status, headers, body)`` of ``script``
    (``body`` a JSON value, or ``DROP``: close the connection without answering, after
    reading the request), then ``default`` for ever. ``requests`` lists ``(method,
    path, body bytes)``; ``connections`` counts the TCP connections accepted."""

    DROP = object()

    def __init__(self, script=(), default=(200, {"ETag": '"0"'}, {})):
        self.script, self.default = list(script), default
        self.requests: list[tuple[str, str, bytes]] = []
        self.connections = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def methods(self) -> list[str]:
        return [method for method, _, _ in self.requests]

    def answer(self, method: str, path: str, body: bytes):
        with self.lock:
            self.requests.append((method, path, body))
            return self.script.pop(0) if self.script else self.default

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as gunicorn and the live server

    def setup(self):
        super().setup()
        with self.server.fake.lock:
            self.server.fake.connections += 1

    def _any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, headers, answer = self.server.fake.answer(self.command, self.path, body)
        if answer is FakeServer.DROP:
            self.close_connection = True
            return
        data = b"" if answer is None else json.dumps(answer).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = _any

    def log_message(self, *args):
        pass


class Interceptor:
    """Wraps ``store._exchange`` (sync or async). ``actions`` maps the index of an
    exchange (0 = the first after wrapping) to what happens to it:

    - ``"lose"``: sent, the server acts, the answer is lost (a network error);
    - ``"drop"``: not sent now, a network error all the same (kept for ``"land"``);
    - ``"land"``: sent; then the dropped request reaches the server late (its answer
      goes nowhere), as a slow first request past the client's timeout would;
    - a function: called first (e.g. another writer's write), then sent.

    ``seen`` lists ``(method, path)`` of every exchange the store attempted."""

    def __init__(self, store, actions: dict):
        self.actions, self.seen, self.dropped = actions, [], None
        store = real(store)
        original = store._exchange
        if inspect.iscoroutinefunction(original):
            async def exchange(call):
                action = self._before(call)
                answer = await original(call)
                if action == "land":
                    await _discard(original(self.dropped))
                return self._after(action, call, answer)
        else:
            def exchange(call):
                action = self._before(call)
                answer = original(call)
                if action == "land":
                    _discard_sync(original, self.dropped)
                return self._after(action, call, answer)
        store._exchange = exchange

    def _before(self, call):
        action = self.actions.get(len(self.seen))
        self.seen.append((call.method, call.path.split("/")[0]))
        if callable(action):
            action()
        if action == "drop":
            self.dropped = call
            raise client.network_error(call, ConnectionResetError("answer lost"), sent=True)
        return action

    @staticmethod
    def _after(action, call, answer):
        if action == "lose":
            raise client.network_error(call, ConnectionResetError("answer lost"), sent=True)
        return answer


async def _discard(awaitable) -> None:
    try:
        await awaitable
    except client.CheckpointError:
        pass


def _discard_sync(exchange, call) -> None:
    try:
        exchange(call)
    except client.CheckpointError:
        pass
