"""Operations endpoints and the request id (issue 9, item 7; README "Production").

- ``GET /healthz``: the process answers (no database, no broker): 200 ``{"status": "ok"}``.
  For a liveness probe: restart the process when it stops answering.
- ``GET /readyz`` (``?scope=node`` for a load balancer: only ``NODE_CHECKS`` fail it, see
  ``readyz``): the database answers ``SELECT 1``, and the Celery broker accepts a
  connection where ``CELERY_BROKER_URL`` is configured: 200 ``{"status": "ok", "checks":
  {...}}``, else 503 ``{"status": "unavailable", "checks": {"database": "ok", "broker":
  "failed: OperationalError"}}`` naming what failed (the exception's class only: no host,
  no password) with ``Retry-After``. For monitoring and alerts; a balancer's readiness
  probe reads ``?scope=node`` and takes the node out, not restart it. ``worker`` (issue 17, item 11): with a broker, a Celery
  worker ran beat's stale-run sweep within ``RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S`` (the
  ``sweep.celery`` heartbeat, database clock), else ``failed: WorkerSilent``; in the
  embedded mode the in-process worker's (``sweep.inprocess``; a process whose worker
  started less than that long ago is given that long); ``not configured`` when neither
  runs. The body's ``heartbeat`` gives each heartbeat's age in seconds.
  With ``RECOVERY_STATIC_MANIFEST`` (``DEBUG=0``) also ``static_manifest``: collectstatic's
  manifest is there and names every static file the templates use
  (``checkpoints.ops.staticcheck``).
- ``GET /metrics``: Prometheus text format: django-prometheus' request and database
  metrics, ``checkpoints.metrics.RESUME_DECISIONS`` and the domain gauges read at scrape
  time (``checkpoints.metrics.DomainCollector``). It names tenants and counts their runs,
  so it is closed unless ``RECOVERY_METRICS_TOKEN`` is set, and then answers only a
  request with ``Authorization: Bearer <that token>`` (401 otherwise; 404 while no token
  is configured). A scrape reads; it writes nothing.

The three answer any method but GET/HEAD with 405. They are exempt from the https
redirect (``SECURE_REDIRECT_EXEMPT``): probes and scrapers reach a node directly.

``RequestIdMiddleware`` (first in ``MIDDLEWARE``) keeps an incoming ``X-Request-ID`` only
when it is well-formed (``REQUEST_ID``: 8 to 128 of ``A-Z a-z 0-9 . _ : -``); otherwise
it drops it and django-guid generates a fresh UUID. django-guid then puts the id in a
context variable (every log line of the request carries it as ``request_id``: the
``django_guid.log_filters.CorrelationId`` filter in ``LOGGING``), echoes it on the
response as ``X-Request-ID``, and hands it to the Celery tasks the request sends
(django-guid's Celery integration). It also writes one access log line per request
(logger ``recovery.access``, INFO: method, path, status, duration in ms).
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from urllib.parse import unquote_plus

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, JsonResponse, QueryDict
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, multiprocess
from prometheus_client import generate_latest as render

from recovery.celery import app

from .. import heartbeat, replica, services
from ..exceptions import InvalidPayload
from ..jobs import workerstatus
from ..jsonparse import printable
from ..metrics import DomainCollector
from ..querystring import single_values
from ..services import notify_delivery
from . import security
from .staticcheck import check_static_manifest

log = logging.getLogger("recovery.access")

#: A well-formed request id: what a proxy or a client may choose (UUIDs with or without
#: hyphens, nginx's ``$request_id``, ULIDs, ``service:123``), bounded, ASCII, and safe to
#: echo in a header and print in a log line.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{8,128}")
HEADER = "HTTP_X_REQUEST_ID"


class RequestIdMiddleware:
    """Drop an ill-formed ``X-Request-ID`` before django-guid reads it (it then generates
    one), and log each request at INFO on ``recovery.access`` once it is answered."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        given = request.META.get(HEADER)
        if given is not None and not REQUEST_ID.fullmatch(given):
            del request.META[HEADER]
        started = time.perf_counter()
        response = self.get_response(request)
        if log.isEnabledFor(logging.INFO):
            # A path is the client's text: control characters escaped, so a "%0A" in it
            # cannot start a forged line of a plain-text log (JSON escapes them anyway).
            path = request.path.encode("unicode_escape").decode("ascii")
            log.info("%s %s %s", request.method, path, response.status_code,
                     extra={"method": request.method, "path": path,
                            "status": response.status_code,
                            "duration_ms": round((time.perf_counter() - started) * 1000, 1)})
        return response


@require_safe
def healthz(request):
    """Liveness: 200 ``{"status": "ok"}`` while the process can answer; reads nothing."""
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_broker() -> None:
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                               timeout=settings.CELERY_BROKER_CONNECTION_TIMEOUT)


