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

    def __init__(self, path: str):
        self.path = path
        with self._conn() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(SCHEMA)

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
        row = {
            "status": "succeeded",
            "charge_id": charge_id,
            "amount_cents": body.get("amount_cents"),
            "order_id": body.get("order_id"),
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
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
        status, answer = self.store.perform(kinds[path], key, body)
        return self._send(status, answer)


def make_server(db_path: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server bound to (host, port) (port 0: any free port) over ``db_path``."""
    handler = type("BoundHandler", (Handler,), {"store": Store(db_path)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class PaymentService:
    """The service in a background thread (tests). ``url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, db_path: str, port: int = 0):
        self.server = make_server(str(db_path), port=port)
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
    args = parser.parse_args(argv)
    server = make_server(args.db, args.host, args.port)
    print(f"payments listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
