"""Restored usage never decreases (issue 19, item 4; CONTRACT.md 8; RUNIFOLD.md 2 and 3).

A checkpoint write whose usage counter goes below the stored revision's is refused (422
``usage_decreased`` naming the counter) and kept as a conflict, through either write
dialect and through a runifold import; a resume that carries the runtime's usage must
match the checkpoint's (``continue``/``replay``) or be at least it (``retry``), else
``reject``/``usage_mismatch``, and the approval is not spent.
"""

from __future__ import annotations

import io
import json
import uuid

import pytest
from django.db import connection
from django.urls import reverse

from checkpoints import policy, services
from checkpoints.exceptions import UsageDecreased
from checkpoints.interop import runifold
from checkpoints.models import Checkpoint, CheckpointRevision, Conflict, RetryRequest, Run
from tests.api.apihelpers import url
from tests.helpers import envelope, put_checkpoint, sweep_later
from tests.kind_fixtures import payload as fixture_payload

COUNTERS = ("tokens", "cost_microusd", "duration_micros", "turns", "tool_calls", "delegations")


def agent_payload(state: str = "ready_for_turn", **usage) -> dict:
    """The runifold.agent v1 fixture in ``state`` with its usage counters set."""
    payload = fixture_payload(f"runifold.agent/v1/{state}")
    payload["usage"] = {name: usage.get(name, 0) for name in COUNTERS}
    return payload


def agent_body(revision: int = 0, *, ids=None, state="ready_for_turn", **usage) -> dict:
    cid, rid = ids or (uuid.uuid4(), uuid.uuid4())
    return envelope(checkpoint_id=cid, run_id=rid, revision=revision, kind="runifold.agent",
                    payload=agent_payload(state, **usage))


def approved_retry(tenant, writer, reviewer, approver, body: dict):
    """``body`` written (an agent turn in flight), its owner gone quiet, a retry requested
    and approved by another person: ``(run_id, retry)``, ready for a resume claim."""
    run_id = uuid.UUID(body["run_id"])
    put_checkpoint(writer, tenant, body)
    services.lease_acquire(actor=writer, tenant=tenant, run_id=run_id, owner="w1", ttl_s=1)
    sweep_later()
    retry = services.retry_request(actor=reviewer, tenant=tenant, run_id=run_id, reason="stuck")
    services.retry_approve(actor=approver, tenant=tenant, retry_id=retry.pk, reason="ok")
    return run_id, retry


@pytest.fixture(params=["orm", "sql"])
def dialect(request, settings):
    """Both write dialects: the SQL one exists on PostgreSQL only."""
    if request.param == "sql" and connection.vendor != "postgresql":
        pytest.skip("the SQL write path is PostgreSQL's (set DATABASE_URL)")
    settings.RECOVERY_SQL_WRITE_PATH = request.param == "sql"
    return request.param


# --------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("previous", "sent", "found"), [
    ({"tokens": 5}, {"tokens": 5}, None),
    ({"tokens": 5}, {"tokens": 6}, None),
    ({"tokens": 5, "turns": 2}, {"tokens": 9, "turns": 1}, ("turns", 2, 1)),
    ({"tokens": 5}, {}, ("tokens", 5, 0)),            # a counter left out counts as 0
    ({}, {"tokens": 1}, None),                        # nothing known before: nothing to compare
    ({"tokens": 2**64 - 1}, {"tokens": 2**64 - 2}, ("tokens", 2**64 - 1, 2**64 - 2)),
])
def test_usage_decrease_names_the_first_counter_that_goes_back(previous, sent, found):
    assert policy.usage_decrease(previous, sent) == found


@pytest.mark.parametrize(("action", "runtime", "allowed"), [
    ("continue", {"tokens": 5}, True),
    ("continue", {"tokens": 6}, False),
    ("continue", {"tokens": 4}, False),
    ("replay", {"tokens": 6}, False),
    ("retry", {"tokens": 5}, True),
    ("retry", {"tokens": 6}, True),
    ("retry", {"tokens": 4}, False),
    ("retry", {}, False),
    ("reject", {"tokens": 0}, True),
    ("reconcile", {}, True),
])
def test_usage_allows_what_runifold_allows(action, runtime, allowed):
    assert policy.usage_allows(action, {"tokens": 5}, runtime) is allowed


