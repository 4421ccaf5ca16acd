"""The crash matrix: a runtime SIGKILLed in every write-ahead window, taken to the end.

Real processes throughout: ``checkpoints.demo.worker`` against ``live_server``, the demo
payment service (which dedupes by Idempotency-Key) in a thread. For each window:

1. the worker dies there: by ``--die-at`` (it SIGKILLs itself), or, for a call in
   flight, the test SIGKILLs it while the provider holds the request before (3a) or
   after (3b) committing it; the provider still commits;
2. once the 1 s lease has really expired (database clock), the stale-run sweep runs:
   the run's recovery state;
3. the resume decision a restarted runtime would get (``resume_preview``: claims
   nothing);
4. what reconciliation finds (``services.run_reconcile`` as a reviewer; without a broker
   it runs in this process on commit). A look-up's 404 settles ``not_executed`` only once
   the settle delay has passed since ``submitted``: 0 s where the window needs it (2), the
   default 30 s in 3a, where the first look-up comes while the provider still holds the
   request and must not call it "not executed";
5. the provider's executions for the order: zero or one, never two;
6. to the end: a reviewer requests a retry, an approver approves it, the preview says
   ``retry`` without consuming it, ``worker --resume`` claims it and finishes the run:
   ``completed``, and the provider still counts at most one execution.

The table (window, state, decision, reconciliation, executions, ...) is written to
``$RECOVERY_VAR_DIR/crash-matrix.txt`` and printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from checkpoints import services
from checkpoints.exceptions import InvalidTransition
from checkpoints.models import Effect, Run

from .conftest import (
    ROOT,
    approve_retry,
    sweep_after_lease_expiry,
    worker_argv,
    worker_env,
)

pytestmark = pytest.mark.django_db(transaction=True)

KILLED = -signal.SIGKILL
COLUMNS = ("window", "state after sweep", "resume preview", "reconciliation",
           "after reconciliation", "executions", "approved retry, resumed",
           "executions at the end", "provider requests")


@dataclass(frozen=True)
class Window:
    id: str
    shape: str = "order"
    die_at: str | None = None  # the worker kills itself here
    hold: str | None = None  # the test kills it while the provider holds the request
    settle_s: int = 30
    # expected
    state: str = "ambiguous"
    decision: tuple[str, str] = ("reject", "in_flight")
    reconciled: str = "nothing in doubt"  # effect state after reconciliation
    executions_before: int = 0
    state_after_reconcile: str = "ambiguous"


WINDOWS = [
    Window("1 after in-flight checkpoint, before submission", die_at="after_intent"),
    Window("2 after submitted, before the call", die_at="after_submitted", settle_s=0,
           decision=("reconcile", "effects_in_doubt"), reconciled="not_executed"),
    Window("3a during the call, provider not yet committed", hold="before_commit",
           decision=("reconcile", "effects_in_doubt"), reconciled="confirmed",
           executions_before=1),
    Window("3b during the call, provider committed, not answered", hold="after_commit",
           decision=("reconcile", "effects_in_doubt"), reconciled="confirmed",
           executions_before=1),
    Window("4 after the call, before confirmed", die_at="after_call",
           decision=("reconcile", "effects_in_doubt"), reconciled="confirmed",
           executions_before=1),
    Window("5 after confirmed, before the stable checkpoint", die_at="after_confirmed",
           executions_before=1),
    Window("agent: after the CRM call (no look-up)", shape="agent", die_at="after_call",
           decision=("reconcile", "effects_in_doubt"), reconciled="unknown",
           executions_before=1, state_after_reconcile="unknown_outcome"),
]

ROWS: dict[str, tuple] = {}


@pytest.fixture(scope="module", autouse=True)
def matrix_table():
    """Print and save the table once every window has run."""
    yield
    if not ROWS:
        return
    rows = [COLUMNS] + [ROWS[w.id] for w in WINDOWS if w.id in ROWS]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(COLUMNS))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    table = "\n".join(lines)
    path = Path(django_settings.VAR_DIR) / "crash-matrix.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table + "\n")
    print(f"\ncrash matrix ({path}):\n{table}")


def _wait(predicate, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _start(live_server, payments, token, window: Window, ids: dict) -> subprocess.Popen:
    extra = ["--die-at", window.die_at] if window.die_at else []
    return subprocess.Popen(
        worker_argv(live_server, payments, shape=window.shape, extra=extra, **ids),
        env=worker_env(token), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _kill_during_the_call(proc, payments, key: str, hold: str) -> threading.Event:
    """SIGKILL the worker while the provider holds its request; returns the gate."""
    store = payments.store
    if hold == "before_commit":
        _wait(lambda: store.received[key] >= 1 or proc.poll() is not None,
              "the provider to receive the charge")
        assert store.committed[key] == 0
    else:
        _wait(lambda: store.committed[key] >= 1 or proc.poll() is not None,
              "the provider to commit the charge")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    return store.hold_before_commit if hold == "before_commit" else store.hold_after_commit


def _reconcile(tenant, reviewer, run_id) -> str:
    try:
        services.run_reconcile(actor=reviewer, tenant=tenant, run_id=uuid.UUID(run_id),
                               reason="the runtime died; ask the provider")
    except InvalidTransition:
        return "nothing in doubt"
    states = list(Effect.objects.filter(run__uuid=run_id).values_list("state", flat=True))
    return ",".join(states)


@pytest.mark.parametrize("window", WINDOWS, ids=[w.id.split(" ")[0] if w.shape == "order"
                                                   else "agent" for w in WINDOWS])
def test_each_crash_window_recovers_with_at_most_one_execution(
        window, acme, rita, april, writer_token, live_server, payments, store,
        resume_worker, settings):
    settings.RECOVERY_RECONCILE_SETTLE_DELAY_S = window.settle_s
    ids = dict(run_id=str(uuid.uuid4()), checkpoint_id=str(uuid.uuid4()),
               order_id=f"M-{uuid.uuid4().hex[:6]}")
    order = ids["order_id"]

    def executions() -> int:
        return payments.store.executions(order)

    # 1. The runtime dies in the window.
    if window.hold:
        gate = threading.Event()
        setattr(payments.store, f"hold_{window.hold}", gate)
    proc = _start(live_server, payments, writer_token, window, ids)
    if window.hold:
        gate = _kill_during_the_call(proc, payments, f"charge:{order}", window.hold)
        if window.hold == "after_commit":
            gate.set()  # the answer goes nowhere: the worker is dead
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == KILLED, (out, err)
    effect_key = (f"{ids['checkpoint_id']}:agent:refund-assistant:turn:1:call:0"
                  if window.shape == "agent" else f"charge:{order}")

    # 2. The lease really expires; the sweep marks the run.
    run, _ = sweep_after_lease_expiry(acme, ids["run_id"])
    assert run.recovery_state == window.state, run.recovery_reason

    # 3. What a restarted runtime would be told (claims nothing).
    identity = ({"agent": "refund-assistant", "model": "openai/gpt-4.1-mini"}
                if window.shape == "agent" else {"workflow": "acme.order",
                                                 "definition_version": "1"})
    preview = store.resume_preview(ids["run_id"], **identity)
    assert (preview["action"], preview["reason"]) == window.decision

    # 4. Reconciliation.
    if window.hold == "before_commit":
        # The provider still holds the charge: its look-up answers 404, which within the
        # settle delay must not settle "not executed".
        found_early = _reconcile(acme, rita, ids["run_id"])
        assert found_early == "unresolved"
        assert executions() == 0
        gate.set()
        _wait(lambda: payments.store.committed[f"charge:{order}"] == 1,
              "the provider to commit the held charge")
        reconciled = _reconcile(acme, rita, ids["run_id"])
        reconciliation = f"404 within settle delay: {found_early}; after commit: {reconciled}"
    else:
        reconciled = _reconcile(acme, rita, ids["run_id"])
        reconciliation = reconciled
        if window.reconciled == "not_executed":
            reconciliation += f" (settle delay {window.settle_s} s)"
        if window.reconciled == "unknown":
            reconciliation += " (no look-up)"
    assert reconciled == window.reconciled
    assert executions() == window.executions_before
    effect = Effect.objects.filter(run__uuid=ids["run_id"]).first()
    if window.reconciled == "confirmed":
        charge = payments.store.lookup(effect_key)
        assert effect.receipt["charge_id"] == charge["charge_id"]
    run.refresh_from_db()
    assert run.recovery_state == window.state_after_reconcile, run.recovery_reason
    then = store.resume_preview(ids["run_id"], **identity)

    # 6. Four eyes, then the runtime resumes and finishes the run.
    approve_retry(acme, ids["run_id"], rita, april)
    run.refresh_from_db()
    assert run.recovery_state == "retry_approved"
    token_before = run.fencing_token
    for _ in range(2):  # a preview never consumes the approval or fences the owner
        again = store.resume_preview(ids["run_id"])
        assert (again["action"], again["reason"]) == ("retry", "retry_approved")
    run.refresh_from_db()
    assert (run.recovery_state, run.fencing_token) == ("retry_approved", token_before)

    resumed = resume_worker(ids["run_id"])

    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.result["action"], resumed.result["outcome"]) == ("retry", "completed")
    run.refresh_from_db()
    assert run.recovery_state == "completed", run.recovery_reason
    assert run.fencing_token > token_before
    effects = list(Effect.objects.filter(run=run))
    assert [e.state for e in effects] == ["confirmed"]
    assert executions() == 1
    requests = payments.store.received[effect_key]
    if window.reconciled in ("confirmed", "nothing in doubt") and window.executions_before:
        assert requests == 1  # a confirmed effect replays its receipt: never called again
    assert store.resume_preview(ids["run_id"])["action"] == "replay"

    ROWS[window.id] = (
        window.id, window.state, "/".join(window.decision), reconciliation,
        f"{window.state_after_reconcile}, {then['action']}/{then['reason']}",
        window.executions_before, f"{resumed.result['action']} -> {run.recovery_state} "
        f"(effect attempt {effects[0].attempt})", executions(), requests,
    )


def test_a_second_resumer_gets_nothing_once_the_retry_is_claimed(
        acme, rita, april, run_worker, resume_worker, payments, store):
    """Two restarted runtimes, one approval: only one claim consumes it."""
    worker = run_worker(die_at="after_intent")
    assert worker.returncode == KILLED
    sweep_after_lease_expiry(acme, worker.run_id)
    approve_retry(acme, worker.run_id, rita, april)

    first = store.resume(worker.run_id)
    second = resume_worker(worker.run_id)

    assert (first["action"], first["reason"]) == ("retry", "retry_approved")
    assert store.fencing_token == first["fencing_token"]
    assert second.returncode == 5, second.stderr
    assert second.result["outcome"] == "not_resumed"
    assert second.result["action"] == "reject"
    assert "Nothing was done" in second.stderr
    assert Run.objects.get(uuid=worker.run_id).recovery_state != "retry_approved"
    assert payments.store.executions(worker.order_id) == 0
