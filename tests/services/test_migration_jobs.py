"""Migrations as stored jobs (issue 19, item 2; CONTRACT.md 8; docs/migrations.md):
``services.migration_job_submit`` (admin only, audited, idempotent by client token),
``migration_preview`` (writes nothing), the job runner ``jobs.migrations.execute``
(records each checkpoint's result as it goes, resumes after a kill, retried, fails
visibly) and the API's ``POST``/``GET …/kinds/{kind}/migrations``."""

from __future__ import annotations

import json
import uuid

import pytest

from checkpoints import services
from checkpoints.exceptions import Forbidden, InvalidPayload
from checkpoints.jobs import migrations as job_layer
from checkpoints.models import AuditEvent, Checkpoint, MigrationJob, MigrationJobItem
from checkpoints.services import migrations
from tests.api.apihelpers import get, url
from tests.helpers import age_world
from tests.matrixhelpers import db_diff, db_state
from tests.services.test_migrations import QUIET, order, stored


def submit(tenant, actor, token=None, **kw):
    kw.setdefault("kind", "acme.order")
    kw.setdefault("to_version", 2)
    return services.migration_job_submit(actor=actor, tenant=tenant,
                                         client_token=token or uuid.uuid4(), **kw)


@pytest.fixture
def stranded(acme, wendy):
    """Three acme.order v1 checkpoints whose owners are gone, and a fourth whose owner is
    live (written after the others aged)."""
    bodies = [order(wendy, acme), order(wendy, acme, "shipping"), order(wendy, acme)]
    age_world(QUIET)
    return bodies + [order(wendy, acme)]


def test_a_job_is_stored_queued_and_audited_then_runs_recording_each_checkpoint(
        acme, adam, stranded):
    job, created = submit(acme, adam)
    assert created and job.state == "queued"
    event = AuditEvent.objects.get(action="migration.submit")
    assert (event.target_type, event.target_ref) == ("migration_job", str(job.uuid))
    assert event.after == {"kind": "acme.order", "to_version": 2, "reverse": False,
                           "runs": None}
    assert not MigrationJobItem.objects.exists()  # nothing runs inside the request
    result = job_layer.execute(job.pk)
    assert result["result"] == "done"
    assert result["counts"] == {"migrated": 3, "skipped": 0, "refused": 1, "conflict": 0}
    job.refresh_from_db()
    assert (job.state, job.attempts, job.last_error) == ("done", 1, "")
    items = {i.checkpoint_uuid: i for i in MigrationJobItem.objects.filter(job=job)}
    assert {str(k) for k in items} == {b["id"] for b in stranded}
    live = items[uuid.UUID(stranded[3]["id"])]
    assert (live.outcome, live.reason, live.from_version) == ("refused", "owner_live", 1)
    assert str(live.run_uuid) == stranded[3]["run_id"]
    # Each migrated checkpoint's event carries the job's id as its batch.
    batches = {e.after["batch_id"] for e in AuditEvent.objects.filter(action="checkpoint.migrate")}
    assert batches == {str(job.uuid)}
    assert [stored(b).schema_version for b in stranded] == [2, 2, 2, 1]
    # A second delivery of the message does nothing.
    assert job_layer.execute(job.pk)["result"] == "skipped"


def test_the_same_token_answers_the_same_job_and_another_request_with_it_is_refused(
        acme, adam, stranded):
    token = uuid.uuid4()
    job, created = submit(acme, adam, token)
    again, created_again = submit(acme, adam, str(token))
    assert created and not created_again and again.pk == job.pk
    assert MigrationJob.objects.count() == 1
    assert AuditEvent.objects.filter(action="migration.submit").count() == 1
    with pytest.raises(InvalidPayload, match="^client_token:"):
        submit(acme, adam, token, reverse=True, to_version=1)


@pytest.mark.parametrize(("change", "field"), [
    ({"kind": "no.such"}, "kind"), ({"to_version": 7}, "to_version"),
    ({"to_version": "2"}, "to_version"), ({"reverse": "yes"}, "reverse"),
    ({"run_ids": ["nope"]}, "runs"), ({"run_ids": []}, "runs"), ({"run_ids": "x"}, "runs")])
