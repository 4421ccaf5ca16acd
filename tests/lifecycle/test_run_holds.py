"""A run shows the legal holds that cover it (stop 37, the newcomer's finding: a run held
by a subject hold looked like any other, its page offering "Place legal hold" and saying
nothing of the hold already on it). ``selectors.covering_holds`` is the rule from one
run; ``services.held_runs_q`` (what retention and erasure keep) is the same rule over the
tenant's runs: a generated table of hold sets holds the two to one answer. The run page
and ``GET …/runs/{run_id}`` (``legal_holds``) both read ``selectors.run_legal_holds``;
neither shows a subject's value. SQLite and PostgreSQL."""

from __future__ import annotations

import itertools

import pytest

from checkpoints import selectors, services
from checkpoints.models import Run
from tests.lifecycle.test_erasure_holds import SECRET_CUSTOMER, completed_run, declare

pytestmark = pytest.mark.django_db

HOLDS = ("this run", "another run", "its subject", "another subject", "the tenant",
         "a released one")


def _place(kind, adam, tenant, run, other):
    """Place one hold of ``kind`` (``HOLDS``); return it when it should cover ``run``."""
    args = {"this run": {"runs": [run.uuid]}, "another run": {"runs": [other.uuid]},
            "its subject": {"subject": {"field": "customer", "value": SECRET_CUSTOMER}},
            "another subject": {"subject": {"field": "customer", "value": "cust-other"}},
            "the tenant": {"whole_tenant": True},
            "a released one": {"runs": [run.uuid]}}[kind]
    hold = services.legal_hold_place(actor=adam, tenant=tenant, reason=f"why: {kind}", **args)
    if kind == "a released one":
        services.legal_hold_release(actor=adam, tenant=tenant, hold_id=hold.uuid, reason="done")
        return None
    return hold if kind in ("this run", "its subject", "the tenant") else None


@pytest.mark.parametrize("kinds", [c for n in range(0, 3)
                                   for c in itertools.combinations(HOLDS, n)],
                         ids=lambda c: "+".join(c) or "none")
def test_the_holds_a_run_shows_are_those_that_keep_it(acme, wendy, adam, kinds):
    declare(acme)
    run = completed_run(wendy, acme)
    other = completed_run(wendy, acme, customer="cust-other")
    covering = {h.pk for h in (_place(k, adam, acme, run, other) for k in kinds) if h}
    shown = {h.pk for h in selectors.covering_holds(run)}
    assert shown == covering
    held = services.held_runs_q(acme)
    kept = held is None or Run.objects.for_tenant(acme).filter(held, pk=run.pk).exists()
    assert kept is bool(shown), kinds  # the services' rule and the run's, one answer
    assert (services.Blocker.HELD in services.run_blockers(run)) is bool(shown)


def test_the_run_page_and_the_api_name_the_hold_never_the_value(acme, wendy, adam, vic,
                                                                 api_as, client):
    declare(acme)
    run = completed_run(wendy, acme)
    client.force_login(vic)  # a viewer: the holds' own list is every role's
    page = client.get(f"/t/acme/runs/{run.uuid}/")
    assert page.status_code == 200 and 'id="held-note"' not in page.content.decode()
    hold = services.legal_hold_place(
        actor=adam, tenant=acme, reason="litigation 7",
        subject={"field": "customer", "value": SECRET_CUSTOMER})
    html = client.get(f"/t/acme/runs/{run.uuid}/").content.decode()
    assert 'id="held-note"' in html and "litigation 7" in html
    assert "customer" in html.split('id="held-note"')[1].split("</p>")[0]
    answer = api_as(vic).get(f"/api/v1/tenants/acme/runs/{run.uuid}")
    assert answer.status_code == 200
    assert answer.json()["legal_holds"] == [{
        "id": str(hold.uuid), "scope": "subject", "subject_field": "customer",
        "reason": "litigation 7", "placed_by": adam.username,
        "placed_at": answer.json()["legal_holds"][0]["placed_at"]}]
    assert SECRET_CUSTOMER not in html and SECRET_CUSTOMER not in answer.content.decode()
    services.legal_hold_release(actor=adam, tenant=acme, hold_id=hold.uuid, reason="settled")
    assert api_as(vic).get(f"/api/v1/tenants/acme/runs/{run.uuid}").json()[
        "legal_holds"] == []
