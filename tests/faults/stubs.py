"""Test doubles for the reconciliation fault tests (issue 5).

- ``StatusStub``: a real HTTP status service on 127.0.0.1 (stdlib server in a thread) that
  answers ``GET /operations/<key>`` with whatever a test stored for the key (status and
  raw bytes), can hold a look-up on a gate (a slow provider), and records every look-up.
- Reconciler plugins, loaded by dotted path through ``ReconcilerConfig`` rows, that raise,
  hang past their timeout or return garbage.
- ``use_plugin``: point a tenant's service at a plugin; ``broker_at``: publish elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from django.test import override_settings

from checkpoints import reconcile
from checkpoints.models import ReconcilerConfig

HOLD_LIMIT_S = 30  # a held look-up never waits longer than this, whatever the test does


class StatusStub:
    """``GET /operations/<key>``: the stored ``(status, body bytes)`` for the key, else 404.

    ``hold(key)`` makes the next look-ups of ``key`` wait until ``release(key)`` (bounded);
    ``entered(key)`` is an event set when such a look-up arrived. ``seen`` lists every key
    looked up, in order.
    """

    def __init__(self):
        self.answers: dict[str, tuple[int, bytes]] = {}
        self.seen: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.arrived: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                prefix = "/operations/"
                key = unquote(self.path[len(prefix):]) if self.path.startswith(prefix) else ""
                with stub._lock:
                    stub.seen.append(key)
                    gate = stub.gates.get(key)
                    arrived = stub.arrived.setdefault(key, threading.Event())
                arrived.set()
                if gate is not None:
                    gate.wait(HOLD_LIMIT_S)
                status, body = stub.answers.get(key, (404, b'{"error": "not_found"}'))
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the reconciler read what it wanted (or its process died)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/operations"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> StatusStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        for gate in self.gates.values():
            gate.set()
        self.server.shutdown()
        self.server.server_close()

    def answer(self, key: str, body: bytes | str, status: int = 200) -> None:
        self.answers[key] = (status, body.encode() if isinstance(body, str) else body)

    def hold(self, key: str) -> None:
        with self._lock:
            self.gates[key] = threading.Event()
            self.arrived[key] = threading.Event()

    def release(self, key: str) -> None:
        self.gates.pop(key).set()

    def entered(self, key: str) -> threading.Event:
        with self._lock:
            return self.arrived.setdefault(key, threading.Event())

    def looked_up(self, key: str) -> int:
        return self.seen.count(key)


def use_plugin(tenant, service: str, plugin: str, *, url: str = "", timeout_s: int = 5,
               settle_delay_s: int | None = None) -> None:
    """The tenant's reconciler for ``service`` (test set-up of configuration)."""
    ReconcilerConfig.objects.update_or_create(
        tenant=tenant, service=service,
        defaults={"plugin": plugin, "url": url, "timeout_s": timeout_s,
                  "settle_delay_s": settle_delay_s})


# --------------------------------------------------------------------------------------
# Misbehaving plugins (dotted paths: tests.faults.stubs.<Class>)
# --------------------------------------------------------------------------------------

class RaisingPlugin:
    """A plugin whose look-up raises, with a message no database would store as is."""

    name = "raising"

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    def lookup(self, effect):
        raise RuntimeError("provider SDK exploded \x00 \ud800 " + "x" * 5000)


HANG = threading.Event()  # set by the test's teardown, so a hung look-up thread ends


class HangingPlugin:
    """A plugin whose look-up never answers within its timeout."""

    name = "hanging"

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    def lookup(self, effect):
        HANG.wait(HOLD_LIMIT_S)
        return reconcile.Answer.found({"status": "succeeded", "late": True})


class _Unprintable:
    def __str__(self):
        raise ValueError("no text for you")


class _Exploding(reconcile.Answer):
    """An Answer whose receipt cannot even be read."""

    def __getattribute__(self, name):
        if name == "receipt":
            raise RuntimeError("receipt property exploded")
        return super().__getattribute__(name)


