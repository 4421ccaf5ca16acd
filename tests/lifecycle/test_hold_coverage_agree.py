"""One legal-hold coverage rule, every place that reads it (the last stop's open item:
``selectors.covering_holds`` and ``services.held_runs_q`` were two expressions of the
rule; both now read ``selectors.hold_covers_q``, as ``services.run_blockers`` does).

A generated table: every set of up to two hold kinds (``KINDS``) placed over three runs
of different attributes (``RUNS``: indexed under a customer and an account, under
another customer only, under no subject at all). A hand-written oracle (``COVERS``) says
which runs each kind covers; ``held_runs_q`` (retention's candidates), the run page's
hold note, ``GET …/runs/{id}``'s ``legal_holds``, ``run_blockers`` and then what
retention (or erasure) actually deletes must all say the same. SQLite and PostgreSQL."""

from __future__ import annotations

import itertools

import pytest

from checkpoints import services
from checkpoints.models import Checkpoint, DataPolicy, Run
from tests.helpers import age_world, envelope, put_checkpoint

pytestmark = pytest.mark.django_db

DAY = 86400
FIELDS = {"customer": "/customer/id", "account": "/account"}
#: The runs' attributes: what their payloads carry under the declared subject fields.
RUNS = {"a": {"customer": {"id": "cust-a"}, "account": "acct-a"},
        "b": {"customer": {"id": "cust-b"}},
        "c": {"customer": {"id": None}}}  # indexed under no subject
#: Hold kind -> the ``legal_hold_place`` arguments (a run named by its key).
KINDS = {"names a": {"runs": ["a"]},
         "names b and c": {"runs": ["b", "c"]},
         "customer a": {"subject": {"field": "customer", "value": "cust-a"}},
         "account a": {"subject": {"field": "account", "value": "acct-a"}},
         "customer b": {"subject": {"field": "customer", "value": "cust-b"}},
         "customer nobody": {"subject": {"field": "customer", "value": "cust-z"}},
         "account of b": {"subject": {"field": "account", "value": "cust-b"}},
         "tenant": {"whole_tenant": True},
         "released (names a)": {"runs": ["a"]}}
#: The oracle: which runs each kind covers, written out by hand.
COVERS = {"names a": {"a"}, "names b and c": {"b", "c"}, "customer a": {"a"},
          "account a": {"a"}, "customer b": {"b"}, "customer nobody": set(),
          "account of b": set(), "tenant": {"a", "b", "c"}, "released (names a)": set()}
TABLE = [c for n in range(0, 3) for c in itertools.combinations(KINDS, n)]


def _world(wendy, adam, acme, kinds):
    """The three runs (completed), then the holds of ``kinds``; returns the runs by key
    and the expected covering holds' reasons by run key."""
    DataPolicy.objects.create(tenant=acme, subject_fields=FIELDS)
    runs = {}
    for key, extra in RUNS.items():
        payload = {"phase": "ready", **extra}
        body = envelope(payload=payload)
        put_checkpoint(wendy, acme, body)
        put_checkpoint(wendy, acme, {**body, "revision": 1,
                                     "payload": {**payload, "phase": "completed"}}, expected=0)
        runs[key] = Run.objects.for_tenant(acme).get(uuid=body["run_id"])
    expected = {key: set() for key in RUNS}
    for kind in kinds:
        args = dict(KINDS[kind])
        if "runs" in args:
            args["runs"] = [runs[k].uuid for k in args["runs"]]
        hold = services.legal_hold_place(actor=adam, tenant=acme, reason=f"case {kind}", **args)
        if kind.startswith("released"):
            services.legal_hold_release(actor=adam, tenant=acme, hold_id=hold.uuid,
                                        reason="done")
        for key in COVERS[kind]:
            expected[key].add(str(hold.uuid))
    return runs, expected


@pytest.mark.parametrize("refusal", ["retention", "erasure"])
@pytest.mark.parametrize("kinds", TABLE, ids=lambda c: "+".join(c) or "none")
def test_the_page_the_api_and_the_refusals_agree_on_what_a_hold_covers(
        acme, wendy, adam, april, vic, api_as, client, kinds, refusal):
    runs, expected = _world(wendy, adam, acme, kinds)
    client.force_login(vic)
    held = services.held_runs_q(acme)  # what retention's candidates and the tombstone purge leave
    for key, run in runs.items():
        covered = bool(expected[key])
        in_set = held is None or Run.objects.for_tenant(acme).filter(held, pk=run.pk).exists()
        assert in_set is covered, (key, kinds)
        html = client.get(f"/t/acme/runs/{run.uuid}/").content.decode()
        assert ('id="held-note"' in html) is covered, (key, kinds)
        note = html.split('id="held-note"')[1].split("</p>")[0] if covered else ""
        shown = {k for k in kinds if f"case {k}<" in note}
        assert shown == {k for k in kinds if key in COVERS[k]}, (key, kinds)
        answer = api_as(vic).get(f"/api/v1/tenants/acme/runs/{run.uuid}")
        assert {h["id"] for h in answer.json()["legal_holds"]} == expected[key], (key, kinds)
        run.refresh_from_db()
        assert (services.Blocker.HELD in services.run_blockers(run)) is covered, (key, kinds)
    if refusal == "retention":
        services.data_policy_set(actor=None, tenant=acme, payload_retention_days=1)
        age_world(2 * DAY)
        services.retention_purge(tenant=acme)
    else:
        request = services.erasure_request(actor=adam, tenant=acme, reason="gdpr",
                                           runs=[r.uuid for r in runs.values()])
        done = services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid)
        assert done.counts["legal_hold"] == sum(1 for k in RUNS if expected[k]), kinds
    for key, run in runs.items():
        kept = Checkpoint.objects.for_tenant(acme).filter(run_id=run.pk).exists()
        assert kept is bool(expected[key]), (key, kinds, refusal)
