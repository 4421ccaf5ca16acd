"""A run id retention deleted stays deleted (docs/security/retention.md, "A deleted
run"): once retention's phase 2 deleted the run row, the tombstone still refuses every
write that would create the run again (checkpoint and effect ``PUT``, a LangGraph put or
thread copy) with the same 409 ``run_deleted`` as before phase 2, and nothing is
written; a lease or resume of the id finds no run (404). After a four-eyes tombstone
purge the id is free again. On SQLite and PostgreSQL, ages moved by ``age_world``; the
race of a creation with phase 2's delete: ``test_retention_races.py``."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import services
from checkpoints.exceptions import RunDeleted
from checkpoints.interop import langgraph
from checkpoints.models import AuditEvent, Checkpoint, Effect, Run, Tombstone
from recovery_client.protocol import thread_run_id
from tests.api.apihelpers import post, put_cp, put_fx
from tests.helpers import (
    age_world,
    effect_body,
    envelope,
    graph_put,
    lg_put,
    put_checkpoint,
    put_effect,
)

from .retention_world import DAY, set_policy

pytestmark = pytest.mark.django_db


def expired_run(writer, tenant, run_id: uuid.UUID | None = None) -> dict:
    """A run that completed, then went through both phases of retention: payloads
    (tombstone) and effect records (the run row). Returns its first checkpoint's body."""
    body = envelope(run_id=run_id, payload={"phase": "ready", "order_id": "X-1"})
    put_checkpoint(writer, tenant, body)
    put_checkpoint(writer, tenant, {**body, "revision": 1,
                                    "payload": {"phase": "completed", "order_id": "X-1"}},
                   expected=0)
    set_policy(tenant, payload_retention_days=1, effect_retention_days=1)
    age_world(2 * DAY)
    stats = services.retention_purge(tenant=tenant)
    assert (stats["purged"], stats["expired"]) == (1, 1), stats
    assert not Run.objects.for_tenant(tenant).filter(uuid=body["run_id"]).exists()
    assert Tombstone.objects.for_tenant(tenant).filter(run_uuid=body["run_id"]).exists()
    return body


def words(tenant, run_id) -> str:
    """The detail of the refusal: the API's words, with the tombstone's date."""
    stone = Tombstone.objects.for_tenant(tenant).get(run_uuid=run_id)
    return (f"run_id: the payloads of run {run_id} were deleted on "
            f"{stone.deleted_at.date().isoformat()} (retention or erasure; see its "
            "tombstone); it takes no more writes, start a new run")


def nothing_written(tenant, run_id, events: int) -> None:
    assert not Run.objects.for_tenant(tenant).filter(uuid=run_id).exists()
    assert not Checkpoint.objects.for_tenant(tenant).exists()
    assert not Effect.objects.for_tenant(tenant).exists()
    assert AuditEvent.objects.for_tenant(tenant).count() == events


def test_the_api_refuses_a_checkpoint_or_effect_that_would_create_an_expired_run(
        api_as, acme, wendy):
    body = expired_run(wendy, acme)
    run_id = body["run_id"]
    events = AuditEvent.objects.for_tenant(acme).count()
    client = api_as(wendy)
    attempts = [
        put_cp(client, "acme", body, create=True),  # its own checkpoint, again
        put_cp(client, "acme", envelope(run_id=run_id), create=True),  # a new one
        put_fx(client, "acme", effect_body(run_id=run_id, operation_key="refund:X-1"),
               create=True),
    ]
    for answer in attempts:
        assert answer.status_code == 409, answer.content
        assert answer.json()["error"] == "run_deleted"
        assert answer.json()["detail"] == words(acme, run_id)
    # A lease or a resume creates no run: the id has none (404), before and after.
    for answer in (post(client, "acme", f"runs/{run_id}/lease", {"owner": "w", "ttl_s": 30}),
                   post(client, "acme", f"runs/{run_id}/resume", {})):
        assert answer.status_code == 404, answer.content
    nothing_written(acme, run_id, events)


