"""The outbound POST's SSRF rules (issue 21, item 4) and Standard Webhooks signing
checked against the independent ``standardwebhooks`` package. Pure: no database."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from checkpoints import safehttp, webhooksign

REFUSED = [
    ("http://127.0.0.1/", "loopback"),
    ("http://10.1.2.3/", "private"),
    ("http://172.16.0.9/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://[fd00::1]/", "private"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://localhost:9/", "loopback"),  # a name resolving to 127.0.0.1
    ("http://100.64.0.1/", "not global"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_private_addresses_are_refused_by_default(url, why):
    result = safehttp.post(url, body=b"{}", headers={}, timeout_s=1)
    assert not result.ok and result.status is None
    assert result.error.startswith("refused: ") and f"({why})" in result.error


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_the_operator_may_allow_them(url, why):
    host = safehttp.split(url)[1]
    assert safehttp.host_problem(host) != ""
    assert safehttp.host_problem(host, allow_private=True) == ""


def test_an_allowed_network_lets_only_it_through():
    nets = safehttp.networks(("10.20.0.0/16",))
    assert safehttp.host_problem("10.20.3.4", allow_cidrs=nets) == ""
    assert safehttp.host_problem("10.21.3.4", allow_cidrs=nets) != ""
    with pytest.raises(ValueError, match="not a network"):
        safehttp.networks(("ten",))


def test_a_public_address_passes_and_mapped_forms_are_judged_as_ipv4():
    assert safehttp.address_problem(ipaddress.ip_address("93.184.216.34")) == ""
    assert safehttp.address_problem(ipaddress.ip_address("::ffff:10.0.0.1")) == "private"


@pytest.mark.parametrize("url", ["ftp://example.com/", "https://user:pw@example.com/",
                                 "https:///nohost", "http://[::1"])
def test_bad_urls_are_refused(url):
    assert safehttp.post(url, body=b"", headers={}).error.startswith("refused: ")


def test_the_connection_goes_to_the_resolved_address_with_the_name_as_host(receiver):
    url = receiver.url.replace("127.0.0.1", "localhost")
    result = safehttp.post(url, body=b"{}", headers={}, timeout_s=2, allow_private=True)
    assert result.ok and result.head == "thanks!"
    assert receiver.seen[0][0]["host"] == f"localhost:{receiver.server.server_port}"


def test_the_response_read_is_bounded(receiver):
    result = safehttp.post(receiver.url, body=b"{}", headers={}, allow_private=True,
                           max_bytes=3, head_chars=2)
    assert result.ok and result.head == "th"


def test_signatures_verify_with_standardwebhooks():
    secret, other = webhooksign.new_secret(), webhooksign.new_secret()
    body = '{"type":"test","data":{"é":1}}'.encode()
    now = int(time.time())
    headers = webhooksign.headers([secret, other], "msg_1", now, body)
    assert headers["webhook-timestamp"] == str(now)
    assert all(s.startswith("v1,") for s in headers["webhook-signature"].split(" "))
    assert Webhook(secret).verify(body, headers) == {"type": "test", "data": {"é": 1}}
    assert Webhook(other).verify(body, headers)
    # and the library's own signature equals ours
    theirs = Webhook(secret).sign("msg_1", datetime.fromtimestamp(now, UTC), body.decode())
    assert theirs == webhooksign.signature(secret, "msg_1", now, body)
    assert webhooksign.secret_hint(secret) == f"whsec_…{secret[-4:]}"


def test_an_error_quoting_the_url_keeps_its_path_and_query_out(monkeypatch):
    """A Slack or Teams URL's path is its secret: an error whose text quotes the request's
    URL is logged by host only."""
    secret = "/services/T000/B000/XXXXsecretXXXX?token=hunter2"

    def fail(self, method, url, **kwargs):
        raise safehttp.httpx.ConnectError(f"could not reach {url}")

    monkeypatch.setattr(safehttp.httpx.Client, "stream", fail)
    monkeypatch.setattr(safehttp, "resolve", lambda *a, **k: "127.0.0.1")
    result = safehttp.post("http://hooks.example.test" + secret, body=b"{}", headers={},
                           timeout_s=1)
    assert result.status is None and result.error.startswith("ConnectError")
    assert "hooks.example.test" in result.error
    assert "XXXXsecretXXXX" not in result.error and "hunter2" not in result.error


@pytest.mark.parametrize(("url", "why"), [
    ("http://[2002:a9fe:a9fe::1]/", "link-local"),  # 6to4 of 169.254.169.254
    ("http://[2002:7f00:1::]/", "loopback"),  # 6to4 of 127.0.0.1
    ("http://[2002:0a00:0001::1]/", "private"),  # 6to4 of 10.0.0.1
])
def test_a_6to4_address_is_judged_as_the_ipv4_it_embeds(url, why):
    """Attack (issue 21, item 4): 2002::/16 carries an IPv4 address in bits 16-48; a host
    with a 6to4 route sends it there. Python calls 2002:a9fe:a9fe::1 global, so the
    metadata address passed, at creation and at send time."""
    host = safehttp.split(url)[1]
    assert why in safehttp.host_problem(host)
    result = safehttp.post(url, body=b"{}", headers={}, timeout_s=1)
    assert result.error.startswith("refused: ") and f"({why})" in result.error
    assert safehttp.address_problem(ipaddress.ip_address("2002:5db8:d822::1")) == ""


@pytest.mark.parametrize("host", ["localhost.", "LOCALHOST.", "a.localhost.", "127.0.0.1.",
                                  "169.254.169.254."])
def test_a_trailing_dot_names_the_same_host(host):
    """Attack (issue 21, item 4): ``localhost.`` (a fully qualified name) is localhost and
    ``169.254.169.254.`` the metadata address; creation refused the bare forms only."""
    assert safehttp.host_problem(host) != ""


def test_a_receiver_dripping_its_headers_is_cut_at_the_timeout():
    """Attack (issue 21, item 4): "one timeout for the whole exchange". httpx's timeout is
    per read, so a receiver sending its header one byte at a time, each within the
    timeout, held a sender thread (and the round waiting for it) for as long as it
    liked: 12 s for a 1 s timeout here, days with 64 KB of header."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def drip():
        conn, _ = server.accept()
        conn.recv(65536)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(30):
                conn.sendall(b"X")
                time.sleep(0.2)
            conn.sendall(b": y\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass
        finally:
            conn.close()

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    started = time.monotonic()
    result = safehttp.post(f"http://127.0.0.1:{server.getsockname()[1]}/", body=b"{}",
                           headers={}, timeout_s=1, allow_private=True)
    took = time.monotonic() - started
    server.close()
    assert took < 2.5, took
    assert not result.ok and result.error.startswith("timeout"), result
