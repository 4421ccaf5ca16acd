"""The least-privilege set-up (``manage.py setup_database_roles``; docs/security/audit.md),
for real on PostgreSQL: the app role the service runs as appends to the audit trail
through the services, and cannot empty, change, or un-trigger it."""

from __future__ import annotations

import io
import uuid

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint
from tests.helpers import envelope, put_checkpoint
from tests.security import tampering
from tests.security.conftest import django_connected_as, drop_roles

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

EVENTS = AuditEvent._meta.db_table
HEADS = "checkpoints_auditchainhead"

# What the service's own role must not be able to do (fault 2 of issue 6).
REFUSED = [
    ("truncate", f"TRUNCATE {EVENTS}", "permission denied for table"),
    ("delete", f"DELETE FROM {EVENTS}", "permission denied for table"),
    ("update", f"UPDATE {EVENTS} SET reason = 'rewritten'", "permission denied for table"),
    ("disable trigger",
     f"ALTER TABLE {EVENTS} DISABLE TRIGGER checkpoints_audit_append_only",
     "must be owner of table"),
    ("disable all triggers", f"ALTER TABLE {EVENTS} DISABLE TRIGGER ALL",
     "must be owner of table"),
    ("drop trigger", f"DROP TRIGGER checkpoints_audit_no_truncate ON {EVENTS}",
     "must be owner of relation"),
    ("triggers off for the session", "SET session_replication_role = replica",
     "permission denied to set parameter"),
    ("replace the trigger function",
     "CREATE OR REPLACE FUNCTION checkpoints_audit_append_only() RETURNS trigger "
     "LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'", "permission denied for schema public"),
    ("drop the table", f"DROP TABLE {EVENTS}", "must be owner of table"),
    ("delete a chain head", f"DELETE FROM {HEADS}", "permission denied for table"),
    ("truncate the chain heads", f"TRUNCATE {HEADS}", "permission denied for table"),
    ("delete a tenant registration", "DELETE FROM checkpoints_audittenant",
     "permission denied for table"),
    ("rewrite a tenant registration", "UPDATE checkpoints_audittenant SET slug = 'x'",
     "permission denied for table"),
    ("create a table", "CREATE TABLE public.planted (a int)",
     "permission denied for schema public"),
    # Issue 22: the Merkle tree only grows; the queue may only lose what was integrated.
    *((f"{verb} the tree ({table})", sql.format(t=table), "permission denied for table")
      for table in ("checkpoints_auditleaf", "checkpoints_audittreenode",
                    "checkpoints_audittreehead")
      for verb, sql in (("delete from", "DELETE FROM {t}"), ("update", "UPDATE {t} SET "
                        "tenant_id = tenant_id"), ("truncate", "TRUNCATE {t}"))),
    ("rewrite a queue row", "UPDATE checkpoints_auditpending SET tenant_id = tenant_id",
     "permission denied for table"),
    ("truncate the queue", "TRUNCATE checkpoints_auditpending", "permission denied for table"),
]


@pytest.fixture
def chain(db_roles, acme, wendy):
    put_checkpoint(wendy, acme, envelope())
    return acme


@pytest.mark.parametrize("what, sql, error", REFUSED, ids=[r[0] for r in REFUSED])
def test_it_refuses_the_app_role(db_roles, chain, what, sql, error):
    before = AuditEvent.objects.filter(tenant=chain).count()
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=error):
            cur.execute(sql)
    assert AuditEvent.objects.filter(tenant=chain).count() == before
    assert services.audit_verify(tenant=chain) == (True, before, "")


def test_it_runs_the_service_as_the_app_role(db_roles, chain, wendy):
    """Ordinary rights on the other tables; the audit events are INSERTed by the services."""
    body = envelope()
    with django_connected_as(db_roles.app):
        with connection.cursor() as cur:
            cur.execute("SELECT current_user")
            assert cur.fetchone()[0] == db_roles.app
        put_checkpoint(wendy, chain, body)
        put_checkpoint(wendy, chain, dict(body, revision=1), expected=0)
        tenant = services.tenant_create(slug="initech")
        record = services.audit_head_export(tenant=chain)
        assert services.audit_verify(tenant=chain)[0]
        assert services.audit_head_check(record=record) == ""
    assert Checkpoint.objects.get(tenant=chain, uuid=uuid.UUID(body["id"])).revision == 1
    assert services.audit_verify(tenant=tenant) == (True, 1, "")
    assert AuditEvent.objects.filter(tenant=chain, action="checkpoint.write").count() == 3


def test_it_gives_the_owner_every_table_and_the_trigger_function(db_roles):
    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tableowner <> %s", [db_roles.owner])
        assert cur.fetchall() == []
        cur.execute("SELECT pg_get_userbyid(proowner) FROM pg_proc "
                    "WHERE proname = 'checkpoints_audit_append_only'")
        assert cur.fetchone()[0] == db_roles.owner


def test_it_still_refuses_the_owner_a_plain_truncate(db_roles, chain):
    """The owner could disable the triggers (so it stays out of the service), but a plain
    TRUNCATE, DELETE or UPDATE by it is refused too."""
    services.audit_integrate(chain)  # leaves, a head: rows for the row triggers to refuse
    with db_roles.connect(db_roles.owner) as owner, owner.cursor() as cur:
        # CASCADE: the leaves name the events (issue 22); their own trigger refuses too.
        for sql in (f"TRUNCATE {EVENTS} CASCADE", f"DELETE FROM {EVENTS}",
                    f"UPDATE {EVENTS} SET reason = 'x'", f"TRUNCATE {HEADS}",
                    *(f"DELETE FROM {t}" for t in (tampering.LEAVES, tampering.TREE_HEADS)),
                    *(f"TRUNCATE {t} CASCADE" for t in tampering.TREE)):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                cur.execute(sql)
    assert services.audit_verify(tenant=chain)[0]


def test_it_can_be_run_again(db_roles):
    out = io.StringIO()
    call_command("setup_database_roles", owner=db_roles.owner, app=db_roles.app, stdout=out)
    assert f"app {db_roles.app}" in out.getvalue()


def test_it_refuses_an_app_role_that_inherits_the_owner(db_roles):
    """The app role is taken out of the owner role; membership through another role is
    found by the final check, and nothing of the run stays."""
    middle = db_roles.app.replace("app", "mid")
    with connection.cursor() as cur:
        cur.execute(f'CREATE ROLE "{middle}"')
        cur.execute(f'GRANT "{db_roles.owner}" TO "{middle}"')
        cur.execute(f'GRANT "{middle}" TO "{db_roles.app}"')
    try:
        with pytest.raises(CommandError, match="is a member of the owner role"):
            call_command("setup_database_roles", owner=db_roles.owner, app=db_roles.app)
    finally:
        drop_roles(middle)


def test_it_needs_a_superuser(db_roles):
    with django_connected_as(db_roles.app), \
            pytest.raises(CommandError, match="is not a superuser"):
        call_command("setup_database_roles", owner=db_roles.owner, app=db_roles.app)
