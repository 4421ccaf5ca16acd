"""A tiny card-charging service for the demo, honouring idempotency keys (stdlib only).

Run it with ``python -m checkpoints.demo.payments --port 8765 --db var/demo-payments.sqlite3``
or, in tests, ``PaymentService(db_path).start()`` (a thread; ``.url`` and ``.stop()``).

HTTP (JSON bodies):

- ``POST /charges`` with header ``Idempotency-Key: K`` and body
  ``{"amount_cents": int >= 0, "order_id": str, ...}``: charges once per key. The first
  request answers 201, a repeat with the same body 200 with the *same* charge; a repeat
  with another body 422 ``{"error": "idempotency_key_reuse"}``. No key: 400.
- ``POST /crm/notes`` with ``Idempotency-Key``: a CRM write for the demo agents (same
  rules). The CRM has **no** status lookup, so reconciliation answers ``unknown``.
- ``GET /operations/{K}``: 200 ``{"status": "succeeded", "charge_id", "amount_cents",
  "order_id", "idempotency_key", "created_at_ms"}`` if charge K exists, else 404
  ``{"error": "not_found"}``. This is what ``checkpoints.reconcile.HttpStatusReconciler``
  asks (``RECOVERY_RECONCILERS="payments=http://127.0.0.1:PORT/operations"``).
- ``GET /charges?order_id=X``: ``{"charges": [...]}``, for tests and the curious.

Slow provider (crash tests, and to watch a call in flight in the demo):
``--delay-before-ms N`` sleeps N ms after a ``POST`` arrived and before it commits,
``--delay-after-ms N`` between the commit and the answer
(``PaymentService(..., delay_before_ms=, delay_after_ms=)``, or set
``service.store.delay_before_s`` / ``delay_after_s`` at any time). In-process, a test can
instead hold every ``POST`` at either point until it says so: set
``store.hold_before_commit`` / ``store.hold_after_commit`` to a ``threading.Event`` and
``set()`` it to let them go (each waits at most 60 s). A client that goes away meanwhile
changes nothing: the operation still commits, the answer is dropped.
``Store.received[key]`` counts the POSTs that arrived per key (committed or not),
``Store.committed[key]`` those that found the key new and inserted it; an execution is a
row in the table, so ``charges(order_id)`` lists each charge executed exactly once.

State lives in a SQLite file (one row per key, ``UNIQUE`` key), so it survives the
workers, and this process, dying; the key's uniqueness is enforced by the database, not
by a lock in this process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    idempotency_key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    charge_id TEXT NOT NULL,
    order_id TEXT,
    amount_cents INTEGER,
    body TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
)
"""
MAX_BODY = 64 * 1024


class Store:
    """The service's state: a SQLite file with one row per idempotency key."""

    def __init__(self, path: str, delay_before_ms: int = 0, delay_after_ms: int = 0):
        self.path = path
        self.delay_before_s = delay_before_ms / 1000
        self.delay_after_s = delay_after_ms / 1000
        self.hold_before_commit: threading.Event | None = None
        self.hold_after_commit: threading.Event | None = None
        self.received: Counter = Counter()  # POSTs arrived, per idempotency key
        self.committed: Counter = Counter()  # POSTs that inserted the key (0 or 1 per key)
        self._lock = threading.Lock()
        with self._conn() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(SCHEMA)

    def count(self, counter: Counter, key: str) -> None:
        with self._lock:
            counter[key] += 1

    def _conn(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def perform(self, kind: str, key: str, body: dict) -> tuple[int, dict]:
        """Do operation ``kind`` once per ``key``. Returns (HTTP status, answer).

        201 for the first request, 200 replaying the stored answer for a repeat with the
        same body, 422 for a repeat with a different body.
        """
        request_hash = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        prefix = "ch" if kind == "charge" else "note"
        charge_id = f"{prefix}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        arguments = body.get("arguments") if isinstance(body.get("arguments"), dict) else {}
        row = {
            "status": "succeeded",
            "charge_id": charge_id,
            "amount_cents": body.get("amount_cents", arguments.get("amount_cents")),
            "order_id": body.get("order_id", arguments.get("order_id")),
            "idempotency_key": key,
            "created_at_ms": int(time.time() * 1000),
        }
        with self._conn() as conn:
            try:
                conn.execute(
                    "INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, kind, request_hash, charge_id, row["order_id"], row["amount_cents"],
                     json.dumps(row), row["created_at_ms"]),
                )
                self.count(self.committed, key)
                return 201, row
            except sqlite3.IntegrityError:
                stored_hash, stored = conn.execute(
                    "SELECT request_hash, body FROM operations WHERE idempotency_key = ?", (key,)
                ).fetchone()
        if stored_hash != request_hash:
            return 422, {"error": "idempotency_key_reuse",
                         "detail": "Idempotency-Key: already used with another request body"}
        return 200, json.loads(stored)

    def lookup(self, key: str, kind: str = "charge") -> dict | None:
        """The stored answer for ``key`` (only operations of ``kind``), or ``None``."""
        with self._conn() as conn:
            found = conn.execute(
                "SELECT body FROM operations WHERE idempotency_key = ? AND kind = ?", (key, kind)
            ).fetchone()
        return json.loads(found[0]) if found else None

    def executions(self, order_id: str, kind: str | None = None) -> int:
        """How many operations were executed for ``order_id`` (rows; a charge's or a CRM
        note's ``order_id``, the latter from its ``arguments``), of ``kind`` if given."""
        sql = "SELECT COUNT(*) FROM operations WHERE order_id = ?"
        args: tuple = (order_id,)
        if kind is not None:
            sql += " AND kind = ?"
            args = (order_id, kind)
        with self._conn() as conn:
            return conn.execute(sql, args).fetchone()[0]

    def charges(self, order_id: str | None = None) -> list[dict]:
        """Every charge (optionally of one order), oldest first."""
        sql = "SELECT body FROM operations WHERE kind = 'charge'"
        args: tuple = ()
        if order_id is not None:
            sql += " AND order_id = ?"
            args = (order_id,)
        with self._conn() as conn:
            return [json.loads(b) for (b,) in conn.execute(sql + " ORDER BY rowid", args)]


