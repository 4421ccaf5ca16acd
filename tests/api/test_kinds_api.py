"""``GET …/kinds`` (CONTRACT.md 8; docs/kinds.md): for one tenant, each kind and schema
version its checkpoints use, beside what the kind registry supports, with checkpoints,
runs and ``schema_mismatch`` runs per version; the registry's kinds the tenant does not use
are listed with zeros. Nothing of another tenant's checkpoints or runs, and another
tenant's accounts get 404 (the isolation table covers every identity)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import selectors
from tests.api.apihelpers import get, new_checkpoint, put_cp
from tests.helpers import envelope, put_checkpoint

#: ``selectors.kind_usage`` once the caller's rights are known (read once per request, by
#: ``access_tenant``): the checkpoints per kind and version, the ``schema_mismatch`` runs
#: per kind and version, the tenant's declared kinds (none here, so no body is read).
QUERIES = 3


def _kinds(response) -> dict[str, dict]:
    assert response.status_code == 200, response.content
    return {k["kind"]: k for k in response.json()["kinds"]}


def _versions(kind: dict) -> dict[int, tuple]:
    return {v["schema_version"]: (v["supported"], v["checkpoints"], v["runs"],
                                  v["schema_mismatch_runs"]) for v in kind["versions"]}


@pytest.fixture
def used(api_as, wendy, wes):
    """acme: acme.order v1 in two runs (one with two checkpoints), an acme.order v9 run
    (a version the registry does not support: schema_mismatch), an ``acme.mystery`` run (unregistered). globex: its
    own ``globex.secret`` v7 run and an acme.order v1 run."""
    w = api_as(wendy)
    first = new_checkpoint(w, "acme")
    new_checkpoint(w, "acme", run_id=first["run_id"])
    new_checkpoint(w, "acme", payload={"phase": "charging"})
    new_checkpoint(w, "acme", schema_version=9)
    new_checkpoint(w, "acme", kind="acme.mystery", payload={"anything": 1})
    g = api_as(wes)
    new_checkpoint(g, "globex", kind="globex.secret", schema_version=7, payload={})
    new_checkpoint(g, "globex")


def test_it_counts_each_kind_and_version_of_the_tenant(api_as, vic, used):
    kinds = _kinds(get(api_as(vic), "acme", "kinds"))
    order = kinds["acme.order"]
    assert (order["registered"], order["supported_versions"],
            order["newest_supported_version"]) == (True, [1, 2], 2)
    assert order["description"].startswith("demo order workflow")
    assert _versions(order) == {1: (True, 3, 2, 0), 2: (True, 0, 0, 0), 9: (False, 1, 1, 1)}
    mystery = kinds["acme.mystery"]
    assert (mystery["registered"], mystery["supported_versions"],
            mystery["newest_supported_version"], mystery["description"]) == (False, [], None, "")
    assert _versions(mystery) == {1: (False, 1, 1, 1)}


def test_it_lists_the_registrys_kinds_the_tenant_does_not_use_with_zeros(api_as, vic, used):
    kinds = _kinds(get(api_as(vic), "acme", "kinds"))
    assert list(kinds) == sorted(kinds)
    assert _versions(kinds["runifold.workflow"]) == {3: (True, 0, 0, 0), 4: (True, 0, 0, 0)}
    assert kinds["runifold.workflow"]["newest_supported_version"] == 4
    assert _versions(kinds["runifold.agent"]) == {1: (True, 0, 0, 0)}
    assert {"langgraph.checkpoint", "runifold.agent", "runifold.workflow"} <= set(kinds)


def test_it_shows_nothing_of_another_tenants_checkpoints(api_as, vic, omar, used):
    acme = _kinds(get(api_as(vic), "acme", "kinds"))
    assert "globex.secret" not in acme
    globex = _kinds(get(api_as(omar), "globex", "kinds"))
    assert _versions(globex["globex.secret"]) == {7: (False, 1, 1, 1)}
    assert _versions(globex["acme.order"]) == {1: (True, 1, 1, 0), 2: (True, 0, 0, 0)}
    assert "acme.mystery" not in globex


def test_a_run_leaves_the_mismatch_count_when_its_next_write_is_supported(api_as, wendy, vic):
    w = api_as(wendy)
    body = new_checkpoint(w, "acme", schema_version=9)
    assert _versions(_kinds(get(api_as(vic), "acme", "kinds"))["acme.order"])[9] \
        == (False, 1, 1, 1)
    other = envelope(run_id=body["run_id"])  # a second checkpoint of the run, v1
    assert put_cp(w, "acme", other, create=True).status_code == 201
    versions = _versions(_kinds(get(api_as(vic), "acme", "kinds"))["acme.order"])
    assert versions == {1: (True, 1, 1, 0), 2: (True, 0, 0, 0), 9: (False, 1, 1, 0)}


@pytest.mark.parametrize("who", ["omar", "wes"])
def test_another_tenants_account_gets_404(request, api_as, used, who):
    r = get(api_as(request.getfixturevalue(who)), "acme", "kinds")
    assert r.status_code == 404
    assert r.json() == {"error": "not_found", "detail": "no tenant 'acme'"}


def test_it_takes_no_query_parameter(api_as, vic, acme):
    r = get(api_as(vic), "acme", "kinds", kind="acme.order")
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_payload" and "kind" in r.json()["detail"]


def test_it_lists_a_kind_loaded_from_a_kind_module(api_as, wendy, vic, kind_registry):
    from checkpoints.apps import load_kind_modules

    load_kind_modules(["examples.kinds.acme_refunds"])
    refund = _kinds(get(api_as(vic), "acme", "kinds"))["acme.refund"]
    assert (refund["registered"], refund["supported_versions"]) == (True, [1])
    assert _versions(refund) == {1: (True, 0, 0, 0)}


def test_the_selector_costs_the_same_queries_whatever_the_number_of_kinds(vic, wendy, acme,
                                                                         used):
    def cost() -> list[str]:
        with CaptureQueriesContext(connection) as ctx:
            selectors.kind_usage(user=vic, tenant=acme)
        return [q["sql"] for q in ctx.captured_queries]

    cost()  # the caller's rights, kept on the account
    before = cost()
    for n in range(3):
        put_checkpoint(wendy, acme, envelope(kind=f"acme.more{n}", payload={}))
    after = cost()
    assert len(after) == len(before) == QUERIES, after
