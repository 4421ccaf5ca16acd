"""The audit log: one hash chain per tenant, verified by ``services.audit_verify``;
tampering is detected; on PostgreSQL a trigger refuses UPDATE and DELETE."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from checkpoints import audit, services
from checkpoints.models import AuditEvent
from tests.api.apihelpers import snapshot
from tests.helpers import envelope, put_checkpoint
from tests.security import tampering


@pytest.fixture
def history(acme, globex, wendy, wes, rita):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    put_checkpoint(wes, globex, envelope())
    return body


def test_it_keys_each_tenants_events_and_integrates_them_in_order(acme, globex, history):
    """Issue 22: events keyed alone (seq: the row's id, increasing), then integrated by
    the sequencer as leaves 0..n-1 in seq order."""
    for tenant in (acme, globex):
        events = list(AuditEvent.objects.filter(tenant=tenant).order_by("seq"))
        assert [e.seq for e in events] == sorted(e.pk for e in events)
        assert all(e.prev_hash == "" and e.hash_scheme == 4 for e in events)
        services.audit_integrate(tenant)
        assert [e.leaf.index for e in AuditEvent.objects.filter(tenant=tenant)
                .order_by("seq")] == list(range(len(events)))
        assert services.audit_verify(tenant=tenant) == (True, len(events), "")


def _tamper(sql: str, params: list) -> None:
    """Change a row as a database superuser would, bypassing the append-only trigger."""
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute(sql, params)


def test_it_detects_an_edited_event(acme, globex, history):
    victim = AuditEvent.objects.filter(tenant=acme, action="checkpoint.write").order_by("seq")[0]
    _tamper(f"UPDATE {AuditEvent._meta.db_table} SET reason = %s WHERE id = %s",
            ["nothing to see", victim.pk])
    intact, _, problem = services.audit_verify(tenant=acme)
    assert not intact
    assert f"seq {victim.seq}" in problem
    assert services.audit_verify(tenant=globex)[0]


@pytest.mark.django_db(transaction=True)
def test_it_detects_a_deleted_event(acme, history):
    services.audit_integrate(acme)
    victim = AuditEvent.objects.filter(tenant=acme).order_by("seq")[1]
    tampering.raw(f"DELETE FROM {AuditEvent._meta.db_table} WHERE id = %s", [victim.pk])
    intact, _, problem = services.audit_verify(tenant=acme)
    assert not intact
    assert problem == (f"leaf 1 names event id {victim.pk}, which is not one of the tenant's "
                       "events (deleted?)")


def test_it_detects_a_rewritten_hash_that_breaks_the_next_link(acme, history):
    events = list(AuditEvent.objects.filter(tenant=acme).order_by("seq"))
    _tamper(f"UPDATE {AuditEvent._meta.db_table} SET actor_name = %s, hash = %s WHERE id = %s",
            ["mallory", "f" * 64, events[1].pk])
    intact, _, problem = services.audit_verify(tenant=acme)
    assert not intact
    assert f"seq {events[1].seq}" in problem


@pytest.mark.postgres
def test_it_refuses_update_and_delete_in_the_database(acme, history):
    event = AuditEvent.objects.filter(tenant=acme).first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(reason="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cur:
        cur.execute(f"DELETE FROM {AuditEvent._meta.db_table}")
    event.refresh_from_db()
    assert event.reason == ""
    assert services.audit_verify(tenant=acme)[0]


def test_it_writes_the_audit_event_in_the_same_transaction_as_the_change(acme, wendy,
                                                                         monkeypatch):
    """If the audit insert fails, nothing of the write is left: no run, checkpoint or
    revision. (The test used to raise in an outer ``transaction.atomic()`` of its own,
    which rolled back whatever the code did, so it could not fail.)"""
    before = snapshot()

    def audit_store_down(*args, **kwargs):
        raise DatabaseError("audit insert failed")

    monkeypatch.setattr(audit, "new_event", audit_store_down)
    with pytest.raises(DatabaseError):
        put_checkpoint(wendy, acme, envelope())
    assert snapshot() == before
    monkeypatch.undo()
    assert services.audit_verify(tenant=acme)[0]
