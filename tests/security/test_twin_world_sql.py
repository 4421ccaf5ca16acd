"""The twin world's requests whose code has a PostgreSQL-only path, on PostgreSQL.

``make test`` runs the twin world (tests/security/test_twin_world.py, mark ``once``) in
the SQLite pass only: tenant scoping is in the queries Django builds for either backend.
The requests below write through SQL of the store's own on PostgreSQL (``checkpoints.sql``:
the checkpoint write path, the LangGraph writes and puts, the thread and run deletes), so
they run again here, with the same world and the same checks."""

from __future__ import annotations

import pytest

from tests.security import test_twin_world as twin
from tests.security.test_twin_world import world  # noqa: F401 - the module's world fixture

pytestmark = pytest.mark.postgres

SQL_PATHS = [("api", key) for key in twin.API
             if key.startswith(("put ", "post ")) and any(
                 part in key for part in ("/checkpoints", "/langgraph/", "/effects/"))]


def test_the_list_names_the_sql_paths():
    assert ("api", "put /api/v1/tenants/{tenant}/checkpoints/{checkpoint_id}") in SQL_PATHS
    assert ("api", "post /api/v1/tenants/{tenant}/langgraph/writes") in SQL_PATHS
    assert len(SQL_PATHS) >= 8


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "key"), SQL_PATHS, ids=[f"{k}:{x}" for k, x in SQL_PATHS])
def test_a_request_on_a_postgresql_path_shows_nothing_of_the_twin(world, kind, key):  # noqa: F811
    twin.test_a_request_shows_nothing_of_the_twin(world, kind, key)