class WorkerSilent(Exception):
    """The background worker's heartbeat is older than its bound (or absent)."""


def _check_worker() -> str | None:
    """The ``worker`` check (kept apart from the others): raises ``WorkerSilent`` when the
    deployment's background worker is late (``workerstatus.worker_status``: the rule the
    dashboard's banner reads too); returns ``"not configured"`` when no worker is
    expected, else None (ok)."""
    status = workerstatus.worker_status()
    if not status.expected:
        return "not configured"
    if status.late:
        raise WorkerSilent(status.detail())
    return None


class MigrationsPending(Exception):
    """The database lacks migrations this code needs (not yet run, or rolled back)."""


def _check_migrations() -> str | None:
    """The ``migrations`` check (issue 22; an attack's finding: with migration 0041 not
    yet applied every checkpoint update was a 500 while ``/readyz`` said ready): raises
    ``MigrationsPending`` naming how many of this code's migrations the database lacks
    and the first of them; a database that cannot answer raises its own error. Reads the
    migration graph (loaded once per process) and ``django_migrations``: about 4 ms."""
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        first = plan[0][0]
        raise MigrationsPending(f"{len(plan)} migration(s) not applied, first "
                                f"{first.app_label}.{first.name}: run manage.py migrate as the "
                                "owner role, then setup_database_roles")
    return None


def heartbeat_ages() -> dict[str, float]:
    """``{heartbeat name: age in seconds}`` (database clock), for ``/readyz``'s body."""
    return {name: round(b.age_s, 1) for name, b in sorted(heartbeat.read().items())}


#: Checks whose failure degrades a node but leaves it ready: what it needs has a fallback
#: that serves the same answers. The read replica: a node that finds it broken or lagging
#: reads from the primary (``replica._recheck``), so failing ``/readyz`` for it would take
#: every web node out of its load balancer at once while each could serve (the older
#: notes' "fails rather than degrades"). The failure is still named, in ``/readyz``'s
#: ``degraded`` list and in ``/metrics`` (``recovery_replica_up``, the
#: ``RecoveryReplicaDown`` alert).
DEGRADING = frozenset({"replica"})

#: The checks that say whether THIS node can serve requests (``/readyz?scope=node``, for
#: a load balancer; the operator's walk: one stopped worker failed ``/readyz`` on every
#: web node while each served): ``database`` (no page or call answers without it; down
#: for all, no node can serve, so taking them all out loses nothing), ``migrations``
#: (this node's code against the schema: a node deployed ahead of ``migrate`` answers
#: 500s), ``login_slots`` and ``static_manifest`` (this
#: node's files: logins, pages) and ``replica`` (this node's fallback, degrading as in
#: the deployment scope). The others, ``broker``, ``worker``, ``retention``,
#: ``notifications`` and ``audit``, are the deployment's shared pieces and background
#: work: every node gives the same answer, none serves better by being taken out, and
#: work waiting for the broker is stored and sent when it is back (a reconcile answers
#: 202 ``queued: false``, tests/faults/test_broker_down.py), so a broker outage taking
#: every node out of the balancer would turn a delay into an outage.
NODE_CHECKS = frozenset({"database", "migrations", "login_slots", "static_manifest",
                         "replica"})
#: ``/readyz``'s ``scope`` values: ``deployment`` (the default: every check, for
#: monitoring and alerts) and ``node`` (``NODE_CHECKS``, for load balancers).
SCOPES = ("deployment", "node")


def _lenient(name: str, scope: str) -> bool:
    """Whether a failure of check ``name`` leaves the answer ready in ``scope``."""
    return name in DEGRADING or (scope == "node" and name not in NODE_CHECKS)


def readiness(scope: str = "deployment") -> tuple[bool, dict[str, str]]:
    """``(ready, checks)``: each dependency's ``"ok"``, ``"failed: ErrorClass"`` or (the
    broker without ``CELERY_BROKER_URL``) ``"not configured"``. ``ready`` is false when
    any check failed except those in ``DEGRADING``; with ``scope="node"`` (``SCOPES``)
    also except those not in ``NODE_CHECKS``. Every check runs in both scopes."""
    checks: dict[str, str] = {}
    probes = [("database", _check_database), ("migrations", _check_migrations)]
    if not settings.CELERY_TASK_ALWAYS_EAGER:  # a broker is configured
        probes.append(("broker", _check_broker))
    else:
        checks["broker"] = "not configured"
    probes.append(("worker", _check_worker))
    probes.append(("retention", services.retention_health))
    probes.append(("notifications", notify_delivery.notify_health))
    probes.append(("audit", services.audit_health))
    probes.append(("login_slots", security.check_login_slots))  # every login takes one
    if settings.RECOVERY_STATIC_MANIFEST:  # pages need collectstatic's manifest
        probes.append(("static_manifest", check_static_manifest))
    if replica.configured():  # issue 22: reachable, streaming, lag within its bound
        probes.append(("replica", replica.replica_check))
    ready = True
    for name, probe in probes:
        try:
            checks[name] = probe() or "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready": say which
            ready = ready and _lenient(name, scope)
            checks[name] = f"failed: {type(exc).__name__}"
            logging.getLogger(__name__).warning("readiness: %s failed: %s", name, exc)
    return ready, dict(sorted(checks.items()))


