"""Shared fixtures: two tenants and one persona per role, built through the services.

Tenant ``acme``: rita (reviewer), april (approver), vic (viewer), wendy (writer, a service
account with a bearer token), adam (admin). Tenant ``globex``: omar (reviewer), wes
(writer). Nobody has a global permission or superuser status.

The database is whatever ``DATABASE_URL`` says (PostgreSQL in CI), else embedded SQLite.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from checkpoints import auditshape, services
from tests import openapi_check

PASSWORD = "pw-for-tests"

# Every audit event the suite writes is held to its action's allow-list of keys
# (checkpoints/auditshape.py: audit events never hold payload values; issue 20).
auditshape.ENFORCE = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """Two PostgreSQL processes share one pass file by file under ``make test``
    (``tests/claims.py``); otherwise pytest's own loop."""
    from tests import claims

    return claims.runtestloop(session)


def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    on_pg = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords and not on_pg:
            item.add_marker(skip_pg)


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_audit_triggers():
    """Let the test runner empty the PostgreSQL test database between transactional tests,
    quickly.

    The audit tables refuse TRUNCATE (migration 0005), and Django's flush truncates every
    table. The test database's superuser switches triggers off for the flush only
    (``SET LOCAL session_replication_role = replica``, which only a superuser may do): the
    same escape hatch docs/security/audit.md lists among what the audit cannot stop.

    With the triggers off, foreign keys are not checked either (PostgreSQL enforces them
    with triggers), so each table is emptied with ``DELETE`` in any order instead of one
    ``TRUNCATE`` of all of them: a transactional test leaves a few rows, and TRUNCATE
    makes new files for every table and index each time. Measured (stop 40): five test
    files with about 40 transactional tests among 180 took 53 s instead of 93 s (the
    lock below included); the whole PostgreSQL pass had grown to 72 minutes, and the
    flush was py-spy's most common sample in it.
    ``reset_sequences`` (TRUNCATE … RESTART IDENTITY) keeps Django's statements.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables:
            return []
        if reset_sequences:
            statements = original(self, style, tables, reset_sequences=True,
                                  allow_cascade=allow_cascade)
        else:
            # The lock TRUNCATE took: the flush waits for every other session's open
            # transaction on these tables (a thread of the test still writing), so no row
            # committed after the DELETE's snapshot is left behind. Locks make no files.
            names = ", ".join(self.quote_name(table) for table in tables)
            statements = [f"LOCK TABLE {names} IN ACCESS EXCLUSIVE MODE",
                          *(f"DELETE FROM {self.quote_name(table)}" for table in tables)]
        # execute_sql_flush runs these in one transaction: SET LOCAL covers them all.
        return ["SET LOCAL session_replication_role = replica", *statements]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = original


@pytest.fixture(autouse=True)
def _no_daily_digest_unless_asked(settings):
    """The daily digest goes out once the database clock's hour reaches
    ``RECOVERY_NOTIFY_DIGEST_HOUR`` (UTC), so a test that dispatched notifications after
    08:00 UTC got a digest it did not ask for and failed by the time of day. Hour 24 is
    never reached; the digest's own tests set the hour they mean."""
    settings.RECOVERY_NOTIFY_DIGEST_HOUR = 24


@pytest.fixture(autouse=True)
def _api_answers_match_the_schema(request, monkeypatch):
    """Every answer the test client gets from ``/api/v1/`` must be what the OpenAPI
    schema at ``/api/schema/`` documents for its path, method and status
    (``tests/openapi_check.py``); a test that deliberately gets an answer the schema
    cannot describe says why with ``@pytest.mark.no_schema_check(reason=...)``.

    Wraps ``django.test.Client.request``, which every test client (``APIClient``
    included) sends through, so no test can forget it."""
    marker = request.node.get_closest_marker("no_schema_check")
    if marker is not None:
        if not marker.kwargs.get("reason"):
            pytest.fail("@pytest.mark.no_schema_check needs a reason=")
        yield
        return
    send = Client.request

    def checked_request(self, **kwargs):
        response = send(self, **kwargs)
        if openapi_check.wants_check(response):
            openapi_check.check(response)
        return response

    monkeypatch.setattr(Client, "request", checked_request)
    yield


@pytest.fixture(autouse=True)
def _answers_render_without_queries(monkeypatch):
    """No API answer loads anything while it is rendered (issue 8: a lazy relation in a
    serializer is one more query per row, or per request): what a serializer shows is
    loaded by the selector or service (``select_related``), set by the view, or given as
    context. Every ``Answer.render`` of every test runs with queries refused."""
    from django.db import connections

    from checkpoints.api.serializers import Answer

    render = Answer.render.__func__

    def render_without_queries(cls, instance, **context):
        def refuse(execute, sql, params, many, context):
            raise AssertionError(f"a query while rendering {cls.__name__} (a lazy relation "
                                 f"in a serializer?): {sql[:300]}")

        with connections["default"].execute_wrapper(refuse):
            return render(cls, instance, **context)

    monkeypatch.setattr(Answer, "render", classmethod(render_without_queries))


@pytest.fixture
def kind_registry():
    """The kind registry (``checkpoints.kinds``), restored after the test: the registry is
    global, so a test that registers kinds (or loads kind modules) must leave it as it
    found it. Also forgets the kind modules the test imported (``tests.kindmodules.*``,
    ``examples.kinds.*``), so the next ``load_kind_modules`` imports, and registers, again."""
    from tests.kind_fixtures import registry_restored

    with registry_restored() as kinds:
        yield kinds


@pytest.fixture
def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def acme(db):
    return services.tenant_create(slug="acme", name="Acme Corp")


@pytest.fixture
def globex(db):
    return services.tenant_create(slug="globex", name="Globex")


def _person(username, tenant, role, service=False):
    user = services.account_create(username=username, password=None if service else PASSWORD,
                                   service=service)
    services.role_grant(actor=None, tenant=tenant, user=user, role=role)
    return user


@pytest.fixture
def rita(acme):
    return _person("rita", acme, "reviewer")


@pytest.fixture
def april(acme):
    return _person("april", acme, "approver")


@pytest.fixture
def vic(acme):
    return _person("vic", acme, "viewer")


@pytest.fixture
def wendy(acme):
    return _person("wendy", acme, "writer", service=True)


@pytest.fixture
def adam(acme):
    return _person("adam", acme, "admin")


@pytest.fixture
def omar(globex):
    return _person("omar", globex, "reviewer")


@pytest.fixture
def wes(globex):
    return _person("wes", globex, "writer", service=True)


def bearer_client(user) -> APIClient:
    """An API client that authenticates with a fresh bearer token of ``user``.

    The token is stored as ``services.token_issue`` stores it but without its
    ``token.issue`` audit event (``tests.helpers.plumbing_token``): tests make clients
    between snapshots of what a request wrote, and the client is set-up, not the action
    under test. ``token_issue`` and its event: tests/security/test_accounts.py."""
    from tests.helpers import plumbing_token

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plumbing_token(user)}")
    return client


@pytest.fixture
def api_as():
    """``api_as(user)`` -> APIClient with that user's bearer token."""
    return bearer_client