def test_the_services_refuse_it_with_the_words_of_a_run_still_listed(acme, wendy):
    body = expired_run(wendy, acme)
    run_id = uuid.UUID(body["run_id"])
    events = AuditEvent.objects.for_tenant(acme).count()
    with pytest.raises(RunDeleted) as checkpoint:
        put_checkpoint(wendy, acme, envelope(run_id=run_id))
    with pytest.raises(RunDeleted) as effect:
        put_effect(wendy, acme, effect_body(run_id=run_id, operation_key="refund:X-2"))
    assert checkpoint.value.detail == effect.value.detail == words(acme, run_id)
    nothing_written(acme, run_id, events)


def test_a_langgraph_put_or_copy_does_not_create_an_expired_thread_run(acme, wendy):
    run_id = thread_run_id("t-gone")
    expired_run(wendy, acme, run_id=run_id)
    graph_put(wendy, acme, lg_put("t-src", "1f0c3a2e-0000-6000-8000-000000000000"))
    before = AuditEvent.objects.for_tenant(acme).count()
    with pytest.raises(RunDeleted, match=f"^run_id: the payloads of run {run_id} were"):
        graph_put(wendy, acme, lg_put("t-gone", "1f0c3a2e-0001-6000-8000-000000000000"))
    with pytest.raises(RunDeleted, match=f"^run_id: the payloads of run {run_id} were"):
        langgraph.graph_thread_copy(actor=wendy, tenant=acme, source_thread_id="t-src",
                                    target_thread_id="t-gone")
    assert not Run.objects.for_tenant(acme).filter(uuid=run_id).exists()
    assert AuditEvent.objects.for_tenant(acme).count() == before


def test_a_write_to_an_existing_run_reads_no_tombstone(acme, wendy):
    """The tombstone is read only where a run row is about to be created."""
    body = envelope()
    put_checkpoint(wendy, acme, body)
    table = Tombstone._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        put_checkpoint(wendy, acme, envelope(run_id=body["run_id"]))
        put_effect(wendy, acme, effect_body(run_id=body["run_id"]))
        put_checkpoint(wendy, acme, {**body, "revision": 1}, expected=0)
    assert not [q["sql"] for q in queries.captured_queries if table in q["sql"]]


def test_another_tenants_tombstone_does_not_refuse_the_id(acme, globex, wendy, wes):
    body = expired_run(wendy, acme)
    put_checkpoint(wes, globex, envelope(run_id=body["run_id"]))
    assert Run.objects.for_tenant(globex).filter(uuid=body["run_id"]).exists()


def test_after_a_tombstone_purge_the_id_may_be_used_again(acme, adam, april, wendy,
                                                           tmp_path):
    body = expired_run(wendy, acme)
    set_policy(acme, tombstone_retention_days=30)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "export")
    age_world(31 * DAY)
    with pytest.raises(RunDeleted):  # the tombstone is still there
        put_checkpoint(wendy, acme, body)
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    services.tombstone_purge_execute(actor=adam, tenant=acme, purge_id=purge.uuid)
    assert not Tombstone.objects.for_tenant(acme).exists()
    put_checkpoint(wendy, acme, body)  # nothing remembers the id: a new run
    run = Run.objects.for_tenant(acme).get(uuid=body["run_id"])
    assert run.payloads_deleted_at is None and run.latest_checkpoint.revision == 0


def test_an_update_of_an_expired_run_says_run_deleted_not_not_found(api_as, acme, wendy):
    """(stop 35, the attack's doubt) A runtime that still holds the run's checkpoint or
    effect and updates it (``If-Match``) after phase 2 deleted the row gets the same 409
    ``run_deleted`` it got before phase 2, from the tombstone, not a 404 that reads as a
    bug of its own; nothing written. An id with no tombstone still gets the 404."""
    body = expired_run(wendy, acme)
    run_id = body["run_id"]
    events = AuditEvent.objects.for_tenant(acme).count()
    client = api_as(wendy)
    effect = effect_body(run_id=run_id, operation_key="refund:X-3", revision=1)
    for answer in (put_cp(client, "acme", {**body, "revision": 2}, match=1),
                   put_fx(client, "acme", effect, match=0)):
        assert answer.status_code == 409, answer.content
        assert answer.json()["error"] == "run_deleted"
        assert answer.json()["detail"] == words(acme, run_id)
    nothing_written(acme, run_id, events)
    other = envelope()
    for answer in (put_cp(client, "acme", {**other, "revision": 1}, match=0),
                   put_fx(client, "acme", effect_body(revision=1), match=0)):
        assert answer.status_code == 404, answer.content
