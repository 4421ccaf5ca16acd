"""The LangGraph endpoints under ``/api/v1/tenants/{tenant}/langgraph/`` (issue 10,
docs/langgraph.md "Server"): statuses, bodies, strict bodies and query parameters, roles
and tenants. Every answer here is also checked against the OpenAPI schema
(``tests/conftest.py``)."""

from __future__ import annotations

import json

import pytest

from checkpoints.models import AuditEvent, Conflict, GraphCheckpoint, Run
from recovery_client.protocol import thread_run_id
from tests.api.apihelpers import post, url
from tests.helpers import lg_put, lg_writes, typed

pytestmark = pytest.mark.django_db

LG = "langgraph/"


def put(client, body, tenant="acme", token=None):
    extra = {"HTTP_FENCING_TOKEN": str(token)} if token is not None else {}
    return client.post(url(tenant, LG + "checkpoints"), data=json.dumps(body),
                       content_type="application/json", **extra)


def get(client, query="", tenant="acme"):
    return client.get(url(tenant, LG + "checkpoints") + (f"?{query}" if query else ""))


@pytest.fixture
def writer(api_as, wendy):
    return api_as(wendy)


def test_a_put_answers_its_run_and_revision_and_a_retry_the_same(writer):
    body = lg_put("t-1", "01", nodes=["charge"], identity={"workflow": "refund"})
    first = put(writer, body)
    assert first.status_code == 201, first.content
    assert first.json() == {"thread_id": "t-1", "checkpoint_ns": "", "checkpoint_id": "01",
                            "run_id": str(thread_run_id("t-1")), "revision": 0}
    again = put(writer, body)
    assert (again.status_code, again.json()) == (200, first.json())
    assert first["Cache-Control"].startswith("max-age=0") or "no-store" in first["Cache-Control"]


def test_a_stale_parent_is_412_with_the_head_and_a_conflict(writer):
    put(writer, lg_put("t-1", "01"))
    assert put(writer, lg_put("t-1", "02", parent="01")).status_code == 201
    refused = put(writer, lg_put("t-1", "03", parent="01"))
    assert refused.status_code == 412
    body = refused.json()
    assert (body["error"], body["current_revision"], body["head_checkpoint_id"]) == (
        "conflict", 1, "02")
    assert body["detail"].startswith("parent_checkpoint_id:")
    assert Conflict.objects.count() == 1


def test_a_fenced_put_is_409_with_the_current_token(writer):
    put(writer, lg_put("t-1", "01"))
    lease = post(writer, "acme", f"runs/{thread_run_id('t-1')}/lease",
                 {"owner": "graph-1", "ttl_s": 60})
    token = lease.json()["fencing_token"]
    refused = put(writer, lg_put("t-1", "02", parent="01"), token=token - 1)
    assert (refused.status_code, refused.json()) == (409, {"error": "fenced",
                                                           "fencing_token": token})
    assert put(writer, lg_put("t-1", "02", parent="01"), token=token).status_code == 201
    bad = put(writer, lg_put("t-1", "03", parent="02"), token="soon")
    assert bad.status_code == 400 and bad.json()["detail"].startswith("Fencing-Token:")


