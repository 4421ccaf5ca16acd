"""A request's stored jobs carry its incident (the newcomer's finding: an on-call engineer's
``Incident-Ref``, or the dashboard's incident box, tagged every event they caused, but not
the reconcile job's answer, written later by the system: the README sent them to find it
"by run"). The incident is stored with the job (``ReconcileRequest.incident_ref``,
``MigrationJob.incident_ref``, as ``BulkAction.incident_ref``) and every event the job
records carries it, the system's included (``audit.working_on(..., system=True)``); a
request without one stores none, and its job's events carry none.

The job runs here as the worker runs it: ``jobs.reconciliation.execute`` after the
request committed, outside the request (no incident context left over)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.urls import reverse

from checkpoints import audit, services
from checkpoints.jobs import bulk as bulk_job
from checkpoints.jobs import migrations as job_layer
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, BulkAction, MigrationJob, ReconcileRequest
from checkpoints.vocab import AuditAction
from tests.api.apihelpers import get, url
from tests.services.test_bulk_jobs import many_runs
from tests.services.test_bulk_jobs import submit as bulk_submit
from tests.services.test_migration_jobs import once_migrated, seven  # noqa: F401 - fixture
from tests.services.test_migration_jobs import submit as migration_submit

pytestmark = pytest.mark.django_db

REASON = "INC-2041: charge timed out"


def _api_reconcile(api_as, reviewer, run_id, ref=None):
    headers = {} if ref is None else {"HTTP_INCIDENT_REF": ref}
    r = api_as(reviewer).post(url("acme", f"runs/{run_id}/reconcile"),
                              data={"reason": REASON}, content_type="application/json",
                              **headers)
    assert r.status_code == 202, r.content
    return r


def _run_the_jobs() -> list[AuditEvent]:
    """Run every stored reconcile request as a worker does (outside any request), and
    return the events the jobs recorded."""
    last = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first()
    for pk in ReconcileRequest.objects.values_list("pk", flat=True):
        assert reconciliation.execute(pk)["result"] == "confirmed"
    return list(AuditEvent.objects.filter(seq__gt=last).order_by("seq"))


def test_the_reconcile_answer_carries_the_api_requests_incident(
        api_as, rita, stuck, scripted):
    _api_reconcile(api_as, rita, stuck.run_id, "INC-2041")
    assert AuditEvent.objects.get(action=AuditAction.RUN_RECONCILE).incident_ref == "INC-2041"
    assert ReconcileRequest.objects.get().incident_ref == "INC-2041"

    events = _run_the_jobs()
    assert AuditAction.EFFECT_RECONCILE in {e.action for e in events}
    assert {(e.actor_name, e.incident_ref) for e in events} == {("system", "INC-2041")}
    # Found by the incident, as the README says: the reviewer's request and its answer.
    found = get(api_as(rita), "acme", "audit-events", q="INC-2041").json()["results"]
    assert {(row["actor"], row["action"]) for row in found} >= {
        ("rita", AuditAction.RUN_RECONCILE), ("system", AuditAction.EFFECT_RECONCILE)}


def test_without_an_incident_the_answer_carries_none(api_as, rita, stuck, scripted):
    _api_reconcile(api_as, rita, stuck.run_id)
    assert ReconcileRequest.objects.get().incident_ref is None
    events = _run_the_jobs()
    assert events and {e.incident_ref for e in events} == {None}


def test_the_reconcile_answer_carries_the_dashboard_sessions_incident(
        login, rita, stuck, scripted):
    client = login(rita)
    r = client.post(reverse("incident_set", args=["acme"]), {"incident_ref": "INC-7"})
    assert r.status_code in (302, 303), r.content[:300]
    r = client.post(reverse("run_reconcile", args=["acme", stuck.run_id]),
                    {"reason": REASON})
    assert r.status_code in (302, 303), r.content[:300]
    assert AuditEvent.objects.get(action=AuditAction.RUN_RECONCILE).incident_ref == "INC-7"
    events = _run_the_jobs()
    assert events and {(e.actor_name, e.incident_ref) for e in events} == {("system", "INC-7")}
    # and the dashboard's audit log shows it on the system's answer
    page = client.get("/t/acme/audit/?action=effect.reconcile")
    assert page.status_code == 200 and "INC-7" in page.content.decode()


def test_a_system_event_in_a_request_carries_no_incident(acme):
    # Outside a stored job, what the system does on its own carries none, even while a
    # person's incident is set (the request's context): only a job's events inherit it.
    def system_event():
        with transaction.atomic():
            return audit.audit_record(tenant=acme, actor=None,
                                      action=AuditAction.RUN_RECONCILE,
                                      target_type="run", target_id="x")

    with audit.working_on("INC-2041"):
        assert system_event().incident_ref is None
    with audit.working_on("INC-2041", system=True):
        assert system_event().incident_ref == "INC-2041"
        # a request's context inside a job's is the request's own again
        with audit.working_on("INC-2041"):
            assert system_event().incident_ref is None
    assert system_event().incident_ref is None


def test_a_migration_jobs_events_carry_the_requests_incident(
        acme, adam, seven, monkeypatch):  # noqa: F811 - fixture
    with audit.working_on("INC-9"):
        job, _ = migration_submit(acme, adam)
    assert MigrationJob.objects.get().incident_ref == "INC-9"
    # the admin loses the right part-way: the system gives the job up (migration.fail)
    once_migrated(monkeypatch, 3, lambda: services.role_revoke(
        actor=None, tenant=acme, user=adam, role="admin"))
    assert job_layer.execute(job.pk)["result"] == "failed"
    migrated = AuditEvent.objects.filter(action=AuditAction.CHECKPOINT_MIGRATE)
    assert migrated.count() == 4
    assert set(migrated.values_list("actor_name", "incident_ref")) == {("adam", "INC-9")}
    fail = AuditEvent.objects.get(action=AuditAction.MIGRATION_FAIL)
    assert (fail.actor_name, fail.incident_ref) == ("system", "INC-9")


def test_a_bulk_jobs_failure_by_the_system_carries_the_requests_incident(
        acme, rita, monkeypatch):
    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 3)
    monkeypatch.setattr(bulk_job, "BATCH", 2)
    runs = many_runs(acme, 5)
    with audit.working_on("INC-3"):
        bulk, _ = bulk_submit(rita, acme, runs)
    assert BulkAction.objects.get(pk=bulk.pk).incident_ref == "INC-3"
    services.account_deactivate(user=rita)
    assert bulk_job.execute(bulk.pk)["result"] == "failed"
    fail = AuditEvent.objects.get(action=AuditAction.BULK_FAIL)
    assert (fail.actor_name, fail.incident_ref) == ("system", "INC-3")
