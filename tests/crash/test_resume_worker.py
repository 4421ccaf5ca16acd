"""``python -m checkpoints.demo.worker --resume``: every resume decision, real processes.

The worker previews the decision to find the checkpoint, takes the shape and the order
from the stored payload, claims the decision (``POST …/resume``) with its own identity and
acts on it: ``continue`` and ``retry`` finish the run, ``replay`` does nothing and shows
the recorded outcome, ``reject`` and ``reconcile`` do nothing and say why (exit 5).
The crash matrix (``test_crash_matrix``) covers ``retry`` in every window.
"""

from __future__ import annotations

import signal
import uuid

import pytest

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Effect, Run
from recovery_client.client import CheckpointError, HttpCheckpointStore, next_revision, now_ms
from tests.helpers import age_world

from .conftest import approve_retry, sweep_after_lease_expiry

pytestmark = pytest.mark.django_db(transaction=True)

KILLED = -signal.SIGKILL
EXIT_REFUSED, EXIT_NOT_RESUMED = 4, 5


def the_run(tenant, run_id) -> Run:
    return Run.objects.get(tenant=tenant, uuid=run_id)


@pytest.mark.parametrize("shape", ["order", "agent"])
def test_it_continues_a_stable_run_to_completion(shape, acme, run_worker, resume_worker,
                                                 payments):
    created = run_worker(shape=shape, extra=["--create-only"])
    assert created.returncode == 0, created.stderr

    resumed = resume_worker(created.run_id)

    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.result["action"], resumed.result["outcome"]) == ("continue", "completed")
    assert resumed.result["shape"] == shape
    run = the_run(acme, created.run_id)
    assert run.recovery_state == "completed"
    assert [e.state for e in Effect.objects.filter(run=run)] == ["confirmed"]
    assert payments.store.executions(created.order_id) == 1
    assert run.fencing_token == 1  # the lease it took; nobody else ever owned the run


def test_it_replays_a_completed_run_and_executes_nothing(acme, run_worker, resume_worker,
                                                        payments):
    done = run_worker()
    assert done.returncode == 0, done.stderr
    requests = sum(payments.store.received.values())
    revision = the_run(acme, done.run_id).latest_checkpoint.revision

    resumed = resume_worker(done.run_id)

    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.result["action"], resumed.result["outcome"]) == ("replay", "replayed")
    assert resumed.result["recorded"] == {"phase": "completed",
                                          "charge_id": done.result["receipt"]["charge_id"]}
    assert sum(payments.store.received.values()) == requests
    assert the_run(acme, done.run_id).latest_checkpoint.revision == revision
    assert payments.store.executions(done.order_id) == 1


def test_it_refuses_an_in_flight_run_without_an_approved_retry(acme, run_worker,
                                                               resume_worker, payments):
    dead = run_worker(die_at="after_intent")
    assert dead.returncode == KILLED
    sweep_after_lease_expiry(acme, dead.run_id)
    token = the_run(acme, dead.run_id).fencing_token

    resumed = resume_worker(dead.run_id)

    assert resumed.returncode == EXIT_NOT_RESUMED
    assert (resumed.result["action"], resumed.result["reason"]) == ("reject", "in_flight")
    assert "not resumed" in resumed.stderr and "request" in resumed.stderr
    assert "Nothing was done" in resumed.stderr
    run = the_run(acme, dead.run_id)
    assert (run.recovery_state, run.fencing_token) == ("ambiguous", token)
    assert run.latest_checkpoint.revision == 1
    assert not Effect.objects.filter(run=run).exists()
    assert payments.store.executions(dead.order_id) == 0


def test_it_asks_for_reconciliation_when_an_effect_is_in_doubt(acme, run_worker,
                                                               resume_worker, payments):
    dead = run_worker(die_at="after_submitted")
    assert dead.returncode == KILLED
    sweep_after_lease_expiry(acme, dead.run_id)

    resumed = resume_worker(dead.run_id)

    assert resumed.returncode == EXIT_NOT_RESUMED
    assert (resumed.result["action"], resumed.result["reason"]) == ("reconcile",
                                                                    "effects_in_doubt")
    assert "reconcile" in resumed.stderr
    assert Effect.objects.get(run__uuid=dead.run_id).state == "unresolved"
    assert sum(payments.store.received.values()) == 0


def test_it_refuses_a_run_of_another_definition_version(acme, store, resume_worker, payments):
    """The worker claims with its own identity (acme.order v1); a v2 run is not its own."""
    run_id, cid = str(uuid.uuid4()), str(uuid.uuid4())
    store.compare_and_swap({"id": cid, "run_id": run_id, "revision": 0, "kind": "acme.order",
                            "schema_version": 1, "updated_at_ms": now_ms(),
                            "payload": {"phase": "ready", "order_id": "V2-1",
                                        "amount_cents": 100, "workflow": "acme.order",
                                        "definition_version": "2"}}, None)

    resumed = resume_worker(run_id)

    assert resumed.returncode == EXIT_NOT_RESUMED
    assert (resumed.result["action"], resumed.result["reason"]) == ("reject",
                                                                    "identity_mismatch")
    assert the_run(acme, run_id).latest_checkpoint.revision == 0
    assert payments.store.executions("V2-1") == 0


