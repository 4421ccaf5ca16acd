"""Checkpoint compare-and-swap through ``services.checkpoint_put`` (CONTRACT.md 3, RUNIFOLD.md 1)."""

from __future__ import annotations

import uuid

import pytest

from checkpoints.exceptions import Forbidden, InvalidPayload, NotFound, StaleRevision
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Conflict, Run
from tests.helpers import envelope, put_checkpoint


def _run(body) -> Run:
    return Run.objects.get(uuid=body["run_id"])


def test_it_creates_at_revision_0_with_history_and_an_audit_event(acme, wendy):
    body = envelope()
    cp = put_checkpoint(wendy, acme, body)
    assert (cp.revision, cp.phase_class, cp.written_by) == (0, "stable", wendy)
    assert list(cp.revisions.values_list("revision", flat=True)) == [0]
    run = _run(body)
    assert run.latest_checkpoint == cp
    assert run.workflow == "acme.order"
    event = AuditEvent.objects.get(action="checkpoint.write")
    assert (event.actor, event.after["revision"], event.run_uuid) == (wendy, 0, run.uuid)


def test_it_updates_one_revision_at_a_time(acme, wendy):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    for n in range(3):
        phase = ["charging", "charged", "completed"][n]
        cp = put_checkpoint(wendy, acme, dict(body, revision=n + 1, payload={"phase": phase}),
                            expected=n)
    assert cp.revision == 3
    assert list(CheckpointRevision.objects.filter(checkpoint=cp).values_list(
        "revision", "phase_class")) == [(0, "stable"), (1, "in_flight"), (2, "stable"),
                                        (3, "completed")]
    assert _run(body).recovery_state == "completed"


def test_it_refuses_a_stale_update_and_keeps_the_conflict(acme, wendy):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(StaleRevision) as exc:
        put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "cancelled"}),
                       expected=0)
    assert exc.value.current_revision == 1
    assert exc.value.body() == {"error": "conflict", "current_revision": 1}
    # The refusal is committed, not rolled back with the exception.
    conflict = Conflict.objects.get()
    assert (conflict.expected_revision, conflict.actual_revision,
            conflict.attempted_revision, conflict.writer_name) == (0, 1, 1, "wendy")
    assert conflict.refused_ciphertext and "cancelled" not in conflict.refused_ciphertext
    run = _run(body)
    assert run.unacknowledged_conflicts == 1
    assert run.recovery_state == "conflicted"
    assert AuditEvent.objects.filter(action="checkpoint.conflict").count() == 1
    # The refused write changed nothing.
    cp = Checkpoint.objects.get()
    assert cp.revision == 1
    assert CheckpointRevision.objects.count() == 2


def test_it_counts_every_refused_write_on_the_run(acme, wendy):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    for _ in range(3):
        with pytest.raises(StaleRevision):
            put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    assert _run(body).unacknowledged_conflicts == 3
    assert Conflict.objects.count() == 3


def test_it_refuses_a_create_of_an_existing_id_as_a_conflict(acme, wendy):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(StaleRevision) as exc:
        put_checkpoint(wendy, acme, dict(body, run_id=str(uuid.uuid4())))
    assert exc.value.current_revision == 1
    conflict = Conflict.objects.get()
    assert conflict.expected_revision is None
    assert conflict.run == _run(body)  # the run that owns the id
    assert Run.objects.count() == 1


def test_it_answers_not_found_for_an_update_of_a_missing_checkpoint(acme, wendy):
    with pytest.raises(NotFound):
        put_checkpoint(wendy, acme, envelope(revision=1), expected=0)
    assert not Run.objects.exists()
    assert not Conflict.objects.exists()


@pytest.mark.parametrize(("revision", "expected"), [(1, None), (5, None), (2, 0), (0, 0),
                                                    (1, 1)])
def test_it_refuses_a_body_revision_that_is_not_the_next_one(acme, wendy, revision, expected):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    with pytest.raises(InvalidPayload) as exc:
        put_checkpoint(wendy, acme, dict(body, revision=revision), expected=expected)
    assert "revision" in exc.value.detail
    assert not Conflict.objects.exists()
    assert Checkpoint.objects.get().revision == 0


@pytest.mark.parametrize("field", ["run_id", "kind"])
def test_it_never_changes_run_id_or_kind(acme, wendy, field):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    changed = {"run_id": str(uuid.uuid4()), "kind": "acme.invoice"}[field]
    with pytest.raises(InvalidPayload) as exc:
        put_checkpoint(wendy, acme, dict(body, revision=1, **{field: changed}), expected=0)
    assert exc.value.detail.startswith(field)
    assert Checkpoint.objects.get().revision == 0
    assert Run.objects.count() == 1


@pytest.mark.parametrize(("kind", "version", "payload"), [
    ("runifold.workflow", 2, {"workflow": "w"}),
    ("runifold.workflow", 5, {"workflow": "w"}),
    ("acme.invoice", 1, {"phase": "ready"}),
    ("acme.order", 1, {"phase": "teleporting"}),
])
def test_it_stores_an_unsupported_payload_and_flags_the_run(acme, wendy, kind, version,
                                                            payload):
    body = envelope(kind=kind, schema_version=version, payload=payload)
    cp = put_checkpoint(wendy, acme, body)
    assert cp.phase_class == "unsupported"
    run = _run(body)
    assert run.recovery_state == "schema_mismatch"
    assert run.recovery_reason
    assert CheckpointRevision.objects.filter(checkpoint=cp).count() == 1


def test_it_recovers_from_schema_mismatch_when_a_supported_revision_follows(acme, wendy):
    body = envelope(payload={"phase": "teleporting"})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "ready"}), expected=0)
    assert _run(body).recovery_state == "healthy"


def test_it_keeps_the_same_uuid_in_two_tenants_apart(acme, globex, wendy, wes):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wes, globex, body)
    put_checkpoint(wes, globex, dict(body, revision=1), expected=0)
    revisions = dict(Checkpoint.objects.values_list("tenant__slug", "revision"))
    assert revisions == {"acme": 0, "globex": 1}
    assert Run.objects.filter(uuid=body["run_id"]).count() == 2


def test_it_refuses_writers_without_the_right(acme, globex, wendy, vic, rita, omar, wes):
    body = envelope()
    with pytest.raises(Forbidden):
        put_checkpoint(vic, acme, body)
    with pytest.raises(Forbidden):
        put_checkpoint(rita, acme, body)
    with pytest.raises(NotFound):
        put_checkpoint(omar, acme, body)
    with pytest.raises(NotFound):
        put_checkpoint(wes, acme, body)
    assert not Checkpoint.objects.exists()
