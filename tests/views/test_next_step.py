"""The inbox says what to do (issue 21, item 7): the reason column is the run page's next
step, short, from the same rule (``selectors.nextstep``) for each effect situation; the API
run list says the same words; a header line per role counts what waits for a reviewer
and an approver from the state counters the tabs show; the page's steps cost a fixed
number of queries whatever its length."""

from __future__ import annotations

import html
import re
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints import selectors, services
from checkpoints.reconcile import Answer
from tests.conftest import bearer_client
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect
from tests.views.conftest import make_stuck_run, reconcile

pytestmark = pytest.mark.django_db

INBOX = "/t/acme/"


def _fresh(acme, wendy):
    order = f"O-{uuid.uuid4().hex[:8]}"
    return make_stuck_run(wendy, acme, order_id=order, key=f"charge:{order}")


def _in_doubt(acme, wendy, rita, scripted):
    return _fresh(acme, wendy).run_id


def _confirmed(acme, wendy, rita, scripted):  # reconciliation found the charge
    stuck = _fresh(acme, wendy)
    reconcile(rita, acme, stuck.run_id)
    return stuck.run_id


def _never_ran(acme, wendy, rita, scripted):  # reconciliation: the service never saw it
    stuck = _fresh(acme, wendy)
    scripted.answers = [Answer.not_executed("payments: no such operation")]
    reconcile(rita, acme, stuck.run_id)
    return stuck.run_id


def _unknown(acme, wendy, rita, scripted):
    stuck = _fresh(acme, wendy)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    return stuck.run_id


def _settled(acme, wendy, rita, scripted):  # confirmed by the runtime, then it died
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key=f"charge:{run_id}"),
                "submitted", "confirmed")
    sweep_later()
    return run_id


def _awaiting(acme, wendy, rita, scripted):
    run_id = _unknown(acme, wendy, rita, scripted)
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="try again")
    return run_id


def _closed(acme, wendy, rita, scripted):
    run_id = _fresh(acme, wendy).run_id
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="refunded by hand")
    return run_id


def _healthy(acme, wendy, rita, scripted):
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "ready"}))
    return run_id


#: Each situation and the inbox's words for it (the run page's next step, short).
SITUATIONS = {
    "in_doubt": (_in_doubt, "payments in doubt · reconcile first"),
    "confirmed": (_confirmed, "payments confirmed · a retry replays it"),
    "never_ran": (_never_ran, "payments never ran · a retry calls it once"),
    "unknown": (_unknown, "nobody can tell · possible duplicate"),
    "settled": (_settled, "payments confirmed · a retry replays it"),
    "awaiting": (_awaiting, "retry requested by rita · an approver decides"),
    "closed": (_closed, "closed by rita · nothing to do"),
    "healthy": (_healthy, ""),
}


@pytest.mark.parametrize("name", sorted(SITUATIONS))
def test_the_inbox_says_the_run_pages_next_step_short(login, rita, wendy, acme, scripted,
                                                      name):
    make, words = SITUATIONS[name]
    run_id = make(acme, wendy, rita, scripted)
    client = login(rita)
    page = client.get(reverse("run_detail", args=["acme", run_id]))
    inbox = client.get(INBOX, {"state": "all"})
    row = next(r for r in inbox.context["rows"] if r["uuid"] == run_id)
    assert row["next_step"] == page.context["next_step_short"] == words
    if words:
        body = html.unescape(inbox.content.decode())
        cell = body[body.index(f'data-run="{run_id}"'):]
        cell = cell[:cell.index("</tr>")]
        assert words in cell
        # The state comes right after the run id, before the next step.
        assert cell.index('class="state-cell"') < cell.index('next-step-cell')
        # The API run list says the same words.
        api = bearer_client(rita).get("/api/v1/tenants/acme/runs", {"limit": 200})
        item = next(r for r in api.json()["results"] if r["run_id"] == str(run_id))
        assert item["next_step"] == words


def test_the_run_page_and_the_inbox_use_one_rule_for_the_long_and_short_words(
        login, rita, wendy, acme, scripted):
    run_id = _confirmed(acme, wendy, rita, scripted)
    context = login(rita).get(reverse("run_detail", args=["acme", run_id])).context
    assert context["next_step"].startswith("Reconciliation confirmed payments charge:O-")
    assert context["next_step_short"] == "payments confirmed · a retry replays it"


def test_a_page_of_steps_costs_a_fixed_number_of_queries(rita, wendy, acme, scripted):
    def cost(n_runs: int) -> int:
        rows = selectors.run_list(user=rita, tenant=acme, filters=selectors.RunFilters(),
                                  limit=200).rows
        assert len(rows) == n_runs
        with CaptureQueriesContext(connection) as ctx:
            steps = selectors.page_steps(user=rita, tenant=acme, rows=rows)
        assert len(steps) == n_runs
        return len(ctx.captured_queries)

    for make in (_in_doubt, _confirmed, _unknown, _awaiting):
        make(acme, wendy, rita, scripted)
    few = cost(4)
    for make in (_in_doubt, _confirmed, _never_ran, _unknown, _settled, _awaiting, _closed,
                 _healthy) * 2:
        make(acme, wendy, rita, scripted)
    many = cost(20)
    # Effects, open retry requests, reconcile requests, the database clock: four at most
    # (the role check reads the grants already cached for the user).
    assert many == few <= 4, (few, many)
    print(f"\npage_steps queries: {few} for 4 runs, {many} for 20 runs")
    assert selectors.page_steps(user=rita, tenant=acme, rows=[]) == {}


def test_the_header_counts_what_waits_for_each_role_as_the_tabs_do(
        login, rita, april, wendy, acme, scripted):
    for make in (_in_doubt, _in_doubt, _unknown, _awaiting, _closed, _healthy):
        make(acme, wendy, rita, scripted)
    response = login(april).get(INBOX)
    work = {w["who"]: w["n"] for w in response.context["role_work"]}
    tabs = {value: n for value, _, n in response.context["tabs"]}
    assert work == {"a reviewer": 3, "an approver": 1}
    assert work["a reviewer"] == sum(tabs[s] for s in (
        "ambiguous", "unknown_outcome", "conflicted", "schema_mismatch"))
    assert work["an approver"] == tabs["awaiting_approval"]
    body = html.unescape(response.content.decode())
    line = body[body.index('id="role-work"'):]
    line = re.sub(r"<[^>]+>", "", line[line.index(">") + 1:line.index("</p>")])
    assert " ".join(line.split()) == "3 runs need a reviewer · 1 needs an approver"
    # A search narrows the tabs, never the header: it counts the tenant's work.
    narrowed = login(april).get(INBOX, {"q": "no-such-run-anywhere"})
    assert narrowed.context["role_work"] == response.context["role_work"]
