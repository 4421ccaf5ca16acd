"""During a database outage every dashboard page answers a self-contained 503 page with
``Retry-After`` (never a bare 500, never a traceback), the API its 503 JSON, and the
health endpoints tell the truth (issue 17, item 12; checkpoints/ops/outage.py decides what an
outage is, once, for both).

The outage is made two ways: every query of the connection fails with the error a dead
server gives (Django's ``OperationalError``/``InterfaceError``, or the driver's own as it
would escape Django's wrapper), and on PostgreSQL the connection really pointed at a port
where nothing listens."""

from __future__ import annotations

import sqlite3
import uuid

import pytest
from django.db import InterfaceError, OperationalError, connection, connections
from django.test import Client

from tests.helpers import ambiguous_run, closed_port

DRIVER_ERROR = sqlite3.OperationalError
if connection.vendor == "postgresql":
    import psycopg

    DRIVER_ERROR = psycopg.OperationalError


@pytest.fixture
def pages(acme, rita, wendy):
    """``(logged-in client, paths of dashboard pages)``, all made before the outage."""
    run_id = ambiguous_run(wendy, acme)
    client = Client(raise_request_exception=False)
    client.force_login(rita)
    return client, ["/", f"/t/{acme.slug}/", f"/t/{acme.slug}/runs/{run_id}/",
                    f"/t/{acme.slug}/audit/", f"/t/{acme.slug}/report/"]


def _assert_outage_page(response, path):
    assert response.status_code == 503, (path, response.status_code)
    assert response["Retry-After"] == "5", path
    assert response["Content-Type"].startswith("text/html"), path
    text = response.content.decode()
    assert "The database is unavailable" in text, path
    assert "Try again in 5 seconds" in text, path
    for leak in ("Traceback", "simulated", "OperationalError", "InterfaceError", "SELECT"):
        assert leak not in text, (path, leak)
    assert "/static/" not in text, path  # self-contained: nothing else to fetch
    assert "no-store" in response["Cache-Control"], path


def _assert_api_outage(client, slug):
    response = client.get(f"/api/v1/tenants/{slug}/runs",
                          HTTP_AUTHORIZATION="Bearer rcv_not_a_real_token_at_all_000000")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json() == {"error": "unavailable"}


def _failing(error):
    def fail(execute, sql, params, many, context):
        raise error("connection to server at 127.0.0.1 refused (simulated)")
    return fail


@pytest.mark.django_db
@pytest.mark.no_schema_check(reason="the outage answers before any view: 503 is documented")
@pytest.mark.parametrize("error", [OperationalError, InterfaceError, DRIVER_ERROR],
                         ids=["OperationalError", "InterfaceError", "driver"])
def test_every_dashboard_page_answers_503_while_the_database_is_down(pages, acme, error):
    client, paths = pages
    anonymous = Client(raise_request_exception=False)
    with connection.execute_wrapper(_failing(error)):
        for path in paths:
            _assert_outage_page(client.get(path), path)
            _assert_outage_page(client.get(path, HTTP_HX_REQUEST="true"), path)
        # The login page reads the session of a signed-in reviewer; a login (the form's
        # POST) reads the account. (Its GET without a session needs no database.)
        _assert_outage_page(client.get("/login/"), "/login/")
        response = anonymous.post("/login/", {"username": "rita", "password": "x" * 12})
        _assert_outage_page(response, "/login/")
        _assert_api_outage(anonymous, acme.slug)
        assert anonymous.get("/healthz").status_code == 200  # the process is alive
        ready = anonymous.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"].startswith("failed: ")
    # Back: the same pages answer again.
    for path in paths:
        assert client.get(path).status_code in (200, 302), path


@pytest.mark.django_db
def test_a_defect_is_still_a_500_page_without_details(pages):
    client, paths = pages
    with connection.execute_wrapper(_failing(ValueError)):  # not an outage: a defect
        response = client.get(paths[1])
    assert response.status_code == 500
    assert "Retry-After" not in response
    text = response.content.decode()
    assert "Server error" in text and "simulated" not in text and "Traceback" not in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.no_schema_check(reason="the outage answers before any view: 503 is documented")
def test_pages_answer_503_when_the_database_server_is_unreachable(pages, acme):
    client, paths = pages
    anonymous = Client(raise_request_exception=False)
    conn = connections["default"]
    saved = dict(conn.settings_dict)
    conn.close()
    conn.settings_dict["PORT"] = str(closed_port())
    try:
        for path in [*paths, f"/t/{acme.slug}/runs/{uuid.uuid4()}/"]:
            _assert_outage_page(client.get(path), path)
        response = anonymous.post("/login/", {"username": "rita", "password": "x" * 12})
        _assert_outage_page(response, "/login/")
        _assert_api_outage(anonymous, acme.slug)
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").json()["checks"]["database"] == \
            "failed: OperationalError"
    finally:
        conn.close()
        conn.settings_dict.update(saved)
    assert client.get(paths[1]).status_code == 200
