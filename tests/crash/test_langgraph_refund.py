"""The LangGraph refund example killed inside its payment tool (issue 10, "Tests").

``examples/langgraph_refund/run.py`` runs as a real subprocess against the live server and
an in-process demo payment service; with ``--crash-in-tool`` it SIGKILLs itself inside the
payment tool after the service committed the charge, before the effect is confirmed.
Once its 1 s lease has really expired (database clock), the stale-run sweep makes the run
ambiguous; ``run.py --resume`` is refused (an effect in doubt); reconciliation, pointed at
the fake provider, finds the charge and confirms the effect; a resume is still refused
(the run is in flight: "reject, unless a reviewer's retry was approved"); once a reviewer
requested a retry and an approver approved it, ``run.py --resume`` claims it and
re-invokes the graph on the same thread, LangGraph re-runs the ``charge`` node,
``@recorded_effect`` replays the confirmed receipt, and the provider has executed exactly
one charge.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pytest

from checkpoints import services
from checkpoints.demo.supervisor import Supervisor
from checkpoints.models import Effect, Run
from recovery_client.protocol import thread_run_id

from .conftest import ROOT, approve_retry, parse_result, sweep_after_lease_expiry, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

KILLED = -signal.SIGKILL
EXAMPLE = "examples.langgraph_refund.run"


@dataclass
class ExampleRun:
    thread_id: str
    run_id: str
    returncode: int
    result: dict
    stderr: str


@pytest.fixture
def run_example(live_server, payments, writer_token):
    """``run_example(*args)`` runs the example to its end with ``args`` after the
    server, tenant, payment service and a 1 s lease; ``start(order_id)`` are the
    arguments that start a new thread for an order, ``resume(thread_id)`` those that
    resume it."""

    def run(*args) -> ExampleRun:
        argv = [sys.executable, "-m", EXAMPLE, "--base-url", live_server.url,
                "--tenant", "acme", "--payments-url", payments.url, "--ttl", "1", *args]
        proc = subprocess.run(argv, env=worker_env(writer_token), cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        result = parse_result(proc.stdout)
        thread_id = result.get("thread_id") or ""
        return ExampleRun(thread_id, result.get("run_id", ""), proc.returncode, result,
                          proc.stderr)

    return run


def start(order_id: str, *extra: str) -> list[str]:
    return ["--thread-id", f"refund-{order_id}", "--order-id", order_id,
            "--amount-cents", "2599", *extra]


def resume(thread_id: str, *extra: str) -> list[str]:
    return ["--resume", "--thread-id", thread_id, *extra]


def new_order() -> str:
    return f"LG-{uuid.uuid4().hex[:6]}"


def test_it_refunds_once_with_any_saver_and_records_the_effect(acme, run_example, payments):
    """With LangGraph's own in-memory saver the checkpoints stay in the process, and the
    payment tool's effect is still recorded in the thread's run."""
    order = new_order()
    example = run_example(*start(order, "--saver", "memory"))

    assert example.returncode == 0, example.stderr
    assert example.run_id == str(thread_run_id(f"refund-{order}"))
    charges = payments.store.charges(order)
    assert len(charges) == 1
    assert (example.result["outcome"], example.result["status"]) == ("completed", "refunded")
    assert example.result["receipt"]["charge_id"] == charges[0]["charge_id"]
    effect = Effect.objects.get(run__uuid=example.run_id)
    assert (effect.service, effect.operation_key, effect.state) == (
        "payments", f"refund:{order}", "confirmed")
    assert effect.receipt["charge_id"] == charges[0]["charge_id"]
    assert effect.run.tenant == acme


def test_after_a_kill_in_the_payment_tool_only_an_approved_retry_resumes_and_charges_once(
        acme, rita, april, run_example, payments, store):
    """The resume policy is obeyed: in flight is refused until two people approved a
    retry, even once reconciliation confirmed the charge; the approved resume replays the
    confirmed receipt and the provider executes one charge."""
    order = new_order()
    key = f"refund:{order}"
    killed = run_example(*start(order, "--crash-in-tool"))

    # Killed inside the tool: the provider committed the charge, the effect is submitted
    # and the thread's head LangGraph checkpoint is still running ``charge``.
    assert killed.returncode == KILLED, killed.stderr
    charge_id = payments.store.charges(order)[0]["charge_id"]
    assert payments.store.committed[key] == 1
    run = Run.objects.get(tenant=acme, uuid=killed.run_id)
    effect = Effect.objects.get(run=run)
    assert (effect.operation_key, effect.state) == (key, "submitted")
    assert run.latest_checkpoint.kind == "langgraph.checkpoint"
    assert (run.phase_class, run.phase_label) == ("in_flight",
                                                  "running charge (0/1 tasks written)")
    head = (run.latest_checkpoint_id, run.latest_checkpoint.revision)

    swept, _ = sweep_after_lease_expiry(acme, killed.run_id)
    effect.refresh_from_db()
    assert (swept.recovery_state, effect.state) == ("ambiguous", "unresolved")

    # Before reconciliation a resume does nothing: the effect is in doubt.
    early = run_example(*resume(killed.thread_id))
    assert early.returncode == 5, early.stderr
    assert (early.result["outcome"], early.result["action"], early.result["reason"]) == (
        "not_resumed", "reconcile", "effects_in_doubt")
    assert payments.store.received[key] == 1

    services.run_reconcile(actor=rita, tenant=acme, run_id=run.uuid,
                           reason="the graph died inside its payment tool")
    effect.refresh_from_db()
    assert effect.state == "confirmed"
    assert effect.receipt["charge_id"] == charge_id

    # Reconciled, but still in flight: no resume without an approved retry.
    refused = run_example(*resume(killed.thread_id))
    assert refused.returncode == 5, refused.stderr
    assert (refused.result["outcome"], refused.result["action"],
            refused.result["reason"]) == ("not_resumed", "reject", "in_flight")
    assert "in_flight" in refused.stderr and "retry" in refused.result["hint"]
    assert payments.store.received[key] == 1
    run.refresh_from_db()
    assert (run.latest_checkpoint_id, run.latest_checkpoint.revision) == head  # nothing ran
    assert run.recovery_state == "ambiguous"

    approve_retry(acme, killed.run_id, rita, april)
    resumed = run_example(*resume(killed.thread_id))

    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.result["action"], resumed.result["reason"]) == ("retry", "retry_approved")
    assert (resumed.result["outcome"], resumed.result["status"]) == ("completed", "refunded")
    assert resumed.result["charge_id"] == charge_id
    assert resumed.result["receipt"] == {"order_id": order, "charge_id": charge_id,
                                         "amount_cents": 2599}
    assert payments.store.committed[key] == 1  # exactly one charge executed
    assert payments.store.received[key] == 1  # and the resume never even asked again
    assert payments.store.executions(order) == 1
    run.refresh_from_db()
    assert run.recovery_state == "completed"
    assert [e.state for e in Effect.objects.filter(run=run)] == ["confirmed"]
    done = (run.latest_checkpoint_id, run.latest_checkpoint.revision)

    # Completed: a resume replays the recorded result and executes nothing.
    replayed = run_example(*resume(killed.thread_id))
    assert replayed.returncode == 0, replayed.stderr
    assert (replayed.result["outcome"], replayed.result["action"]) == ("replayed", "replay")
    assert (replayed.result["status"], replayed.result["charge_id"]) == ("refunded", charge_id)
    assert payments.store.received[key] == 1
    run.refresh_from_db()
    assert (run.latest_checkpoint_id, run.latest_checkpoint.revision) == done
    assert store.resume_preview(killed.run_id)["action"] == "replay"


def test_it_resumes_an_approved_retry_through_the_demo_supervisor(
        acme, rita, april, run_example, payments, live_server, writer_token, tmp_path):
    """The demo's path: a reviewer reconciles, requests a retry, a second person approves
    it, and the supervisor resumes the LangGraph run from its run id alone."""
    order = new_order()
    killed = run_example(*start(order, "--crash-in-tool"))
    assert killed.returncode == KILLED, killed.stderr
    sweep_after_lease_expiry(acme, killed.run_id)
    services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(killed.run_id),
                           reason="the graph died inside its payment tool")
    approve_retry(acme, killed.run_id, rita, april)
    sup = Supervisor(base_url=live_server.url, payments_url=payments.url,
                     tokens={"acme": writer_token}, log_path=tmp_path / "sup.log",
                     worker_args=["--ttl", "5"], cwd=str(ROOT))
    try:
        lines = sup.tick()
        deadline = time.monotonic() + 60
        while sup.running and time.monotonic() < deadline:
            time.sleep(0.1)
            lines += sup.reap()
    finally:
        sup.stop(grace_s=10)

    assert len(lines) == 1, lines
    assert f"run={killed.run_id} exit=0 outcome=completed" in lines[0]
    assert "decision=retry/retry_approved" in lines[0]
    assert Run.objects.get(uuid=killed.run_id).recovery_state == "completed"
    assert payments.store.committed[f"refund:{order}"] == 1
