"""A webhook receiver for the demo (issue 21): the signed messages the demo's crashed runs
produced, shown as a receiver sees them (stdlib only).

Run it with ``python -m checkpoints.demo.receiver --port 8767 --log var/demo-receiver.jsonl``
and the endpoint's signing secret in ``$RECOVERY_DEMO_WEBHOOK_SECRET`` (``whsec_…``), or,
in tests, ``Receiver(log_path, secret).start()`` (a thread; ``.url`` and ``.stop()``).

- ``POST /hook``: one delivery. Its Standard Webhooks signature is checked here with
  ``hmac`` (independently of the sender's code): the ``webhook-signature`` header's
  ``v1,<base64>`` entries (several during a secret's rotation) against HMAC-SHA256 of
  ``webhook-id.webhook-timestamp.body`` keyed with the secret's base64-decoded bytes.
  Each delivery is appended to the log as one JSON line (time received, the three
  headers, whether the signature verifies, the body) and answered 204; a redelivery of
  the same ``webhook-id`` is logged again and marked as a duplicate (receivers
  deduplicate on it).
- ``GET /``: an HTML page listing the deliveries, newest first, refreshed every 5 s.
- ``GET /deliveries``: the same as JSON (``{"deliveries": [...]}``).

Loopback only, for the demo: the demo's web server allows private addresses
(``RECOVERY_NOTIFY_ALLOW_PRIVATE=true``) so its sender may post here.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import html
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: A delivery's body larger than this is refused (413) and not logged.
BODY_MAX = 1024 * 1024
HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, header: str) -> bool:
    """Whether one of ``header``'s ``v1,<base64>`` signatures is HMAC-SHA256 of
    ``msg_id.timestamp.body`` under ``secret`` (``whsec_`` + base64 of the key)."""
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        return False
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


class Receiver:
    """The receiver's state: where deliveries are logged and the secret that verifies
    them; ``start()`` serves it on loopback in a thread (port 0: any free port)."""

    def __init__(self, log_path: str | Path, secret: str, *, port: int = 0):
        self.log_path = Path(log_path)
        self.secret = secret
        self.port = port
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def deliveries(self) -> list[dict]:
        """Every logged delivery, oldest first."""
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    def record(self, headers: dict[str, str], body: bytes) -> dict:
        """Verify and log one delivery; returns its log entry."""
        with self.lock:
            seen = {d["headers"].get("webhook-id") for d in self.deliveries()}
            entry = {
                "received_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "headers": headers,
                "verified": verify(self.secret, headers.get("webhook-id", ""),
                                   headers.get("webhook-timestamp", ""), body,
                                   headers.get("webhook-signature", "")),
                "duplicate": headers.get("webhook-id") in seen,
                "body": body.decode("utf-8", "replace"),
            }
            with self.log_path.open("a") as log:
                log.write(json.dumps(entry) + "\n")
        return entry

    def page(self) -> str:
        rows = []
        for d in reversed(self.deliveries()):
            try:
                body = json.loads(d["body"])
                shown = json.dumps(body, indent=2)
                kind = body.get("type", "?")
            except ValueError:
                shown, kind = d["body"], "?"
            mark = "signature verified" if d["verified"] else "SIGNATURE DOES NOT VERIFY"
            rows.append(
                f"<section><h2>{html.escape(kind)} · {html.escape(d['received_at'])} · "
                f"<span class={'ok' if d['verified'] else 'bad'}>{mark}</span>"
                f"{' · duplicate (same webhook-id)' if d['duplicate'] else ''}</h2>"
                f"<pre>{html.escape(chr(10).join(f'{k}: {v}' for k, v in d['headers'].items()))}"
                f"</pre><pre>{html.escape(shown)}</pre></section>")
        return ("<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=5>"
                "<title>Demo webhook receiver</title><style>body{font:14px sans-serif;"
                "margin:2em}pre{background:#f4f4f4;padding:.5em;overflow:auto}"
                ".ok{color:#070}.bad{color:#b00}</style>"
                f"<h1>Demo webhook receiver: {len(rows)} deliveries</h1>"
                + ("".join(rows) or "<p>Nothing received yet: crashed runs are told once "
                   "their incident's window has passed.</p>"))

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # the log file says what arrived
                pass

            def _answer(self, status: int, body: bytes = b"", ctype: str = "text/plain"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != "/hook":
                    return self._answer(404)
                if length > BODY_MAX:
                    return self._answer(413)
                body = self.rfile.read(length)
                receiver.record({h: self.headers.get(h, "") for h in HEADERS}, body)
                return self._answer(204)

            def do_GET(self):  # noqa: N802
                if self.path == "/deliveries":
                    return self._answer(200, json.dumps(
                        {"deliveries": receiver.deliveries()}).encode(), "application/json")
                if self.path == "/":
                    return self._answer(200, receiver.page().encode(),
                                        "text/html; charset=utf-8")
                return self._answer(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True, help="JSON Lines file of the deliveries")
    args = parser.parse_args()
    secret = os.environ.get("RECOVERY_DEMO_WEBHOOK_SECRET", "")
    receiver = Receiver(args.log, secret, port=args.port).start()
    print(f"demo webhook receiver on {receiver.url}/hook, page {receiver.url}/", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        receiver.stop()


if __name__ == "__main__":
    main()
