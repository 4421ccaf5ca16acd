"""The operator's migration of a kind's checkpoints (issue 19, item 2;
``services.checkpoints_migrate``, docs/migrations.md), with state built by real writes:
one new revision per checkpoint through the write path, audited, fenced against the
run's owner, refused while that owner is live, losing to a runtime's write, a dry run
that writes nothing, and a walk that resumes after a kill without migrating twice.
Runs on SQLite and on PostgreSQL (``DATABASE_URL``)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import kinds, services, upcasters
from checkpoints.exceptions import Fenced, Forbidden, InvalidPayload, NotFound
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Conflict, Run
from checkpoints.services import migrations
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, sweep_later, walk_effect
from tests.kind_fixtures import fixtures as kind_fixtures
from tests.matrixhelpers import db_diff, db_state

QUIET = 3600  # seconds: past the ambiguity threshold, so a run without a lease is unowned


def order(writer, tenant, phase="charged", revisions=1, version=1, **payload):
    """An ``acme.order`` checkpoint written ``revisions`` times; returns its last body."""
    payload = {"phase": phase, "order_id": "A-1042", "amount_cents": 2599, **payload}
    body = envelope(schema_version=version, payload=payload)
    put_checkpoint(writer, tenant, body)
    for rev in range(1, revisions):
        body = dict(body, revision=rev)
        put_checkpoint(writer, tenant, body, expected=rev - 1)
    return body


def migrate(tenant, actor=None, **kw):
    kw.setdefault("kind", "acme.order")
    kw.setdefault("to_version", 2)
    return services.checkpoints_migrate(actor=actor, tenant=tenant, **kw)


def stored(body) -> Checkpoint:
    return Checkpoint.objects.select_related("run").get(uuid=body["id"])


def payload_of(body) -> dict:
    return services.checkpoint_envelope(stored(body))["payload"]


def migrate_events():
    return list(AuditEvent.objects.filter(action="checkpoint.migrate").order_by("seq"))


# --- a migration -------------------------------------------------------------------------

def test_it_writes_one_audited_revision_per_checkpoint_and_fences_the_owner(acme, wendy):
    bodies = [order(wendy, acme), order(wendy, acme, "shipping", revisions=3),
              order(wendy, acme, "completed", amount_cents=1)]
    age_world(QUIET)
    runs_before = {r.uuid: r for r in Run.objects.all()}
    writes_before = AuditEvent.objects.filter(action="checkpoint.write").count()
    report = migrate(acme)
    assert report.counts == {"migrated": 3, "skipped": 0, "refused": 0, "conflict": 0}
    assert report.refusals == {} and not report.dry_run
    events = migrate_events()
    assert len(events) == 3
    assert AuditEvent.objects.filter(action="checkpoint.write").count() == writes_before
    for body, event in zip(bodies, events, strict=True):
        cp = stored(body)
        assert (cp.revision, cp.schema_version) == (body["revision"] + 1, 2)
        assert payload_of(body)["amount"]["currency"] == "USD"
        assert "amount_cents" not in payload_of(body)
        # History keeps the old revision; the migrated one is one more row.
        versions = dict(CheckpointRevision.objects.filter(checkpoint=cp)
                        .values_list("revision", "schema_version"))
        assert versions == {**{r: 1 for r in range(cp.revision)}, cp.revision: 2}
        # The run: its version and phase, the token one up, its last write time unchanged.
        run, before = cp.run, runs_before[cp.run.uuid]
        assert (run.schema_version, run.phase_class) == (2, before.phase_class)
        assert run.fencing_token == before.fencing_token + 1
        assert run.last_write_at == before.last_write_at
        # One event: the migration's name, both versions, the batch, the tokens.
        assert (event.target_ref, event.actor_name) == (str(cp.uuid), "system")
        assert event.before == {"revision": cp.revision - 1, "schema_version": 1,
                                "fencing_token": before.fencing_token}
        assert event.after["migration"] == ["acme.order amount_cents -> amount"]
        assert (event.after["schema_version"], event.after["revision"]) == (2, cp.revision)
        assert event.after["batch_id"] == str(report.batch_id)
        assert event.after["fencing_token"] == run.fencing_token
        assert "2599" not in json.dumps(event.after)  # no payload value in the audit
    assert services.audit_verify(tenant=acme)[0]


def test_a_second_run_finds_nothing_left_to_migrate(acme, wendy):
    order(wendy, acme)
    order(wendy, acme, "ready")
    age_world(QUIET)
    assert migrate(acme).counts["migrated"] == 2
    again = migrate(acme)
    assert again.items == [] and again.counts["migrated"] == 0
    assert len(migrate_events()) == 2


def test_the_examples_name_key_paths_never_values(acme, wendy):
    order(wendy, acme)
    order(wendy, acme, "ready")
    body = envelope(payload={"phase": "ready", "order_id": "B-7"})  # no amount: no change
    put_checkpoint(wendy, acme, body)
    age_world(QUIET)
    report = migrate(acme)
    assert [(e["count"], e["added"], e["removed"], e["changed"]) for e in report.examples] == [
        (2, ["amount"], ["amount_cents"], []), (1, [], [], [])]
    assert report.examples[1]["checkpoint_id"] == body["id"]
    text = json.dumps(report.examples)
    assert "2599" not in text and "A-1042" not in text and "B-7" not in text


def test_a_closed_run_stays_closed_and_another_checkpoint_stays_the_latest(acme, wendy, rita):
    first = order(wendy, acme)
    latest = envelope(run_id=first["run_id"], payload={"phase": "shipping"})
    put_checkpoint(wendy, acme, latest)
    age_world(QUIET)
    run_id = uuid.UUID(first["run_id"])
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="refunded by hand")
    assert migrate(acme).counts["migrated"] == 2
    run = Run.objects.get(uuid=run_id)
    assert run.recovery_state == "closed" and run.closed_at is not None
    assert run.latest_checkpoint.uuid == uuid.UUID(latest["id"])
    assert run.fencing_token == 2  # one per migrated checkpoint


def test_only_the_runs_named_are_migrated(acme, wendy):
    one, other = order(wendy, acme), order(wendy, acme)
    age_world(QUIET)
    report = migrate(acme, run_ids=[one["run_id"]])
    assert [str(i.checkpoint_id) for i in report.items] == [one["id"]]
    assert (stored(one).schema_version, stored(other).schema_version) == (2, 1)


def test_it_migrates_back_only_when_asked_to_reverse(acme, wendy):
    body = order(wendy, acme)
    age_world(QUIET)
    migrate(acme)
    migrated = payload_of(body)
    refused = migrate(acme, to_version=1)
    assert [(i.outcome, i.reason) for i in refused.items] == [("refused", "no_path")]
    assert "down needs reverse" in refused.items[0].detail
    age_world(QUIET)
    back = migrate(acme, to_version=1, reverse=True)
    assert back.counts["migrated"] == 1
    assert payload_of(body) == dict(body["payload"]) and migrated != payload_of(body)
    assert stored(body).revision == body["revision"] + 2
    assert migrate_events()[-1].after["migration"] == ["acme.order amount_cents -> amount (down)"]
    # --reverse never goes up.
    assert migrate(acme, reverse=True).items[0].reason == "no_path"


def test_a_waiting_workflow_is_not_taken_back_to_v3(acme, wendy):
    fixture = kind_fixtures("runifold.workflow", 4)
    bodies = {}
    for case in fixture:
        state = case.payload["phase"]["state"]
        body = envelope(kind="runifold.workflow", schema_version=4, payload=case.payload)
        put_checkpoint(wendy, acme, body)
        bodies.setdefault(state, body)
    age_world(QUIET)
    report = migrate(acme, kind="runifold.workflow", to_version=3, reverse=True)
    refused = [i for i in report.items if i.outcome == "refused"]
    assert [(str(i.checkpoint_id), i.reason) for i in refused] == [
        (bodies["waiting"]["id"], "not_reversible")]
    assert "waiting exists only in v4" in refused[0].detail
    assert report.counts["migrated"] == len(fixture) - 1
    assert stored(bodies["waiting"]).schema_version == 4


def test_the_owner_check_reads_no_effect_and_the_run_keeps_its_doubt(acme, wendy):
    """Whether the owner is gone depends on the lease and the last write only: a
    migration looks at no effect or retry request before its write (one statement per
    checkpoint fewer; two for a run with an effect in doubt). The write path still reads
    them for the run's recovery state: an ambiguous run with its submitted effect stays
    ambiguous, with the same reason, after its checkpoint is migrated."""
    body = order(wendy, acme, "charging")
    walk_effect(wendy, acme, effect_body(run_id=body["run_id"]), "submitted")
    sweep_later()
    run = Run.objects.get(uuid=body["run_id"])
    assert (run.recovery_state, "payments charge:A-1042" in run.recovery_reason) == (
        "ambiguous", True)
    with CaptureQueriesContext(connection) as queries:
        assert migrate(acme, dry_run=True).counts["migrated"] == 1
    sent = [q["sql"] for q in queries.captured_queries]
    assert not [q for q in sent if "checkpoints_effect" in q or "checkpoints_retryrequest" in q]
    assert len(sent) == 3  # the batch of candidates, the run, the checkpoint
    assert migrate(acme).counts["migrated"] == 1
    after = Run.objects.get(uuid=body["run_id"])
    assert (after.recovery_state, after.recovery_reason) == (run.recovery_state,
                                                             run.recovery_reason)
    assert after.schema_version == 2 and after.fencing_token == run.fencing_token + 1


# --- refusals ----------------------------------------------------------------------------

def test_a_run_whose_owner_is_live_is_refused_and_left_alone(acme, wendy):
    leased = order(wendy, acme)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(leased["run_id"]),
                           owner="w1", ttl_s=7200)
    age_world(QUIET)  # quiet, but the lease still runs
    recent = order(wendy, acme)  # no lease, wrote just now
    before = db_state()
    report = migrate(acme)
    assert db_diff(before, db_state()) == {}
    assert report.refusals == {"owner_live": 2}
    details = {str(i.run_id): i.detail for i in report.items}
    assert "owner w1 is live until" in details[leased["run_id"]]
    assert "it wrote recently" in details[recent["run_id"]]


@pytest.mark.parametrize(("body", "reason", "words"), [
    (dict(schema_version=9), "no_path", "acme.order v9 is not registered"),
    (dict(payload={"phase": "ready", "amount_cents": -5}), "no_path",
     "stored payload does not match"),
    (dict(payload={"phase": "ready", "amount": "lots"}), "invalid_after", "payload.amount"),
])
def test_a_checkpoint_no_migration_can_take_is_refused(acme, wendy, body, reason, words):
    put_checkpoint(wendy, acme, envelope(**body))
    age_world(QUIET)
    (item,) = migrate(acme).items
    assert (item.outcome, item.reason) == ("refused", reason)
    assert words in item.detail
    assert migrate_events() == []


def test_a_result_the_target_schema_refuses_is_invalid_after(acme, wendy, monkeypatch):
    broken = upcasters.Migration("acme.order", 1, lambda p: {"phase": "lost"}, name="broken")
    monkeypatch.setitem(kinds._REGISTRY["acme.order"].migrations, 1, broken)
    body = order(wendy, acme)
    age_world(QUIET)
    (item,) = migrate(acme).items
    assert (item.outcome, item.reason) == ("refused", "invalid_after")
    assert item.detail.startswith("broken: payload does not match acme.order v2")
    assert stored(body).schema_version == 1


# --- fencing and races ---------------------------------------------------------------------

def test_a_zombie_owner_writing_after_the_migration_is_fenced_and_kept(acme, wendy):
    body = order(wendy, acme, "charging")
    run_id = uuid.UUID(body["run_id"])
    token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w1",
                                   ttl_s=60).fencing_token
    age_world(120)  # w1's lease expired: its owner is gone
    assert migrate(acme).counts["migrated"] == 1
    late = dict(body, revision=body["revision"] + 2, payload={"phase": "charged"})
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, late, expected=body["revision"] + 1, token=token)
    conflict = Conflict.objects.get(target_uuid=body["id"])
    assert (conflict.reason, conflict.fencing_token_sent) == ("fenced", token)
    assert conflict.fencing_token_current == token + 1
    assert stored(body).schema_version == 2  # the migrated revision stands


def test_a_runtime_that_never_took_a_lease_is_fenced_after_a_migration(acme, wendy):
    body = order(wendy, acme)
    age_world(QUIET)
    migrate(acme)
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, dict(body, revision=body["revision"] + 2),
                       expected=body["revision"] + 1)
    assert Conflict.objects.get(target_uuid=body["id"]).reason == "fenced"


def test_a_runtime_write_racing_the_migration_wins_and_the_run_is_a_conflict(
        acme, wendy, monkeypatch):
    body = order(wendy, acme)
    age_world(QUIET)
    runtime = dict(body, revision=body["revision"] + 1,
                   payload={"phase": "shipping", "order_id": "A-1042"})
    real = kinds.migrate

    def racing(*args, **kwargs):
        # The runtime's write lands between the migration's read and its write.
        put_checkpoint(wendy, acme, runtime, expected=body["revision"])
        return real(*args, **kwargs)

    monkeypatch.setattr(migrations.kinds, "migrate", racing)
    token = Run.objects.get(uuid=body["run_id"]).fencing_token
    (item,) = migrate(acme).items
    assert (item.outcome, item.revision) == ("conflict", body["revision"])
    assert f"revision {runtime['revision']} first" in item.detail
    cp = stored(body)
    assert (cp.revision, cp.schema_version) == (runtime["revision"], 1)
    assert payload_of(body) == runtime["payload"]  # never overwritten
    assert Conflict.objects.get(target_uuid=body["id"]).reason == "stale_revision"
    run = Run.objects.get(uuid=body["run_id"])
    assert run.fencing_token == token and run.recovery_state == "conflicted"
    assert migrate_events() == []


# --- dry run -------------------------------------------------------------------------------

def test_a_dry_run_writes_nothing_and_says_what_would_happen(acme, wendy):
    order(wendy, acme)
    order(wendy, acme, "completed")
    live = order(wendy, acme)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(live["run_id"]),
                           owner="w1", ttl_s=7200)
    age_world(QUIET)
    before = db_state()
    report = migrate(acme, dry_run=True)
    assert db_diff(before, db_state()) == {}
    assert report.dry_run
    assert report.counts == {"migrated": 2, "skipped": 0, "refused": 1, "conflict": 0}
    (refused,) = [i for i in report.items if i.outcome == "refused"]
    assert (str(refused.run_id), refused.reason) == (live["run_id"], "owner_live")
    assert [(e["count"], e["added"], e["removed"]) for e in report.examples] == [
        (2, ["amount"], ["amount_cents"])]
    # The real run does what the preview said.
    assert migrate(acme).counts == report.counts


# --- a walk killed mid-way, run again --------------------------------------------------------

class Killed(Exception):
    pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch_size", [1, 3, 100])
def test_a_migration_killed_mid_way_resumes_to_the_state_of_one_clean_run(
        acme, globex, wendy, wes, monkeypatch, batch_size):
    """The same checkpoints in two tenants: acme's walk dies inside its fifth checkpoint's
    transaction (after the write, before the commit) and runs again; globex's runs once.
    Both end the same, and no checkpoint has two migration revisions."""
    for writer, tenant in ((wendy, acme), (wes, globex)):
        for i in range(7):
            order(writer, tenant, ["ready", "charged", "completed"][i % 3],
                  revisions=1 + i % 2, order_id=f"A-{i}")
    age_world(QUIET)
    real, calls = migrations.writepath.checkpoint_write, []

    def dies_on_the_fifth(**kw):
        written = real(**kw)
        calls.append(kw["envelope"].checkpoint_id)
        if len(calls) == 5:
            raise Killed("killed mid-batch")
        return written

    monkeypatch.setattr(migrations.writepath, "checkpoint_write", dies_on_the_fifth)
    with pytest.raises(Killed):
        migrate(acme, batch_size=batch_size)
    assert Checkpoint.objects.filter(tenant=acme, schema_version=2).count() == 4
    monkeypatch.setattr(migrations.writepath, "checkpoint_write", real)
    again = migrate(acme, batch_size=batch_size)
    assert again.counts == {"migrated": 3, "skipped": 0, "refused": 0, "conflict": 0}
    migrate(globex, batch_size=batch_size)

    def final(tenant):
        return [(services.checkpoint_envelope(cp)["payload"], cp.revision, cp.schema_version,
                 cp.run.fencing_token)
                for cp in Checkpoint.objects.filter(tenant=tenant).select_related("run")
                .order_by("id")]

    assert final(acme) == final(globex)
    for tenant in (acme, globex):
        migrated = list(AuditEvent.objects.filter(tenant=tenant, action="checkpoint.migrate")
                        .values_list("target_ref", flat=True))
        assert sorted(migrated) == sorted(set(migrated)) and len(migrated) == 7
        assert CheckpointRevision.objects.filter(tenant=tenant, schema_version=2).count() == 7
        assert services.audit_verify(tenant=tenant)[0]


# --- rights and arguments ------------------------------------------------------------------

def test_it_needs_the_tenant_admins_right(acme, wendy, adam, vic, rita, omar):
    order(wendy, acme)
    age_world(QUIET)
    for who in (vic, rita, wendy):
        with pytest.raises(Forbidden):
            migrate(acme, actor=who)
    with pytest.raises(NotFound):
        migrate(acme, actor=omar)
    report = migrate(acme, actor=adam)
    assert report.counts["migrated"] == 1
    assert migrate_events()[0].actor_name == "adam"


@pytest.mark.parametrize(("kw", "field"), [
    (dict(kind="acme.invoice"), "kind:"),
    (dict(to_version=3), "to_version:"),
    (dict(to_version="2"), "to_version:"),
    (dict(batch_size=0), "batch_size:"),
    (dict(batch_size=10_001), "batch_size:"),
    (dict(run_ids="not-a-list"), "run_ids:"),
    (dict(run_ids=["nope"]), "run_ids:"),
])
def test_it_refuses_bad_arguments_before_doing_anything(acme, wendy, kw, field):
    order(wendy, acme)
    before = db_state()
    with pytest.raises(InvalidPayload) as refused:
        migrate(acme, **kw)
    assert refused.value.detail.startswith(field)
    assert db_diff(before, db_state()) == {}


def test_an_offline_kind_resumes_again_once_migrated(acme, wendy):
    body = order(wendy, acme)
    age_world(QUIET)
    kinds.set_migration_mode("acme.order", "offline")
    try:
        claim = services.resume_claim(actor=wendy, tenant=acme,
                                      run_id=uuid.UUID(body["run_id"]), asked={})
        assert claim["reason"] == "migration_required"
        migrate(acme)
        claim = services.resume_claim(actor=wendy, tenant=acme,
                                      run_id=uuid.UUID(body["run_id"]), asked={})
        assert (claim["action"], claim["revision"]) == ("continue", body["revision"] + 1)
        assert claim["fencing_token"] == 1  # the token the runtime writes with now
    finally:
        kinds.set_migration_mode("acme.order", "lazy")