def test_it_leaves_a_kind_it_does_not_know_alone(acme, store, resume_worker):
    run_id, cid = str(uuid.uuid4()), str(uuid.uuid4())
    store.compare_and_swap({"id": cid, "run_id": run_id, "revision": 0, "kind": "acme.invoice",
                            "schema_version": 1, "updated_at_ms": now_ms(),
                            "payload": {"phase": "ready"}}, None)

    resumed = resume_worker(run_id)

    assert resumed.returncode == EXIT_NOT_RESUMED
    assert resumed.result["reason"] == "unsupported_kind"
    assert not AuditEvent.objects.filter(action__startswith="retry.").exists()


def test_it_reports_a_run_that_does_not_exist(resume_worker):
    resumed = resume_worker(str(uuid.uuid4()))

    assert resumed.returncode == EXIT_REFUSED
    assert resumed.result["outcome"] == "refused"
    assert "not_found" in resumed.stderr


def test_a_retried_worker_fences_the_old_owner(acme, rita, april, live_server, run_worker,
                                              resume_worker, writer_token, payments):
    """The zombie that held the run before the retry cannot write after it."""
    dead = run_worker(die_at="after_intent")
    sweep_after_lease_expiry(acme, dead.run_id)
    approve_retry(acme, dead.run_id, rita, april)
    old_token = the_run(acme, dead.run_id).fencing_token

    resumed = resume_worker(dead.run_id)
    zombie = HttpCheckpointStore(live_server.url, "acme", writer_token)
    zombie.fencing_token = old_token
    latest = zombie.load(dead.checkpoint_id)

    assert resumed.returncode == 0, resumed.stderr
    assert the_run(acme, dead.run_id).recovery_state == "completed"
    with pytest.raises(CheckpointError) as err:
        zombie.compare_and_swap(next_revision(latest, dict(latest["payload"],
                                                           phase="cancelled")),
                                latest["revision"])
    assert (err.value.kind, err.value.error) == ("conflict", "fenced")
    run = the_run(acme, dead.run_id)
    assert run.recovery_state == "conflicted"  # the zombie's write is kept, and shown
    assert run.latest_checkpoint.revision == latest["revision"]
    assert payments.store.executions(dead.order_id) == 1


def test_it_leaves_a_closed_run_alone(acme, rita, run_worker, resume_worker, payments):
    dead = run_worker(die_at="after_intent")
    sweep_after_lease_expiry(acme, dead.run_id)
    services.run_close(actor=rita, tenant=acme, run_id=uuid.UUID(dead.run_id),
                       reason="refunded by hand")

    resumed = resume_worker(dead.run_id)

    assert resumed.returncode == EXIT_NOT_RESUMED
    assert (resumed.result["action"], resumed.result["reason"]) == ("reject", "closed")
    assert "closed" in resumed.stderr
    assert the_run(acme, dead.run_id).recovery_state == "closed"
    assert payments.store.executions(dead.order_id) == 0


def test_it_resumes_a_run_the_operator_migrated_to_v2(acme, run_worker, resume_worker,
                                                      payments):
    """A stranded v1 order, migrated to v2 (``services.checkpoints_migrate``, what
    ``manage.py migrate_checkpoints acme.order --to 2 --run RUN`` calls), is resumed by
    the demo worker as the supervisor starts it: it reads v2's ``amount.cents``, charges
    that amount once and writes the rest of the run in v2."""
    created = run_worker(extra=["--create-only", "--schema-version", "1"])
    assert created.returncode == 0, created.stderr
    assert the_run(acme, created.run_id).schema_version == 1  # the code before v2
    age_world(3600)  # its owner is gone: the migration is not refused owner_live
    report = services.checkpoints_migrate(actor=None, tenant=acme, kind="acme.order",
                                          to_version=2, run_ids=[created.run_id])
    assert report.counts["migrated"] == 1

    resumed = resume_worker(created.run_id)

    assert resumed.returncode == 0, resumed.stderr
    assert (resumed.result["action"], resumed.result["outcome"]) == ("continue", "completed")
    run = the_run(acme, created.run_id)
    assert (run.recovery_state, run.schema_version) == ("completed", 2)
    cp = Checkpoint.objects.get(uuid=created.checkpoint_id)
    payload = services.checkpoint_envelope(cp)["payload"]
    assert (payload["phase"], payload["amount"]) == ("completed",
                                                     {"cents": 2599, "currency": "USD"})
    assert set(CheckpointRevision.objects.filter(checkpoint=cp)
               .values_list("schema_version", flat=True)) == {1, 2}
    assert payments.store.executions(created.order_id) == 1
    assert [c["amount_cents"] for c in payments.store.charges(created.order_id)] == [2599]