# --------------------------------------------------------------------------------------
# Writes
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_write_that_lowers_a_counter_is_refused_and_kept(acme, wendy, dialect):
    ids = (uuid.uuid4(), uuid.uuid4())
    put_checkpoint(wendy, acme, agent_body(0, ids=ids, tokens=100, turns=1))
    put_checkpoint(wendy, acme, agent_body(1, ids=ids, tokens=120, turns=1), expected=0)
    with pytest.raises(UsageDecreased) as refused:
        put_checkpoint(wendy, acme, agent_body(2, ids=ids, tokens=90, turns=1), expected=1)
    assert refused.value.status == 422
    assert refused.value.body()["error"] == "usage_decreased"
    assert refused.value.body()["counter"] == "tokens"
    assert "usage.tokens" in refused.value.body()["detail"]
    stored = Checkpoint.objects.get(uuid=ids[0])
    assert (stored.revision, stored.usage["tokens"]) == (1, 120)
    assert CheckpointRevision.objects.filter(checkpoint=stored).count() == 2
    conflict = Conflict.objects.get()
    assert (conflict.reason, conflict.expected_revision, conflict.actual_revision,
            conflict.attempted_revision) == ("usage_decreased", 1, 1, 2)
    run = Run.objects.get(uuid=ids[1])
    assert (run.unacknowledged_conflicts, run.recovery_state) == (1, "conflicted")
    # Equal is not a decrease; the same revision goes through once the usage is right.
    assert put_checkpoint(wendy, acme, agent_body(2, ids=ids, tokens=120, turns=1),
                          expected=1).revision == 2


@pytest.mark.django_db
def test_an_unsupported_revision_does_not_reset_the_counters(acme, wendy, dialect):
    """A payload the registry cannot read is stored (never lost) with the counters known
    before it, so the next readable write is still held to them."""
    ids = (uuid.uuid4(), uuid.uuid4())
    put_checkpoint(wendy, acme, agent_body(0, ids=ids, tokens=100))
    garbled = dict(agent_body(1, ids=ids), payload={"not": "an agent"})
    assert put_checkpoint(wendy, acme, garbled, expected=0).phase_class == "unsupported"
    assert Checkpoint.objects.get(uuid=ids[0]).usage["tokens"] == 100
    with pytest.raises(UsageDecreased):
        put_checkpoint(wendy, acme, agent_body(2, ids=ids, tokens=10), expected=1)


@pytest.mark.django_db
def test_the_api_answers_422_naming_the_counter(api_as, acme, wendy):
    ids = (uuid.uuid4(), uuid.uuid4())
    client = api_as(wendy)
    first = agent_body(0, ids=ids, cost_microusd=300)
    path = url("acme", f"checkpoints/{ids[0]}")
    assert client.put(path, first, format="json", HTTP_IF_NONE_MATCH="*").status_code == 201
    lower = agent_body(1, ids=ids, cost_microusd=299)
    r = client.put(path, lower, format="json", HTTP_IF_MATCH='"0"')
    assert r.status_code == 422, r.content
    assert r.json()["error"] == "usage_decreased"
    assert r.json()["detail"].startswith("usage.cost_microusd:")


@pytest.mark.django_db
def test_a_retried_runtime_may_not_restore_lower_usage(acme, wendy, rita, april):
    """Across an approved retry too: the runtime that takes the retry resumes from the
    checkpoint's counters and only adds to them (RUNIFOLD.md 2)."""
    ids = (uuid.uuid4(), uuid.uuid4())
    run_id, _ = approved_retry(acme, wendy, rita, april,
                               agent_body(0, ids=ids, state="turn_in_flight", tokens=702))
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={},
                                  usage={"tokens": 702})
    assert claim["action"] == "retry"
    token = claim["fencing_token"]
    with pytest.raises(UsageDecreased):
        put_checkpoint(wendy, acme, agent_body(1, ids=ids, tokens=0), expected=0, token=token)
    assert put_checkpoint(wendy, acme, agent_body(1, ids=ids, tokens=951), expected=0,
                          token=token).revision == 1


@pytest.mark.django_db
def test_a_runifold_line_that_lowers_a_counter_is_refused(acme, wendy):
    ids = (uuid.uuid4(), uuid.uuid4())
    put_checkpoint(wendy, acme, agent_body(0, ids=ids, tokens=50))
    line = json.dumps(agent_body(1, ids=ids, tokens=49)).encode() + b"\n"
    errors = []
    report = runifold.runifold_import(
        actor=wendy, tenant=acme, lines=runifold.jsonl_lines(io.BytesIO(line)),
        on_error=lambda number, detail: errors.append((number, detail)))
    assert (report.imported, report.failed) == (0, 1)
    [(number, detail)] = errors
    assert number == 1 and detail.startswith("usage.tokens:")
    assert Checkpoint.objects.get(uuid=ids[0]).revision == 0
    line = json.dumps(agent_body(1, ids=ids, tokens=50)).encode() + b"\n"
    assert runifold.runifold_import(actor=wendy, tenant=acme, lines=runifold.jsonl_lines(
        io.BytesIO(line))).imported == 1


# --------------------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("state", "runtime", "answer"), [
    ("ready_for_turn", {"tokens": 40, "turns": 1}, ("continue", "stable")),
    ("ready_for_turn", {"tokens": 41, "turns": 1}, ("reject", "usage_mismatch")),
    ("ready_for_turn", {"tokens": 39, "turns": 1}, ("reject", "usage_mismatch")),
    ("ready_for_turn", None, ("continue", "stable")),      # not sent: not compared
    ("completed", {"tokens": 40, "turns": 1}, ("replay", "completed")),
    ("completed", {"tokens": 40}, ("reject", "usage_mismatch")),   # turns left out: 0
])
def test_a_resume_compares_the_runtimes_usage(acme, wendy, state, runtime, answer):
    body = agent_body(0, state=state, tokens=40, turns=1)
    put_checkpoint(wendy, acme, body)
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                  asked={}, usage=runtime)
    assert (claim["action"], claim["reason"]) == answer