def test_bad_input_is_refused_naming_the_field_with_nothing_written(acme, adam, change, field):
    before = db_state()
    with pytest.raises(InvalidPayload, match=f"^{field}:"):
        submit(acme, adam, **change)
    with pytest.raises(InvalidPayload, match="^client_token:"):
        submit(acme, adam, token="not-a-uuid")
    assert db_diff(before, db_state()) == {}


def test_only_the_tenants_admin_may_submit_or_preview(acme, rita, stranded):
    before = db_state()
    with pytest.raises(Forbidden):
        submit(acme, rita)
    with pytest.raises(Forbidden):
        services.migration_preview(actor=rita, tenant=acme, kind="acme.order", to_version=2)
    assert db_diff(before, db_state()) == {}


def test_the_preview_writes_nothing_and_says_what_the_job_would_do(acme, adam, stranded):
    before = db_state()
    preview = services.migration_preview(actor=adam, tenant=acme, kind="acme.order",
                                         to_version=2)
    assert db_diff(before, db_state()) == {}
    assert preview.counts == {"migrated": 3, "skipped": 0, "refused": 1, "conflict": 0}
    assert preview.refusals == {"owner_live": 1} and preview.checkpoints == 4
    [example] = preview.examples
    assert (example["added"], example["removed"], example["count"]) == (
        ["amount", "amount.cents", "amount.currency"], ["amount_cents"], 3) or \
        example["count"] == 3
    [refused] = preview.refused
    assert (str(refused.run_id), refused.reason) == (stranded[3]["run_id"], "owner_live")


def test_a_job_killed_mid_way_goes_on_from_where_it_was(acme, adam, stranded, monkeypatch):
    job, _ = submit(acme, adam)
    real, calls = migrations._migrate_locked, []

    def dies_on_the_second(*args):
        calls.append(args)
        if len(calls) == 2:
            raise SystemExit("killed")  # not an Exception: the worker process dies
        return real(*args)

    monkeypatch.setattr(migrations, "_migrate_locked", dies_on_the_second)
    with pytest.raises(SystemExit):
        job_layer.execute(job.pk)
    monkeypatch.setattr(migrations, "_migrate_locked", real)
    job.refresh_from_db()
    assert job.state == "running" and MigrationJobItem.objects.filter(job=job).count() == 1
    assert job_layer.execute(job.pk)["result"] == "skipped"  # its claim still holds
    age_world(job_layer.CLAIM_S + 1)  # the claim passes: the sweep sends it again
    assert services.sweep_stale_runs()["migrations_redriven"] == 1
    job.refresh_from_db()
    assert (job.state, job.attempts) == ("done", 2)
    # Ageing the claim aged the fourth run's owner too: all four, each once.
    assert MigrationJobItem.objects.filter(job=job, outcome="migrated").count() == 4
    assert AuditEvent.objects.filter(action="checkpoint.migrate").count() == 4
    assert Checkpoint.objects.filter(schema_version=2).count() == 4


def test_an_unexpected_error_is_retried_then_the_job_fails_visibly(acme, adam, stranded,
                                                                    monkeypatch):
    job, _ = submit(acme, adam)

    def broken(*args):
        raise RuntimeError("a bug in a step")

    monkeypatch.setattr(migrations, "_migrate_locked", broken)
    for attempt in range(1, job_layer.MAX_FAILURES + 1):
        age_world(3600)  # the back-off passes
        result = job_layer.execute(job.pk)
        job.refresh_from_db()
        assert job.attempts == attempt and "RuntimeError: a bug in a step" in job.last_error
    assert result["result"] == "failed" and job.state == "failed"
    assert job.finished_at is not None


