"""runifold in and out (issue 10, item 4): ``import_runifold`` / ``export_runifold`` and
``interop.runifold`` against the fixtures in ``tests/fixtures/runifold/`` (written by us
from RUNIFOLD.md 1-4; ids and values invented): every supported kind, version and phase,
every effect status, a history file, and a file of bad lines (one per rule).

What is checked: the round trip (import -> export -> the same JSON after key sorting),
one error per bad line with the others imported, re-import writing nothing (no row, no
audit event), the recovery states of imported runs, tenant isolation, fencing, the
database refusing a batch, and (on PostgreSQL) a 100,000-line import in bounded memory
and two imports of one file at once.
"""

from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from checkpoints import services
from checkpoints.exceptions import Forbidden, NotFound, RunDeleted
from checkpoints.interop import runifold
from checkpoints.interop.runifold import jsonl_lines
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Effect,
    EffectRevision,
    Run,
    RunSubject,
)
from checkpoints.services.runs import run_facts, run_facts_many
from checkpoints.vocab import AuditAction, EffectClass, EffectState, PhaseClass, RecoveryState
from tests import runifold_synth
from tests.helpers import age_world
from tests.matrixhelpers import db_diff, db_state

FIXTURES = Path(__file__).parent / "fixtures" / "runifold"
#: Import order: an effect line without run_id needs its agent checkpoint first.
FILES = ("agent.v1", "workflow.v3", "workflow.v4", "effects", "history")

B_ID = "0193a4f2-6c1e-7b3a-9d42-5e8f1c0a7b21"  # agent.v1: turn_in_flight turn 2
B_RUN = "0193a4f2-6b90-7c55-8a10-3f2d9e4b6c07"


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()
            if line.strip()]


def canonical(lines) -> list[str]:
    """Each line as JSON with sorted keys, sorted: what "identical" compares."""
    return sorted(json.dumps(json.loads(x) if isinstance(x, str | bytes) else x,
                             sort_keys=True) for x in lines)


def latest(recs: list[dict]) -> list[dict]:
    """The highest revision of each checkpoint and effect: what export writes without
    --history."""
    best: dict[tuple, dict] = {}
    for r in recs:
        key = ("c", r["id"]) if "kind" in r else ("e", r["request"]["effect_id"])
        if key not in best or r["revision"] > best[key]["revision"]:
            best[key] = r
    return list(best.values())


