"""The demo supervisor: runs whose retry was approved are resumed by a real worker process,
one at a time per run, with one log line per resume."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from django.core.management import call_command

from checkpoints import services
from checkpoints.apps import set_offline_kinds
from checkpoints.demo.supervisor import Supervisor, parse_tokens
from checkpoints.models import Checkpoint, CheckpointRevision, Run
from recovery_client.client import HttpCheckpointStore, next_revision, now_ms

from .conftest import ROOT, approve_retry, sweep_after_lease_expiry, wait_for_lease_expiry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def supervisor(live_server, payments, writer_token, tmp_path):
    made = []

    def make(**kw) -> Supervisor:
        sup = Supervisor(base_url=live_server.url, payments_url=payments.url,
                         tokens={"acme": writer_token}, log_path=tmp_path / "sup.log",
                         worker_args=["--ttl", "5"], **kw)
        made.append(sup)
        return sup

    yield make
    for sup in made:
        sup.stop(grace_s=10)


def tick_until_idle(sup: Supervisor, timeout_s: float = 30) -> list[str]:
    """Tick until no worker runs and a pass starts none; returns every log line."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        lines += sup.tick()
        if not sup.running:
            return lines
        assert time.monotonic() < deadline, "the resume workers did not finish"
        time.sleep(0.1)


def test_it_resumes_an_approved_run_once_and_logs_it(acme, rita, april, run_worker,
                                                     payments, supervisor, tmp_path):
    dead = run_worker(die_at="after_intent")
    idle = run_worker(die_at="after_intent")  # ambiguous, but nobody approved a retry
    for worker in (dead, idle):
        sweep_after_lease_expiry(acme, worker.run_id)
    approve_retry(acme, dead.run_id, rita, april)
    sup = supervisor()

    lines = sup.tick()
    started = dict(sup.running)
    lines += sup.tick()  # listed until the worker claims it: never a second worker

    assert list(started) == [("acme", dead.run_id)]
    assert list(sup.running) in ([], [("acme", dead.run_id)])
    assert all(r.proc is started[("acme", dead.run_id)].proc for r in sup.running.values())
    lines += tick_until_idle(sup)
    assert len(lines) == 1
    assert f"tenant=acme run={dead.run_id} exit=0 outcome=completed" in lines[0]
    assert "decision=retry/retry_approved" in lines[0]
    assert (tmp_path / "sup.log").read_text().splitlines() == lines
    assert Run.objects.get(uuid=dead.run_id).recovery_state == "completed"
    assert Run.objects.get(uuid=idle.run_id).recovery_state == "ambiguous"
    assert payments.store.executions(dead.order_id) == 1
    assert payments.store.executions(idle.order_id) == 0
    assert sup.tick() == [] and not sup.running


def test_it_backs_off_and_gives_up_on_a_run_it_cannot_resume(acme, rita, april, live_server,
                                                             writer_token, supervisor):
    """A v2 order is not this worker's definition: not resumed, tried again only after
    the back-off, at most ``max_attempts`` times; the approval is never spent."""
    store = HttpCheckpointStore(live_server.url, "acme", writer_token)
    run_id, cid = str(uuid.uuid4()), str(uuid.uuid4())
    first = {"id": cid, "run_id": run_id, "revision": 0, "kind": "acme.order",
             "schema_version": 1, "updated_at_ms": now_ms(),
             "payload": {"phase": "ready", "order_id": "V2-9", "amount_cents": 100,
                         "workflow": "acme.order", "definition_version": "2"}}
    store.compare_and_swap(first, None)
    store.lease(run_id, "v2-runtime", ttl_s=1)
    store.compare_and_swap(next_revision(first, dict(first["payload"], phase="charging")), 0)
    wait_for_lease_expiry(acme, run_id)
    sweep_after_lease_expiry(acme, run_id)
    approve_retry(acme, run_id, rita, april)
    sup = supervisor(backoff_s=60, max_attempts=2)

    lines = tick_until_idle(sup)
    assert len(lines) == 1 and "outcome=not_resumed" in lines[0]
    assert "decision=reject/identity_mismatch" in lines[0] and "attempt=1/2" in lines[0]
    assert tick_until_idle(sup) == []  # backing off
    sup.not_before.clear()  # the back-off is over
    lines = tick_until_idle(sup)
    assert len(lines) == 1 and "attempt=2/2" in lines[0]
    sup.not_before.clear()
    assert tick_until_idle(sup) == []  # given up
    assert Run.objects.get(uuid=run_id).recovery_state == "retry_approved"


@pytest.fixture
def acme_order_offline(kind_registry):
    """What the demo's web server runs with, ``RECOVERY_OFFLINE_KINDS=acme.order``
    (``apps.set_offline_kinds``; ``live_server`` serves from this process), lazy again
    after the test."""
    set_offline_kinds(["acme.order"])


