"""Hostile tests of issue 10 (LangGraph API and saver, runifold import/export, clients).

Each test states the behaviour the contract or the module's own docstring promises; each
was written failing (a strict xfail naming the place in the code) and passes since its
defect was fixed. One test per defect.
"""

from __future__ import annotations

import io
import json
import uuid

import pytest

from checkpoints import services
from checkpoints.exceptions import AlreadyDone
from checkpoints.interop import langgraph, runifold
from checkpoints.interop.runifold import jsonl_lines
from checkpoints.models import (
    AuditEvent,
    Conflict,
    Effect,
    GraphCheckpoint,
    RetryRequest,
    Run,
)
from recovery_client.client import CheckpointError, HttpCheckpointStore
from recovery_client.protocol import thread_run_id
from tests.conftest import bearer_client
from tests.helpers import (
    age_world,
    effect_body,
    envelope,
    graph_put,
    lg_put,
    put_checkpoint,
    put_effect,
    sweep_later,
)
from tests.test_runifold_io import B_RUN, import_fixtures, records, service_import

LG = "/api/v1/tenants/acme/langgraph/"


def _client(user):
    client = bearer_client(user)
    client.raise_request_exception = False  # see the answer a real caller gets
    return client


def _export(tenant, **kw) -> list[str]:
    lines: list[str] = []
    runifold.runifold_export(actor=None, tenant=tenant, write=lines.append, **kw)
    return lines


# --------------------------------------------------------------------------------------
# 1. LangGraph API (checkpoints/interop/langgraph/, checkpoints/api/)
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("version", "seen"), [
    ("\u00b2", 1),          # SUPERSCRIPT TWO: str.isdigit() is True, int() refuses it
    ("1", "\u2460"),        # CIRCLED DIGIT ONE, on the versions_seen side
    ("--1", 1),             # lstrip("-") then int("--1")
])
def test_a_channel_version_that_only_looks_numeric_is_400_not_500(wendy, version, seen):
    body = lg_put("t-1", "01", versions={"branch:to:charge": version},
                  values={"branch:to:charge": None},
                  seen={"charge": {"branch:to:charge": seen}})
    response = _client(wendy).post(LG + "checkpoints", data=json.dumps(body),
                                   content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith("checkpoint.")
    assert not GraphCheckpoint.objects.exists() and not Run.objects.exists()


@pytest.mark.django_db
def test_a_fenced_put_on_a_new_thread_leaves_no_run_behind(wendy):
    client = _client(wendy)
    refused = client.post(LG + "checkpoints", data=json.dumps(lg_put("t-new", "01")),
                          content_type="application/json", HTTP_FENCING_TOKEN="3")
    assert refused.status_code == 409
    # The same refusal through the checkpoint API leaves nothing (the reference).
    body = envelope()
    plain = client.put(f"/api/v1/tenants/acme/checkpoints/{body['id']}", data=json.dumps(body),
                       content_type="application/json", HTTP_FENCING_TOKEN="3",
                       HTTP_IF_NONE_MATCH="*")
    assert plain.status_code == 409
    assert list(Run.objects.values_list("uuid", flat=True)) == []
    assert not Conflict.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("mark_unknown", [True, False])
def test_deleting_a_thread_does_not_leave_an_approvable_retry_on_the_closed_run(
        acme, wendy, rita, april, mark_unknown):
    """A writer (no review right) deleting its thread never takes a run out of the
    reviewers' inbox: with an effect in doubt, or unknown with a retry request open, the
    run stays open (no checkpoint) and the request stays for the approver on an open run
    (docs/langgraph.md "Deleting"; services.review.awaits_review)."""
    run_id = thread_run_id("t-1")
    graph_put(wendy, acme, lg_put("t-1", "01", nodes=["charge"]))
    fx = effect_body(run_id=run_id, operation_key="charge:lg")
    put_effect(wendy, acme, fx)
    put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0)
    sweep_later()  # the owner is gone: the submitted effect is unresolved
    retry = None
    if mark_unknown:
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=fx["id"], reason="?")
        retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="died")
    before = Run.objects.get(uuid=run_id).recovery_state
    langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="t-1")
    run = Run.objects.get(uuid=run_id)
    assert run.closed_at is None and run.latest_checkpoint is None
    assert run.recovery_state == before == ("awaiting_approval" if mark_unknown
                                            else "ambiguous")
    assert Effect.objects.filter(run=run).count() == 1
    event = AuditEvent.objects.get(action="langgraph.thread_delete")
    assert event.after["run"] == "awaiting_review"
    if retry is not None:  # still the approver's, decided on an open run as any other
        assert RetryRequest.objects.get(pk=retry.pk).state == "requested"
        services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
        assert Run.objects.get(uuid=run_id).recovery_state == "retry_approved"


@pytest.mark.django_db
def test_a_thread_deletion_closes_as_a_reviewer_close_does(acme, wendy, rita):
    """With nothing awaiting review (a conflict only) the run is closed by the one rule
    of closing (``review.close_locked``): a reviewer's later close finds it closed."""
    run_id = thread_run_id("t-1")
    graph_put(wendy, acme, lg_put("t-1", "02", nodes=["charge"]))
    stale = _client(wendy).post(LG + "checkpoints", data=json.dumps(lg_put("t-1", "01")),
                                content_type="application/json")
    assert stale.status_code == 412 and Conflict.objects.count() == 1
    langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="t-1")
    run = Run.objects.get(uuid=run_id)
    assert (run.recovery_state, run.closed_reason, run.phase_class) == (
        "closed", "thread deleted", "")
    with pytest.raises(AlreadyDone):
        services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="done")


