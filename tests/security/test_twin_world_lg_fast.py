"""The LangGraph fast paths (``_put_sql``, ``_writes_sql``) in the twin world, on
PostgreSQL.

They run only outside a transaction (``interop.langgraph.put``/``writes``: inside one,
the ORM path runs), and every request of tests/security/test_twin_world.py runs inside
the module's rolled-back world, so neither reached them (found at stop 40). Here the
world is committed (a transactional test, in a file of its own so that module's world is
never open around it) and a writer of each tenant sends the post on the ids both tenants
hold: the fast path must answer (not hand back to the ORM path), show nothing of the twin
and change none of the twin's rows.
"""

from __future__ import annotations

import pytest

from checkpoints import sql
from checkpoints.interop.langgraph import put as lg_put_module
from checkpoints.interop.langgraph import writes as lg_writes_module
from tests.security import test_twin_world as twin
from tests.twinworld import MARK, SLUGS, build_world

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

T = "/api/v1/tenants/{tenant}/"
FAST = {f"post {T}langgraph/checkpoints": (lg_put_module, "_put_sql"),
        f"post {T}langgraph/writes": (lg_writes_module, "_writes_sql")}


@pytest.fixture
def committed_world(transactional_db):
    data = build_world(twin.IDS, twin.EXTRA, lg_thread=twin.LG_THREAD, lg_run="tw-run")
    return twin.World(data, twin._personas(), twin._both())


@pytest.mark.parametrize("key", sorted(FAST))
def test_a_langgraph_fast_path_shows_and_changes_nothing_of_the_twin(committed_world,
                                                                     monkeypatch, key):
    module, name = FAST[key]
    real, answers = getattr(module, name), []

    def spy(*args, **kwargs):
        answers.append(real(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(module, name, spy)
    for slug in SLUGS:
        twin_tenant = committed_world.tenant(twin.other(slug))
        before = twin.tenant_rows(twin_tenant)
        path, response = twin._request("api", key, twin.API[key], committed_world, slug,
                                       committed_world.persona(slug, "writer"))
        assert response.status_code in (200, 201), (path, response.content)
        assert MARK[twin.other(slug)] not in response.content.decode()
        assert MARK[slug] not in str(response.headers)
        assert twin.tenant_rows(twin_tenant) == before, f"{path}: the twin's rows changed"
    assert len(answers) == len(SLUGS)
    assert all(answer is not sql.FALLBACK for answer in answers), answers