# What the garbage plugin returns; the test picks one by name.
GARBAGE = {
    "none": lambda: None,
    "a_string": lambda: "found",
    "a_dict": lambda: {"kind": "found", "receipt": {"charge_id": "ch_1"}},
    "unknown_kind": lambda: reconcile.Answer("maybe"),
    "unhashable_kind": lambda: reconcile.Answer(["found"], {"charge_id": "ch_1"}),
    "receipt_not_object": lambda: reconcile.Answer("found", [1, 2, 3]),
    "receipt_nan": lambda: reconcile.Answer.found({"amount": float("nan")}),
    "receipt_inf": lambda: reconcile.Answer.found({"amount": float("inf")}),
    "receipt_nul_key": lambda: reconcile.Answer.found({"a\x00b": 1}),
    "receipt_surrogate": lambda: reconcile.Answer.found({"note": "\ud800"}),
    "receipt_set": lambda: reconcile.Answer.found({"ids": {1, 2}}),
    "receipt_deep": lambda: reconcile.Answer.found({"x": _deep(5000)}),
    "receipt_huge": lambda: reconcile.Answer.found({"pad": "x" * (2 * 1024 * 1024)}),
    "evidence_object": lambda: reconcile.Answer("cannot_tell", None, "hm", object()),
    "evidence_huge": lambda: reconcile.Answer.cannot_tell(
        "hm", evidence={"blob": "a" * (5 * 1024 * 1024)}),
    "found_evidence_huge": lambda: reconcile.Answer.found(
        {"charge_id": "ch_1"}, evidence={"blob": "a" * (5 * 1024 * 1024)}),
    "detail_unprintable": lambda: reconcile.Answer("found", {"charge_id": "ch_1"},
                                                   _Unprintable()),
    "exploding_answer": lambda: _Exploding("found", {"charge_id": "ch_1"}),
}
GARBAGE_CHOICE = {"value": "none"}


def _deep(n: int):
    value: list = []
    for _ in range(n):
        value = [value]
    return value


class GarbagePlugin:
    """A plugin that returns ``GARBAGE[GARBAGE_CHOICE["value"]]()``."""

    name = "garbage"

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    def lookup(self, effect):
        return GARBAGE[GARBAGE_CHOICE["value"]]()


class CountingPlugin:
    """Answers ``found`` for every key and counts look-ups per key (thread-safe)."""

    name = "counting"
    lookups: dict[str, int] = {}
    _lock = threading.Lock()

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    def lookup(self, effect):
        with self._lock:
            self.lookups[effect.operation_key] = self.lookups.get(effect.operation_key, 0) + 1
        return reconcile.Answer.found({"status": "succeeded", "key": effect.operation_key})


@contextlib.contextmanager
def broker_at(url: str):
    """Make this process publish to ``url`` (eager off), whatever the Celery app had
    already connected to: ``override_settings`` alone does not reconfigure the app, and
    Celery reads ``$CELERY_BROKER_URL`` before its own configuration."""
    from recovery.celery import app

    saved_conf, saved_env = app.conf.broker_url, os.environ.get("CELERY_BROKER_URL")

    def point(to, env):
        if env is None:
            os.environ.pop("CELERY_BROKER_URL", None)
        else:
            os.environ["CELERY_BROKER_URL"] = env
        app.conf.broker_url = to
        app._pool = None
        app.amqp._producer_pool = None

    point(url, url)
    try:
        with override_settings(CELERY_TASK_ALWAYS_EAGER=False):
            yield
    finally:
        point(saved_conf, saved_env)


class FakeProvider:
    """An in-memory external service for the state machine: ``executed`` counts how many
    times each operation key was really carried out (it does *not* deduplicate keys: the
    worst case), and a look-up answers as ``modes[key]`` says: ``truthful`` (found if it
    was executed, else not found), ``found``, ``not_found``, ``cannot_tell``,
    ``no_lookup``."""

    name = "fake"
    executed: dict[str, int] = {}
    modes: dict[str, str] = {}

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    @classmethod
    def reset(cls) -> None:
        cls.executed, cls.modes = {}, {}

    @classmethod
    def execute(cls, key: str) -> dict:
        cls.executed[key] = cls.executed.get(key, 0) + 1
        return {"status": "succeeded", "key": key, "n": cls.executed[key]}

    def lookup(self, effect):
        key = effect.operation_key
        mode = self.modes.get(key, "truthful")
        if mode == "truthful":
            mode = "found" if self.executed.get(key) else "not_found"
        if mode == "found":
            return reconcile.Answer.found({"status": "succeeded", "key": key})
        if mode == "not_found":
            return reconcile.Answer.not_executed("never saw the key")
        if mode == "no_lookup":
            return reconcile.Answer.no_lookup()
        return reconcile.Answer.cannot_tell("provider unavailable")
