"""A stored job's failure is an audit event (``bulk.fail``, ``migration.fail``): when a
bulk job or a migration job ends ``failed`` (its requester lost the right or was
deactivated between batches, ``jobs.migrations.requester_now``; a refusal of the request
itself; ``MAX_FAILURES`` unexpected errors in a row), one event by the system says which
job, why (the stored reason) and how far it got, in the transaction that fails it,
through ``audit_record`` like every other event (so the verifier covers it), shown by
``GET …/audit-events`` and the dashboard's audit log. Once only: a re-driven job, a
second delivery, or an attempt that lost its claim writes no second one."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest

from checkpoints import auditwords, services
from checkpoints.dbclock import NOW
from checkpoints.jobs import bulk as bulk_job
from checkpoints.jobs import migrations as job_layer
from checkpoints.models import AuditEvent, BulkAction, MigrationJob
from checkpoints.services import migrations
from checkpoints.vocab import AuditAction, BulkState, MigrationJobState, TargetType
from tests.api.apihelpers import get
from tests.helpers import age_world
from tests.services.test_bulk_jobs import many_runs, once_acted_on
from tests.services.test_bulk_jobs import submit as bulk_submit
from tests.services.test_migration_jobs import once_migrated, seven  # noqa: F401 - fixture
from tests.services.test_migration_jobs import submit as migration_submit
from tests.views.test_bulk import logged_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_jobs(monkeypatch):
    """More than 3 runs make a bulk job; batches of 2."""
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    monkeypatch.setattr(bulk_job, "BATCH", 2)


def claim_passed(bulk) -> None:
    """A bulk job's claim (if any) passed, on the database clock."""
    BulkAction.objects.filter(pk=bulk.pk, claimed_until__isnull=False).update(
        claimed_until=NOW - timedelta(seconds=1))


def fail_events(action, job) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, target_ref=str(job.uuid))
                .order_by("seq"))


def shown(tenant, viewer, event: AuditEvent, api_as) -> None:
    """The event as an operator finds it: ``GET …/audit-events?action=`` (with the
    stored reason and counts) and the dashboard's audit log (its sentence); and the
    tenant's audit still verifies with it sealed in."""
    r = get(api_as(viewer), tenant.slug, "audit-events", action=event.action)
    assert r.status_code == 200, r.content
    [row] = r.json()["results"]
    assert (row["id"], row["actor"], row["action"]) == (event.pk, "system", event.action)
    assert row["target_id"] == event.target_ref and row["reason"] == event.reason
    assert row["after"] == event.after and row["before"] == {"state": "running"}
    page = logged_in(viewer).get(f"/t/{tenant.slug}/audit/?action={event.action}")
    assert page.status_code == 200
    text = html.unescape(page.content.decode())
    assert f'data-action="{event.action}"' in text
    assert auditwords.sentence(event) in text
    services.audit_integrate(tenant)
    intact, _, problem = services.audit_verify(tenant=tenant)
    assert intact, problem


# --- bulk jobs ----------------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["revoked", "deactivated"])
def test_a_bulk_job_whose_requester_lost_the_right_writes_its_failure(
        acme, rita, vic, small_jobs, monkeypatch, api_as, loss):
    runs = many_runs(acme, 7)
    bulk, _ = bulk_submit(rita, acme, runs)
    lose = (lambda: services.account_deactivate(user=rita)) if loss == "deactivated" else (
        lambda: services.role_revoke(actor=None, tenant=acme, user=rita, role="reviewer"))
    once_acted_on(monkeypatch, 2, lose)

    assert bulk_job.execute(bulk.pk)["result"] == "failed"

    bulk.refresh_from_db()
    assert bulk.state == BulkState.FAILED and "stopped after 4 of 7 runs" in bulk.last_error
    [event] = fail_events(AuditAction.BULK_FAIL, bulk)
    assert (event.actor_id, event.actor_name) == (None, "system")
    assert (event.target_type, event.run_uuid) == (TargetType.BULK_ACTION, None)
    assert event.reason == bulk.last_error  # why: the stored reason, word for word
    assert event.before == {"state": "running"}
    assert event.after == {"state": "failed", "done": 4, "refused": 0, "failed": 0,
                           "total": 7, "attempts": 1, "failures": 0}
    assert auditwords.sentence(event).startswith(
        f"system gave up bulk {str(bulk.uuid)[:8]} after 4 of 7 runs (4 done, 0 refused, "
        "0 failed): rita")
    shown(acme, vic, event, api_as)