class Handler(BaseHTTPRequestHandler):
    """Routes the four endpoints described in the module docstring."""

    store: Store  # set on the subclass made by ``make_server``
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - quiet: the demo prints its own output
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client died while we worked: what is done stays done
            self.close_connection = True

    def do_GET(self):  # noqa: N802 - http.server's naming
        url = urllib.parse.urlsplit(self.path)
        if url.path.startswith("/operations/"):
            key = urllib.parse.unquote(url.path[len("/operations/"):])
            found = self.store.lookup(key)
            if found is None:
                return self._send(404, {"error": "not_found"})
            return self._send(200, found)
        if url.path == "/charges":
            order = urllib.parse.parse_qs(url.query).get("order_id", [None])[0]
            return self._send(200, {"charges": self.store.charges(order)})
        if url.path == "/health":
            return self._send(200, {"status": "ok"})
        return self._send(404, {"error": "not_found"})

    def do_POST(self):  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        kinds = {"/charges": "charge", "/crm/notes": "crm_note"}
        if path not in kinds:
            return self._send(404, {"error": "not_found"})
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self._send(400, {"error": "invalid_request", "detail": "Content-Length"})
        if length > MAX_BODY:
            return self._send(413, {"error": "too_large"})
        raw = self.rfile.read(length) if length else b""
        key = (self.headers.get("Idempotency-Key") or "").strip()
        if not key or len(key) > 512:
            return self._send(400, {"error": "invalid_request",
                                    "detail": "Idempotency-Key: required, at most 512 chars"})
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._send(400, {"error": "invalid_request", "detail": "body: not JSON"})
        if not isinstance(body, dict):
            return self._send(400, {"error": "invalid_request", "detail": "body: not an object"})
        amount = body.get("amount_cents", 0)
        if type(amount) is not int or amount < 0:
            return self._send(400, {"error": "invalid_request",
                                    "detail": "amount_cents: an integer >= 0"})
        store = self.store
        store.count(store.received, key)
        _hold(store.hold_before_commit, store.delay_before_s)
        status, answer = store.perform(kinds[path], key, body)
        _hold(store.hold_after_commit, store.delay_after_s)
        return self._send(status, answer)


def _hold(gate: threading.Event | None, delay_s: float) -> None:
    """The slow provider: wait for a test's gate (at most 60 s), then sleep ``delay_s``."""
    if gate is not None:
        gate.wait(timeout=60)
    if delay_s:
        time.sleep(delay_s)


def make_server(db_path: str, host: str = "127.0.0.1", port: int = 0, *,
                delay_before_ms: int = 0, delay_after_ms: int = 0) -> ThreadingHTTPServer:
    """An HTTP server bound to (host, port) (port 0: any free port) over ``db_path``;
    the delays are the slow provider's (module docstring)."""
    store = Store(db_path, delay_before_ms=delay_before_ms, delay_after_ms=delay_after_ms)
    handler = type("BoundHandler", (Handler,), {"store": store})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class PaymentService:
    """The service in a background thread (tests). ``url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, db_path: str, port: int = 0, *, delay_before_ms: int = 0,
                 delay_after_ms: int = 0):
        self.server = make_server(str(db_path), port=port, delay_before_ms=delay_before_ms,
                                  delay_after_ms=delay_after_ms)
        self.store: Store = self.server.RequestHandlerClass.store
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> PaymentService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="demo payment service")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", default="var/demo-payments.sqlite3")
    parser.add_argument("--delay-before-ms", type=int, default=0,
                        help="sleep this long after a POST arrives, before committing it")
    parser.add_argument("--delay-after-ms", type=int, default=0,
                        help="sleep this long after committing a POST, before answering")
    args = parser.parse_args(argv)
    server = make_server(args.db, args.host, args.port, delay_before_ms=args.delay_before_ms,
                         delay_after_ms=args.delay_after_ms)
    print(f"payments listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