def run_import(path, tenant="acme", **kw) -> tuple[str, str]:
    """``import_runifold``; returns (stdout, stderr); raises CommandError on failed lines."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("import_runifold", str(path), tenant=tenant, stdout=out, stderr=err, **kw)
    except CommandError as exc:
        exc.out, exc.err = out.getvalue(), err.getvalue()
        raise
    return out.getvalue(), err.getvalue()


def run_export(tmp_path, tenant="acme", name="out.jsonl", **kw) -> tuple[list[str], str]:
    out = io.StringIO()
    target = tmp_path / name
    call_command("export_runifold", str(target), tenant=tenant, stdout=out, **kw)
    return target.read_text().splitlines(), out.getvalue()


def import_fixtures(tenant="acme", files=FILES) -> None:
    for name in files:
        run_import(FIXTURES / f"{name}.jsonl", tenant)


def service_import(tenant, data: bytes, **kw):
    errors = []
    report = runifold.runifold_import(actor=None, tenant=tenant,
                                      lines=jsonl_lines(io.BytesIO(data)),
                                      on_error=lambda n, d: errors.append((n, d)), **kw)
    return report, errors


# --------------------------------------------------------------------------------------
# The fixtures cover what the issue lists
# --------------------------------------------------------------------------------------

def test_the_fixtures_cover_every_kind_version_phase_and_effect_status():
    phases = {}
    for name in FILES:
        for r in records(name):
            if "kind" in r:
                phases.setdefault((r["kind"], r["schema_version"]), set()).add(
                    r["payload"]["phase"]["state"])
    workflow = {"ready", "step_in_flight", "parallel_in_flight", "race_in_flight", "completed"}
    assert phases[("runifold.agent", 1)] == {"ready_for_turn", "turn_in_flight", "completed"}
    assert phases[("runifold.workflow", 3)] == workflow
    assert phases[("runifold.workflow", 4)] == workflow | {"waiting"}
    statuses = {r["status"]["state"] for r in records("effects")}
    assert statuses == {"prepared", "started", "completed", "failed"}
    # One record per id in the files without history, so export writes them all back.
    for name in FILES[:-1]:
        assert len(latest(records(name))) == len(records(name)), name


# --------------------------------------------------------------------------------------
# Round trip
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_import_then_export_gives_the_fixtures_back(acme, tmp_path):
    import_fixtures()
    everything = [r for name in FILES for r in records(name)]
    lines, summary = run_export(tmp_path)
    assert canonical(lines) == canonical(latest(everything))
    assert "checkpoint line(s)" in summary and "left out" not in summary
    history, _ = run_export(tmp_path, name="history.jsonl", history=True)
    assert canonical(history) == canonical(everything)
    # Each line as export writes it: compact JSON with sorted keys.
    assert all(line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"),
                                  ensure_ascii=False) for line in lines + history)
    # Checkpoints first: an effect line may need its agent checkpoint imported before it.
    kinds = ["kind" in json.loads(line) for line in history]
    assert kinds == sorted(kinds, reverse=True)


@pytest.mark.django_db
def test_what_export_writes_imports_into_another_tenant_and_exports_the_same(acme, globex,
                                                                             tmp_path):
    import_fixtures()
    history, _ = run_export(tmp_path, history=True)
    out, _ = run_import(tmp_path / "out.jsonl", "globex")
    assert f"{len(history)} line(s) imported" in out
    again, _ = run_export(tmp_path, "globex", name="again.jsonl", history=True)
    assert canonical(again) == canonical(history)
    # And into the tenant it came from: everything is already there.
    out, _ = run_import(tmp_path / "out.jsonl", "acme")
    assert f"0 line(s) imported, {len(history)} skipped as already present, 0 failed" in out


@pytest.mark.django_db
def test_a_line_that_names_a_derivable_run_is_written_back_without_it(acme, tmp_path):
    """An explicit run_id equal to the one the agent key leads to is redundant: export
    leaves it out, and importing that gives the same effect (docs/runifold.md)."""
    import_fixtures(files=("agent.v1",))
    record = dict(records("effects")[0], run_id=B_RUN)
    report, errors = service_import(acme, json.dumps(record).encode())
    assert (report.imported, errors) == (1, [])
    lines, _ = run_export(tmp_path)
    (effect_line,) = [json.loads(x) for x in lines if "request" in json.loads(x)]
    assert "run_id" not in effect_line
    assert effect_line == {k: v for k, v in record.items() if k != "run_id"}


# --------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_importing_again_writes_nothing_at_all(acme):
    import_fixtures()
    events = AuditEvent.objects.filter(tenant=acme).count()
    before = db_state()
    for name in FILES:
        out, err = run_import(FIXTURES / f"{name}.jsonl")
        n = len(records(name))
        assert out.strip().endswith(f"0 line(s) imported, {n} skipped as already present, "
                                    f"0 failed ({n} line(s) read)"), out
        assert err == ""
    assert AuditEvent.objects.filter(tenant=acme).count() == events
    assert db_diff(before, db_state()) == {}


@pytest.mark.django_db
def test_the_commands_read_stdin_and_write_stdout(acme, monkeypatch, capsysbinary):
    data = (FIXTURES / "agent.v1.jsonl").read_bytes()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    out, _ = run_import("-", no_progress=True)
    assert "3 line(s) imported" in out
    err = io.StringIO()
    call_command("export_runifold", "-", tenant="acme", no_progress=True, stderr=err)
    assert canonical(capsysbinary.readouterr().out.decode().splitlines()) == canonical(
        data.decode().splitlines())
    assert "3 checkpoint line(s) and 0 effect line(s) exported" in err.getvalue()


@pytest.mark.django_db
def test_each_written_line_is_one_audit_event_in_the_tenants_chain(acme):
    import_fixtures()
    events = Counter(AuditEvent.objects.filter(tenant=acme).values_list("action", flat=True))
    everything = [r for name in FILES for r in records(name)]
    assert events[AuditAction.CHECKPOINT_IMPORT] == sum("kind" in r for r in everything)
    assert events[AuditAction.EFFECT_IMPORT] == sum("request" in r for r in everything)
    assert services.audit_verify(tenant=acme)[0]
    event = AuditEvent.objects.get(tenant=acme, action=AuditAction.EFFECT_IMPORT,
                                   target_ref="0193a4f2-8b13-7a2a-84d5-2e6f708192a3")
    assert event.actor_name == "system" and str(event.run_uuid) == B_RUN
    assert event.after == {"revision": 1, "state": "unresolved", "runifold_state": "started",
                           "operation_key": f"{B_ID}:agent:refund-assistant:turn:2:call:0",
                           "service": "tool:0190c2d1-44aa-7b10-8e21-6a7b8c9d0e1f"}


# --------------------------------------------------------------------------------------
# Bad lines
# --------------------------------------------------------------------------------------

#: bad.jsonl, line by line: the start of its error, or None for a good line. Line 17 is
#: blank (skipped, not counted); line 18 repeats line 1 (skipped as already present).
BAD = {
    1: None,
    2: "record: malformed JSON",
    3: "record: must be a JSON object",
    4: "record: duplicated key 'revision'",
    5: "record: neither a checkpoint envelope",
    6: "record: has both",
    7: "id: 'not-a-uuid' is not a UUID",
    8: "owner: unknown field",
    9: "kind: must be runifold.agent or runifold.workflow",
    10: "schema_version: runifold.workflow v2 is not supported (supported: 3, 4)",
    11: "payload: does not match runifold.agent v1: payload.phase.state must be one of",
    12: "revision: must be an integer in 0..9223372036854775807",
    13: "updated_at_ms: must be an integer in 0..9223372036854775807",
    14: "record.payload.transcript[1].content[0].text: U+0000 is not allowed",
    15: "record.payload.usage.tokens: NaN is not allowed",
    16: "record: nesting deeper than 64 levels",
    18: None,
    19: "revision: revision 0 of checkpoint 0193c000-0a0b-7c0d-8e0f-000000000001 is stored "
        "with other content",
    20: "revision: the store holds revision 0 of checkpoint 0193c000-0a0b-7c0d-8e0f-"
        "000000000001; the next line for it must be revision 1",
    21: "run_id: checkpoint 0193c000-0a0b-7c0d-8e0f-000000000001 belongs to run",
    22: None,
    23: "owner: unknown field",
    24: "status.state: must be one of prepared, started, completed, failed",
    25: "status.output: required when completed",
    26: "status.error: must be an object (RunError)",
    27: "request.effect_class: must be one of",
    28: "request.kind: must be one of Model, Tool, Agent, Approval, Wait",
    29: "request.effect_id: 'x' is not a UUID",
    30: "status.state: a started record is at least revision 1",
    31: "revision: a prepared record is revision 0",
    32: "run_id: required",
    33: "run_id: required",
    34: "request.idempotency_key: at most 512 characters",
    35: None,
    36: "request.idempotency_key: already used by effect 0193c000-1b2c-7d3e-8f40-000000000001",
    37: "revision: revision 0 of effect 0193c000-1b2c-7d3e-8f40-000000000001 is stored with "
        "other content",
    38: "run_id: effect 0193c000-1b2c-7d3e-8f40-000000000001 belongs to run",
    39: "request.kind: the extension name makes the service",
    40: "request.input: required",
    41: "status.error: retry_safety must be one of",
    42: None,
    43: None,
    44: "status.state: effect 0193c000-1b2c-7d3e-8f40-000000000001 is confirmed in this store",
}


@pytest.mark.django_db
def test_each_bad_line_gets_its_own_error_and_the_good_lines_import(acme):
    with pytest.raises(CommandError) as raised:
        run_import(FIXTURES / "bad.jsonl")
    err = raised.value.err.splitlines()
    failing = {n: start for n, start in BAD.items() if start}
    assert len(err) == len(failing), err
    for line, (number, start) in zip(err, sorted(failing.items()), strict=True):
        assert line.startswith(f"line {number}: {start}"), (line, start)
    assert raised.value.out.strip().endswith(
        f"5 line(s) imported, 1 skipped as already present, {len(failing)} failed "
        f"(43 line(s) read)")
    assert "line(s) failed" in str(raised.value)
    # The good lines are there: the checkpoint at revision 1, the effect confirmed.
    cp = Checkpoint.objects.get(tenant=acme, uuid="0193c000-0a0b-7c0d-8e0f-000000000001")
    assert (cp.revision, cp.phase_class) == (1, PhaseClass.IN_FLIGHT)
    effect = Effect.objects.get(tenant=acme, uuid="0193c000-1b2c-7d3e-8f40-000000000001")
    assert (effect.revision, effect.state) == (2, EffectState.CONFIRMED)
    assert effect.receipt == {"order": "A-1043", "found": True}
    assert Run.objects.filter(tenant=acme).count() == 1  # no run made by a bad line
    # And the rejected revision 0 kept its first content.
    assert CheckpointRevision.objects.get(checkpoint=cp, revision=0).updated_at_ms \
        == json.loads((FIXTURES / "bad.jsonl").read_text().splitlines()[0])["updated_at_ms"]


@pytest.mark.django_db
def test_bytes_that_are_not_utf8_and_lines_past_the_limit_are_errors_of_their_own(
        acme, settings):
    good = (FIXTURES / "agent.v1.jsonl").read_bytes().splitlines()
    settings.RECOVERY_MAX_BODY_BYTES = 4096
    data = b"\n".join([good[0], b'{"kind": "\xff\xfe"}', b'{"x": "' + b"y" * 9000 + b'"}',
                       good[1]]) + b"\n"
    report, errors = service_import(acme, data)
    assert (report.lines, report.imported, report.failed) == (4, 2, 2)
    assert errors[0][0] == 2 and errors[0][1].startswith("record: not UTF-8")
    assert errors[1] == (3, "record: longer than 4096 bytes (RECOVERY_MAX_BODY_BYTES)")


def test_the_line_reader_keeps_one_line_in_memory_and_counts_every_byte():
    data = b'{"a": 1}\n' + b"x" * 50_000 + b"\n\n" + b'{"b": 2}'
    lines = list(jsonl_lines(io.BytesIO(data), max_bytes=1000))
    assert [(x.number, x.data) for x in lines] == [
        (1, b'{"a": 1}\n'), (2, None), (3, b"\n"), (4, b'{"b": 2}')]
    assert sum(x.size for x in lines) == len(data)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_the_line_limit_counts_a_line_without_its_ending(ending):
    def line(n):
        return b'{"a": "' + b"x" * (n - 9) + b'"}'

    data = line(1000) + ending + line(1001) + ending + line(1000) + ending + line(1000)
    lines = list(jsonl_lines(io.BytesIO(data), max_bytes=1000))
    assert [x.data for x in lines] == [line(1000) + ending, None, line(1000) + ending,
                                       line(1000)]
    assert sum(x.size for x in lines) == len(data)
    assert list(jsonl_lines(io.BytesIO(line(1001)), max_bytes=1000))[0].data is None


# --------------------------------------------------------------------------------------
# What imported runs look like
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_imported_runs_get_their_recovery_states(acme, wendy):
    import_fixtures()
    b = Run.objects.get(tenant=acme, uuid=B_RUN)
    # An in-flight checkpoint is in flight: a restarting runtime is told to do nothing.
    assert (b.phase_class, b.phase_label) == (PhaseClass.IN_FLIGHT, "turn_in_flight turn 2")
    assert (b.agent, b.model) == ("refund-assistant", "openai/gpt-4.1-mini")
    answer = services.resume_preview(actor=wendy, tenant=acme, run_id=b.uuid, asked={})
    assert (answer["action"], answer["reason"], answer["revision"]) == (
        "reconcile", "effects_in_doubt", 3)  # its started call comes first (below)
    step = records("workflow.v3")[1]  # step_in_flight; its one effect completed
    answer = services.resume_preview(actor=wendy, tenant=acme,
                                     run_id=uuid.UUID(step["run_id"]), asked={})
    assert (answer["action"], answer["reason"]) == ("reject", "in_flight")
    # Its started effect is in doubt at once, so the run is ambiguous and names it.
    assert b.recovery_state == RecoveryState.AMBIGUOUS
    assert "unresolved" in b.recovery_reason and "turn:2:call:0" in b.recovery_reason
    effects = {str(e.uuid): e for e in Effect.objects.filter(tenant=acme)}
    started = effects["0193a4f2-8b13-7a2a-84d5-2e6f708192a3"]
    assert (started.state, started.revision, started.submitted_at is not None) == (
        EffectState.UNRESOLVED, 1, True)
    done = effects["0193a4f2-7a02-7e19-b3c4-1d5e6f708192"]
    assert done.state == EffectState.CONFIRMED and done.receipt == records("effects")[0][
        "status"]["output"]
    assert effects["0193a4f2-8b13-7c02-95e6-3f708192a3b4"].state == EffectState.PLANNED
    failed = effects["0193a6e1-9c00-7a11-8b22-3c4d5e6f7a8b"]
    assert failed.state == EffectState.FAILED and failed.receipt["retry_safety"] == "Safe"
    # A completed output that is not an object is kept wrapped, and written back as it was.
    assert effects["0193a7c3-2f33-7041-acbd-3e4f5a6b7c8d"].receipt == {"runifold_output": "low"}
    # Service, key, class and fingerprint (module doc of interop.runifold).
    assert (done.service, done.operation_key, done.effect_class) == (
        "tool:0190c2d1-44aa-7b10-8e21-6a7b8c9d0e1f",
        f"{B_ID}:agent:refund-assistant:turn:1:call:0", EffectClass.NON_IDEMPOTENT)
    assert failed.service == "acme.webhook:0190c2d1-5511-7c20-9f31-7b8c9d0e1f2a"
    assert failed.effect_class == EffectClass.IDEMPOTENT  # keyed IdempotentWrite
    assert effects["0193a7c4-1e22-7f30-9bac-2d3e4f5a6b7c"].effect_class \
        == EffectClass.NON_IDEMPOTENT  # Destructive
    pure = effects["0193a7c3-2f33-7041-acbd-3e4f5a6b7c8d"]
    assert (pure.effect_class, pure.operation_key) == (EffectClass.READ_ONLY, str(pure.uuid))
    import hashlib

    request = records("effects")[0]["request"]
    canonical_request = json.dumps(request, sort_keys=True, separators=(",", ":"))
    assert done.request_fingerprint == hashlib.sha256(canonical_request.encode()).hexdigest()
    # The other phases: completed runs are completed, waiting ones stable, a workflow
    # whose charge_back step started a call is ambiguous.
    states = {}
    for r in records("agent.v1") + records("workflow.v3") + records("workflow.v4"):
        run = Run.objects.get(tenant=acme, uuid=r["run_id"])
        states.setdefault(r["payload"]["phase"]["state"], set()).add(
            (run.phase_class, run.recovery_state))
    assert states["completed"] == {(PhaseClass.COMPLETED, RecoveryState.COMPLETED)}
    assert states["waiting"] == {(PhaseClass.STABLE, RecoveryState.HEALTHY)}
    assert states["ready"] == {(PhaseClass.STABLE, RecoveryState.HEALTHY)}
    assert (PhaseClass.IN_FLIGHT, RecoveryState.AMBIGUOUS) in states["step_in_flight"]


@pytest.mark.django_db
def test_the_state_counters_count_what_an_import_wrote(acme, globex):
    """The counters' triggers fire for the import's batched inserts (COPY on PostgreSQL)
    and its run updates as for every other write (migration 0011)."""
    from tests.services.test_state_counts import assert_counts

    import_fixtures()
    with pytest.raises(CommandError):
        run_import(FIXTURES / "bad.jsonl")
    assert_counts(acme, globex)


@pytest.mark.django_db
def test_the_batch_facts_are_the_facts_of_each_run(acme):
    """``run_facts_many`` (the import's one read for many runs) reads what ``run_facts``
    reads, run by run."""
    import_fixtures()
    runs = list(Run.objects.filter(tenant=acme).select_related("tenant"))
    now = runs[0].last_write_at
    many = run_facts_many(runs, now)
    for run in runs:
        assert many[run.pk] == run_facts(run, now), run.uuid


@pytest.mark.django_db
def test_the_history_file_walks_each_record_revision_by_revision(acme):
    import_fixtures(files=("history",))
    cp = Checkpoint.objects.get(tenant=acme, uuid="0193b001-0a1b-7c2d-8e3f-405162738495")
    assert list(cp.revisions.values_list("revision", flat=True)) == [0, 1, 2, 3, 4]
    assert cp.phase_class == PhaseClass.COMPLETED
    retried = Effect.objects.get(tenant=acme, uuid="0193b002-2c3d-7e4f-8051-62738495a6b7")
    assert list(EffectRevision.objects.filter(effect=retried).values_list(
        "revision", "state", "source")) == [
        (0, "planned", "import"), (1, "unresolved", "import"), (2, "unresolved", "import"),
        (3, "confirmed", "import")]
    assert retried.receipt == {"message_id": "msg_5521"}


@pytest.mark.django_db
def test_an_import_advances_a_run_written_through_the_api_by_the_next_revision_only(acme,
                                                                                  wendy):
    """A checkpoint a runtime wrote is advanced by the exact next revision, audited as an
    import; a closed run is reopened by it, as by any write."""
    first, second = records("history")[0], records("history")[1]
    services.checkpoint_put(actor=wendy, tenant=acme, envelope=services.parse_envelope(
        first, url_id=uuid.UUID(first["id"])), expected_revision=None)
    report, errors = service_import(acme, json.dumps(second).encode())
    assert (report.imported, errors) == (1, [])
    cp = Checkpoint.objects.get(tenant=acme, uuid=first["id"])
    assert cp.revision == 1 and cp.written_by is None
    event = AuditEvent.objects.filter(tenant=acme, action=AuditAction.CHECKPOINT_IMPORT).get()
    assert (event.before, event.after["revision"]) == ({"revision": 0}, 1)


# --------------------------------------------------------------------------------------
# Tenants, rights, fencing
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_same_file_into_two_tenants_is_two_sets_of_objects(acme, globex, tmp_path):
    import_fixtures("acme")
    import_fixtures("globex")
    for model in (Run, Checkpoint, CheckpointRevision, Effect, EffectRevision):
        a = set(model.objects.filter(tenant=acme).values_list("pk", flat=True))
        g = set(model.objects.filter(tenant=globex).values_list("pk", flat=True))
        assert a and len(a) == len(g) and not a & g, model.__name__
    assert set(Effect.objects.filter(tenant=acme).values_list("uuid", flat=True)) \
        == set(Effect.objects.filter(tenant=globex).values_list("uuid", flat=True))
    acme_lines, _ = run_export(tmp_path, "acme", name="a.jsonl", history=True)
    globex_lines, _ = run_export(tmp_path, "globex", name="g.jsonl", history=True)
    assert canonical(acme_lines) == canonical(globex_lines)
    # Re-importing into one tenant does not see the other's objects as its own, and an
    # effect's run is derived only from checkpoints of its own tenant.
    services.tenant_create(slug="initech", name="Initech")
    with pytest.raises(CommandError) as raised:
        run_import(FIXTURES / "effects.jsonl", "initech")
    agent_keyed = [r for r in records("effects") if "run_id" not in r]
    assert raised.value.err.count("run_id: required") == len(agent_keyed)


@pytest.mark.django_db
def test_rights_come_from_the_tenant_role(acme, globex, wendy, vic, rita, wes):
    data = (FIXTURES / "agent.v1.jsonl").read_bytes()
    for actor, error in ((vic, Forbidden), (wes, NotFound)):
        with pytest.raises(error):
            runifold.runifold_import(actor=actor, tenant=acme, lines=jsonl_lines(
                io.BytesIO(data)))
        with pytest.raises(error):
            runifold.runifold_export(actor=actor, tenant=acme, write=print)
    report = runifold.runifold_import(actor=wendy, tenant=acme,
                                      lines=jsonl_lines(io.BytesIO(data)))
    assert report.imported == 3
    assert set(Checkpoint.objects.filter(tenant=acme).values_list("written_by", flat=True)) \
        == {wendy.pk}
    lines = []
    runifold.runifold_export(actor=rita, tenant=acme, write=lines.append)
    assert len(lines) == 3
    assert not Checkpoint.objects.filter(tenant=globex).exists()


@pytest.mark.django_db
def test_an_import_does_not_write_a_run_that_has_had_an_owner(acme, wendy):
    first, second = records("history")[0], records("history")[1]
    service_import(acme, json.dumps(first).encode())
    services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(first["run_id"]),
                           owner="worker-1", ttl_s=60)
    before = db_state()
    report, errors = service_import(acme, (json.dumps(first) + "\n" + json.dumps(second))
                                    .encode())
    assert (report.imported, report.skipped) == (0, 1)  # the stored line still compares
    assert len(errors) == 1 and errors[0][1].startswith(
        f"run_id: run {first['run_id']} has had an owner in this store (fencing token 1)")
    assert db_diff(before, db_state()) == {}


C_ID = "0193a5b0-1f2e-7a4b-8c6d-0e1f2a3b4c5d"  # agent.v1: completed, revision 2
C_RUN = "0193a5b0-1e77-7d01-9a2b-3c4d5e6f7081"


def _erase(acme, rita, april, run_id: str) -> None:
    request = services.erasure_request(actor=rita, tenant=acme, runs=[run_id], reason="art. 17")
    done = services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid)
    assert done.counts["erased"] == 1
    assert Run.objects.get(tenant=acme, uuid=run_id).payloads_deleted_at is not None


def _effect_of(run_id: str, effect_id: str, key: str) -> dict:
    """A settled (``completed``) effect record of ``run_id``: it does not stop an erasure."""
    record = json.loads(json.dumps(records("effects")[5]))
    record["run_id"] = run_id
    record["request"]["effect_id"] = effect_id
    record["request"]["idempotency_key"] = key
    return record


@pytest.mark.django_db
def test_an_import_does_not_write_a_run_whose_payloads_were_deleted(acme, wendy, rita, april):
    """An attack's finding: after an erasure, importing the same file again brought the
    erased checkpoint back. Every line of such a run (its checkpoint, an effect it kept,
    a new effect) is refused with the API's ``run_deleted`` detail, and nothing is
    written; the other lines still compare and are skipped (docs/security/retention.md,
    "A deleted run")."""
    kept = _effect_of(C_RUN, "0193a5b0-2a00-7b00-8c00-000000000001", "refund-lookup:C-1")
    service_import(acme, (FIXTURES / "agent.v1.jsonl").read_bytes() + json.dumps(kept).encode())
    _erase(acme, rita, april, C_RUN)
    assert not Checkpoint.objects.filter(tenant=acme, run__uuid=C_RUN).exists()
    with pytest.raises(RunDeleted) as api:  # what the API answers (409 run_deleted)
        c_line = next(r for r in records("agent.v1") if r["id"] == C_ID)
        services.checkpoint_put(actor=wendy, tenant=acme, envelope=services.parse_envelope(
            {**c_line, "revision": 0}, url_id=uuid.UUID(C_ID)), expected_revision=None)
    fresh = _effect_of(C_RUN, "0193a5b0-2a00-7b00-8c00-000000000002", "refund-lookup:C-2")
    before = db_state()
    with pytest.raises(CommandError, match="1 line") as command:  # the attack, exit 1
        run_import(FIXTURES / "agent.v1.jsonl")
    assert command.value.err == f"line 3: {api.value.detail}\n"
    assert "0 line(s) imported, 2 skipped" in command.value.out
    report, errors = service_import(acme, "\n".join(
        json.dumps(r) for r in records("agent.v1") + [kept, fresh]).encode())
    assert (report.imported, report.skipped, report.failed) == (0, 2, 3)
    assert errors == [(3, api.value.detail), (4, api.value.detail), (5, api.value.detail)]
    assert api.value.detail.startswith(f"run_id: the payloads of run {C_RUN} were deleted on ")
    assert db_diff(before, db_state()) == {}
    assert not Checkpoint.objects.filter(tenant=acme, uuid=C_ID).exists()


@pytest.mark.django_db
def test_a_run_deleted_between_the_batch_read_and_its_write_is_not_written(acme, rita, april,
                                                                           monkeypatch):
    """The batch found no run and no tombstone (the run was created and erased after
    the batch read: simulated by hiding the stored runs from its first lock and the
    tombstones from its read of them), so it creates the run, and the creation finds one
    whose payloads were deleted: the batch is rolled back and nothing is written."""
    service_import(acme, (FIXTURES / "agent.v1.jsonl").read_bytes())
    _erase(acme, rita, april, C_RUN)
    before = db_state()
    monkeypatch.setattr(runifold.imports, "_lock_runs", lambda tenant, run_ids: {})
    monkeypatch.setattr(runifold.imports, "tombstone_dates", lambda tenant, run_ids: {})
    line = next(r for r in records("agent.v1") if r["id"] == C_ID)
    report, errors = service_import(acme, json.dumps(line).encode())
    assert (report.imported, report.failed) == (0, 1)
    assert db_diff(before, db_state()) == {}


@pytest.mark.django_db
def test_an_import_does_not_create_again_a_run_whose_row_retention_deleted(acme, wendy, rita,
                                                                           april):
    """Retention's phase 2 deleted the erased run's row; its tombstone stays. Importing
    the original file again must not create the run anew under the same id: its line is
    refused with the API's words (the 409 ``run_deleted`` a ``PUT`` gets, the tombstone's
    date), the lines of another run are still imported, and nothing of the deleted run is
    written (docs/security/retention.md, "A deleted run")."""
    service_import(acme, (FIXTURES / "agent.v1.jsonl").read_bytes())
    _erase(acme, rita, april, C_RUN)
    services.data_policy_set(actor=None, tenant=acme, effect_retention_days=1)
    age_world(2 * 86_400)  # two days after the run ended
    assert services.retention_purge(tenant=acme)["expired"] == 1
    assert not Run.objects.filter(tenant=acme, uuid=C_RUN).exists()
    c_line = next(r for r in records("agent.v1") if r["id"] == C_ID)
    with pytest.raises(RunDeleted) as api:  # what the API answers (409 run_deleted)
        services.checkpoint_put(actor=wendy, tenant=acme, envelope=services.parse_envelope(
            {**c_line, "revision": 0}, url_id=uuid.UUID(C_ID)), expected_revision=None)
    assert api.value.detail.startswith(f"run_id: the payloads of run {C_RUN} were deleted on ")
    other = {**c_line, "id": str(uuid.uuid4()), "run_id": str(uuid.uuid4())}
    before = db_state()
    report, errors = service_import(acme, "\n".join(
        json.dumps(r) for r in (c_line, other)).encode())
    assert (report.imported, report.failed) == (1, 1)
    assert errors == [(1, api.value.detail)]
    assert not Run.objects.filter(tenant=acme, uuid=C_RUN).exists()
    assert Checkpoint.objects.get(tenant=acme, uuid=other["id"]).run.uuid == uuid.UUID(
        other["run_id"])
    new_run = Run.objects.get(tenant=acme, uuid=other["run_id"])
    assert db_diff(before, db_state())["checkpoints.Run"] == {"added": [new_run.pk]}
    with pytest.raises(CommandError, match="1 line") as command:  # the command, exit 1
        run_import(FIXTURES / "agent.v1.jsonl")
    assert command.value.err == f"line 3: {api.value.detail}\n"
    assert not Run.objects.filter(tenant=acme, uuid=C_RUN).exists()


@pytest.mark.django_db
def test_an_import_indexes_subjects_as_an_api_write_of_the_same_payload(acme, wendy, adam,
                                                                        rita, april):
    """docs/security/erasure.md, "Subjects": every checkpoint write indexes the declared
    subject fields, the import's too, so an erasure or a hold by subject finds imported
    runs. Each imported run gets the rows an API write of the same payload gets."""
    services.data_policy_set(actor=adam, tenant=acme, subject_fields={
        "wf": "/workflow", "version": "/workflow_version", "order": "/value/order_id",
        "nowhere": "/no/such/field"})
    report, errors = service_import(acme, (FIXTURES / "workflow.v4.jsonl").read_bytes())
    assert errors == [] and report.imported == len(records("workflow.v4"))

    def rows_of(run_uuid) -> set:
        return set(RunSubject.objects.filter(tenant=acme, run__uuid=run_uuid)
                   .values_list("field", "digest"))

    for record in records("workflow.v4"):
        twin = {**record, "id": str(uuid.uuid4()), "run_id": str(uuid.uuid4()), "revision": 0}
        services.checkpoint_put(actor=wendy, tenant=acme, envelope=services.parse_envelope(
            twin, url_id=uuid.UUID(twin["id"])), expected_revision=None)
        assert rows_of(record["run_id"]) == rows_of(twin["run_id"]), record["id"]
        assert ("wf", services.subject_digest(acme, "wf", "refund-approval")) \
            in rows_of(record["run_id"])
    # Importing again writes nothing, the index included.
    before = db_state()
    service_import(acme, (FIXTURES / "workflow.v4.jsonl").read_bytes())
    assert db_diff(before, db_state()) == {}
    # An erasure by subject finds the imported runs (and the API's twins).
    request = services.erasure_request(actor=rita, tenant=acme, reason="dsr",
                                       subject={"field": "wf", "value": "refund-approval"})
    done = services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid)
    assert done.counts["runs"] == 2 * len(records("workflow.v4"))


# --------------------------------------------------------------------------------------
# When the database refuses a batch
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_batch_the_database_refuses_is_written_again_line_by_line(acme, monkeypatch):
    """Another writer took a key between the batch's read and its write (simulated by
    hiding the stored key from the read): the batch rolls back, its lines are written one
    per transaction, and only the line that collides is an error."""
    import_fixtures(files=("agent.v1",))
    effects = records("effects")
    taken = dict(effects[2])
    service_import(acme, json.dumps(taken).encode())
    twin = json.loads(json.dumps(taken))
    twin["request"]["effect_id"] = "0193a4f2-8b13-7c02-95e6-3f708192ffff"
    monkeypatch.setattr(runifold.imports, "_stored_keys", lambda tenant, lines: {})
    data = "\n".join(json.dumps(r) for r in (effects[0], twin, effects[1])).encode()
    report, errors = service_import(acme, data)
    assert (report.imported, report.failed) == (2, 1)
    assert errors == [(2, "id: another writer wrote this id or key while the import ran; "
                          "import the file again to compare")]
    assert not Effect.objects.filter(tenant=acme, uuid=twin["request"]["effect_id"]).exists()
    assert services.audit_verify(tenant=acme)[0]


# --------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_export_leaves_out_what_runifold_cannot_read_and_says_so(acme, wendy, tmp_path):
    from tests.helpers import effect_body, envelope, put_checkpoint, put_effect

    import_fixtures(files=("agent.v1",))
    put_checkpoint(wendy, acme, envelope())  # acme.order
    put_effect(wendy, acme, effect_body())  # no runifold request
    lines, summary = run_export(tmp_path)
    assert len(lines) == 3
    assert "left out: 1 checkpoint(s) of other kinds or unsupported schemas, 1 effect(s) " \
           "without a runifold request" in summary


@pytest.mark.django_db
def test_export_of_some_runs_and_its_audit_events(acme, tmp_path):
    import_fixtures()
    lines, _ = run_export(tmp_path, run=[B_RUN])
    ids = {json.loads(x).get("id") or json.loads(x)["request"]["effect_id"] for x in lines}
    assert ids == {B_ID, "0193a4f2-7a02-7e19-b3c4-1d5e6f708192",
                   "0193a4f2-8b13-7a2a-84d5-2e6f708192a3", "0193a4f2-8b13-7c02-95e6-3f708192a3b4"}
    pages = AuditEvent.objects.filter(tenant=acme, action=AuditAction.RUNIFOLD_EXPORT)
    assert sorted(e.after["checkpoint_lines"] + e.after["effect_lines"] for e in pages) == [1, 3]
    with pytest.raises(CommandError, match="run_id: no run 0193"):
        run_export(tmp_path, run=["0193ffff-0000-7000-8000-000000000000"])
    with pytest.raises(CommandError, match="--run: 'nope' is not a UUID"):
        run_export(tmp_path, run=["nope"])
    assert not (tmp_path / "out.jsonl.partial").exists()


@pytest.mark.django_db
def test_nothing_leaves_an_export_whose_audit_event_failed(acme, monkeypatch):
    from checkpoints import audit

    import_fixtures(files=("agent.v1",))

    def down(*args, **kwargs):
        raise RuntimeError("audit store down")

    monkeypatch.setattr(audit, "new_event", down)
    written = []
    with pytest.raises(RuntimeError):
        runifold.runifold_export(actor=None, tenant=acme, write=written.append)
    assert written == []


def _replan_after_an_approved_retry(acme, wendy, rita, april) -> str:
    """An imported started effect (unresolved here), called unknown, retried with
    approval and planned again by the run's new owner: planned at revision 3."""
    from tests.helpers import age_world, effect_body, put_effect

    import_fixtures(files=("agent.v1", "effects"))
    eid = "0193a4f2-8b13-7a2a-84d5-2e6f708192a3"
    age_world(3600)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=uuid.UUID(eid), reason="?")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(B_RUN), reason="x")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(B_RUN), asked={})
    e = Effect.objects.get(tenant=acme, uuid=eid)
    put_effect(wendy, acme, effect_body(
        effect_id=eid, run_id=B_RUN, revision=e.revision + 1, state="planned",
        operation_key=e.operation_key, service=e.service, effect_class=e.effect_class,
        fingerprint=e.request_fingerprint), expected=e.revision, token=claim["fencing_token"])
    return eid