def test_a_bulk_job_that_keeps_failing_writes_its_failure_once_at_the_end(
        acme, rita, small_jobs, monkeypatch):
    runs = many_runs(acme, 4)
    bulk, _ = bulk_submit(rita, acme, runs)

    def down(*args, **kwargs):
        raise ConnectionError("database went away near customer alice@example.com")

    monkeypatch.setattr(services, "bulk_job_act", down)
    for attempt in range(1, bulk_job.MAX_FAILURES + 1):
        BulkAction.objects.filter(pk=bulk.pk).update(next_attempt_at=NOW)
        bulk_job.execute(bulk.pk)
        # The retries before the last are not failures of the job: no event.
        assert len(fail_events(AuditAction.BULK_FAIL, bulk)) == (
            attempt == bulk_job.MAX_FAILURES)
    bulk.refresh_from_db()
    assert bulk.state == BulkState.FAILED and "alice@example.com" in bulk.last_error
    [event] = fail_events(AuditAction.BULK_FAIL, bulk)
    assert event.after == {"state": "failed", "done": 0, "refused": 0, "failed": 0,
                           "total": 4, "attempts": 3, "failures": 3}
    # Why, without the exception's words: they may quote stored data, and an audit
    # event is never erased (they stay in last_error, on the job's page).
    assert event.reason == ("gave up after 3 failed attempts in a row; the last (attempt "
                            "3) raised ConnectionError (its message: the job's last error)")
    assert "alice" not in event.reason


def test_a_bulk_failure_is_written_once_whatever_redelivers_the_job(acme, rita, small_jobs,
                                                                    monkeypatch):
    runs = many_runs(acme, 7)
    bulk, _ = bulk_submit(rita, acme, runs)
    act, calls = services.bulk_job_act, []

    def dies_on_the_third(job, at, run_id, **kwargs):
        calls.append(at)
        if len(calls) == 3:
            raise SystemExit("killed")  # the worker process dies mid-batch
        return act(job, at, run_id, **kwargs)

    monkeypatch.setattr(services, "bulk_job_act", dies_on_the_third)
    with pytest.raises(SystemExit):
        bulk_job.execute(bulk.pk)
    monkeypatch.setattr(services, "bulk_job_act", act)
    services.role_revoke(actor=None, tenant=acme, user=rita, role="reviewer")
    claim_passed(bulk)  # the sweep re-drives it

    services.sweep_stale_runs()
    bulk.refresh_from_db()
    assert (bulk.state, bulk.attempts) == (BulkState.FAILED, 2), bulk.last_error
    [event] = fail_events(AuditAction.BULK_FAIL, bulk)
    assert event.after["attempts"] == 2 and event.after["done"] == 2

    # Delivered again, swept again, claim long passed: nothing more.
    assert bulk_job.execute(bulk.pk)["result"] == "skipped"
    claim_passed(bulk)
    services.sweep_stale_runs()
    assert bulk_job.execute(bulk.pk)["result"] == "skipped"
    assert len(fail_events(AuditAction.BULK_FAIL, bulk)) == 1


def test_an_attempt_that_lost_its_claim_fails_nothing_and_writes_nothing(acme, rita,
                                                                         small_jobs):
    bulk, _ = bulk_submit(rita, acme, many_runs(acme, 4))
    BulkAction.objects.filter(pk=bulk.pk).update(state=BulkState.RUNNING, attempts=2)
    stale = BulkAction.objects.select_related("tenant").get(pk=bulk.pk)
    stale.attempts = 1  # an earlier attempt, taken over after its claim passed

    assert services.bulk_job_fail(stale, last_error="x", reason="x") is False

    bulk.refresh_from_db()
    assert bulk.state == BulkState.RUNNING and bulk.last_error == ""
    assert not fail_events(AuditAction.BULK_FAIL, bulk)

    # An aborted job is not failed after it either: the abort's event stays the only end.
    services.bulk_abort(actor=rita, tenant=acme, bulk_id=bulk.uuid, reason="wrong filter")
    stale.attempts = 2
    assert services.bulk_job_fail(stale, last_error="x", reason="x") is False
    bulk.refresh_from_db()
    assert bulk.state == BulkState.ABORTED
    assert [e.action for e in AuditEvent.objects.filter(target_ref=str(bulk.uuid))
            .order_by("seq")] == [AuditAction.BULK_SUBMIT, AuditAction.BULK_ABORT]


