"""The LangGraph refund example killed inside its payment tool (issue 10, "Tests").

``examples/langgraph_refund/run.py`` runs as a real subprocess against the live server and
an in-process demo payment service; with ``--crash-in-tool`` it SIGKILLs itself inside the
payment tool after the service committed the charge, before the effect is confirmed.
Once its 1 s lease has really expired (database clock), the stale-run sweep makes the run
ambiguous; reconciliation, pointed at the fake provider, finds the charge and confirms
the effect; ``run.py --resume`` re-invokes the graph on the same thread, LangGraph re-runs
the ``charge`` node, ``@recorded_effect`` replays the confirmed receipt, and the provider
has executed exactly one charge.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass

import pytest

from checkpoints.integrations.threads import thread_run_id
from checkpoints.models import Effect, Run

from .conftest import ROOT, parse_result, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

KILLED = -signal.SIGKILL
EXAMPLE = "examples.langgraph_refund.run"


@dataclass
class ExampleRun:
    thread_id: str
    run_id: str
    order_id: str
    returncode: int
    result: dict
    stderr: str


@pytest.fixture
def run_example(live_server, payments, writer_token):
    """``run_example(*args, thread_id=..., order_id=...)`` runs the example to its end."""

    def run(*args, thread_id=None, order_id=None) -> ExampleRun:
        order_id = order_id or f"LG-{uuid.uuid4().hex[:6]}"
        thread_id = thread_id or f"refund-{order_id}"
        argv = [sys.executable, "-m", EXAMPLE, "--base-url", live_server.url,
                "--tenant", "acme", "--thread-id", thread_id, "--order-id", order_id,
                "--amount-cents", "2599", "--payments-url", payments.url, "--ttl", "1", *args]
        proc = subprocess.run(argv, env=worker_env(writer_token), cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        return ExampleRun(thread_id, str(thread_run_id(thread_id)), order_id, proc.returncode,
                          parse_result(proc.stdout), proc.stderr)

    return run


def test_it_refunds_once_with_any_saver_and_records_the_effect(acme, run_example, payments):
    """With LangGraph's own in-memory saver the checkpoints stay in the process, and the
    payment tool's effect is still recorded in the thread's run."""
    example = run_example("--saver", "memory")

    assert example.returncode == 0, example.stderr
    charges = payments.store.charges(example.order_id)
    assert len(charges) == 1
    assert example.result["outcome"] == "completed"
    assert example.result["status"] == "refunded"
    assert example.result["receipt"]["charge_id"] == charges[0]["charge_id"]
    effect = Effect.objects.get(run__uuid=example.run_id)
    assert (effect.service, effect.operation_key, effect.state) == (
        "payments", f"refund:{example.order_id}", "confirmed")
    assert effect.receipt["charge_id"] == charges[0]["charge_id"]
    assert payments.store.committed[f"refund:{example.order_id}"] == 1
    assert Run.objects.get(uuid=example.run_id).tenant == acme
