"""An outbound POST that is safe to aim at a URL a tenant typed (issue 21, item 4;
docs/notifications.md "Outbound requests"): the notification sender's only way out.

- The host is resolved ONCE; every address it resolves to must be public (not loopback,
  link-local such as 169.254.169.254, private RFC 1918 / fc00::/7, unspecified,
  multicast, reserved, shared 100.64/10, nor an IPv4-mapped or 6to4 IPv6 form of those), unless
  the operator allows it (``allow_private``, or ``allow_cidrs``: networks let through).
- The connection goes to that resolved address (no second look-up: DNS rebinding), with
  the name in the ``Host`` header and as the TLS server name (certificate checked
  against it). Proxies from the environment are ignored (they would resolve again).
- Redirects are never followed: a 3xx is a failure naming where it pointed (host only).
- One timeout for the whole exchange: a response that is not complete within
  ``timeout_s`` is a failure; at most ``max_bytes`` of the body are read, the first
  ``head_chars`` characters kept.

Pure (no Django): the caller passes the operator's settings. An error never holds the
URL's path or query (a Slack or Teams URL's path is its secret), only its host.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore
import httpx

MAX_BYTES = 64 * 1024
HEAD_CHARS = 512
SCHEMES = ("http", "https")


@dataclass(frozen=True)
class Result:
    """One POST's outcome: ``status`` (None: no response), ``latency_ms`` (send to last
    byte read, or to the failure), ``head`` (the body's first characters, decoded
    leniently), ``error`` ("" when a response came in time; else why, without the URL's
    path). ``ok``: a 2xx within the timeout."""

    status: int | None
    latency_ms: int
    head: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.error


class Refused(Exception):
    """The URL may not be called (scheme, host, or an address the operator did not
    allow); the message names the host, never the path."""


def address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why ``ip`` is not a public unicast address ("" when it is): ``loopback``,
    ``link-local``, ``private``, ``unspecified``, ``multicast``, ``reserved`` or ``not
    global``. An IPv4-mapped IPv6 address is judged as the IPv4 address it maps, a 6to4
    one (2002::/16) as the IPv4 address it embeds."""
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip.sixtofour or ip
    for word, bad in (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                      ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                      ("private", ip.is_private), ("reserved", ip.is_reserved)):
        if bad:
            return word
    return "" if ip.is_global else "not global"


def _allowed(ip, allow_private: bool, allow_cidrs) -> bool:
    if allow_private:
        return True
    plain = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
    return any(plain in net or ip in net for net in allow_cidrs)


def resolve(host: str, port: int, *, allow_private: bool = False,
            allow_cidrs: tuple = ()) -> str:
    """The one address to connect to for ``host``: resolved once (``getaddrinfo``);
    every address must be public or allowed (``allow_private``; ``allow_cidrs``: a tuple
    of ``ipaddress`` networks). Raises ``Refused`` naming the host, the address and why."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise Refused(f"cannot resolve {host[:100]}: {exc}") from None
    addresses = []
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        problem = address_problem(ip)
        if problem and not _allowed(ip, allow_private, allow_cidrs):
            raise Refused(f"{host[:100]} resolves to {ip} ({problem}); the operator does "
                          "not allow such addresses (RECOVERY_NOTIFY_ALLOW_PRIVATE)")
        addresses.append(ip)
    if not addresses:
        raise Refused(f"cannot resolve {host[:100]}: no address")
    return str(addresses[0])


def split(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path?query)`` of an absolute http(s) URL. Raises
    ``Refused``: another scheme, no host, user info, a bad port."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Refused("not a valid URL") from None
    if parts.scheme not in SCHEMES:
        raise Refused("only http and https URLs")
    if not parts.hostname:
        raise Refused("the URL has no host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise Refused("the URL must not carry a user name or password")
    if port == 0:  # "h.example.com:0" was sent to 443 while it read port 0 (stop 34)
        raise Refused("port 0 is no port to send to (1 to 65535)")
    port = port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, target


class _Deadline(httpcore.NetworkBackend):
    """The network under one deadline (``time.monotonic()`` value): every connect, read
    and write may wait only what is left of it, so the exchange as a whole ends in time
    (httpx's timeouts are per operation: a receiver dripping its headers a byte at a
    time, each within the timeout, would hold the sender for as long as it liked)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.inner = httpcore.SyncBackend()

    def left(self, timeout: float | None) -> float:
        """Seconds the next operation may wait; raises ``httpcore.ReadTimeout`` when the
        deadline has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout("the exchange's deadline passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host, port, timeout=None, local_address=None,
                    socket_options=None):
        return _DeadlineStream(self.inner.connect_tcp(host, port, self.left(timeout),
                                                      local_address, socket_options), self)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.ConnectError("no unix sockets")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(min(seconds, self.left(None)))


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner, backend: _Deadline):
        self.inner, self.backend = inner, backend

    def read(self, max_bytes, timeout=None):
        return self.inner.read(max_bytes, self.backend.left(timeout))

    def write(self, buffer, timeout=None):
        self.inner.write(buffer, self.backend.left(timeout))

    def close(self):
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _DeadlineStream(self.inner.start_tls(ssl_context, server_hostname,
                                                    self.backend.left(timeout)), self.backend)

    def get_extra_info(self, info):
        return self.inner.get_extra_info(info)


def _transport(deadline: float, verify) -> httpx.HTTPTransport:
    """httpx's transport with its connection pool on the ``_Deadline`` network (httpx
    takes no network backend: its pool, ``_pool``, is replaced; it maps httpcore's
    errors to its own as for its own pool)."""
    transport = httpx.HTTPTransport(verify=verify, trust_env=False)
    context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(
        verify=verify)
    transport._pool = httpcore.ConnectionPool(ssl_context=context, max_connections=1,
                                              network_backend=_Deadline(deadline))
    return transport


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context per process (building one loads the CA bundle: tens of
    milliseconds, once instead of per request)."""
    return httpx.create_ssl_context()


