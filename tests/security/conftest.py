"""PostgreSQL roles for the security tests: a real owner and app role per test, made by
``manage.py setup_database_roles`` (unique names), dropped afterwards."""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from django.core.management import call_command
from django.db import connection, connections


@dataclass
class Roles:
    owner: str
    app: str

    def connect(self, role: str):
        """A psycopg connection (autocommit) to the test database as ``role``."""
        import psycopg

        s = connection.settings_dict
        return psycopg.connect(dbname=s["NAME"], user=role, host=s["HOST"] or None,
                               port=s["PORT"] or None, autocommit=True)


@contextmanager
def django_connected_as(role: str):
    """Run the service's code as ``role``: the default connection reconnects as it."""
    conn = connections["default"]
    saved = conn.settings_dict["USER"]
    conn.close()
    conn.settings_dict["USER"] = role
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict["USER"] = saved


def drop_roles(*names: str) -> None:
    """Give back what the roles own to the test's superuser, then drop them."""
    with connection.cursor() as cur:
        for name in names:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])
            if cur.fetchone():
                cur.execute(f'REASSIGN OWNED BY "{name}" TO CURRENT_USER')
                cur.execute(f'DROP OWNED BY "{name}"')
                cur.execute(f'DROP ROLE "{name}"')


@pytest.fixture
def db_roles(transactional_db, on_postgres):
    """Owner and app roles set up on the test database (PostgreSQL only)."""
    if not on_postgres:
        pytest.skip("database roles need PostgreSQL (set DATABASE_URL)")
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    roles = Roles(owner=f"rcv_audit_owner_{tag}", app=f"rcv_audit_app_{tag}")
    try:
        call_command("setup_database_roles", owner=roles.owner, app=roles.app)
        yield roles
    finally:
        connections["default"].close()
        drop_roles(roles.app, roles.owner)


def pytest_terminal_summary(terminalreporter):
    """Print the tamper set's results table (issue 6 asks for it as evidence)."""
    from django.db import connection as conn

    from tests.security.tampering import RESULTS, results_table

    if RESULTS:
        terminalreporter.section("audit tamper set")
        for line in results_table(conn.vendor):
            terminalreporter.write_line(line)
