"""Fixtures for the process-death tests: the demo payment service in a thread, a writer
token for tenant ``acme``, and ``run_worker`` to start ``checkpoints.demo.worker`` as a
real subprocess against ``live_server``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpoints import services
from checkpoints.client import HttpCheckpointStore
from checkpoints.demo.payments import PaymentService

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def payments(tmp_path, settings):
    """The demo payment service, and the reconciler for ``payments`` pointing at it."""
    service = PaymentService(tmp_path / "payments.sqlite3").start()
    settings.RECOVERY_RECONCILERS = {"payments": f"{service.url}/operations"}
    yield service
    service.stop()


@pytest.fixture
def writer_token(wendy) -> str:
    return services.token_issue(user=wendy)


@pytest.fixture
def store(live_server, writer_token) -> HttpCheckpointStore:
    """A client as the restarted runtime (wendy, tenant acme) would use it."""
    return HttpCheckpointStore(live_server.url, "acme", writer_token)


@dataclass
class WorkerRun:
    run_id: str
    checkpoint_id: str
    order_id: str
    returncode: int
    result: dict
    stderr: str


def worker_argv(live_server, payments, *, shape="order", run_id, checkpoint_id, order_id,
                extra=()) -> list[str]:
    return [sys.executable, "-m", "checkpoints.demo.worker", "--base-url", live_server.url,
            "--tenant", "acme", "--shape", shape, "--run-id", run_id,
            "--checkpoint-id", checkpoint_id, "--order-id", order_id,
            "--amount-cents", "2599", "--payments-url", payments.url, "--ttl", "1", *extra]


def worker_env(token: str) -> dict:
    return dict(os.environ, RECOVERY_TOKEN=token)


def parse_result(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


@pytest.fixture
def run_worker(live_server, payments, writer_token):
    """``run_worker(shape=..., die_at=...)`` runs one worker process to its end."""

    def run(*, shape="order", die_at=None, order_id=None) -> WorkerRun:
        run_id, checkpoint_id = str(uuid.uuid4()), str(uuid.uuid4())
        order_id = order_id or f"A-{uuid.uuid4().hex[:6]}"
        extra = ["--die-at", die_at] if die_at else []
        proc = subprocess.run(
            worker_argv(live_server, payments, shape=shape, run_id=run_id,
                        checkpoint_id=checkpoint_id, order_id=order_id, extra=extra),
            env=worker_env(writer_token), cwd=ROOT, capture_output=True, text=True, timeout=60)
        return WorkerRun(run_id, checkpoint_id, order_id, proc.returncode,
                         parse_result(proc.stdout), proc.stderr)

    return run
