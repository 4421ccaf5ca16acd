"""``HttpCheckpointStore``'s kept-alive connection (issue 8): every request of a store on
one connection; a connection the server closed while idle is replaced before the next
request; one that breaks under a request is sent again once for a read, and a write only
through the retries of ``tests/client/test_retries.py`` (never with ``retries=0``);
``revision`` learns the current revision with a ``HEAD``, which writes nothing."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from checkpoints.models import AuditEvent
from recovery_client.client import CheckpointError, HttpCheckpointStore, next_revision
from tests.helpers import envelope

live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store(live_server, wendy) -> HttpCheckpointStore:
    """The sync store only: these tests look at its one kept-alive connection (the async
    store's pool: ``test_retries.py``)."""
    from checkpoints import services

    return HttpCheckpointStore(live_server.url, "acme", services.token_issue(user=wendy))


@live
def test_it_sends_every_request_on_one_connection(store):
    body = envelope()
    store.compare_and_swap(body, None)
    sock = store._conn.sock
    for revision in range(3):
        body = next_revision(body, {"phase": "ready", "n": revision})
        assert store.compare_and_swap(body, revision) == revision + 1
    assert store.load(body["id"])["revision"] == 3
    assert store._conn.sock is sock
    store.close()
    assert store._conn is None
    assert store.revision(body["id"]) == 3  # a new connection after close()


@live
def test_it_answers_the_current_revision_with_a_head_that_audits_nothing(acme, store):
    body = envelope()
    store.compare_and_swap(body, None)
    store.compare_and_swap(next_revision(body, {"phase": "charging"}), 0)
    events = AuditEvent.objects.count()
    assert store.revision(body["id"]) == 1
    assert store.revision(str(uuid.uuid4())) is None
    assert AuditEvent.objects.count() == events
    store.load(body["id"])  # the payload read is audited, as before
    assert AuditEvent.objects.count() == events + 1


@live
def test_without_keep_alive_it_answers_the_same(live_server, wendy, acme):
    from checkpoints import services

    store = HttpCheckpointStore(live_server.url, "acme", services.token_issue(user=wendy),
                                keep_alive=False)
    body = envelope()
    assert store.compare_and_swap(body, None) == 0
    assert store.revision(body["id"]) == 0
    assert store._conn is None
    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(body, None)
    assert (err.value.kind, err.value.current_revision) == ("conflict", 0)


class Stub:
    """A raw HTTP/1.1 server on a thread: answers each request of a connection with
    ``200 {}`` (``ETag: "7"``), and after ``answers`` answers on one connection closes
    it, either silently between requests (``mode="idle"``) or after reading the next
    request without answering it (``mode="mid"``). Counts the requests it read."""

    def __init__(self, answers: int, mode: str):
        self.answers, self.mode, self.requests = answers, mode, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def read_request(self, f) -> bool:
        line = f.readline()
        if not line:
            return False
        length = 0
        while (header := f.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        f.read(length)
        self.requests.append(line.split()[0].decode())
        return True

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as f:
                served = 0
                while self.read_request(f):
                    if served == self.answers and self.mode == "mid":
                        break  # read the request, close without an answer
                    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                                 b'ETag: "7"\r\nContent-Length: 2\r\n\r\n{}')
                    served += 1
                    if served == self.answers and self.mode == "idle":
                        break  # closed while idle: the client has its answer

    def store(self, **kw) -> HttpCheckpointStore:
        return HttpCheckpointStore(f"http://127.0.0.1:{self.port}", "acme", "t", timeout_s=5,
                                   **kw)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def stub():
    made = []

    def make(answers, mode):
        made.append(Stub(answers, mode))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _wait_closed(store) -> None:
    """Until the stub's close reaches the client's socket (readable: EOF)."""
    import select

    select.select([store._conn.sock], [], [], 5)


def test_it_opens_a_new_connection_when_the_server_closed_the_idle_one(stub):
    server = stub(answers=1, mode="idle")
    store = server.store()
    body = envelope()
    assert store.compare_and_swap(body, None) == 7
    _wait_closed(store)
    assert store.compare_and_swap(next_revision(body, {}), 0) == 7
    assert server.requests == ["PUT", "PUT"]


def test_it_sends_a_read_once_more_when_the_connection_breaks_under_it(stub):
    server = stub(answers=1, mode="mid")
    store = server.store()
    assert store.revision(str(uuid.uuid4())) == 7
    assert store.revision(str(uuid.uuid4())) == 7  # broke under it; sent again
    assert server.requests == ["HEAD", "HEAD", "HEAD"]


def test_without_retries_it_never_sends_a_write_twice_when_the_connection_breaks_under_it(
        stub):
    server = stub(answers=1, mode="mid")
    store = server.store(retries=0)
    body = envelope()
    assert store.compare_and_swap(body, None) == 7
    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(next_revision(body, {}), 0)
    assert err.value.kind == "storage"
    assert server.requests == ["PUT", "PUT"]  # the write may have been stored: not resent


def test_without_keep_alive_an_unreachable_server_is_retried_as_never_sent():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pauses = []
    store = HttpCheckpointStore(f"http://127.0.0.1:{port}", "acme", "t", keep_alive=False,
                                sleep=pauses.append)
    with pytest.raises(CheckpointError) as err:
        store.resume(str(uuid.uuid4()))  # a claim: resent only when surely not sent
    assert (err.value.kind, err.value.status, err.value.sent) == ("storage", 0, False)
    assert len(pauses) == 3
