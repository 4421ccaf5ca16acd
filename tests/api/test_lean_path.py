"""The lean HTTP path of issue 22, item 3: the per-request connection health check costs no
round trip while the kept connection is quiet (``recovery.dbbackend.postgresql``), and
still notices a connection the server closed, so a database restart costs no failed
request."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db import connection


def _psycopg_connect():
    import psycopg

    params = connection.get_connection_params()
    return psycopg.connect(**{k: v for k, v in params.items()
                              if k not in ("cursor_factory", "context")}, autocommit=True)


@pytest.mark.postgres
def test_the_engine_is_the_wrapped_one(db):
    from django.db import connections

    from recovery.dbbackend.postgresql.base import DatabaseWrapper

    assert isinstance(connections["default"], DatabaseWrapper)
    assert settings.RECOVERY_DB_BASE_ENGINE.endswith(".postgresql")
    assert connection.vendor == "postgresql"


@pytest.mark.postgres
def test_quiet_tells_a_live_idle_connection_from_one_the_server_closed(db):
    from recovery.dbbackend.postgresql.base import quiet

    conn = _psycopg_connect()
    try:
        assert quiet(conn) is True
        conn.autocommit = False
        conn.execute("SELECT 1")  # in a transaction: not idle, no answer
        assert quiet(conn) is None
        conn.rollback()
        assert quiet(conn) is True
        pid = conn.info.backend_pid
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(100):  # the backend's exit message reaches the socket
            if quiet(conn) is not True:
                break
            time.sleep(0.05)
        assert quiet(conn) is False
    finally:
        conn.close()
    assert quiet(conn) is None  # closed


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_closed_is_replaced_before_the_next_request(acme, wendy):
    """The request after ``pg_terminate_backend`` of the kept connection answers 200: the
    quiet check saw the closing and Django's own check (``SELECT 1``) closed it."""
    from django.db import close_old_connections

    from tests.api.apihelpers import put_cp
    from tests.conftest import bearer_client
    from tests.helpers import envelope

    api = bearer_client(wendy)
    body = envelope()
    assert put_cp(api, "acme", body, create=True).status_code == 201
    pid = connection.connection.info.backend_pid
    killer = _psycopg_connect()
    try:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        killer.close()
    time.sleep(0.3)
    close_old_connections()  # what request_started does
    assert put_cp(api, "acme", dict(body, revision=1), match=0).status_code == 200
    assert connection.connection.info.backend_pid != pid


def test_a_bearer_put_answers_with_the_same_headers_and_sets_no_cookie(acme, wendy):
    """The one-statement look-up changes no header: a bearer PUT still varies on Accept
    only (no session was touched, so no ``Vary: Cookie`` and no cookie), is never cached,
    and carries its ETag; a refused token still answers 401 with ``WWW-Authenticate``."""
    from tests.api.apihelpers import put_cp
    from tests.conftest import bearer_client
    from tests.helpers import envelope

    api = bearer_client(wendy)
    body = envelope()
    created = put_cp(api, "acme", body, create=True)
    updated = put_cp(api, "acme", dict(body, revision=1), match=0)
    for r in (created, updated):
        assert [v.strip() for v in r["Vary"].split(",")] == ["Accept"], r["Vary"]
        assert "no-store" in r["Cache-Control"] and not r.cookies
    assert updated["ETag"] == '"1"'
    api.credentials(HTTP_AUTHORIZATION="Bearer rcv_not_a_token")
    refused = put_cp(api, "acme", dict(body, revision=2), match=1)
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Bearer"
