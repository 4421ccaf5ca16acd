"""A broker outage with a reconcile job in flight (issue 17, item 11): a real
``celery -A recovery worker`` (prefork, as in production) against this test's own
``redis-server`` on a free loopback port, which the test stops for 20 s while the job's
look-up is running and then starts again on the same port and data directory.

The worker must survive (kombu's Redis transport before 5.7 could end it with
``Unrecoverable error`` while restoring unacknowledged messages) and keep consuming: a
frozen broker (SIGSTOP: connections hang rather than close) made the job's ack time out
and left the worker connected but never fetching again (``recovery/kombu_ack.py``). The
job must settle exactly once, and a job sent after the outage must run.

The outage itself is real time (a broker cannot be aged); everything else waits bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from checkpoints import services
from checkpoints.models import ReconcileRequest
from tests.celery.conftest import wait_for
from tests.celery.test_reconcile_worker import KEY, RECEIPT, _reconciled_once, _settled
from tests.faults.conftest import in_doubt_run, request_for
from tests.faults.stubs import broker_at
from tests.helpers import age_world

OUTAGE_S = 20

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("redis-server") is None,
                       reason="redis-server is not installed: this test runs its own broker"),
    # It runs its own broker, but in the celery_worker pass, as the other real-worker tests.
    pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL"),
                       reason="CELERY_BROKER_URL is not set: the real-worker tests run in "
                              "make test's PostgreSQL pass"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnRedis:
    """A ``redis-server`` on 127.0.0.1:``port`` keeping its data (append-only file) in
    ``folder``, so messages survive a stop and start, as a production broker's do."""

    def __init__(self, folder, port: int):
        self.folder, self.port, self.proc = folder, port, None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "always",
             "--save", "", "--protected-mode", "no"],
            stdout=(self.folder / "redis.log").open("a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def freeze(self) -> None:
        """The broker stops answering without closing a connection (a paused container,
        a network partition): SIGSTOP."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=15)
        self.proc = None


@pytest.fixture
def own_redis(tmp_path, monkeypatch):
    folder = tmp_path / "redis"
    folder.mkdir()
    broker = OwnRedis(folder, _free_port())
    broker.start()
    monkeypatch.setenv("CELERY_BROKER_URL", broker.url)
    with broker_at(broker.url):
        yield broker
    broker.stop()


@pytest.mark.parametrize(("outage", "finish"), [("stop", "during"), ("stop", "after"),
                                               ("freeze", "during")])
def test_the_worker_survives_a_broker_outage_with_a_job_in_flight(
        outage, finish, monkeypatch, own_redis, acme, wendy, rita, stub, start_worker):
    """``outage``: the broker process stops (connections refused) or freezes (connections
    hang: a paused container, a partition). ``finish``: the job's look-up returns while
    the broker is out (its ack cannot be sent) or once it is back (the ack goes over the
    new connection)."""
    pool = "prefork"
    # The look-up is held across the whole outage: its timeout must outlast it.
    monkeypatch.setenv("RECOVERY_RECONCILE_TIMEOUT_S", str(OUTAGE_S + 20))
    worker = start_worker(pool=pool, concurrency=1)
    stub.answer(KEY, RECEIPT)
    stub.hold(KEY)
    run = in_doubt_run(wendy, acme, keys=(KEY,))
    age_world(3600)
    services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="died")
    wait_for(stub.entered(KEY).is_set, worker, what="the look-up to start")

    own_redis.stop() if outage == "stop" else own_redis.freeze()
    time.sleep(1)
    if finish == "during":
        stub.release(KEY)
        wait_for(_settled(run.effects[KEY]), worker, what="the job to finish in the outage")
    time.sleep(OUTAGE_S - 1)
    assert worker.proc.poll() is None, worker.log()[-4000:]
    own_redis.start() if outage == "stop" else own_redis.thaw()
    if finish == "after":
        stub.release(KEY)
        wait_for(_settled(run.effects[KEY]), worker, what="the job to finish after it")

    # The worker reconnects and consumes again: a second job, sent after the outage, runs.
    second_key = "charge:after-outage"
    stub.answer(second_key, RECEIPT)
    later = in_doubt_run(wendy, acme, keys=(second_key,))
    age_world(3600)
    services.run_reconcile(actor=rita, tenant=acme, run_id=later.run_id, reason="died")
    wait_for(_settled(later.effects[second_key]), worker, timeout=60,
             what="a job sent after the outage")
    # Any redelivery of the first job's unacknowledged message has had its chance.
    wait_for(lambda: len(worker.results()) >= 2, worker, what="the results")
    assert worker.proc.poll() is None, worker.log()[-4000:]
    assert "Unrecoverable error" not in worker.log()

    _reconciled_once(run.effects[KEY])
    _reconciled_once(later.effects[second_key])
    req = request_for(run.effects[KEY])
    assert (req.state, req.outcome) == ("done", "confirmed")
    assert stub.looked_up(KEY) == 1  # the job ran once, whatever was redelivered
    assert ReconcileRequest.objects.filter(state="done").count() == 2
    assert os.environ["CELERY_BROKER_URL"] == own_redis.url
