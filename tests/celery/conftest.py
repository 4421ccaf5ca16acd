"""Fixtures for the tests that need a real Redis broker and real ``celery -A recovery
worker`` processes (the ``celery_worker`` pass of ``make test``).

Each worker gets the *test* database through ``DATABASE_URL``, the stub status service
through ``RECOVERY_RECONCILERS`` and its own log file. Workers are stopped at the end of
the test (SIGTERM, then SIGKILL); the broker's queue and its unacknowledged-message keys
are emptied before and after, so a message a killed worker left behind can never reach a
later test's database.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings

from tests.faults import stubs

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30
# kombu's Redis transport keeps delivered-but-unacknowledged messages under these keys.
KOMBU_KEYS = ("celery", "unacked", "unacked_index", "unacked_mutex")


def database_url() -> str:
    """The URL of the database this test runs on (the test database, not the configured
    one), so the worker process reads and writes the same rows."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = quote(db["USER"] or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class Worker:
    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def results(self) -> list[str]:
        """The ``result`` word of every task this worker finished, in order."""
        return re.findall(r"'result': '([a-z_]+)'", self.log())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def _clean_broker() -> None:
    import redis

    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    client.delete(*KOMBU_KEYS)
    client.close()


@pytest.fixture
def stub(settings):
    service = stubs.StatusStub().start()
    settings.RECOVERY_RECONCILERS = {"payments": service.url}
    yield service
    service.stop()


@pytest.fixture
def start_worker(stub, tmp_path):
    """``start_worker(pool="solo", concurrency=1)`` -> a running worker process."""
    _clean_broker()
    started: list[Worker] = []

    def start(pool: str = "solo", concurrency: int = 1) -> Worker:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url(),
            CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
            RECOVERY_RECONCILERS=f"payments={stub.url}",
            RECOVERY_ENCRYPTION_KEYS=",".join(settings.RECOVERY_ENCRYPTION_KEYS),
            RECOVERY_VAR_DIR=str(tmp_path),
            PYTHONUNBUFFERED="1",
        )
        log_path = tmp_path / f"worker-{len(started)}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "recovery", "worker", f"--pool={pool}",
             f"--concurrency={concurrency}", "--loglevel=INFO", "--without-gossip",
             "--without-mingle", "--without-heartbeat",
             "-n", f"test-{uuid.uuid4().hex[:8]}@%h"],
            cwd=ROOT, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
        )
        worker = Worker(proc, log_path)
        started.append(worker)
        wait_for(lambda: "ready." in worker.log(), worker, what="the worker to start")
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
            try:
                worker.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
    for worker in started:
        for pid in children(worker.pid):
            os.kill(pid, signal.SIGKILL)
    _clean_broker()


def wait_for(predicate, *workers: Worker, what: str = "the worker", timeout: float = WAIT_S):
    """Poll ``predicate`` (bounded); fail with the workers' logs when it never holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    logs = "\n".join(f"--- {w.log_path.name} (exit {w.proc.poll()})\n{w.log()[-3000:]}"
                     for w in workers)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; logs:\n{logs}")