def readyz_scope(request) -> str:
    """The ``scope`` query parameter of ``/readyz``: one of ``SCOPES``, ``"deployment"``
    when absent. Checked as every query parameter (``querystring.single_values``: UTF-8,
    given once, no control character), then against ``SCOPES``; raises ``InvalidPayload``
    naming ``scope`` and its choices. Other parameters are ignored, as before ``scope``
    existed (a probe's cache-buster)."""
    raw = "&".join(pair for pair in request.META.get("QUERY_STRING", "").split("&")
                   if unquote_plus(pair.partition("=")[0]) == "scope")
    given = single_values(raw, QueryDict(raw)).get("scope")
    if given is None:
        return "deployment"
    if given not in SCOPES:
        raise InvalidPayload(f"scope: {printable(given)!r} is not a valid choice. "
                             f"One of: {', '.join(SCOPES)}.")
    return given


@require_safe
def readyz(request):
    """Readiness: 200 when the database (and the broker, where configured) answer and
    the background worker's heartbeat is fresh (``_check_worker``), else 503 naming what
    failed, with ``Retry-After: 5``; ``heartbeat``: each heartbeat's age in seconds; with
    a read replica configured (issue 22) the ``replica`` check (reachable, streaming, lag
    within ``RECOVERY_REPLICA_MAX_LAG_S``) and ``replica_lag_s``. A failed ``DEGRADING``
    check alone answers 200 ``{"status": "degraded", "degraded": ["replica"], ...}``: the
    node serves (from the primary), and says what it does without.

    ``?scope=node`` (``readyz_scope``; the body then says ``"scope": "node"``): the same
    checks, but only ``NODE_CHECKS`` fail it; a failed deployment-wide one (the broker,
    the worker, retention, notifications, audit) answers 200 ``"degraded"`` naming it, for a load
    balancer (the operator's walk). A bad ``scope``: 400 ``{"error":
    "invalid_payload", "detail": "scope: ..."}``, no check run."""
    try:
        scope = readyz_scope(request)
    except InvalidPayload as exc:
        return JsonResponse({"error": exc.error, "detail": str(exc)}, status=exc.status)
    ready, checks = readiness(scope)
    body = {"checks": checks} if scope == "deployment" else {"scope": scope, "checks": checks}
    degraded = sorted(name for name, words in checks.items()
                      if words.startswith("failed") and _lenient(name, scope))
    try:
        body["heartbeat"] = heartbeat_ages()
    except Exception:  # noqa: BLE001 - the database is down: the checks already say so
        body["heartbeat"] = {}
    if replica.configured():  # issue 22: the lag in seconds, null when it cannot be read
        try:
            body["replica_lag_s"] = round(replica.lag_s(), 2)
        except Exception:  # noqa: BLE001 - the replica check already says what failed
            body["replica_lag_s"] = None
    if ready:
        if degraded:
            return JsonResponse({"status": "degraded", "degraded": degraded, **body})
        return JsonResponse({"status": "ok", **body})
    response = JsonResponse({"status": "unavailable", **body}, status=503)
    response["Retry-After"] = "5"
    return response


def _authorized(request) -> bool:
    expected = settings.RECOVERY_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), expected.encode()))


@require_safe
def metrics(request):
    """The Prometheus scrape (see the module docstring for access). 404 with no token
    configured, 401 (``WWW-Authenticate: Bearer``) without the right one."""
    if not settings.RECOVERY_METRICS_TOKEN:
        return JsonResponse({"error": "not_found",
                             "detail": "metrics are off: set RECOVERY_METRICS_TOKEN"},
                            status=404)
    if not _authorized(request):
        response = JsonResponse({"error": "unauthenticated",
                                 "detail": "Authorization: Bearer <RECOVERY_METRICS_TOKEN>"},
                                status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if settings.PROMETHEUS_MULTIPROC_DIR:
        counted = CollectorRegistry()
        multiprocess.MultiProcessCollector(counted)
    else:
        counted = REGISTRY
    domain = CollectorRegistry(auto_describe=False)
    domain.register(DomainCollector())
    return HttpResponse(render(counted) + render(domain), content_type=CONTENT_TYPE_LATEST)
