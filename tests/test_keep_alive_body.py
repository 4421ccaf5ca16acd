"""A kept-alive connection serves the next request after a body the application did not
read (issue 17, item 3; CONTRACT.md section 6; checkpoints/ops/keepalive.py).

Against a real gunicorn (gunicorn.conf.py, the production server) and Django's
``runserver``, each started on a free port of 127.0.0.1 over a throwaway SQLite database,
with a raw socket: a checkpoint PUT over the body limit is answered 413, then a second
request on the same socket gets its own answer. A body over the drain bound (or a chunked
one on ``runserver``, which cannot read chunked bodies) is answered with ``Connection:
close`` and the socket is closed after the answer: never a garbled next answer."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "keep-alive-test-pw-4411"
LIMIT = 1024 * 1024  # RECOVERY_MAX_BODY_BYTES below
DRAIN = 4 * 1024 * 1024  # RECOVERY_DRAIN_MAX_BYTES below


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _manage(env, *args, stdin=None) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


# Its servers run on their own SQLite file whichever pass runs this module: make test runs
# it once (the `once` mark).
pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """``(environment, token)`` of a migrated SQLite database with tenant acme."""
    var = tmp_path_factory.mktemp("keepalive")
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update({"RECOVERY_VAR_DIR": str(var), "RECOVERY_MAX_BODY_BYTES": str(LIMIT),
                "RECOVERY_DRAIN_MAX_BYTES": str(DRAIN), "WEB_CONCURRENCY": "1",
                "GUNICORN_THREADS": "2", "PYTHONWARNINGS": "ignore"})
    _manage(env, "migrate", "--noinput", "-v0")
    _manage(env, "create_tenant", "acme", "--name", "Acme")
    _manage(env, "create_account", "wendy", "--password-stdin", stdin=PASSWORD + "\n")
    _manage(env, "grant", "wendy", "writer", "acme")
    token = _manage(env, "issue_token", "wendy").strip().splitlines()[-1].strip()
    return env, token


@pytest.fixture(scope="module", params=["gunicorn", "runserver"])
def server(request, world, tmp_path_factory):
    """``(port, server name, token)`` of a started server."""
    env, token = world
    port = _free_port()
    if request.param == "gunicorn":
        command = [sys.executable, "-m", "gunicorn", "recovery.wsgi",
                   "--bind", f"127.0.0.1:{port}"]
    else:
        command = [sys.executable, "manage.py", "runserver", "--noreload",
                   f"127.0.0.1:{port}"]
    log_path = tmp_path_factory.mktemp("log") / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{request.param} did not start:\n"
                                f"{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
        yield port, request.param, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _put_head(token: str, framing: str) -> bytes:
    return (f"PUT /api/v1/tenants/acme/checkpoints/{uuid.uuid4()} HTTP/1.1\r\n"
            f"Host: localhost\r\nAuthorization: Bearer {token}\r\nIf-None-Match: *\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n\r\n").encode()


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _read_answer(sock: socket.socket, buffered: bytes = b"") -> tuple[int, dict, bytes, bytes]:
    """One answer off the socket: ``(status, headers, body, bytes after it)``."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data[:200]!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside an answer"
        rest += chunk
    return status, headers, rest[:length], rest[length:]


def _closed(sock: socket.socket, buffered: bytes) -> bool:
    """The server closed the socket (nothing more than EOF or a reset follows)."""
    assert buffered == b""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=15)


def _send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` on a thread (a server that stops reading may close the socket on
    the sender while this thread reads its answer); errors of the sender are expected."""

    def send():
        with contextlib.suppress(OSError):
            sock.sendall(data)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("size", [LIMIT + 1, 3 * LIMIT])
def test_after_a_413_the_connection_serves_the_next_request(server, size):
    port, _, token = server
    with _connect(port) as sock:
        sock.sendall(_put_head(token, f"Content-Length: {size}") + b"x" * size)
        status, headers, body, rest = _read_answer(sock)
        assert status == 413, body
        assert b"payload_too_large" in body
        assert headers.get("connection", "keep-alive").lower() != "close"
        sock.sendall(HEALTHZ)
        status, _, body, rest = _read_answer(sock, rest)
        assert (status, body) == (200, b'{"status": "ok"}')
        assert rest == b""


def test_an_unread_body_of_a_401_does_not_become_the_next_request(server):
    port, _, _ = server
    body = b'GET /healthz HTTP/1.1\r\nHost: evil\r\n\r\n' * 2000  # a smuggled "request"
    with _connect(port) as sock:
        sock.sendall(f"PUT /api/v1/tenants/acme/checkpoints/{uuid.uuid4()} HTTP/1.1\r\n"
                     f"Host: localhost\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        status, _, _, rest = _read_answer(sock)
        assert status == 401
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, _, answer, rest = _read_answer(sock, rest)
        assert status == 200 and b'"checks"' in answer  # /readyz's, not a smuggled /healthz
        assert rest == b""


def test_a_body_over_the_drain_bound_is_answered_with_connection_close(server):
    port, _, token = server
    with _connect(port) as sock:
        _send_in_background(sock, _put_head(token, f"Content-Length: {DRAIN + 1}")
                            + b"x" * (DRAIN + 1))
        status, headers, body, rest = _read_answer(sock)
        assert status == 413, body
        assert headers["connection"].lower() == "close"
        assert _closed(sock, rest)


def _chunked(size: int) -> bytes:
    piece = 64 * 1024
    out = b"".join(f"{piece:x}\r\n".encode() + b"x" * piece + b"\r\n"
                   for _ in range(size // piece))
    return out + b"0\r\n\r\n"


def test_a_chunked_body_is_drained_or_the_connection_closed(server):
    port, name, token = server
    with _connect(port) as sock:
        sock.sendall(_put_head(token, "Transfer-Encoding: chunked") + _chunked(2 * LIMIT))
        status, headers, body, rest = _read_answer(sock)
        assert status == 411, body  # the API takes Content-Length only (CONTRACT.md 6)
        if name == "runserver":  # cannot decode a chunked body: closes instead
            assert headers["connection"].lower() == "close"
            assert _closed(sock, rest)
            return
        assert headers.get("connection", "keep-alive").lower() != "close"
        sock.sendall(HEALTHZ)
        status, _, body, rest = _read_answer(sock, rest)
        assert (status, body) == (200, b'{"status": "ok"}')


def test_a_chunked_body_over_the_drain_bound_closes_the_connection(server):
    port, name, token = server
    with _connect(port) as sock:
        head = _put_head(token, "Transfer-Encoding: chunked")
        _send_in_background(sock, head + _chunked(DRAIN + 65536)[:-5])  # no end in sight
        status, headers, body, rest = _read_answer(sock)
        assert status == 411, body
        assert headers["connection"].lower() == "close"
        assert _closed(sock, rest)
