"""Process death at each write-ahead boundary (DESIGN.md section 4, issue 2 "Tests").

Each test starts ``checkpoints.demo.worker`` as a real subprocess against the live
server; the worker SIGKILLs itself at one boundary. Once its 1 s lease has really expired
(on the database's clock; the sweep takes no fake ``now``), the run's recovery state and
the resume decision a restarted runtime would get (the preview, which claims nothing)
must be exactly what DESIGN.md section 4 says. ``test_crash_matrix`` takes each window on
to a completed run.
"""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest

from checkpoints import services
from checkpoints.models import Conflict, Effect, Run

from .conftest import ROOT, parse_result, wait_for_lease_expiry, worker_argv, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

KILLED = -signal.SIGKILL


def sweep_after_lease_expiry(tenant, run_id) -> dict:
    wait_for_lease_expiry(tenant, run_id)
    return services.sweep_stale_runs()


def the_run(acme, run_id) -> Run:
    return Run.objects.get(tenant=acme, uuid=run_id)


def test_it_finishes_a_run_when_nobody_dies(acme, run_worker, payments, store):
    worker = run_worker()

    assert worker.returncode == 0, worker.stderr
    run = the_run(acme, worker.run_id)
    assert run.recovery_state == "completed"
    assert [e.state for e in Effect.objects.filter(run=run)] == ["confirmed"]
    assert len(payments.store.charges(worker.order_id)) == 1
    assert store.resume_preview(worker.run_id)["action"] == "replay"


def test_it_leaves_an_in_flight_checkpoint_ambiguous_when_killed_after_intent(
        acme, run_worker, store):
    worker = run_worker(die_at="after_intent")

    assert worker.returncode == KILLED, worker.stderr
    run = the_run(acme, worker.run_id)
    assert run.phase_class == "in_flight"
    # The intent's write judged the lease on the database's clock: live (healthy until
    # the sweep) unless the worker's 1 s lease had already run out when it wrote, as on
    # a loaded machine (a CI run beside two other jobs: stop 34).
    live_at_write = run.last_write_at < run.lease_expires_at
    assert run.recovery_state == ("healthy" if live_at_write else "ambiguous")
    sweep_after_lease_expiry(acme, worker.run_id)
    run.refresh_from_db()
    assert run.recovery_state == "ambiguous"
    assert not Effect.objects.filter(run=run).exists()
    decision = store.resume_preview(worker.run_id, workflow="acme.order")
    assert (decision["action"], decision["reason"]) == ("reject", "in_flight")
    assert decision["revision"] == 1


def test_it_marks_a_submitted_effect_unresolved_when_killed_after_submitted(
        acme, run_worker, payments, store):
    worker = run_worker(die_at="after_submitted")

    assert worker.returncode == KILLED, worker.stderr
    effect = Effect.objects.get(run__uuid=worker.run_id)
    assert effect.state == "submitted"
    stats = sweep_after_lease_expiry(acme, worker.run_id)
    effect.refresh_from_db()
    assert effect.state == "unresolved"
    assert stats["effects_unresolved"] == 1
    assert the_run(acme, worker.run_id).recovery_state == "ambiguous"
    decision = store.resume_preview(worker.run_id)
    assert (decision["action"], decision["reason"]) == ("reconcile", "effects_in_doubt")
    assert payments.store.charges(worker.order_id) == []  # the call never went out


def test_it_reconciles_a_charge_made_just_before_the_kill(acme, rita, run_worker, payments,
                                                          store):
    worker = run_worker(die_at="after_call")

    assert worker.returncode == KILLED, worker.stderr
    assert len(payments.store.charges(worker.order_id)) == 1  # the remote call happened
    sweep_after_lease_expiry(acme, worker.run_id)
    effect = Effect.objects.get(run__uuid=worker.run_id)
    assert effect.state == "unresolved"
    assert the_run(acme, worker.run_id).recovery_state == "ambiguous"
    assert store.resume_preview(worker.run_id)["action"] == "reconcile"

    services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(worker.run_id),
                           reason="worker died after the charge")

    effect.refresh_from_db()
    charges = payments.store.charges(worker.order_id)
    assert effect.state == "confirmed"
    assert len(charges) == 1
    assert effect.receipt["charge_id"] == charges[0]["charge_id"]
    decision = store.resume_preview(worker.run_id)
    assert (decision["action"], decision["reason"]) == ("reject", "in_flight")


def test_it_keeps_a_confirmed_effect_but_rejects_resume_when_killed_after_confirmed(
        acme, run_worker, payments, store):
    worker = run_worker(die_at="after_confirmed")

    assert worker.returncode == KILLED, worker.stderr
    sweep_after_lease_expiry(acme, worker.run_id)
    run = the_run(acme, worker.run_id)
    effect = Effect.objects.get(run=run)
    assert effect.state == "confirmed"
    assert effect.receipt["charge_id"] == payments.store.charges(worker.order_id)[0]["charge_id"]
    assert run.phase_class == "in_flight"
    assert run.recovery_state == "ambiguous"
    decision = store.resume_preview(worker.run_id)
    assert (decision["action"], decision["reason"]) == ("reject", "in_flight")


def test_it_answers_unknown_for_an_agent_tool_call_without_lookup(acme, rita, run_worker,
                                                                   store):
    worker = run_worker(shape="agent", die_at="after_call")

    assert worker.returncode == KILLED, worker.stderr
    sweep_after_lease_expiry(acme, worker.run_id)
    run = the_run(acme, worker.run_id)
    assert run.recovery_state == "ambiguous"
    assert run.phase_label == "turn_in_flight turn 1"
    decision = store.resume_preview(worker.run_id, agent="refund-assistant",
                                    model="openai/gpt-4.1-mini")
    assert decision["action"] == "reconcile"

    services.run_reconcile(actor=rita, tenant=acme, run_id=run.uuid, reason="crm call lost")

    effect = Effect.objects.get(run=run)
    run.refresh_from_db()
    assert (effect.service, effect.state) == ("crm", "unknown")
    assert run.recovery_state == "unknown_outcome"
    decision = store.resume_preview(worker.run_id)
    assert (decision["action"], decision["reason"]) == ("reject", "outcome_unknown")


def test_it_lets_exactly_one_of_two_racing_workers_win(acme, live_server, payments,
                                                       writer_token, tmp_path):
    ids = dict(run_id=str(uuid.uuid4()), checkpoint_id=str(uuid.uuid4()), order_id="A-RACE")
    env = worker_env(writer_token)
    setup = subprocess.run(worker_argv(live_server, payments, **ids, extra=["--create-only"]),
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert setup.returncode == 0, setup.stderr
    race = ["--race-dir", str(tmp_path / "barrier"), "--race-parties", "2"]
    procs = [subprocess.Popen(worker_argv(live_server, payments, **ids, extra=race), env=env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    results = sorted((p.returncode, parse_result(out)["outcome"], parse_result(out))
                     for p, (out, _err) in zip(procs, outs, strict=True))

    assert [(code, outcome) for code, outcome, _ in results] == [(0, "completed"),
                                                                 (3, "lost_race")]
    assert (results[1][2]["status"], results[1][2]["error"]) == (412, "conflict")
    assert results[1][2]["current_revision"] == 1
    run = the_run(acme, ids["run_id"])
    conflicts = list(Conflict.objects.filter(run=run))
    assert [(c.expected_revision, c.actual_revision, c.writer_name) for c in conflicts] == [
        (0, 1, "wendy")]
    assert run.recovery_state == "conflicted"
    assert len(payments.store.charges("A-RACE")) == 1