@pytest.mark.parametrize("loss", ["revoked", "demoted", "deactivated"])
def test_a_requester_who_lost_the_right_fails_the_job_at_once_saying_so(acme, adam, stranded,
                                                                       loss):
    """Attack finding (a failure is visible, and says why): the job's ``last_error`` was
    ``not_found: not found`` for a requester deactivated or no longer in the tenant. The
    words are those of a right lost mid-job (``jobs.migrations.requester_now``)."""
    job, _ = submit(acme, adam)
    if loss == "deactivated":
        adam.is_active = False
        adam.save()
    else:
        services.role_revoke(actor=None, tenant=acme, user=adam, role="admin")
        if loss == "demoted":
            services.role_grant(actor=None, tenant=acme, user=adam, role="approver")
    assert job_layer.execute(job.pk)["result"] == "failed"
    job.refresh_from_db()
    assert job.state == "failed", job.last_error
    lost = {"revoked": "adam no longer holds the admin right in this tenant (not_found)",
            "demoted": "adam no longer holds the admin right in this tenant (forbidden)",
            "deactivated": "adam's account was deactivated"}[loss]
    assert job.last_error == (f"{lost}; stopped after 0 checkpoints migrated; an admin may "
                              "submit the migration again (it skips those already migrated)")
    assert Checkpoint.objects.filter(schema_version=2).count() == 0
    assert not MigrationJobItem.objects.filter(job=job).exists()


@pytest.fixture
def seven(acme, wendy, monkeypatch):
    """Seven acme.order v1 checkpoints whose owners are gone; the job walks them in
    batches of 2 (``jobs.migrations.BATCH``)."""
    bodies = [order(wendy, acme) for _ in range(7)]
    age_world(QUIET)
    monkeypatch.setattr(job_layer, "BATCH", 2)
    return bodies


def once_migrated(monkeypatch, nth: int, then) -> None:
    """Have the worker call ``then()`` right after its ``nth`` checkpoint (from 1)
    committed (in the middle of a batch), as another request would, through its own user
    object."""
    one, seen = migrations._migrate_one, []

    def migrating(*args, **kwargs):
        done = one(*args, **kwargs)
        seen.append(done)
        if len(seen) == nth:
            then()
        return done

    monkeypatch.setattr(migrations, "_migrate_one", migrating)


def stopped_at_the_next_batch(job, bodies, words: str) -> None:
    """The job (7 checkpoints, batches of 2, the right lost after the third) ran its
    second batch to the end as read before it, then stopped: failed, saying why and how
    many checkpoints it migrated, nothing migrated after, one item and one audit event
    per checkpoint migrated."""
    job.refresh_from_db()
    assert job.state == "failed" and job.finished_at is not None, job.last_error
    assert job.claimed_until is None
    assert words in job.last_error, job.last_error
    assert "stopped after 4 checkpoints migrated" in job.last_error, job.last_error
    assert [stored(b).schema_version for b in bodies] == [2, 2, 2, 2, 1, 1, 1]
    items = MigrationJobItem.objects.filter(job=job)
    assert sorted(str(i.checkpoint_uuid) for i in items) == sorted(b["id"] for b in bodies[:4])
    assert {i.outcome for i in items} == {"migrated"}
    assert AuditEvent.objects.filter(action="checkpoint.migrate").count() == 4


@pytest.mark.parametrize("left", [None, "approver"])
def test_a_role_revoked_mid_job_stops_it_at_the_next_batch(acme, adam, seven, monkeypatch,
                                                            left):
    # The requester was checked once per attempt, at its start: an admin revoked
    # mid-job went on migrating the tenant's checkpoints until the attempt ended.
    job, _ = submit(acme, adam)
    if left:
        services.role_grant(actor=None, tenant=acme, user=adam, role=left)
    once_migrated(monkeypatch, 3, lambda: services.role_revoke(
        actor=None, tenant=acme, user=adam, role="admin"))

    assert job_layer.execute(job.pk)["result"] == "failed"

    stopped_at_the_next_batch(job, seven, "adam no longer holds the admin right in this "
                              f"tenant ({'forbidden' if left else 'not_found'})")