# --- migration jobs -----------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["revoked", "deactivated"])
def test_a_migration_job_whose_requester_lost_the_right_writes_its_failure(
        acme, adam, vic, seven, monkeypatch, api_as, loss):  # noqa: F811 - fixture
    job, _ = migration_submit(acme, adam)
    lose = (lambda: services.account_deactivate(user=adam)) if loss == "deactivated" else (
        lambda: services.role_revoke(actor=None, tenant=acme, user=adam, role="admin"))
    once_migrated(monkeypatch, 3, lose)

    assert job_layer.execute(job.pk)["result"] == "failed"

    job.refresh_from_db()
    assert job.state == MigrationJobState.FAILED
    assert "stopped after 4 checkpoints migrated" in job.last_error
    [event] = fail_events(AuditAction.MIGRATION_FAIL, job)
    assert (event.actor_id, event.actor_name) == (None, "system")
    assert event.target_type == TargetType.MIGRATION_JOB
    assert event.reason == job.last_error
    assert event.before == {"state": "running"}
    assert event.after == {"state": "failed", "kind": "acme.order", "to_version": 2,
                           "migrated": 4, "skipped": 0, "refused": 0, "conflict": 0,
                           "attempts": 1, "failures": 0}
    assert auditwords.sentence(event).startswith(
        f"system gave up migration job {str(job.uuid)[:8]} (acme.order to v2) with 4 "
        "checkpoints migrated, 0 skipped, 0 refused, 0 in conflict: adam")
    shown(acme, vic, event, api_as)


def test_a_migration_job_that_keeps_failing_writes_its_failure_once_at_the_end(
        acme, adam, seven, monkeypatch):  # noqa: F811 - fixture
    job, _ = migration_submit(acme, adam)

    def broken(*args):
        raise RuntimeError("a bug in a step")

    monkeypatch.setattr(migrations, "_migrate_locked", broken)
    for attempt in range(1, job_layer.MAX_FAILURES + 1):
        age_world(3600)  # the back-off passes
        job_layer.execute(job.pk)
        assert len(fail_events(AuditAction.MIGRATION_FAIL, job)) == (
            attempt == job_layer.MAX_FAILURES)
    [event] = fail_events(AuditAction.MIGRATION_FAIL, job)
    assert event.reason == ("gave up after 3 failed attempts in a row; the last (attempt "
                            "3) raised RuntimeError (its message: the job's last error)")
    assert event.after["attempts"] == 3 and event.after["failures"] == 3
    assert event.after["migrated"] == 0


def test_a_migration_job_whose_request_is_refused_now_writes_its_failure(
        acme, adam, seven):  # noqa: F811 - fixture
    job, _ = migration_submit(acme, adam)
    MigrationJob.objects.filter(pk=job.pk).update(to_version=7)  # no such version now

    assert job_layer.execute(job.pk)["result"] == "failed"

    job.refresh_from_db()
    assert job.last_error == "invalid_payload: to_version: acme.order has versions 1, 2"
    [event] = fail_events(AuditAction.MIGRATION_FAIL, job)
    assert event.reason == job.last_error and event.after["migrated"] == 0


def test_a_migration_failure_is_written_once_whatever_redelivers_the_job(
        acme, adam, seven, monkeypatch):  # noqa: F811 - fixture
    job, _ = migration_submit(acme, adam)
    real, calls = migrations._migrate_locked, []

    def dies_on_the_third(*args):
        calls.append(args)
        if len(calls) == 3:
            raise SystemExit("killed")
        return real(*args)

    monkeypatch.setattr(migrations, "_migrate_locked", dies_on_the_third)
    with pytest.raises(SystemExit):
        job_layer.execute(job.pk)
    monkeypatch.setattr(migrations, "_migrate_locked", real)
    services.role_revoke(actor=None, tenant=acme, user=adam, role="admin")
    age_world(job_layer.CLAIM_S + 1)

    assert services.sweep_stale_runs()["migrations_redriven"] == 1
    job.refresh_from_db()
    assert (job.state, job.attempts) == (MigrationJobState.FAILED, 2), job.last_error
    [event] = fail_events(AuditAction.MIGRATION_FAIL, job)
    assert event.after["attempts"] == 2 and event.after["migrated"] == 2

    assert job_layer.execute(job.pk)["result"] == "skipped"
    age_world(job_layer.CLAIM_S + 1)
    services.sweep_stale_runs()
    assert len(fail_events(AuditAction.MIGRATION_FAIL, job)) == 1


def test_a_migration_attempt_that_lost_its_claim_writes_nothing(acme, adam, seven):  # noqa: F811
    job, _ = migration_submit(acme, adam)
    MigrationJob.objects.filter(pk=job.pk).update(state=MigrationJobState.RUNNING, attempts=2)
    stale = MigrationJob.objects.select_related("tenant").get(pk=job.pk)
    stale.attempts = 1

    assert services.migration_job_fail(stale, last_error="x", reason="x") is False

    job.refresh_from_db()
    assert job.state == MigrationJobState.RUNNING and job.last_error == ""
    assert not fail_events(AuditAction.MIGRATION_FAIL, job)