@pytest.mark.parametrize(("raw", "field"), [
    ('{"thread_id": "t", "thread_id": "u"}', "body"),
    ("[]", "body"),
    (json.dumps(dict(lg_put("t", "01"), thread_id="")), "thread_id"),
    (json.dumps(dict(lg_put("t", "01"), parent_checkpoint_id=5)), "parent_checkpoint_id"),
    (json.dumps(dict(lg_put("t", "01"), checkpoint={"id": "01"})),
     "checkpoint.channel_versions"),
    (json.dumps(dict(lg_put("t", "01"), hello=1)), "hello"),
])
def test_a_bad_put_is_400_naming_the_field(writer, raw, field):
    response = writer.post(url("acme", LG + "checkpoints"), data=raw,
                           content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_payload"
    assert response.json()["detail"].startswith(field), response.json()
    assert not GraphCheckpoint.objects.exists()


def test_a_body_over_the_limit_is_413_before_anything_is_stored(writer, settings):
    body = lg_put("t", "01", values={"blob": "x" * (settings.RECOVERY_MAX_BODY_BYTES + 1)})
    response = put(writer, body)
    assert response.status_code == 413 and response.json()["error"] == "payload_too_large"
    assert not Run.objects.exists()


def test_writes_are_stored_and_listed_with_their_checkpoint(writer):
    put(writer, lg_put("t-1", "01", nodes=["n"]))
    response = post(writer, "acme", LG + "writes",
                    lg_writes("t-1", "01", "task-1", [(0, "out", "v"), (-1, "__error__", "x")]))
    assert (response.status_code, response.json()) == (200, {"stored": 2})
    again = post(writer, "acme", LG + "writes", lg_writes("t-1", "01", "task-1", [(0, "out", "v")]))
    assert again.json() == {"stored": 0}
    page = get(writer, "thread_id=t-1")
    assert page.status_code == 200
    (tup,) = page.json()["results"]
    assert tup["pending_writes"] == [
        {"task_id": "task-1", "channel": "__error__", "value": typed("x"), "idx": -1},
        {"task_id": "task-1", "channel": "out", "value": typed("v"), "idx": 0}]
    assert page.json()["next_before"] is None
    missing = post(writer, "acme", LG + "writes", lg_writes("t-1", "ghost", "t", [(0, "c", 1)]))
    assert missing.status_code == 404


def test_the_list_pages_with_next_before_and_filters_on_metadata(writer):
    for i, source in enumerate(("input", "loop", "loop")):
        put(writer, lg_put("t-1", f"0{i}", parent=f"0{i - 1}" if i else None,
                           metadata={"source": source, "step": i}))
    first = get(writer, "thread_id=t-1&limit=2").json()
    assert [t["checkpoint_id"] for t in first["results"]] == ["02", "01"]
    assert first["next_before"] == "01"
    rest = get(writer, "thread_id=t-1&limit=2&before=01").json()
    assert ([t["checkpoint_id"] for t in rest["results"]], rest["next_before"]) == (["00"], None)
    loops = get(writer, "thread_id=t-1&filter=" + json.dumps({"source": "loop", "step": 1}))
    assert [t["checkpoint_id"] for t in loops.json()["results"]] == ["01"]
    one = get(writer, "thread_id=t-1&checkpoint_ns=&checkpoint_id=00").json()["results"]
    assert [t["metadata"] for t in one] == [{"source": "input", "step": 0}]


@pytest.mark.parametrize(("query", "name"), [
    ("thread=t", "thread"),
    ("limit=0", "limit"),
    ("limit=1001", "limit"),
    ("limit=x", "limit"),
    ("thread_id=a&thread_id=b", "thread_id"),
    ("thread_id=", "thread_id"),
    ("thread_id=a%0Ab", "thread_id"),
    ("thread_id=%FF", "thread_id"),
    ("checkpoint_id=" + "i" * 129, "checkpoint_id"),
    ("before=", "before"),
    ("filter=not-json", "filter"),
    ("filter=[1]", "filter"),
    ('filter={"a":1,"a":2}', "filter"),
])
def test_bad_query_parameters_are_400_naming_them(writer, query, name):
    response = get(writer, query)
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith(name), response.json()


def test_deleting_copying_and_pruning_threads(writer):
    put(writer, lg_put("t-1", "01", metadata={"run_id": "run-a"}))
    put(writer, lg_put("t-1", "02", parent="01", metadata={"run_id": "run-b"}))
    copied = post(writer, "acme", LG + "threads/copy",
                  {"source_thread_id": "t-1", "target_thread_id": "t-2"})
    assert (copied.status_code, copied.json()) == (200, {"copied": 2})
    again = post(writer, "acme", LG + "threads/copy",
                 {"source_thread_id": "t-1", "target_thread_id": "t-2"})
    assert again.status_code == 412 and again.json()["head_checkpoint_id"] == "02"
    pruned = post(writer, "acme", LG + "threads/prune",
                  {"thread_ids": ["t-2"], "strategy": "keep_latest"})
    assert pruned.json() == {"deleted": 1}
    runs = post(writer, "acme", LG + "runs/delete", {"run_ids": ["run-a"]})
    assert runs.json() == {"deleted": 1}
    deleted = post(writer, "acme", LG + "threads/delete", {"thread_id": "t-1"})
    assert deleted.json() == {"deleted": 1}
    assert post(writer, "acme", LG + "threads/delete", {"thread_id": "t-1"}).json() == {
        "deleted": 0}
    assert [t["thread_id"] for t in get(writer).json()["results"]] == ["t-2"]
    assert AuditEvent.objects.filter(action__startswith="langgraph.").count() == 4


@pytest.mark.parametrize(("rest", "body", "field"), [
    ("threads/delete", {"thread_id": ""}, "thread_id"),
    ("threads/delete", {"thread_id": "t", "x": 1}, "x"),
    ("threads/copy", {"source_thread_id": "t", "target_thread_id": "t"}, "target_thread_id"),
    ("threads/copy", {"source_thread_id": "t"}, "target_thread_id"),
    ("threads/prune", {"thread_ids": ["t"], "strategy": "all"}, "strategy"),
    ("threads/prune", {"thread_ids": "t", "strategy": "delete"}, "thread_ids"),
    ("threads/prune", {"thread_ids": ["t"] * 1001, "strategy": "delete"}, "thread_ids"),
    ("threads/prune", {"thread_ids": ["ok", "a\tb"], "strategy": "delete"}, "thread_ids[1]"),
    ("runs/delete", {"run_ids": ["r" * 129]}, "run_ids[0]"),
    ("runs/delete", {"run_ids": None}, "run_ids"),
    ("writes", dict(lg_writes("t", "01", "task", []), task_id=None), "task_id"),
])
def test_bad_bodies_of_the_other_endpoints_are_400_naming_the_field(writer, rest, body, field):
    response = post(writer, "acme", LG + rest, body)
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith(field), response.json()


@pytest.mark.parametrize("rest", ["checkpoints", "writes", "threads/delete", "threads/copy",
                                  "threads/prune", "runs/delete"])
def test_only_writers_of_the_tenant_may_call_them(api_as, wendy, vic, rita, wes, rest):
    body = {"thread_id": "t"}
    for user, expected in ((vic, 403), (rita, 403), (wes, 404)):
        response = post(api_as(user), "acme", LG + rest, body)
        assert response.status_code == expected, (user, response.content)
    for user, expected in ((vic, 403), (wes, 404)):
        assert get(api_as(user)).status_code == expected


def test_the_same_thread_in_another_tenant_is_another_thread(writer, api_as, wes):
    put(writer, lg_put("t-1", "01"))
    theirs = api_as(wes)
    assert get(theirs, "thread_id=t-1", tenant="globex").json()["results"] == []
    assert put(theirs, lg_put("t-1", "09", parent="01"), tenant="globex").status_code == 412
    assert post(theirs, "globex", LG + "threads/delete", {"thread_id": "t-1"}).json() == {
        "deleted": 0}
    assert [t["checkpoint_id"] for t in get(writer, "thread_id=t-1").json()["results"]] == ["01"]
