"""Reconciliation through a real Redis broker and a real ``celery -A recovery worker``
process, against a stub status service on 127.0.0.1 (stdlib HTTP server).

Runs in the PostgreSQL pass of ``make test`` (``CELERY_BROKER_URL`` set); skipped, with a
message, only when no broker is configured (the embedded SQLite pass). The worker gets
the *test* database through ``DATABASE_URL`` and the stub through
``RECOVERY_RECONCILERS``; the test waits (bounded) for the worker's commit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from django.conf import settings

from checkpoints import services
from checkpoints.models import AuditEvent, Effect, EffectRevision, Run
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL"),
                       reason="CELERY_BROKER_URL is not set: no broker, so no real worker "
                              "(make test runs this in its PostgreSQL pass)"),
]

KNOWN = {"charge:A-1042": {"status": "succeeded", "charge_id": "ch_42", "amount_cents": 2599}}


class StatusHandler(BaseHTTPRequestHandler):
    """``GET /operations/<key>``: 200 with the stored receipt, 404 for a key never seen."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's naming)
        prefix = "/operations/"
        key = unquote(self.path[len(prefix):]) if self.path.startswith(prefix) else None
        self.seen.append(key or self.path)
        body = KNOWN.get(key) if key else None
        payload = json.dumps(body if body else {"error": "not_found"}).encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def status_service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StatusHandler)
    StatusHandler.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/operations"
    server.shutdown()
    server.server_close()


def _database_url() -> str:
    """The URL of the database this test runs on (the test database, not the configured
    one), so the worker process reads and writes the same rows."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = quote(db["USER"] or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def worker(status_service, tmp_path):
    from recovery.celery import app

    app.control.purge()  # nothing left over from an earlier, aborted run
    env = dict(os.environ)
    env.update(
        DATABASE_URL=_database_url(),
        CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
        RECOVERY_RECONCILERS=f"payments={status_service}",
        RECOVERY_ENCRYPTION_KEYS=",".join(settings.RECOVERY_ENCRYPTION_KEYS),
        RECOVERY_VAR_DIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "recovery", "worker", "--pool=solo",
         "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-n", f"test-{uuid.uuid4().hex[:8]}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        yield proc, tmp_path / "worker.log"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_for(predicate, proc, log_path):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"the worker did not finish within {WAIT_S} s (exit {proc.poll()}); log:\n"
                + log_path.read_text()[-4000:])


def test_it_reconciles_in_doubt_effects_in_a_real_worker(acme, wendy, rita, worker):
    proc, log_path = worker
    assert not settings.CELERY_TASK_ALWAYS_EAGER
    body = envelope(payload={"phase": "charging", "order_id": "A-1042"})
    put_checkpoint(wendy, acme, body)
    charged = effect_body(run_id=body["run_id"], operation_key="charge:A-1042")
    never = effect_body(run_id=body["run_id"], operation_key="charge:never-sent")
    for eb in (charged, never):
        put_effect(wendy, acme, eb)
        put_effect(wendy, acme, dict(eb, revision=1, state="submitted"), expected=0)
    run_id = uuid.UUID(body["run_id"])

    task_id = services.run_reconcile(actor=rita, tenant=acme, run_id=run_id,
                                     reason="worker died after the charge")
    assert uuid.UUID(task_id)

    def settled():
        return not Effect.objects.filter(state__in=["submitted", "unresolved"]).exists()

    _wait_for(settled, proc, log_path)
    confirmed = Effect.objects.get(operation_key="charge:A-1042")
    assert (confirmed.state, confirmed.revision) == ("confirmed", 2)
    assert confirmed.receipt == KNOWN["charge:A-1042"]
    assert EffectRevision.objects.get(effect=confirmed, revision=2).source == "reconciliation"
    not_run = Effect.objects.get(operation_key="charge:never-sent")
    assert not_run.state == "not_executed"  # 404: the service never saw the key
    events = AuditEvent.objects.filter(action="effect.reconcile", run_id=run_id)
    assert {(e.actor_id, e.actor_name, e.after["state"]) for e in events} == {
        (None, "system", "confirmed"), (None, "system", "not_executed")}
    assert set(StatusHandler.seen) == {"charge:A-1042", "charge:never-sent"}
    assert Run.objects.get().recovery_state != "ambiguous"
    assert services.audit_verify(tenant=acme)[0]
