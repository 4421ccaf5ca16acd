"""A real HTTP receiver on loopback for the notification tests (issue 21): records each
request (headers lower-cased, body), answers a scripted status, may sleep or block.
Dedups by ``webhook-id`` as a receiver should (``ids``: the distinct ones, in order)."""

from __future__ import annotations

import http.server
import threading
import time


class Receiver:
    """``Receiver()`` starts listening on 127.0.0.1 at once; ``url``; ``seen`` (list of
    ``(headers, body)``); ``statuses``: the status of each next request (then 200);
    ``delay_s``: sleep before answering; ``block``: an Event the handler waits on;
    ``redirect_to``: answer 302 to it."""

    def __init__(self):
        self.seen: list[tuple[dict, bytes]] = []
        self.at: list[float] = []  # time.monotonic() of each arrival
        self.statuses: list[int] = []
        self.delay_s = 0.0
        self.block: threading.Event | None = None
        self.redirect_to = ""
        self.answer = b"thanks!"  # the body every POST is answered with
        self.arrived = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                receiver.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
                receiver.at.append(time.monotonic())
                receiver.arrived.set()
                if receiver.block is not None:
                    receiver.block.wait(30)
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if receiver.redirect_to:
                    status = 302
                try:
                    self.send_response(status)
                    if receiver.redirect_to:
                        self.send_header("Location", receiver.redirect_to)
                    self.send_header("Content-Length", str(len(receiver.answer)))
                    self.end_headers()
                    self.wfile.write(receiver.answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook/s3cr3t-path"

    @property
    def ids(self) -> list[str]:
        out: list[str] = []
        for headers, _ in self.seen:
            if headers.get("webhook-id") not in out:
                out.append(headers.get("webhook-id"))
        return out

    def close(self) -> None:
        if self.block is not None:
            self.block.set()
        self.server.shutdown()
        self.server.server_close()
