"""A kept-alive connection survives a request whose body was not read (issue 17, item 3;
CONTRACT.md section 6: "the connection serves the next request").

A request refused before its body is read (413 over ``RECOVERY_MAX_BODY_BYTES``, 411 for
``Transfer-Encoding``, 401 without a token, 404, a 429 from a middleware ...) leaves its
body on the socket. Left there, it is read as the next request (garbage, or a "remote end
closed connection without response" for the client's next request), and gunicorn drains
only 64 KiB of it before it silently closes a connection it announced as kept alive.

``DrainBodyMiddleware`` wraps the WSGI application (``recovery/wsgi.py``). When the
application starts its answer, the rest of the body is read and discarded, up to
``RECOVERY_DRAIN_MAX_BYTES`` bytes and ``RECOVERY_DRAIN_SECONDS`` seconds; a body that is
larger (by its ``Content-Length``, or a chunked body that has not ended by then), that
stalls, or that the server cannot read (Django's development server cannot decode
``Transfer-Encoding: chunked``) is not drained: the answer then says ``Connection:
close`` and the server closes the connection after it, so the client opens a new one.
The two servers this project documents are told to close in their own way (gunicorn:
``Response.force_close``; Django's ``runserver``: its handler's ``close_connection``);
the WSGI specification gives an application no portable way to ask for it. (``runserver``
itself still reads a ``Content-Length`` body to its end before it closes: a development
server.)
"""

from __future__ import annotations

import logging
import socket
import time

from django.conf import settings

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024


class _CountingInput:
    """``wsgi.input`` counting the bytes the application read (so the drain never reads
    past ``Content-Length`` on a server whose input is the raw socket)."""

    def __init__(self, stream):
        self._stream = stream
        self.read_bytes = 0

    def read(self, *args):
        data = self._stream.read(*args)
        self.read_bytes += len(data)
        return data

    def readline(self, *args):
        line = self._stream.readline(*args)
        self.read_bytes += len(line)
        return line

    def readlines(self, *args):
        lines = self._stream.readlines(*args)
        self.read_bytes += sum(len(line) for line in lines)
        return lines

    def __iter__(self):
        for line in self._stream:
            self.read_bytes += len(line)
            yield line


def _declared_length(environ) -> int | None:
    value = (environ.get("CONTENT_LENGTH") or "").strip()
    return int(value) if value.isdigit() else None


def drain(environ, stream: _CountingInput, *, max_bytes: int, seconds: float,
          can_read_chunked: bool = True) -> bool:
    """Read and discard what is left of the request body; ``True`` when all of it was
    read (the connection may serve the next request), ``False`` when it was not (over
    ``max_bytes``, still arriving after ``seconds``, unreadable, or the client went away):
    the connection must then close. Never raises."""
    chunked = bool(environ.get("HTTP_TRANSFER_ENCODING"))
    declared = _declared_length(environ)
    if chunked:
        if not can_read_chunked:
            return False
        left = None  # until the server reports the end of the chunked body
    elif declared is None:
        return True  # no body (a request without Content-Length has none)
    else:
        left = declared - stream.read_bytes
        if left <= 0:
            return True
        if left > max_bytes:
            return False
    sock = environ.get("gunicorn.socket")
    prior = sock.gettimeout() if isinstance(sock, socket.socket) else None
    deadline = time.monotonic() + seconds
    drained = 0
    try:
        while left is None or left > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if isinstance(sock, socket.socket):
                sock.settimeout(remaining)
            data = stream.read(_CHUNK if left is None else min(_CHUNK, left))
            if not data:
                return left is None  # a chunked body ended; a short one did not
            drained += len(data)
            if left is not None:
                left -= len(data)
            elif drained > max_bytes:
                return False
        return True
    except Exception as exc:  # noqa: BLE001 - a client gone, a bad chunk, a timeout: close
        log.info("request body not drained (%s): closing the connection", type(exc).__name__)
        return False
    finally:
        if isinstance(sock, socket.socket):
            try:
                sock.settimeout(prior)
            except OSError:
                pass


def _close_after(start_response) -> None:
    """Tell the server to answer ``Connection: close`` and close after this answer."""
    server_response = getattr(start_response, "__self__", None)
    if hasattr(server_response, "force_close"):  # gunicorn's http.wsgi.Response
        server_response.force_close()
        return
    handler = getattr(server_response, "request_handler", None)
    if handler is not None:  # Django's runserver (wsgiref's ServerHandler)
        handler.close_connection = True
        server_response.headers["Connection"] = "close"


def _server_reads_chunked(start_response) -> bool:
    # wsgiref (runserver) hands the application an empty input for a chunked body.
    return getattr(getattr(start_response, "__self__", None), "request_handler", None) is None


class DrainBodyMiddleware:
    """WSGI middleware: drain the unread request body when the answer starts, or close
    the connection after the answer when it cannot be drained (module docstring)."""

    def __init__(self, application, *, max_bytes: int | None = None,
                 seconds: float | None = None):
        self.application = application
        self._max_bytes = max_bytes
        self._seconds = seconds

    def _limits(self) -> tuple[int, float]:
        return (self._max_bytes if self._max_bytes is not None
                else settings.RECOVERY_DRAIN_MAX_BYTES,
                self._seconds if self._seconds is not None
                else settings.RECOVERY_DRAIN_SECONDS)

    def __call__(self, environ, start_response):
        stream = _CountingInput(environ["wsgi.input"])
        environ["wsgi.input"] = stream

        def starting(status, headers, exc_info=None):
            write = start_response(status, headers, exc_info)
            max_bytes, seconds = self._limits()
            if not drain(environ, stream, max_bytes=max_bytes, seconds=seconds,
                         can_read_chunked=_server_reads_chunked(start_response)):
                _close_after(start_response)
            return write

        return self.application(environ, starting)