def test_a_stranded_v1_run_waits_for_its_migration_then_is_resumed_in_v2(
        acme, rita, april, run_worker, payments, supervisor, acme_order_offline, tmp_path):
    """The demo's stranded run (issue 19, item 2): an order written in v1 by the code
    before v2, its worker killed after its in-flight checkpoint, its retry approved. The
    store answers the supervisor's worker reject / migration_required with the command;
    the supervisor neither counts that as an attempt nor gives up. Once the operator runs
    the command, its next pass (not the back-off) resumes the run to completed in v2, the
    card charged once."""
    stranded = run_worker(die_at="after_intent", extra=["--schema-version", "1"])
    sweep_after_lease_expiry(acme, stranded.run_id)
    approve_retry(acme, stranded.run_id, rita, april)
    key = ("acme", stranded.run_id)
    sup = supervisor(backoff_s=600, max_attempts=1)

    lines = tick_until_idle(sup)

    assert len(lines) == 1
    assert (f"run={stranded.run_id} exit=5 outcome=not_resumed "
            "decision=reject/migration_required") in lines[0]
    assert (f"python manage.py migrate_checkpoints acme.order --to 2 --tenant acme "
            f"--run {stranded.run_id}") in lines[0]
    assert "waiting=migration" in lines[0] and "attempt=" not in lines[0]
    assert tick_until_idle(sup) == [] and sup.attempts.get(key, 0) == 0  # waits, not spent
    run = Run.objects.get(uuid=stranded.run_id)
    assert (run.recovery_state, run.schema_version) == ("retry_approved", 1)
    assert payments.store.executions(stranded.order_id) == 0

    out = io.StringIO()
    call_command("migrate_checkpoints", "acme.order", "--to", "2", "--tenant", "acme",
                 "--run", stranded.run_id, stdout=out)
    assert "acme: acme.order to v2: 1 migrated, 0 skipped, 0 refused" in out.getvalue()
    lines = tick_until_idle(sup)  # the next pass, well within the 600 s back-off

    assert len(lines) == 1, lines
    assert (f"run={stranded.run_id} exit=0 outcome=completed "
            "decision=retry/retry_approved") in lines[0]
    run = Run.objects.get(uuid=stranded.run_id)
    assert (run.recovery_state, run.schema_version) == ("completed", 2)
    cp = Checkpoint.objects.get(uuid=stranded.checkpoint_id)
    payload = services.checkpoint_envelope(cp)["payload"]
    assert (payload["phase"], payload["amount"]) == ("completed",
                                                     {"cents": 2599, "currency": "USD"})
    assert "amount_cents" not in payload
    versions = list(CheckpointRevision.objects.filter(checkpoint=cp).order_by("revision")
                    .values_list("revision", "schema_version"))
    assert versions[:2] == [(0, 1), (1, 1)] and {v for _, v in versions[2:]} == {2}
    assert payments.store.executions(stranded.order_id) == 1
    assert [c["amount_cents"] for c in payments.store.charges(stranded.order_id)] == [2599]
    assert key not in sup.awaiting_migration and sup.tick() == []


def test_it_reads_tenant_tokens_from_one_variable():
    assert parse_tokens("acme=rcv_a, globex=rcv_b,,bad") == {"acme": "rcv_a",
                                                             "globex": "rcv_b"}
    assert parse_tokens("") == {}


def test_it_runs_as_the_demos_child_process_and_stops_on_sigterm(
        acme, rita, april, live_server, payments, writer_token, run_worker, tmp_path):
    dead = run_worker(shape="agent", die_at="after_intent")
    sweep_after_lease_expiry(acme, dead.run_id)
    approve_retry(acme, dead.run_id, rita, april)
    log = tmp_path / "demo-supervisor.log"
    env = dict(os.environ, RECOVERY_TOKENS=f"acme={writer_token}")
    env.pop("RECOVERY_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "checkpoints.demo.supervisor", "--base-url", live_server.url,
         "--payments-url", payments.url, "--log", str(log), "--interval", "0.5"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and log.read_text().strip()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no resume was logged"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)

    assert proc.returncode == 0, err
    line, = log.read_text().splitlines()
    assert f"run={dead.run_id} exit=0 outcome=completed decision=retry/retry_approved" in line
    assert Run.objects.get(uuid=dead.run_id).recovery_state == "completed"
    assert payments.store.executions(dead.order_id) == 1


def test_a_run_awaiting_its_migration_is_not_read_again_every_back_off(tmp_path):
    """(stop 32, the newcomer's finding) Each try reads the run's payload, an audited
    read: the stranded run's trail grew by one event every 30 s while it waited. A
    ``migration_required`` answer now waits ``MIGRATION_RECHECK_S`` at the same schema
    version (its migration is still seen on the next pass)."""
    import time as clock
    from types import SimpleNamespace

    from checkpoints.demo.supervisor import MIGRATION_RECHECK_S, Resume

    sup = Supervisor(base_url="http://127.0.0.1:9", payments_url="http://127.0.0.1:9",
                     tokens={"acme": "t"}, log_path=tmp_path / "sup.log", backoff_s=30)
    out = '{"outcome": "not_resumed", "action": "reject", "reason": "migration_required"}'
    proc = SimpleNamespace(poll=lambda: 5, returncode=5, communicate=lambda: (out, ""))
    key = ("acme", "r-1")
    sup.running[key] = Resume("acme", "r-1", proc, schema_version=1)
    before = clock.monotonic()
    sup.reap()
    assert sup.awaiting_migration[key] == 1 and sup.attempts.get(key, 0) == 0
    assert sup.not_before[key] >= before + MIGRATION_RECHECK_S