def post(url: str, *, body: bytes, headers: dict[str, str], timeout_s: float = 10.0,
         allow_private: bool = False, allow_cidrs: tuple = (), max_bytes: int = MAX_BYTES,
         head_chars: int = HEAD_CHARS, verify=None) -> Result:
    """POST ``body`` with ``headers`` to ``url`` under the rules of this module. Never
    raises for a network failure: the ``Result`` says what happened (``Refused`` too,
    with latency 0). ``verify``: httpx's TLS verification (None: certifi's CAs, the
    certificate checked against the URL's host name)."""
    started = time.monotonic()

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        scheme, host, port, target = split(url)
        ip = resolve(host, port, allow_private=allow_private, allow_cidrs=allow_cidrs)
    except Refused as exc:
        return Result(None, 0, error=f"refused: {exc}")
    literal = f"[{ip}]" if ":" in ip else ip
    default = port == (443 if scheme == "https" else 80)
    host_header = (f"[{host}]" if ":" in host else host) + ("" if default else f":{port}")
    pinned = f"{scheme}://{literal}:{port}{target}"
    send = {**headers, "Host": host_header}
    extensions = {"sni_hostname": host} if scheme == "https" else {}
    timeout = httpx.Timeout(timeout_s)
    try:
        transport = _transport(started + timeout_s, _tls() if verify is None else verify)
        with httpx.Client(follow_redirects=False, trust_env=False, timeout=timeout,
                          transport=transport) as client, \
                client.stream("POST", pinned, content=body, headers=send,
                              extensions=extensions) as response:
            data = b""
            for chunk in response.iter_raw():
                data += chunk[:max_bytes - len(data)]
                if len(data) >= max_bytes or time.monotonic() - started > timeout_s:
                    break
            status = response.status_code
            head = data.decode("utf-8", "replace")[:head_chars].replace("\x00", "\\0")
            if time.monotonic() - started > timeout_s:
                return Result(status, elapsed_ms(), head,
                              f"timeout: no complete answer within {timeout_s:g} s")
            if 300 <= status < 400:
                where = response.headers.get("location", "")
                return Result(status, elapsed_ms(), head,
                              f"redirect to {_host_of(where)} not followed (HTTP {status})")
            if not 200 <= status < 300:
                return Result(status, elapsed_ms(), head, f"HTTP {status}")
            return Result(status, elapsed_ms(), head)
    except httpx.TimeoutException:
        return Result(None, elapsed_ms(), error=f"timeout: no answer within {timeout_s:g} s")
    except (httpx.HTTPError, OSError, ValueError) as exc:
        # An error's text may quote the request's URL: its path and query are cut out.
        words = str(exc).replace(pinned, f"{scheme}://{host}").replace(target, "/…")
        return Result(None, elapsed_ms(),
                      error=f"{type(exc).__name__}: {words[:200]} ({host[:100]})")


def _host_of(location: str) -> str:
    """Where a redirect pointed, by scheme and host only (its path may be a secret)."""
    try:
        parts = urlsplit(location)
    except ValueError:
        return "an invalid location"
    if parts.hostname:
        return f"{parts.scheme or 'http'}://{parts.hostname}"
    return "a path on the same host" if location else "nowhere"


def networks(cidrs) -> tuple:
    """The operator's allowed networks (``RECOVERY_NOTIFY_ALLOW_CIDRS``: CIDR strings) as
    ``ipaddress`` networks; a malformed entry raises ``ValueError`` naming it."""
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            raise ValueError(f"RECOVERY_NOTIFY_ALLOW_CIDRS: {cidr!r} is not a network") \
                from None
    return tuple(out)


def host_problem(host: str, *, allow_private: bool = False, allow_cidrs: tuple = ()) -> str:
    """Why a URL's host may not be called, judged without resolving it ("" when it may,
    or when only the resolution at send time can tell): an address literal that is not
    public and not allowed, or a ``localhost`` name."""
    bare = host.strip("[]").split("%", 1)[0].rstrip(".")  # "localhost." is localhost
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = ipaddress.ip_address("127.0.0.1") \
            if bare.lower() == "localhost" or bare.lower().endswith(".localhost") else None
    if ip is None:
        return ""
    problem = address_problem(ip)
    if problem and not _allowed(ip, allow_private, allow_cidrs):
        return (f"{host[:100]} is a {problem} address; the operator does not allow such "
                "addresses (RECOVERY_NOTIFY_ALLOW_PRIVATE)")
    return ""