@pytest.mark.django_db
def test_a_head_of_the_langgraph_list_writes_no_audit_event(acme, wendy):
    graph_put(wendy, acme, lg_put("t-1", "01"))
    before = AuditEvent.objects.count()
    response = _client(wendy).head(LG + "checkpoints?thread_id=t-1")
    assert response.status_code == 200 and response.content == b""
    assert AuditEvent.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize("limit", ["5.0", "%EF%BC%95", "5%20"])  # a float, FULLWIDTH 5, "5 "
def test_a_list_limit_that_is_not_a_plain_integer_is_400(wendy, limit):
    response = _client(wendy).get(LG + f"checkpoints?limit={limit}")
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith("limit:")


# --------------------------------------------------------------------------------------
# 2. runifold import / export (checkpoints/interop/runifold/)
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_an_export_after_an_approved_retry_imports_back_into_the_same_tenant(
        acme, wendy, rita, april):
    import_fixtures(files=("agent.v1", "effects"))
    eid = "0193a4f2-8b13-7a2a-84d5-2e6f708192a3"  # started -> unresolved on import
    age_world(3600)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=uuid.UUID(eid), reason="?")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(B_RUN), reason="x")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(B_RUN), asked={})
    assert claim["action"] == "retry"
    e = Effect.objects.get(tenant=acme, uuid=eid)
    put_effect(wendy, acme, effect_body(
        effect_id=eid, run_id=B_RUN, revision=e.revision + 1, state="planned",
        operation_key=e.operation_key, service=e.service, effect_class=e.effect_class,
        fingerprint=e.request_fingerprint), expected=e.revision, token=claim["fencing_token"])
    lines = _export(acme)
    # docs/runifold.md: "What export writes, import accepts; re-importing it into the same
    # tenant skips every line."
    report, errors = service_import(acme, "\n".join(lines).encode())
    assert errors == [] and report.skipped == len(lines)


@pytest.mark.django_db
def test_a_history_export_with_a_schema_mismatch_revision_imports_elsewhere(
        acme, globex, wendy):
    rec = records("agent.v1")[0]
    put_checkpoint(wendy, acme, rec)
    put_checkpoint(wendy, acme, dict(rec, revision=1, payload={"broken": True}), expected=0)
    put_checkpoint(wendy, acme, dict(rec, revision=2), expected=1)
    lines = _export(acme, history=True)
    report, errors = service_import(globex, "\n".join(lines).encode())
    assert errors == [] and report.imported == len(lines)


def test_a_crlf_line_of_exactly_the_limit_reads_like_its_lf_twin():
    line = b'{"a": "' + b"x" * (1000 - 9) + b'"}'
    assert len(line) == 1000
    lf = list(jsonl_lines(io.BytesIO(line + b"\n"), max_bytes=1000))
    crlf = list(jsonl_lines(io.BytesIO(line + b"\r\n"), max_bytes=1000))
    assert lf[0].data is not None
    assert crlf[0].data is not None


# --------------------------------------------------------------------------------------
# 3. Clients (clients/python/recovery_client/client.py, shared by aclient.py)
# --------------------------------------------------------------------------------------

def test_the_client_size_check_counts_non_ascii_text_as_the_server_does(live_server, wendy):
    body = envelope(payload={"phase": "ready", "order_id": "A-1", "note": "\u4e2d" * 200_000})
    utf8 = json.dumps(body, ensure_ascii=False).encode()
    assert len(utf8) < 1024 * 1024  # within the server's limit as UTF-8
    raw = _client(wendy).put(f"/api/v1/tenants/acme/checkpoints/{body['id']}", data=utf8,
                             content_type="application/json", HTTP_IF_NONE_MATCH="*")
    assert raw.status_code == 201  # the server takes it
    other = dict(body, id=str(uuid.uuid4()), run_id=str(uuid.uuid4()))
    with HttpCheckpointStore(live_server.url, "acme", services.token_issue(user=wendy)) as store:
        assert store.compare_and_swap(other, None) == 0


# --------------------------------------------------------------------------------------
# 4. RecoverySaver (clients/python/recovery_client/langgraph.py)
# --------------------------------------------------------------------------------------

def test_get_tuple_raises_when_the_tenant_is_not_the_tokens(live_server, acme, wendy, wes):
    from recovery_client.langgraph import RecoverySaver

    graph_put(wendy, acme, lg_put("t-1", "01", nodes=["charge"]))
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    with RecoverySaver(live_server.url, "acme", services.token_issue(user=wes)) as saver:
        with pytest.raises(CheckpointError):
            saver.get_tuple(config)


def test_put_writes_refused_by_the_server_is_not_acknowledged(live_server, acme, wendy, wes):
    from recovery_client.langgraph import RecoverySaver

    graph_put(wendy, acme, lg_put("t-1", "01", nodes=["charge"]))
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": "", "checkpoint_id": "01"}}
    with RecoverySaver(live_server.url, "acme", services.token_issue(user=wes)) as saver:
        with pytest.raises(CheckpointError):
            saver.put_writes(config, [("charge", {"amount": 1})], "task-1")
