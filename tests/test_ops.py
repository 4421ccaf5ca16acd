"""Operations (issue 9, item 7; checkpoints/ops/health.py, checkpoints/metrics.py): the probes,
the Prometheus scrape (its access, each domain gauge against a known world, the resume
counter), the request id (validated, echoed, on log lines) and the JSON log lines.
The same endpoints against a real gunicorn: tests/browser/test_production.py."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import logging.config
import os
import re
import socket
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.db.models import Count
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from checkpoints import heartbeat, replica, services
from checkpoints.exceptions import StaleRevision
from checkpoints.models import (
    AuditEvent,
    AuditPending,
    BulkAction,
    Conflict,
    Effect,
    MigrationJob,
    ReconcileRequest,
    Run,
)
from checkpoints.ops import health
from checkpoints.vocab import EffectState, ReconcileState, RecoveryState
from tests.faults.conftest import in_doubt_run
from tests.faults.stubs import broker_at
from tests.helpers import ambiguous_run, envelope, put_checkpoint, sweep_later
from tests.security import tampering

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-" + "x" * 30
UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens


# --------------------------------------------------------------------------------------
# /healthz and /readyz
# --------------------------------------------------------------------------------------

def test_healthz_answers_without_the_database(client, django_assert_num_queries, monkeypatch):
    monkeypatch.setattr(connection, "cursor", _refuse)
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def _refuse(*args, **kwargs):
    raise OperationalError("connection refused (simulated)")


@pytest.fixture
def no_broker(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # what CELERY_BROKER_URL unset means


def test_readyz_is_ok_with_the_database_and_no_broker_configured(client, no_broker):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "heartbeat": {},
                               "checks": {"audit": "ok", "broker": "not configured",
                                          "database": "ok", "login_slots": "ok",
                                          "migrations": "ok",
                                          "notifications": "not configured",
        "retention": "not configured",
                                          "worker": "not configured"}}


def test_readyz_names_the_database_when_it_is_down(client, monkeypatch, no_broker):
    monkeypatch.setattr(connection, "cursor", _refuse)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "5"
    assert response.json() == {"status": "unavailable", "heartbeat": {},
                               "checks": {"audit": "failed: OperationalError",
                                          "broker": "not configured",
                                          "database": "failed: OperationalError",
                                          "login_slots": "ok",
                                          "migrations": "failed: OperationalError",
                                          "notifications": "failed: OperationalError",
                                          "retention": "failed: OperationalError",
                                          "worker": "not configured"}}


def test_readyz_names_the_broker_when_it_is_down(client):
    with broker_at(f"redis://127.0.0.1:{closed_port()}/0"):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("failed: ")
    assert "127.0.0.1" not in json.dumps(body)  # names the dependency, not its address


@pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL"),
                    reason="CELERY_BROKER_URL is not set (make test's PostgreSQL pass sets it)")
def test_readyz_is_ok_with_a_live_broker(client):
    heartbeat.beat("sweep", "sweep.celery")  # a worker ran beat's sweep just now
    with broker_at(os.environ["CELERY_BROKER_URL"]):
        response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"audit": "ok", "broker": "ok", "database": "ok",
                                         "login_slots": "ok", "migrations": "ok",
                                         "notifications": "not configured",
        "retention": "not configured", "worker": "ok"}


def test_probes_refuse_writes(client):
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.post(path).status_code == 405


# --------------------------------------------------------------------------------------
# /metrics: access
# --------------------------------------------------------------------------------------

def test_metrics_are_off_without_a_token(client, settings):
    settings.RECOVERY_METRICS_TOKEN = ""
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer ")
    assert response.status_code == 404
    assert b"recovery_" not in response.content


def test_metrics_need_the_token(client, settings, wendy):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    api_token = services.token_issue(user=wendy)  # an account's token opens nothing here
    for header in (None, "Bearer", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x",
                   f"Basic {TOKEN}", f"Bearer {api_token}"):
        extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
        response = client.get("/metrics", **extra)
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"recovery_runs" not in response.content
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")


def test_a_logged_in_session_does_not_open_the_metrics(client, settings, rita):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    client.force_login(rita)
    assert client.get("/metrics").status_code == 401


# --------------------------------------------------------------------------------------
# /metrics: content
# --------------------------------------------------------------------------------------

def scrape(client) -> dict[str, dict[tuple, float]]:
    """``{sample name: {sorted label items: value}}`` of one authorised scrape."""
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.fixture
def world(acme, globex, wendy, wes, rita):
    """acme: an ambiguous run, a run with three effects in doubt (reconcile requested: one
    request retrying after failed look-ups, one given up, one queued), a run conflicted by a refused
    write; globex: one healthy run."""
    ambiguous_run(wendy, acme)
    in_doubt = in_doubt_run(wendy, acme, keys=("charge:A-1", "charge:A-2", "charge:A-3"))
    sweep_later()
    services.run_reconcile(actor=rita, tenant=acme, run_id=in_doubt.run_id, reason="metrics")
    first, second, _third = ReconcileRequest.objects.filter(
        run__uuid=in_doubt.run_id).order_by("pk")
    # What the worker leaves behind (its own tests drive it): a look-up that could not tell,
    # and a request that hit the attempt cap.
    ReconcileRequest.objects.filter(pk=first.pk).update(failures=2, attempts=2)
    ReconcileRequest.objects.filter(pk=second.pk).update(state=ReconcileState.GAVE_UP)
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(StaleRevision):  # a second writer from the same revision
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    put_checkpoint(wes, globex, envelope())
    return in_doubt


def gauge(figures, name, **labels) -> float:
    return figures[name][tuple(sorted(labels.items()))]


def test_each_domain_gauge_counts_the_known_world(client, settings, world, acme, globex):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    figures = scrape(client)
    # The world as plain counts of the rows (not through the state counters).
    for tenant in (acme, globex):
        runs = dict(Run.objects.filter(tenant=tenant).values_list("recovery_state")
                    .annotate(n=Count("id")))
        for state in RecoveryState.values:
            assert gauge(figures, "recovery_runs", tenant=tenant.slug, state=state) \
                == runs.get(state, 0), (tenant.slug, state)
        effects = dict(Effect.objects.filter(tenant=tenant).values_list("state")
                       .annotate(n=Count("id")))
        for state in EffectState.values:
            assert gauge(figures, "recovery_effects", tenant=tenant.slug, state=state) \
                == effects.get(state, 0), (tenant.slug, state)
        assert gauge(figures, "recovery_audit_events", tenant=tenant.slug) \
            == AuditEvent.objects.filter(tenant=tenant).count() > 0
    # ... and as the fixture built it.
    assert gauge(figures, "recovery_runs", tenant="acme", state="ambiguous") == 2
    assert gauge(figures, "recovery_runs", tenant="acme", state="conflicted") == 1
    assert gauge(figures, "recovery_runs", tenant="globex", state="healthy") == 1
    assert gauge(figures, "recovery_runs", tenant="globex", state="ambiguous") == 0
    assert gauge(figures, "recovery_effects", tenant="acme", state="unresolved") == 3
    assert gauge(figures, "recovery_open_conflicts", tenant="acme") == 1
    assert Conflict.objects.filter(tenant=acme, acknowledged_at__isnull=True).count() == 1
    assert gauge(figures, "recovery_open_conflicts", tenant="globex") == 0
    assert gauge(figures, "recovery_reconcile_requests", tenant="acme", state="queued") == 2
    assert gauge(figures, "recovery_reconcile_requests", tenant="acme", state="running") == 0
    assert gauge(figures, "recovery_reconcile_requests", tenant="acme", state="gave_up") == 1
    assert gauge(figures, "recovery_reconcile_failing", tenant="acme") == 1
    assert gauge(figures, "recovery_reconcile_requests", tenant="globex", state="queued") == 0
    assert gauge(figures, "recovery_reconcile_failing", tenant="globex") == 0
    # Only the tenants' slugs label the series, and every tenant has every state.
    tenants = {dict(k)["tenant"] for k in figures["recovery_runs"]}
    assert tenants == {"acme", "globex"}
    assert len(figures["recovery_runs"]) == 2 * len(RecoveryState.values)


def test_the_audit_queue_is_counted_and_aged_on_the_database_clock(client, settings, world,
                                                                     acme, globex):
    """Issue 22: ``recovery_audit_pending`` and ``recovery_audit_integration_lag_seconds``
    per tenant, the age from ``queued_at`` (the database's) to the database's now; 0 for a
    tenant with nothing queued."""
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    services.audit_integrate(globex)
    queued = AuditPending.objects.filter(tenant=acme).count()
    assert queued > 0
    then = timezone.now() - timedelta(seconds=300)
    oldest = AuditPending.objects.filter(tenant=acme).order_by("event_id").first()
    tampering.raw("UPDATE checkpoints_auditpending SET queued_at = %s WHERE event_id = %s",
                  [then, oldest.event_id])
    figures = scrape(client)
    assert gauge(figures, "recovery_audit_pending", tenant="acme") == queued
    assert 300 <= gauge(figures, "recovery_audit_integration_lag_seconds", tenant="acme") < 400
    assert gauge(figures, "recovery_audit_pending", tenant="globex") == 0
    assert gauge(figures, "recovery_audit_integration_lag_seconds", tenant="globex") == 0
    assert gauge(figures, "recovery_audit_events", tenant="globex") \
        == AuditEvent.objects.filter(tenant=globex).count()
    services.audit_integrate(acme)
    figures = scrape(client)
    assert gauge(figures, "recovery_audit_pending", tenant="acme") == 0
    assert gauge(figures, "recovery_audit_integration_lag_seconds", tenant="acme") == 0


def test_migration_jobs_are_counted_queued_running_and_failed(client, settings, acme,
                                                              globex, adam):
    # What a worker leaves behind (the jobs' own tests drive it): rows in each state.
    for state in ("queued", "queued", "running", "failed", "done"):
        MigrationJob.objects.create(
            tenant=acme, uuid=uuid.uuid4(), client_token=uuid.uuid4(), requested_by=adam,
            requested_by_name=adam.username, kind="order", to_version=2, selection={},
            fingerprint="0" * 64, state=state)
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    figures = scrape(client)
    assert {dict(k)["state"]: v for k, v in figures["recovery_migration_jobs"].items()
            if dict(k)["tenant"] == "acme"} == {"queued": 2, "running": 1, "failed": 1}
    assert {dict(k)["state"]: v for k, v in figures["recovery_migration_jobs"].items()
            if dict(k)["tenant"] == "globex"} == {"queued": 0, "running": 0, "failed": 0}


def test_bulk_jobs_are_counted_queued_running_failed_and_stalled(client, settings, acme,
                                                                 globex, rita):
    # What a worker leaves behind (tests/services/test_bulk_jobs.py drives it); an inline
    # bulk action (not a job) is not counted.
    for state, claim in (("queued", None), ("running", 60), ("running", -60), ("failed", None),
                         ("finished", None), ("aborted", None)):
        BulkAction.objects.create(
            tenant=acme, uuid=uuid.uuid4(), client_token=uuid.uuid4(), requested_by=rita,
            requested_by_name="rita", action="close", reason="r", selection={},
            fingerprint="0" * 64, total=600, background=True, state=state,
            claimed_until=None if claim is None else timezone.now() + timedelta(seconds=claim))
    BulkAction.objects.create(
        tenant=acme, uuid=uuid.uuid4(), client_token=uuid.uuid4(), requested_by=rita,
        requested_by_name="rita", action="close", reason="r", selection={},
        fingerprint="0" * 64, total=2, state="running")
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    figures = scrape(client)
    assert {dict(k)["state"]: v for k, v in figures["recovery_bulk_jobs"].items()
            if dict(k)["tenant"] == "acme"} == {"queued": 1, "running": 2, "failed": 1}
    assert gauge(figures, "recovery_bulk_jobs_stalled", tenant="acme") == 1
    assert gauge(figures, "recovery_bulk_jobs_stalled", tenant="globex") == 0


def test_the_scrape_costs_the_same_queries_whatever_the_rows(client, settings, world,
                                                             django_assert_max_num_queries):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    with django_assert_max_num_queries(12):  # ten figures (the audit: heads and queue; bulk jobs) and the heartbeats
        scrape(client)


def test_a_scrape_writes_nothing(client, settings, world, acme):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    before = (AuditEvent.objects.count(), ReconcileRequest.objects.count())
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        scrape(client)
    assert all(q["sql"].lstrip().upper().startswith("SELECT") for q in queries.captured_queries)
    assert (AuditEvent.objects.count(), ReconcileRequest.objects.count()) == before


def test_resume_decisions_are_counted_by_action_and_mode(client, settings, acme, wendy):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    run_id = ambiguous_run(wendy, acme)
    before = scrape(client).get("recovery_resume_decisions_total", {})

    def count(figures, action, mode):
        return figures.get(tuple(sorted({"tenant": "acme", "action": action,
                                         "mode": mode}.items())), 0)

    preview = services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
    services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    after = scrape(client)["recovery_resume_decisions_total"]
    assert count(after, preview["action"], "preview") - count(before, preview["action"],
                                                              "preview") == 2
    assert count(after, claim["action"], "claim") - count(before, claim["action"], "claim") == 1


def test_django_prometheus_request_and_database_metrics_are_served(client, settings):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    client.get("/healthz")
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    assert "django_http_requests_total_by_method_total" in text
    assert 'django_db_execute_total{alias="default"' in text


# --------------------------------------------------------------------------------------
# The request id and the log lines
# --------------------------------------------------------------------------------------

def test_a_request_without_an_id_gets_a_fresh_one(client):
    first = client.get("/healthz")["X-Request-ID"]
    second = client.get("/healthz")["X-Request-ID"]
    assert UUID_TEXT.fullmatch(first) and UUID_TEXT.fullmatch(second)
    assert first != second


@pytest.mark.parametrize("given", ["abcdef12", "3f2b8c0e9d7a4b6c8e1f0a2b3c4d5e6f",
                                   "6fa459ea-ee8a-3ca4-894e-db77e160355e", "svc:web-1.a_b",
                                   "x" * 128])
def test_a_well_formed_incoming_id_is_kept_and_echoed(client, given):
    assert client.get("/healthz", HTTP_X_REQUEST_ID=given)["X-Request-ID"] == given


@pytest.mark.parametrize("given", ["x" * 129, "short", "", "réquest-id-1", "id with spaces",
                                   "id\tabcdefgh", "<script>alert(1)</script>",
                                   "abcdefgh;rm", "ab/cdefgh"])
def test_an_ill_formed_incoming_id_is_replaced(client, given):
    echoed = client.get("/healthz", HTTP_X_REQUEST_ID=given)["X-Request-ID"]
    assert echoed != given
    assert UUID_TEXT.fullmatch(echoed)


@contextlib.contextmanager
def _captured_log(formatter: str):
    """The project's LOGGING with ``formatter`` (``json``/``text``) into a buffer, access
    log on; the configuration is put back afterwards."""
    buffer = io.StringIO()
    config = copy.deepcopy(settings.LOGGING)
    config["handlers"]["console"]["formatter"] = formatter
    config["handlers"]["console"]["stream"] = buffer
    config["loggers"]["recovery.access"] = {"level": "INFO"}
    logging.config.dictConfig(config)
    try:
        yield buffer
    finally:
        logging.config.dictConfig(settings.LOGGING)


@pytest.fixture
def json_log():
    """The project's LOGGING with the JSON formatter into a buffer, access log on."""
    with _captured_log("json") as buffer:
        yield buffer


def test_every_log_line_of_a_request_is_json_with_its_request_id(json_log, client, rita):
    given = "req-" + uuid.uuid4().hex
    client.force_login(rita)
    client.get("/t/acme/runs/not-a-run/", HTTP_X_REQUEST_ID=given)  # 404: django.request
    client.get("/healthz")  # another request, another id
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    ours = [line for line in lines if line["request_id"] == given]
    assert {line["logger"] for line in ours} >= {"recovery.access", "django.request"}
    access = next(line for line in ours if line["logger"] == "recovery.access")
    assert access["status"] == 404 and access["method"] == "GET"
    assert access["path"] == "/t/acme/runs/not-a-run/"
    assert isinstance(access["duration_ms"], float)
    assert {"time", "level", "message"} <= set(access)
    others = [line for line in lines if line["request_id"] != given]
    assert others and all(UUID_TEXT.fullmatch(line["request_id"]) for line in others)


def test_text_logs_carry_the_request_id_too(client):
    with _captured_log("text") as buffer:
        Client().get("/healthz", HTTP_X_REQUEST_ID="text-log-12345")
    assert "INFO recovery.access [text-log-12345] GET /healthz 200" in buffer.getvalue()


def test_a_path_cannot_forge_a_line_of_the_text_access_log():
    with _captured_log("text") as buffer:
        Client().get("/healthz%0AINFO recovery.access [x] GET /admin/ 200",
                     HTTP_X_REQUEST_ID="forge-log-12345")
    lines = [line for line in buffer.getvalue().splitlines()
             if line.startswith("INFO recovery.access")]
    assert len(lines) == 1 and "[forge-log-12345]" in lines[0]
    assert "/healthz\\nINFO" in lines[0]


def test_the_scrape_still_serves_the_process_metrics_when_the_database_is_down(
        client, settings, monkeypatch):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    monkeypatch.setattr(connection, "cursor", _refuse)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    body = response.content.decode()
    assert "recovery_domain_scrape_ok 0.0" in body
    assert "recovery_runs{" not in body
    assert "django_http_requests" in body  # django-prometheus' own, still there


# --------------------------------------------------------------------------------------
# The worker's heartbeat in /readyz and /metrics (issue 17, item 11)
# --------------------------------------------------------------------------------------

def _age_heartbeats(seconds: float) -> None:
    from datetime import timedelta

    from django.db.models import F

    from checkpoints.models import Heartbeat

    Heartbeat.objects.update(at=F("at") - timedelta(seconds=seconds))


@pytest.fixture
def reachable_broker(settings, monkeypatch):
    """A broker configured, and answering (the worker check is what is under test)."""
    from checkpoints.ops import health as ops

    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERY_INPROCESS_WORKER = False
    monkeypatch.setattr(ops, "_check_broker", lambda: None)
    return settings


def test_readyz_names_the_worker_when_no_worker_ever_swept(client, reachable_broker):
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body["checks"] == {"audit": "ok", "broker": "ok", "database": "ok",
                              "login_slots": "ok", "migrations": "ok",
                              "notifications": "not configured",
        "retention": "not configured",
                              "worker": "failed: WorkerSilent"}


def test_readyz_names_the_worker_once_its_heartbeat_is_older_than_the_bound(
        client, reachable_broker):
    services.sweep_stale_runs(by="celery")  # beat's sweep, run by a worker
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["worker"] == "ok"
    assert response.json()["heartbeat"]["sweep.celery"] < 5

    bound = reachable_broker.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S
    _age_heartbeats(bound - 5)
    assert client.get("/readyz").status_code == 200
    _age_heartbeats(10)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["worker"] == "failed: WorkerSilent"
    assert response.json()["heartbeat"]["sweep.celery"] >= bound


def test_readyz_is_not_fooled_by_the_web_process_sweeping_for_a_dead_worker(
        client, reachable_broker):
    from checkpoints.jobs import inprocess

    services.sweep_stale_runs(by="celery")
    _age_heartbeats(3600)
    assert inprocess.catch_up() is not None  # the web process swept: the runs are right
    response = client.get("/readyz")
    assert response.status_code == 503  # ... but the worker is still dead, and says so
    assert response.json()["checks"]["worker"] == "failed: WorkerSilent"


def test_readyz_reads_the_in_process_worker_s_heartbeat_in_the_embedded_mode(
        client, settings, monkeypatch, no_broker):
    from checkpoints.jobs import inprocess

    settings.RECOVERY_INPROCESS_WORKER = True
    monkeypatch.setattr(inprocess, "start", lambda **kw: False)  # no thread in the tests
    monkeypatch.setattr(inprocess, "started_at", [])  # this process started no thread
    assert client.get("/readyz").status_code == 503  # no in-process sweep ever
    services.sweep_stale_runs(by="inprocess")
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["worker"] == "ok"
    _age_heartbeats(settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S + 1)
    assert client.get("/readyz").json()["checks"]["worker"] == "failed: WorkerSilent"
    # A worker thread this process started moments ago gets its first round.
    import time

    monkeypatch.setattr(inprocess, "started_at", [time.monotonic()])
    assert client.get("/readyz").json()["checks"]["worker"] == "ok"


def test_metrics_carry_the_heartbeat_ages(client, settings, acme):
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    assert "recovery_heartbeat_age_seconds" not in scrape(client)  # nothing ran yet
    services.sweep_stale_runs(by="celery")
    _age_heartbeats(120)
    got = scrape(client)
    ages = got["recovery_heartbeat_age_seconds"]
    assert set(ages) == {(("name", "sweep"),), (("name", "sweep.celery"),)}
    assert 120 <= ages[(("name", "sweep.celery"),)] < 130
    from checkpoints.models import Heartbeat

    at = Heartbeat.objects.get(name="sweep.celery").at.timestamp()
    assert got["recovery_heartbeat_timestamp_seconds"][(("name", "sweep.celery"),)] == at


def test_readyz_names_the_audit_sequencer_when_events_wait_too_long(client, no_broker, acme,
                                                                    settings):
    """Issue 22, item 1: an audit event queued longer than RECOVERY_AUDIT_LAG_MAX_S
    (database clock) means the sequencer is not running."""
    assert client.get("/readyz").json()["checks"]["audit"] == "ok"
    then = timezone.now() - timedelta(seconds=settings.RECOVERY_AUDIT_LAG_MAX_S + 5)
    tampering.raw("UPDATE checkpoints_auditpending SET queued_at = %s WHERE tenant_id = %s",
                  [then, acme.pk])
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["audit"] == "failed: AuditLate"
    services.audit_integrate(acme)
    assert client.get("/readyz").json()["checks"]["audit"] == "ok"


@pytest.mark.django_db
def test_readyz_fails_while_a_migration_of_this_code_is_not_applied(client, no_broker):
    """Code of a new release on a database not yet migrated (or rolled back): 503 naming
    ``migrations`` (an attack's finding: with 0041 missing every checkpoint update was a
    500 while /readyz said ready)."""
    from django.db.migrations.recorder import MigrationRecorder

    newest = MigrationRecorder.Migration.objects.filter(app="checkpoints").order_by("-name")[0]
    newest.delete()  # the database now says it lacks this code's newest migration
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == "failed: MigrationsPending"


@pytest.mark.parametrize(("where", "failure"), [
    ("a-file/login-slots", "NotADirectoryError"), ("a-file", "NotADirectoryError"),
    ("slots-dir", "IsADirectoryError"), ("slots-loop", "OSError"),
    ("slots-dangling", "FileNotFoundError")])
def test_readyz_fails_when_logins_could_not_take_a_slot(client, no_broker, settings, tmp_path,
                                                       where, failure):
    """(stop 34, an attack's finding) The login-slot folder below a regular file, or a
    regular file itself: every login answered 500 while ``/readyz`` said ok. The probe
    now names ``login_slots``, and makes nothing. So does a slot a login could not open
    (the second attack's: a directory, a link in a loop, a link to nothing), and the
    login then is the 500 the probe warned of."""
    (tmp_path / "a-file").write_text("x")
    for name in ("slots-dir", "slots-loop", "slots-dangling"):
        (tmp_path / name).mkdir()
    (tmp_path / "slots-dir" / "slot-0").mkdir()
    os.symlink("slot-0", tmp_path / "slots-loop" / "slot-0")
    os.symlink(tmp_path / "nowhere" / "x", tmp_path / "slots-dangling" / "slot-0")
    settings.RECOVERY_LOGIN_SLOT_DIR = str(tmp_path / where)
    settings.RECOVERY_LOGIN_SLOTS = 1
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["login_slots"] == f"failed: {failure}"
    if where.startswith("slots-"):  # what the probe foresaw: the login cannot take it
        from checkpoints.ops.security import acquire_login_slot

        with pytest.raises(OSError):
            acquire_login_slot(0)
    settings.RECOVERY_LOGIN_SLOT_DIR = str(tmp_path / "fine" / "login-slots")
    assert client.get("/readyz").json()["checks"]["login_slots"] == "ok"
    assert not (tmp_path / "fine").exists()


def test_readyz_degrades_but_stays_ready_when_only_the_replica_fails(
        client, reachable_broker, monkeypatch):
    """(stop 36; the older notes' "/readyz fails rather than degrades on a bad replica")
    A node that finds the read replica broken or lagging reads from the primary
    (``replica._recheck``), so it can serve: 200 ``degraded`` naming the replica, not a
    503 that would take every node out of its balancer at once. Any other failure still
    fails the node, with the replica's beside it."""
    services.sweep_stale_runs(by="celery")
    monkeypatch.setattr(replica, "configured", lambda: True)
    monkeypatch.setattr(replica, "lag_s", lambda: 99.0)

    def lagging():
        raise replica.ReplicaLagging("lag 99.0 s > 30 s")

    monkeypatch.setattr(replica, "replica_check", lagging)
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["degraded"]) == ("degraded", ["replica"])
    assert body["checks"]["replica"] == "failed: ReplicaLagging" and body["replica_lag_s"] == 99.0
    assert all(v in ("ok", "not configured") for k, v in body["checks"].items() if k != "replica")

    monkeypatch.setattr(replica, "replica_check", lambda: None)
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json()["status"] == "ok"
    assert "degraded" not in response.json()

    def down():
        raise OperationalError("the database is gone")

    monkeypatch.setattr(replica, "replica_check", lagging)
    monkeypatch.setattr(health, "_check_database", down)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "failed: OperationalError"
    assert response.json()["checks"]["replica"] == "failed: ReplicaLagging"
