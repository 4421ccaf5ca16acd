"""Fixtures for the process-death tests: the demo payment service in a thread, a writer
token for tenant ``acme``, ``run_worker`` to start ``checkpoints.demo.worker`` as a real
subprocess against ``live_server`` (``resume_worker`` for ``--resume``), and helpers that
wait for a lease to really expire on the database's clock before sweeping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpoints import services
from checkpoints.dbclock import db_now
from checkpoints.demo.payments import PaymentService
from checkpoints.models import Run
from recovery_client.client import HttpCheckpointStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def payments(tmp_path, settings):
    """The demo payment service, and the reconciler for ``payments`` pointing at it."""
    service = PaymentService(tmp_path / "payments.sqlite3").start()
    settings.RECOVERY_RECONCILERS = {"payments": f"{service.url}/operations"}
    yield service
    for gate in (service.store.hold_before_commit, service.store.hold_after_commit):
        if gate is not None:
            gate.set()  # let a held request go before the server stops
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
    """``run_worker(shape=..., die_at=..., extra=[...])`` runs one worker process to its
    end."""

    def run(*, shape="order", die_at=None, order_id=None, extra=()) -> WorkerRun:
        run_id, checkpoint_id = str(uuid.uuid4()), str(uuid.uuid4())
        order_id = order_id or f"A-{uuid.uuid4().hex[:6]}"
        extra = [*extra, *(["--die-at", die_at] if die_at else [])]
        proc = subprocess.run(
            worker_argv(live_server, payments, shape=shape, run_id=run_id,
                        checkpoint_id=checkpoint_id, order_id=order_id, extra=extra),
            env=worker_env(writer_token), cwd=ROOT, capture_output=True, text=True, timeout=60)
        return WorkerRun(run_id, checkpoint_id, order_id, proc.returncode,
                         parse_result(proc.stdout), proc.stderr)

    return run


@pytest.fixture
def resume_worker(live_server, payments, writer_token):
    """``resume_worker(run_id, extra=())`` runs ``worker --resume`` for a run to its end."""

    def run(run_id: str, extra=()) -> WorkerRun:
        argv = [sys.executable, "-m", "checkpoints.demo.worker", "--resume",
                "--base-url", live_server.url, "--tenant", "acme", "--run-id", run_id,
                "--payments-url", payments.url, "--ttl", "5", *extra]
        proc = subprocess.run(argv, env=worker_env(writer_token), cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        result = parse_result(proc.stdout)
        return WorkerRun(run_id, result.get("checkpoint_id", ""), "", proc.returncode, result,
                         proc.stderr)

    return run


# --- time: the database's clock, never a fake "now" --------------------------------------

db_time = db_now  # the services compare leases with this clock


def wait_for_lease_expiry(tenant, run_id, timeout_s: float = 10) -> Run:
    """Block until the run's lease has expired on the database's clock; returns the run."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = Run.objects.get(tenant=tenant, uuid=run_id)
        expires = run.lease_expires_at
        if expires is None or expires <= db_time():
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"the lease of run {run_id} did not expire by {expires}")
        time.sleep(0.05)


def sweep_after_lease_expiry(tenant, run_id) -> tuple[Run, dict]:
    """Wait for the real lease expiry, then run the stale-run sweep once (what beat does)."""
    wait_for_lease_expiry(tenant, run_id)
    stats = services.sweep_stale_runs()
    return Run.objects.get(tenant=tenant, uuid=run_id), stats


def approve_retry(tenant, run_id, requester, approver):
    """A reviewer requests a retry of the run and a second person approves it."""
    rid = uuid.UUID(str(run_id))
    retry = services.retry_request(actor=requester, tenant=tenant, run_id=rid,
                                   reason="the runtime died; finish the run")
    return services.retry_approve(actor=approver, tenant=tenant, retry_id=retry.pk,
                                  reason="checked the provider: safe to go on")
