"""``/readyz?scope=node`` for load balancers (the operator's walk: the shared Celery worker
stopped and ``/readyz`` answered 503 on every web node while each served the API and the
dashboard; a balancer following it turned one dead worker into a full outage).

``/readyz`` (the deployment scope, for monitoring and alerts) keeps failing on every check;
``?scope=node`` fails only on ``health.NODE_CHECKS`` (whether this node can serve) and
names a failed deployment-wide check (worker, retention, notifications, audit) as
``degraded``, 200. ``scope`` is checked as every query parameter: 400 naming it and its
choices."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from checkpoints import services
from checkpoints.ops import health
from checkpoints.services import notify_delivery

pytestmark = pytest.mark.django_db


class Down(Exception):
    """A check's failure, simulated."""


def _down(*args, **kwargs):
    raise Down("simulated")


@pytest.fixture
def reachable_broker(settings, monkeypatch):
    """A broker configured and answering, no in-process worker: the worker check reads
    the Celery worker's heartbeat (none yet: ``WorkerSilent``)."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERY_INPROCESS_WORKER = False
    monkeypatch.setattr(health, "_check_broker", lambda: None)
    return settings


def test_a_silent_worker_fails_readyz_but_not_the_node_scope(client, reachable_broker):
    deployment = client.get("/readyz")
    assert deployment.status_code == 503 and deployment["Retry-After"] == "5"
    assert deployment.json()["checks"]["worker"] == "failed: WorkerSilent"
    assert "scope" not in deployment.json()  # the body of /readyz as before
    node = client.get("/readyz?scope=node")
    assert node.status_code == 200, node.content
    body = node.json()
    assert (body["status"], body["scope"], body["degraded"]) == ("degraded", "node",
                                                                  ["worker"])
    assert body["checks"] == deployment.json()["checks"]  # every check, still listed
    services.sweep_stale_runs(by="celery")  # a worker swept: both ready again
    assert client.get("/readyz").status_code == 200
    node, deployment = (client.get(p).json() for p in ("/readyz?scope=node", "/readyz"))
    node.pop("heartbeat"), deployment.pop("heartbeat")  # ages: a moment apart
    assert node == {**deployment, "scope": "node"}
    assert node["status"] == "ok"


# Each check: (where its probe is looked up, its name there), whether it fails the node.
CHECKS = {
    "worker": (health, "_check_worker", False),
    "retention": (services, "retention_health", False),
    "notifications": (notify_delivery, "notify_health", False),
    "audit": (services, "audit_health", False),
    "database": (health, "_check_database", True),
    "migrations": (health, "_check_migrations", True),
    # Work waiting for the broker is stored: an outage delays, never takes a node out.
    "broker": (health, "_check_broker", False),
    "login_slots": (health.security, "check_login_slots", True),
    "static_manifest": (health, "check_static_manifest", True),
}


def test_every_check_is_classified():
    assert {name for name, (_, _, node) in CHECKS.items() if node} | {"replica"} == \
        health.NODE_CHECKS


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_check_fails_readyz_and_only_a_node_check_fails_the_node_scope(
        client, reachable_broker, monkeypatch, name):
    services.sweep_stale_runs(by="celery")
    reachable_broker.RECOVERY_STATIC_MANIFEST = True
    monkeypatch.setattr(health, "check_static_manifest", lambda: None)
    assert client.get("/readyz").status_code == 200
    where, attribute, node_check = CHECKS[name]
    monkeypatch.setattr(where, attribute, _down)
    deployment = client.get("/readyz")
    assert deployment.status_code == 503
    assert deployment.json()["checks"][name] == "failed: Down"
    node = client.get("/readyz?scope=node")
    assert node.json()["checks"][name] == "failed: Down"
    if node_check:
        assert node.status_code == 503 and node.json()["status"] == "unavailable"
    else:
        assert node.status_code == 200 and node.json()["degraded"] == [name]


def test_a_database_down_fails_both(client, monkeypatch):
    def refuse(*args, **kwargs):
        raise OperationalError("connection refused (simulated)")

    monkeypatch.setattr(connection, "cursor", refuse)
    for path in ("/readyz", "/readyz?scope=node", "/readyz?scope=deployment"):
        response = client.get(path)
        assert response.status_code == 503, path
        assert response["Retry-After"] == "5"
        assert response.json()["checks"]["database"] == "failed: OperationalError"


@pytest.mark.parametrize("query", ["scope=cluster", "scope=", "scope=NODE",
                                   "scope=node&scope=node", "scope=%FF", "scope=node%0A",
                                   "%73cope=all", "x=1&scope=" + "n" * 300])
def test_a_bad_scope_is_refused_naming_it_and_its_choices(client, query):
    response = client.get(f"/readyz?{query}")
    assert response.status_code == 400, (query, response.content)
    body = response.json()
    assert body["error"] == "invalid_payload"
    assert body["detail"].startswith("scope: "), body
    if "&scope=node" not in query and "%FF" not in query and "%0A" not in query:
        assert body["detail"].endswith("One of: deployment, node."), body


def test_other_parameters_are_ignored_as_before(client, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # no broker: ready
    for query in ("", "?x=1", "?nocache=%FF", "?scope=deployment&t=1", "?t=1&t=2"):
        assert client.get(f"/readyz{query}").status_code == 200, query
    assert client.get("/readyz?scope=node&t=1").json()["scope"] == "node"