@pytest.mark.django_db
@pytest.mark.parametrize("history", [False, True])
def test_an_effect_planned_again_is_exported_as_runifolds_started_record(
        acme, globex, wendy, rita, april, history):
    eid = _replan_after_an_approved_retry(acme, wendy, rita, april)
    assert Effect.objects.get(tenant=acme, uuid=eid).revision == 3
    lines = []
    runifold.runifold_export(actor=None, tenant=acme, write=lines.append, history=history)
    mine = [json.loads(x) for x in lines if f'"effect_id":"{eid}"' in x]
    assert mine[-1]["revision"] == 3 and mine[-1]["status"] == {"state": "started"}
    # Same tenant: every line is already there. Another tenant: every line is written,
    # and the re-planned effect arrives in doubt, as runifold would hold it.
    report, errors = service_import(acme, "\n".join(lines).encode())
    assert errors == [] and (report.skipped, report.imported) == (len(lines), 0)
    report, errors = service_import(globex, "\n".join(lines).encode())
    assert errors == [] and report.imported == len(lines)
    there = Effect.objects.get(tenant=globex, uuid=eid)
    assert (there.revision, there.state) == (3, EffectState.UNRESOLVED)


@pytest.mark.django_db
def test_a_history_export_starts_a_checkpoint_after_its_last_unsupported_revision(
        acme, globex, wendy, tmp_path):
    from tests.helpers import put_checkpoint

    rec, other = records("agent.v1")[:2]
    broken = {"broken": True}  # stored by the API as schema_mismatch
    for revision, payload in enumerate([rec["payload"], broken, rec["payload"], broken,
                                        rec["payload"], rec["payload"]]):
        put_checkpoint(wendy, acme, dict(rec, revision=revision, payload=payload),
                       expected=revision - 1 if revision else None)
    put_checkpoint(wendy, acme, dict(other, revision=0))
    put_checkpoint(wendy, acme, dict(other, revision=1, payload=broken), expected=0)
    lines, summary = run_export(tmp_path, history=True)
    # rec: revisions 4 and 5 (after the last unsupported, 3); other: its current
    # revision is unsupported, so it is left out as a plain export leaves it out.
    assert [(x["id"], x["revision"]) for x in map(json.loads, lines)] == [
        (rec["id"], 4), (rec["id"], 5)]
    assert ("left out: 1 checkpoint(s) of other kinds or unsupported schemas, 4 older "
            "revision(s) up to a checkpoint's last unsupported schema") in summary
    report, errors = service_import(globex, "\n".join(lines).encode())
    assert errors == [] and report.imported == 2
    assert Checkpoint.objects.get(tenant=globex, uuid=rec["id"]).revision == 5
    report, errors = service_import(acme, "\n".join(lines).encode())
    assert errors == [] and report.skipped == 2


