"""The twin world's cases whose code has a PostgreSQL-only path, on PostgreSQL.

``make test`` runs the twin world (tests/security/test_twin_world.py, mark ``once``) in
the SQLite pass only: tenant scoping is in the queries Django builds for either backend.
These cases reach SQL of the store's own or PostgreSQL-only operators, so they run again
here with the same world and the same checks:

- a checkpoint update (``If-Match``) of an id both tenants hold: ``checkpoint_update``'s
  statements (``checkpoints.sql``, ``checkpoints_write_lock_v2``; the twin world's own PUT
  is a create, which takes the ORM path);
- the LangGraph checkpoint and writes posts, which update through the same statements;
- search (``ILIKE``, the id branch of ``selectors.search``) and the inbox's counts, the
  run position, the report figures and ``GET …/report`` (``PERCENTILE_CONT``, rollups);
- the audit sequencer and the runifold import (advisory locks, ``COPY`` inserts).

A review of the split (stop 40) found that the twin world never reaches the LangGraph
SQL fast paths themselves (``_put_sql``, ``_writes_sql``): they run only outside a
transaction, and every twin-world request runs inside one:
tests/security/test_twin_world_lg_fast.py sends those posts in a committed world.
"""

from __future__ import annotations

import pytest

from tests.helpers import envelope
from tests.security import test_twin_world as twin
from tests.security.test_twin_world import world  # noqa: F401 - the module's world fixture

pytestmark = pytest.mark.postgres

T = "/api/v1/tenants/{tenant}/"
REQUESTS = [("api", f"post {T}langgraph/checkpoints"), ("api", f"post {T}langgraph/writes"),
            ("api", f"get {T}report")]
SELECTORS = ["run_list", "run_state_counts", "run_position"]
REPORTS = ["figures"]
SERVICES = [(name, i) for name in ("audit_integrate", "runifold_import")
            for i in range(len(twin.SERVICES[name]))]


def test_every_case_named_here_is_in_the_twin_world():
    assert {key for _, key in REQUESTS} <= set(twin.API)
    assert set(SELECTORS) <= set(twin.SELECTORS) and set(REPORTS) <= set(twin.REPORTS)
    assert SERVICES


@pytest.mark.django_db
def test_a_checkpoint_update_of_an_id_both_tenants_hold_shows_nothing_of_the_twin(world):  # noqa: F811
    update = twin.Req({"checkpoint_id": "c_stable"},
                      lambda: envelope(twin.IDS["c_stable"], twin.IDS["r_stable"], 1),
                      {"HTTP_IF_MATCH": '"0"'}, write=True)
    statuses = twin.check_request(world, "api", f"put {T}checkpoints/{{checkpoint_id}}", update)
    assert 200 in statuses  # a writer of each tenant updated its own: the SQL path ran


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "key"), REQUESTS, ids=[k for _, k in REQUESTS])
def test_a_request_on_a_postgresql_path_shows_nothing_of_the_twin(world, kind, key):  # noqa: F811
    twin.test_a_request_shows_nothing_of_the_twin(world, kind, key)


@pytest.mark.django_db
@pytest.mark.parametrize("name", SELECTORS)
def test_a_selector_on_postgresql_answers_with_its_own_tenant_only(world, name):  # noqa: F811
    twin.test_a_selector_answers_with_its_own_tenant_only(world, name)


@pytest.mark.django_db
@pytest.mark.parametrize("name", REPORTS)
def test_a_report_on_postgresql_answers_with_its_own_tenant_only(world, name):  # noqa: F811
    twin.test_a_report_function_answers_with_its_own_tenant_only(world, name)


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "index"), SERVICES, ids=[f"{n}-{i}" for n, i in SERVICES])
def test_a_service_on_postgresql_never_touches_the_twin(world, name, index):  # noqa: F811
    twin.test_a_service_in_one_tenant_never_touches_the_twin(world, name, index)
