"""The four-eyes purge of tombstones (issue 20, item 5; RUNIFOLD.md 5, tombstone
governance): prepare, approve or reject, execute; what each refuses; the evidence; the
late legal-hold race; the chain verified against an exported head afterwards."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import DatabaseError, IntegrityError, connection, transaction

from checkpoints import services
from checkpoints.exceptions import Forbidden, NotFound, PurgeRefused, ReasonRequired
from checkpoints.models import AuditEvent, Tombstone, TombstonePurge
from tests.helpers import age_world
from tests.lifecycle.governance import DAY, hold, keep_tombstones, purged_runs

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready(acme, wendy, tmp_path):
    """Three tombstones 31 days old, exported; the policy keeps tombstones 30 days."""
    stones = purged_runs(wendy, acme, 3)
    keep_tombstones(acme, 30)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "export")
    age_world(31 * DAY)
    return stones


def refused(reason: str, call, **kw):
    with pytest.raises(PurgeRefused) as caught:
        call(**kw)
    assert caught.value.extra["reason"] == reason, caught.value.detail
    return caught.value.detail


def test_prepare_needs_a_tombstone_retention_an_export_and_old_tombstones(acme, adam,
                                                                          wendy, tmp_path):
    purged_runs(wendy, acme, 2)
    prepare = services.tombstone_purge_prepare
    assert "keeps tombstones forever" in refused("no_tombstone_retention", prepare,
                                                 actor=adam, tenant=acme)
    keep_tombstones(acme, 30)
    refused("no_export", prepare, actor=adam, tenant=acme)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "e")
    refused("nothing_to_purge", prepare, actor=adam, tenant=acme)  # too young
    age_world(29 * DAY)
    refused("nothing_to_purge", prepare, actor=adam, tenant=acme)
    age_world(2 * DAY)
    purge = prepare(actor=adam, tenant=acme)
    assert purge.tombstone_count == 2 and purge.state == "prepared"


def test_only_exported_tombstones_outside_holds_are_frozen(acme, adam, wendy, ready):
    later = purged_runs(wendy, acme, 1)  # after the export: not covered
    age_world(31 * DAY)
    hold(acme, adam, runs=[ready[1].run_uuid])
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    assert purge.tombstone_ids == [ready[0].pk, ready[2].pk]
    assert (purge.first_cursor, purge.last_cursor) == (ready[0].pk, ready[2].pk)
    assert purge.export_through == ready[2].pk < later[0].pk
    hold(acme, adam, whole=True)
    refused("legal_hold", services.tombstone_purge_prepare, actor=adam, tenant=acme)


def test_four_eyes(acme, adam, april, rita, vic, ready, django_user_model):
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    for who in (rita, vic):  # neither prepares
        with pytest.raises(Forbidden):
            services.tombstone_purge_prepare(actor=who, tenant=acme)
    with pytest.raises(Forbidden, match="preparer"):
        services.tombstone_purge_approve(actor=adam, tenant=acme, purge_id=purge.uuid)
    with pytest.raises(Forbidden):  # a reviewer is no approver
        services.tombstone_purge_approve(actor=rita, tenant=acme, purge_id=purge.uuid)
    refused("state", services.tombstone_purge_execute, actor=adam, tenant=acme,
            purge_id=purge.uuid)  # not approved yet
    with pytest.raises(Forbidden):  # an approver does not execute
        services.tombstone_purge_execute(actor=april, tenant=acme, purge_id=purge.uuid)
    with pytest.raises(NotFound):
        services.tombstone_purge_approve(actor=april, tenant=acme, purge_id="nope")
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    refused("state", services.tombstone_purge_approve, actor=april, tenant=acme,
            purge_id=purge.uuid)
    # The database refuses the preparer as approver too.
    with pytest.raises(IntegrityError), transaction.atomic():
        TombstonePurge.objects.filter(pk=purge.pk).update(approved_by=adam)


def test_execute_deletes_exactly_the_frozen_tombstones_and_writes_the_evidence(
        acme, adam, april, wendy, ready):
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    newer = purged_runs(wendy, acme, 1)  # not frozen: stays
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    done = services.tombstone_purge_execute(actor=adam, tenant=acme, purge_id=purge.uuid)
    assert list(Tombstone.objects.for_tenant(acme).values_list("pk", flat=True)) == [
        newer[0].pk]
    row = TombstonePurge.objects.for_tenant(acme).get(pk=done.pk)
    assert (row.state, row.prepared_by, row.approved_by, row.executed_by) == (
        "executed", adam, april, adam)
    assert row.tombstone_count == 3 and row.executed_at is not None
    assert (row.first_cursor, row.last_cursor) == (ready[0].pk, ready[2].pk)
    assert row.export_through == ready[2].pk and len(row.fingerprint) == 64
    steps = list(AuditEvent.objects.for_tenant(acme).filter(action__startswith="tombstone_purge")
                 .order_by("seq").values_list("action", "actor_name"))
    assert steps == [("tombstone_purge.prepare", "adam"), ("tombstone_purge.approve", "april"),
                     ("tombstone_purge.execute", "adam")]
    last = AuditEvent.objects.for_tenant(acme).order_by("-seq").first()
    assert last.after["fingerprint"] == row.fingerprint and last.after["tombstones"] == 3
    refused("state", services.tombstone_purge_execute, actor=adam, tenant=acme,
            purge_id=purge.uuid)


def test_a_legal_hold_placed_after_the_preparation_blocks_the_execution(acme, adam, april,
                                                                        ready):
    """The late legal-hold race: a hold placed between approval and execution wins."""
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    h = hold(acme, adam, runs=[ready[1].run_uuid])
    assert "covers 1 of the frozen" in refused(
        "legal_hold", services.tombstone_purge_execute, actor=adam, tenant=acme,
        purge_id=purge.uuid)
    assert Tombstone.objects.for_tenant(acme).count() == 3
    h.runs.all().delete()
    h.delete()
    hold(acme, adam, whole=True)
    refused("legal_hold", services.tombstone_purge_execute, actor=adam, tenant=acme,
            purge_id=purge.uuid)
    assert Tombstone.objects.for_tenant(acme).count() == 3


def test_the_deadline_expires_approval_and_execution(acme, adam, april, ready):
    late = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    age_world(25 * 3600)
    refused("expired", services.tombstone_purge_approve, actor=april, tenant=acme,
            purge_id=late.uuid)
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    age_world(25 * 3600)
    refused("expired", services.tombstone_purge_execute, actor=adam, tenant=acme,
            purge_id=purge.uuid)
    assert Tombstone.objects.for_tenant(acme).count() == 3


def test_changed_tombstones_are_refused_by_the_fingerprint(acme, adam, april, ready):
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    Tombstone.objects.for_tenant(acme).filter(pk=ready[0].pk).delete()  # deleted meanwhile
    assert "2 of 3 still there" in refused("changed", services.tombstone_purge_execute,
                                           actor=adam, tenant=acme, purge_id=purge.uuid)


def test_a_rejection_needs_a_reason_and_ends_the_purge(acme, adam, april, ready):
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    with pytest.raises(ReasonRequired):
        services.tombstone_purge_reject(actor=april, tenant=acme, purge_id=purge.uuid,
                                        reason=" ")
    with pytest.raises(Forbidden):
        services.tombstone_purge_reject(actor=adam, tenant=acme, purge_id=purge.uuid,
                                        reason="mine")
    services.tombstone_purge_reject(actor=april, tenant=acme, purge_id=purge.uuid,
                                    reason="the auditors are not done")
    row = TombstonePurge.objects.for_tenant(acme).get(pk=purge.pk)
    assert (row.state, row.rejected_reason) == ("rejected", "the auditors are not done")
    refused("state", services.tombstone_purge_execute, actor=adam, tenant=acme,
            purge_id=purge.uuid)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # TRUNCATE is refused in a transaction with FK checks
def test_postgresql_refuses_changing_or_truncating_a_tombstone(acme, ready):
    for sql in (f"UPDATE {Tombstone._meta.db_table} SET kind = 'x'",
                f"TRUNCATE {Tombstone._meta.db_table}"):
        with pytest.raises(DatabaseError, match="immutable"), transaction.atomic(), \
                connection.cursor() as cur:
            cur.execute(sql)
    assert Tombstone.objects.for_tenant(acme).count() == 3


def test_the_chain_verifies_against_an_exported_head_after_both_purges(acme, adam, april,
                                                                       ready, tmp_path):
    heads = tmp_path / "heads.jsonl"
    call_command("export_audit_head", "acme", out=str(heads), stdout=io.StringIO())
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    services.tombstone_purge_execute(actor=adam, tenant=acme, purge_id=purge.uuid)
    out = io.StringIO()
    call_command("verify_audit_chain", "acme", against=str(heads),
                 export=[str(tmp_path / "export")], stdout=out)
    text = out.getvalue()
    assert "acme: intact" in text and "holds exported head" in text
    assert "export " in text and " verifies (" in text
    # The tombstones are gone, their events stay: the export still lists them.
    assert "acme: 0 event(s) refer to erased data" in text
    lines = (tmp_path / "export" / "tombstones.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == [s.pk for s in ready]


def test_a_rejection_reason_follows_the_one_lifecycle_rule(acme, adam, april, ready):
    """Control characters are refused as for holds and erasures (the attack helper's
    finding: a purge's rejection took "a\\u0001b")."""
    from checkpoints.exceptions import InvalidPayload
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    for bad in ("a\u0001b", "x" * 1025):
        with pytest.raises(InvalidPayload, match="reason"):
            services.tombstone_purge_reject(actor=april, tenant=acme, purge_id=purge.uuid,
                                            reason=bad)
    assert TombstonePurge.objects.get(pk=purge.pk).state == "prepared"
