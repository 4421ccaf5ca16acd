"""A read writes nothing (issue 8; the house rule "a GET writes nothing, except audited
payload reveals"): every GET and HEAD of the API and every dashboard page a browser
GETs, enumerated by the twin world's recipes (``test_twin_world.API`` and ``PAGES``,
which a test keeps complete against the schema and the URL patterns), sent by every
persona of both tenants, issues no INSERT, UPDATE or DELETE; except that a GET reading
a payload (a checkpoint, a page of its revisions) appends its one audit event, and
nothing else. A HEAD of those writes nothing at all.

The token's ``last_used_at`` (at most one small write a minute, docs/security/access.md)
is noted once per persona before the measured requests.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.security.test_twin_world import API, PAGES, SLUGS, _request, world  # noqa: F401

#: A statement that writes: DML anywhere in it (``WITH ev AS (INSERT ...)`` included).
WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|TRUNCATE|MERGE\s+INTO)\b",
                   re.I)
#: The reads that reveal a payload, and the tables their audit event is written to.
AUDITED = {"get /api/v1/tenants/{tenant}/checkpoints/{checkpoint_id}",
           "get /api/v1/tenants/{tenant}/checkpoints/{checkpoint_id}/revisions",
           # One payload.read per thread namespace answered: the recipe's thread has one.
           "get /api/v1/tenants/{tenant}/langgraph/checkpoints"}
AUDIT_TABLES = {"checkpoints_auditevent", "checkpoints_auditchainhead"}

READS = ([("api", key) for key, req in API.items() if not req.write]
         + [("page", key) for key, req in PAGES.items() if not req.write])


def test_the_reads_are_every_get_and_head():
    assert {k.split(" ", 1)[0] for kind, k in READS if kind == "api"} == {"get", "head"}
    assert {k for k, r in API.items() if r.write} == {
        k for k in API if k.split(" ", 1)[0] in ("put", "post", "patch", "delete")}


@pytest.fixture(scope="module")
def warmed(world, django_db_blocker):  # noqa: F811 - the twin world's fixture
    """Every persona's token used once (its ``last_used_at`` noted, kept until the
    module's world is rolled back)."""
    with django_db_blocker.unblock():
        for p in world.personas:
            p.api().get("/api/v1/tenants/acme/report")
    return world


def _tables(sql: str) -> set[str]:
    """The tables a statement writes to."""
    return set(re.findall(r'(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?(?=[\s"(])',
                          sql, re.I)) - {"OF"}


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "key"), READS, ids=[f"{k}:{x}" for k, x in READS])
def test_a_read_writes_nothing(warmed, kind, key):
    req = (API if kind == "api" else PAGES)[key]
    failures = []
    for slug in SLUGS:
        for p in warmed.personas:
            with transaction.atomic():
                with CaptureQueriesContext(connection) as ctx:
                    path, response = _request(kind, key, req, warmed, slug, p)
                writes = [q["sql"] for q in ctx.captured_queries if WRITE.search(q["sql"])]
                transaction.set_rollback(True)
            where = f"{slug}/{p.name} {key.split(' ')[0].upper()} {path}"
            if key in AUDITED and response.status_code == 200:
                tables = set().union(*map(_tables, writes)) if writes else set()
                inserts = [w for w in writes if re.search(
                    r'INSERT\s+INTO\s+"?checkpoints_auditevent\b', w, re.I)]
                if not tables <= AUDIT_TABLES or len(inserts) != 1:
                    failures.append(f"{where}: {response.status_code}, writes "
                                    f"{sorted(tables)}, {len(inserts)} audit events")
            elif writes:
                failures.append(f"{where}: {response.status_code}, wrote: "
                                + "; ".join(w[:120] for w in writes))
    assert not failures, "\n".join(failures[:30])