def test_an_account_deactivated_mid_job_stops_it_at_the_next_batch(acme, adam, seven,
                                                                   monkeypatch):
    job, _ = submit(acme, adam)
    once_migrated(monkeypatch, 3, lambda: services.account_deactivate(user=adam))

    assert job_layer.execute(job.pk)["result"] == "failed"

    stopped_at_the_next_batch(job, seven, "adam's account was deactivated")


def test_unchanged_rights_walk_every_batch_to_the_end(acme, adam, seven):
    job, _ = submit(acme, adam)

    result = job_layer.execute(job.pk)

    assert result["result"] == "done", result
    assert result["counts"] == {"migrated": 7, "skipped": 0, "refused": 0, "conflict": 0}
    job.refresh_from_db()
    assert (job.state, job.last_error) == ("done", "")
    assert [stored(b).schema_version for b in seven] == [2] * 7


# --- the API ------------------------------------------------------------------------------

def _post(client, body, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(url("acme", "kinds/acme.order/migrations"), data=json.dumps(body),
                       content_type="application/json", **headers)


def test_the_api_answers_202_with_the_job_and_the_same_key_the_same_job(api_as, adam,
                                                                         stranded):
    key = str(uuid.uuid4())
    r = _post(api_as(adam), {"to_version": 2, "dry_run": False}, key)
    assert r.status_code == 202, r.content
    body = r.json()
    assert (body["state"], body["kind"], body["to_version"], body["runs"]) == \
        ("queued", "acme.order", 2, None)
    assert body["client_token"] == key and body["results"] == []
    again = _post(api_as(adam), {"to_version": 2}, key)
    assert again.status_code == 202 and again.json()["id"] == body["id"]
    job_layer.execute(MigrationJob.objects.get().pk)
    done = get(api_as(adam), "acme", f"kinds/acme.order/migrations/{body['id']}").json()
    assert done["state"] == "done" and done["counts"]["migrated"] == 3
    assert {r["outcome"] for r in done["results"]} == {"migrated", "refused"}


def test_the_api_dry_run_answers_200_with_the_preview_and_writes_nothing(api_as, adam,
                                                                          stranded):
    client = api_as(adam)
    before = db_state()
    r = _post(client, {"to_version": 2, "dry_run": True,
                             "runs": [stranded[0]["run_id"], stranded[3]["run_id"]]})
    assert r.status_code == 200, r.content
    assert db_diff(before, db_state()) == {}
    body = r.json()
    assert body["counts"] == {"migrated": 1, "skipped": 0, "refused": 1, "conflict": 0}
    assert [x["reason"] for x in body["refused"]] == ["owner_live"]
    assert body["examples"][0]["count"] == 1


@pytest.mark.parametrize(("body", "field"), [
    ({}, "to_version"), ({"to_version": 9}, "to_version"), ({"to_version": 2, "runs": []},
                                                             "runs"),
    ({"to_version": 2, "dry_run": "no"}, "dry_run"), ({"to_version": 2, "reverse": 1},
                                                      "reverse"),
    ({"to_version": 2, "extra": 1}, "extra"), ({"to_version": 2}, "client_token")])
def test_the_api_answers_400_naming_the_field(api_as, adam, stranded, body, field):
    r = _post(api_as(adam), body)
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith(f"{field}:")


def test_the_api_refuses_a_reviewer_and_hides_the_tenant_from_another(api_as, rita, omar,
                                                                      stranded):
    r = _post(api_as(rita), {"to_version": 2, "dry_run": True})
    assert r.status_code == 403
    assert _post(api_as(omar), {"to_version": 2, "dry_run": True}).status_code == 404
    assert _post(api_as(rita), {"to_version": 2}, str(uuid.uuid4())).status_code == 403
    assert not MigrationJob.objects.exists()


def test_any_role_reads_a_job_and_another_tenant_or_kind_gets_404(api_as, adam, vic, omar,
                                                                  acme, stranded):
    job, _ = submit(acme, adam)
    r = get(api_as(vic), "acme", f"kinds/acme.order/migrations/{job.uuid}")
    assert r.status_code == 200 and r.json()["client_token"] is None
    assert get(api_as(omar), "acme", f"kinds/acme.order/migrations/{job.uuid}").status_code \
        == 404
    for path in (f"kinds/runifold.agent/migrations/{job.uuid}",
                 f"kinds/acme.order/migrations/{uuid.uuid4()}",
                 "kinds/acme.order/migrations/nope"):
        assert get(api_as(vic), "acme", path).status_code == 404, path


def _bound(model, field: str) -> int:
    """The longest value the issue-19 services write into ``model.field`` (their source)."""
    from django.contrib.auth import get_user_model

    from checkpoints import audit, kinds
    from checkpoints.vocab import MigrationJobState, MigrationOutcome, MigrationRefusal

    sources = {
        "kind": kinds.KIND_MAX, "digest": 64, "fingerprint": 64, "description": 200,
        "requested_by_name": get_user_model()._meta.get_field("username").max_length,
        "state": max(map(len, MigrationJobState.values)),
        "outcome": max(map(len, MigrationOutcome.values)),
        "reason": max(map(len, MigrationRefusal.values)),
        "incident_ref": audit.INCIDENT_REF_MAX,  # the request's, checked by its rule
    }
    return sources[field]


def _char_fields():
    from checkpoints.models import DeclaredKindVersion
    for model in (DeclaredKindVersion, MigrationJob, MigrationJobItem):
        for field in model._meta.get_fields():
            if getattr(field, "max_length", None) and field.get_internal_type() == "CharField":
                yield pytest.param(model, field.name, id=f"{model.__name__}.{field.name}")


@pytest.mark.parametrize(("model", "field"), list(_char_fields()))
def test_every_text_column_of_the_new_tables_holds_the_longest_value_written(model, field):
    """The generated table of fault 2 (a value fits its column before any query): every
    CharField of the issue-19 tables against the longest value its service writes; a new
    column without a known source fails here (KeyError) until it is given one."""
    assert model._meta.get_field(field).max_length >= _bound(model, field)


def _version_fields():
    from checkpoints.models import DeclaredKindVersion
    for model in (DeclaredKindVersion, MigrationJob, MigrationJobItem):
        for field in model._meta.get_fields():
            if field.name.endswith("version") and field.get_internal_type().endswith(
                    "IntegerField"):
                yield pytest.param(model, field.name, id=f"{model.__name__}.{field.name}")


@pytest.mark.parametrize(("model", "field"), list(_version_fields()))
def test_every_version_column_of_the_new_tables_holds_every_schema_version(model, field):
    """Schema versions are 0..2^32-1 (``intranges.SCHEMA_VERSION``); attack finding: a
    job's ``to_version`` and an item's ``from_version`` were 32-bit signed columns on
    PostgreSQL (2^31-1 at most), so a job to a declared v4294967295 answered 500 there."""
    from django.db import connection

    from checkpoints import intranges

    internal = model._meta.get_field(field).get_internal_type()
    low, high = connection.ops.integer_field_range(internal)
    assert low <= 0 and (high is None or high >= intranges.SCHEMA_VERSION.maximum), internal


def test_a_job_of_a_200_character_kind_at_version_2_32_minus_1_is_stored_whole(acme, adam):
    from checkpoints.models import DeclaredKindVersion

    kind = "acme." + "k" * 195
    body = {"schema": {"type": "object"}, "description": "d" * 200,
            "phase": {"pointer": "/state", "stable": ["s" * 64]}}
    services.kind_declare(actor=adam, tenant=acme, kind=kind, version=2**32 - 1, body=body)
    job, _ = submit(acme, adam, kind=kind, to_version=2**32 - 1)
    job.refresh_from_db()
    stored = DeclaredKindVersion.objects.get()
    assert (job.kind, job.to_version, stored.kind, stored.description) == (
        kind, 2**32 - 1, kind, "d" * 200)
    assert AuditEvent.objects.get(action="migration.submit").after["kind"] == kind