@pytest.mark.django_db
def test_status_out_renders_every_state_of_ours_as_a_runifold_status():
    error = {"kind": "Invocation", "message": "no", "retry_safety": "Safe", "metadata": {}}
    assert runifold.status_out(EffectState.PLANNED, None, 0) == {"state": "prepared"}
    # runifold has no re-plan: planned again after an approved retry is its started record.
    assert runifold.status_out(EffectState.PLANNED, None, 3) == {"state": "started"}
    for state in (EffectState.SUBMITTED, EffectState.UNRESOLVED, EffectState.UNKNOWN,
                  EffectState.NOT_EXECUTED):
        assert runifold.status_out(state, None, 1) == {"state": "started"}
    assert runifold.status_out(EffectState.CONFIRMED, {"runifold_output": [1]}, 2) == {
        "state": "completed", "output": [1]}
    assert runifold.status_out(EffectState.FAILED, error, 2) == {"state": "failed",
                                                                 "error": error}
    # A reconciler's answer is not a RunError: it is carried inside one.
    rendered = runifold.status_out(EffectState.FAILED, {"status": "declined"}, 2)
    assert rendered["error"]["metadata"] == {"receipt": {"status": "declined"}}
    assert runifold.lines._run_error(rendered["error"]) == ""


# --------------------------------------------------------------------------------------
# PostgreSQL: size and concurrency
# --------------------------------------------------------------------------------------