@pytest.mark.django_db
def test_a_retry_with_less_usage_is_rejected_and_keeps_the_approval(acme, wendy, rita, april):
    run_id, retry = approved_retry(acme, wendy, rita, april,
                                   agent_body(0, state="turn_in_flight", tokens=702))
    low = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={},
                                usage={"tokens": 701})
    assert (low["action"], low["reason"]) == ("reject", "usage_mismatch")
    assert RetryRequest.objects.get().state == "approved"       # not spent
    assert Run.objects.get(uuid=run_id).fencing_token == low["fencing_token"]
    more = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={},
                                 usage={"tokens": 800})        # the lost turn spent more
    assert (more["action"], RetryRequest.objects.get().state) == ("retry", "consumed")


@pytest.mark.django_db
@pytest.mark.parametrize(("usage", "named"), [
    ([1], "usage"), ({"tokens": -1}, "usage.tokens"), ({"tokens": 2**64}, "usage.tokens"),
    ({"tokens": 1.0}, "usage.tokens"), ({"tokens": "1"}, "usage.tokens"),
    ({"tokens": True}, "usage.tokens"), ({"Tokens": 1}, "usage"),
    ({f"c{i}": 0 for i in range(33)}, "usage"),
])
def test_the_resume_body_refuses_bad_usage_naming_the_field(api_as, acme, wendy, usage, named):
    body = agent_body(0)
    put_checkpoint(wendy, acme, body)
    r = api_as(wendy).post(url("acme", f"runs/{body['run_id']}/resume"), {"usage": usage},
                           format="json")
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith(f"{named}:")


@pytest.mark.django_db
def test_the_resume_api_passes_usage_on(api_as, acme, wendy):
    body = agent_body(0, tokens=7)
    put_checkpoint(wendy, acme, body)
    path = url("acme", f"runs/{body['run_id']}/resume")
    r = api_as(wendy).post(path, {"usage": {"tokens": 8}}, format="json")
    assert (r.status_code, r.json()["reason"]) == (200, "usage_mismatch")
    r = api_as(wendy).post(path, {"usage": {"tokens": 7}}, format="json")
    assert (r.status_code, r.json()["action"]) == (200, "continue")


# --------------------------------------------------------------------------------------
# What recovery cost, shown
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_consumed_retry_records_what_the_lost_attempt_spent(api_as, client, acme, wendy,
                                                              rita, april):
    run_id, retry = approved_retry(acme, wendy, rita, april,
                                   agent_body(0, state="turn_in_flight", tokens=702, cost_microusd=215, turns=1))
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={},
                                  usage={"tokens": 800, "cost_microusd": 215, "turns": 2})
    assert claim["action"] == "retry"
    retry.refresh_from_db()
    assert retry.usage_burnt == {"tokens": 98, "turns": 1}
    # The API and the run page show the same: the checkpoint's usage, the retry's cost.
    detail = api_as(rita).get(url("acme", f"runs/{run_id}")).json()
    assert detail["checkpoints"][0]["usage"]["tokens"] == 702
    client.force_login(rita)
    page = client.get(reverse("run_detail", args=["acme", run_id])).content.decode()
    assert ("usage: tokens 702 · cost microusd 215 · duration micros 0 · turns 1 · "
            "tool calls 0 · delegations 0") in page
    assert "tokens 98 · turns 1" in page


@pytest.mark.django_db
def test_a_retry_claimed_without_usage_records_no_cost(acme, wendy, rita, april):
    run_id, retry = approved_retry(acme, wendy, rita, april,
                                   agent_body(0, state="turn_in_flight", tokens=702))
    assert services.resume_claim(actor=wendy, tenant=acme, run_id=run_id,
                                 asked={})["action"] == "retry"
    retry.refresh_from_db()
    assert retry.usage_burnt == {}


@pytest.mark.django_db
def test_the_report_sums_what_recovery_cost_per_kind(acme, wendy, rita, april, vic):
    from checkpoints import reports  # the report, read like the page and the API read it

    for tokens in (702, 500):
        run_id, retry = approved_retry(acme, wendy, rita, april,
                                       agent_body(0, state="turn_in_flight", tokens=tokens))
        services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={},
                              usage={"tokens": tokens + 10, "turns": 1})
    data = reports.figures(user=vic, tenant=acme, range_name="24h")
    assert data["recovery_cost"] == {"runifold.agent": {"tokens": 20, "turns": 2}}
    assert reports.csv_rows(data, "recovery_cost")[1][:3] == ["runifold.agent", "tokens", 20]