def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_30000_line_import_runs_in_bounded_memory(acme, tmp_path):
    """Memory does not grow with the file: the resident size after each batch is
    sampled; its highest value over lines 6,001-30,000 stays within 6 MB of its highest
    over the first 6,000 (a leak of 250 bytes per line, less than one model instance or
    one parsed line kept, would add 6 MB). RSS, not tracemalloc: tracemalloc makes the
    import several times slower. 30,000 lines, not 100,000: the import of 100,000 took
    229 s of the PostgreSQL pass (stop 40); ``bench/bench_runifold.py`` measures the
    peak resident size at 100,000 lines and more."""
    path = tmp_path / "big.jsonl"
    runifold_synth.write(path, 30_000)
    done, first, rest = 0, [], []
    size = path.stat().st_size

    def progress(n: int) -> None:
        nonlocal done
        done += n
        (first if done <= size // 5 else rest).append(_rss())

    with open(path, "rb") as f:
        report = runifold.runifold_import(actor=None, tenant=acme, lines=jsonl_lines(f),
                                          on_progress=progress)
    assert (report.lines, report.imported, report.failed) == (30_000, 30_000, 0)
    assert Effect.objects.filter(tenant=acme).count() == 15_000
    assert len(first) >= 10 and len(rest) >= 40  # 500 lines a batch: 12 and 48 samples
    grown = max(rest) - max(first)
    assert grown < 6 * 2**20, f"memory grew {grown / 2**20:.1f} MB after the first 6,000 lines"
    assert not connection.queries  # no query log kept (DEBUG off)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_imports_of_one_file_at_once_write_it_once(acme):
    """The run locks (taken in id order) make two imports of one file wait for each other
    per batch; every line is written once, the other import skips it (or, when its
    batch read before the first committed, rolls back and compares line by line)."""
    from tests.transactional.test_races import race

    data = b"".join(runifold_synth.lines(2000, seed=7))

    def go(i):
        return runifold.runifold_import(actor=None, tenant=acme,
                                        lines=jsonl_lines(io.BytesIO(data)), batch_size=250)

    a, b = race(2, go)
    assert not isinstance(a, Exception) and not isinstance(b, Exception), (a, b)
    assert a.imported + b.imported == 2000
    assert a.skipped + b.skipped + a.failed + b.failed == 2000
    assert Effect.objects.filter(tenant=acme).count() == 1000
    assert AuditEvent.objects.filter(tenant=acme, action__in=[
        AuditAction.CHECKPOINT_IMPORT, AuditAction.EFFECT_IMPORT]).count() == 2000
    assert services.audit_verify(tenant=acme)[0]
    again = go(0)
    assert (again.imported, again.skipped) == (0, 2000)


def test_the_synthetic_file_is_what_the_fixtures_look_like():
    """The memory test and the bench import lines of the fixtures' shapes: each one
    parses, and a group holds a checkpoint of each kind and a completed and a started
    effect."""
    parsed = [runifold.parse_line(x) for x in runifold_synth.lines(8)]
    assert [type(p).__name__ for p in parsed[:4]] == [
        "CheckpointLine", "EffectLine", "EffectLine", "CheckpointLine"]
    assert [p.status for p in parsed[1:3]] == ["completed", "started"]
    assert len({p.envelope.checkpoint_id for p in parsed if hasattr(p, "envelope")}) == 4



def _effect_line(key, extension=None) -> dict:
    return {"revision": 0, "status": {"state": "prepared"}, "run_id": str(uuid.uuid4()),
            "request": {"effect_id": str(uuid.uuid4()), "invocation_id": str(uuid.uuid4()),
                        "kind": {"Extension": extension} if extension else "Tool",
                        "capability_id": str(uuid.uuid4()), "input": {},
                        "effect_class": "ReadOnly", "idempotency_key": key}}


@pytest.mark.django_db
def test_an_imported_effect_passes_the_names_rule_of_the_api(acme):
    """(stop 33, the attack's finding) ``PUT …/effects`` refuses a control or
    bidirectional character in ``operation_key`` and ``service``
    (``jsonparse.name_problem``); an imported line stored them. Each such line is now an
    error of its own naming the field, and a plain line still imports."""
    lines = [_effect_line("charge\x1b[2Jx"), _effect_line("k-1", extension="x\u202eevil"),
             _effect_line("k-2")]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    report, errors = service_import(acme, data)
    assert [(n, d.split(":")[0]) for n, d in errors] == [
        (1, "request.idempotency_key"), (2, "request.kind")], errors
    assert all("control character" in d for _, d in errors)
    assert list(Effect.objects.values_list("operation_key", flat=True)) == ["k-2"]


@pytest.mark.django_db
def test_an_imported_idempotency_key_that_shows_nothing_is_refused_as_an_empty_one(acme):
    """(stop 35) The API refuses an operation key of spaces or joiners as an empty one
    (``check_name``'s ``blank_words``); an imported line's idempotency key (the store's
    operation key) is judged the same, and a plain line still imports."""
    lines = [_effect_line(" "), _effect_line("\u200d\u200c"), _effect_line("k-3")]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    report, errors = service_import(acme, data)
    assert errors == [(n, "request.idempotency_key: must be a non-empty string or null")
                      for n in (1, 2)], errors
    assert list(Effect.objects.values_list("operation_key", flat=True)) == ["k-3"]
