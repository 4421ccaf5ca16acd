"""The audit Merkle tree (issue 22, item 1; ``checkpoints.audittree``): the sequencer
integrates queued events into leaves and signs a head per batch; every proof it gives
verifies with ``checkpoints.merkle`` alone; and each way of tampering with the leaves,
heads or queue is found by the verifier. Both backends (no trigger needed: the refusals
are tests/security/)."""

from __future__ import annotations

import base64
from datetime import timedelta
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone

from checkpoints import audit, audittree, merkle, services
from checkpoints.dbclock import db_now
from checkpoints.models import AuditEvent, AuditLeaf, AuditPending, AuditTreeHead
from tests.helpers import envelope, put_checkpoint
from tests.security import tampering


@pytest.fixture
def history(acme, globex, wendy, wes):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    put_checkpoint(wendy, acme, dict(body, revision=2), expected=1)
    put_checkpoint(wes, globex, envelope())
    return body


def verify(tenant) -> str:
    intact, _, problem = services.audit_verify(tenant=tenant)
    assert intact == (problem == "")
    return problem


def note(tenant) -> AuditEvent:
    with transaction.atomic():
        return services.audit_record(tenant=tenant, actor=None, action="test.note",
                                     target_type="tenant", target_id=tenant.slug)


def test_the_sequencer_integrates_the_queue_in_order_and_signs_a_head(acme, globex, history):
    queued = list(AuditPending.objects.filter(tenant=acme).order_by("event_id")
                  .values_list("event_id", flat=True))
    assert queued and not AuditLeaf.objects.filter(tenant=acme).exists()
    assert services.audit_integrate(acme, limit=2) == 2
    assert services.audit_integrate(acme) == len(queued) - 2
    assert services.audit_integrate(acme) == 0
    leaves = list(AuditLeaf.objects.filter(tenant=acme).order_by("index"))
    assert [leaf.index for leaf in leaves] == list(range(len(queued)))
    assert [leaf.event_id for leaf in leaves] == queued
    assert not AuditPending.objects.filter(tenant=acme).exists()
    assert AuditPending.objects.filter(tenant=globex).exists()  # per tenant
    heads = list(AuditTreeHead.objects.filter(tenant=acme).order_by("tree_size"))
    assert [h.tree_size for h in heads] == [2, len(queued)]
    hashes = [bytes.fromhex(leaf.hash) for leaf in leaves]
    for head in heads:
        assert head.root_hash == merkle.root_of(hashes[:head.tree_size]).hex()
        assert merkle.verify_head_line({**audittree.head_json(head)}) == ""
    assert verify(acme) == "" and verify(globex) == ""


def test_a_leaf_hash_recomputes_from_the_events_fields_without_a_key(acme, history):
    services.audit_integrate(acme)
    e = AuditEvent.objects.filter(tenant=acme).order_by("seq").last()
    assert merkle.leaf_hash(audittree.leaf_input(e)).hex() == e.leaf.hash
    assert b'"hash":"' + e.hash.encode() in audittree.leaf_input(e)


def test_every_inclusion_proof_verifies_against_every_later_head(acme, wendy, history):
    for _ in range(3):
        note(acme)
        services.audit_integrate(acme)
    for e in AuditEvent.objects.filter(tenant=acme):
        for head in AuditTreeHead.objects.filter(tenant=acme, tree_size__gt=e.leaf.index):
            proof = audittree.inclusion(acme, e, head.tree_size)
            assert merkle.verify_inclusion(
                proof["leaf_index"], head.tree_size,
                merkle.leaf_hash(proof["leaf_input"].encode()),
                [bytes.fromhex(h) for h in proof["audit_path"]], bytes.fromhex(head.root_hash))
    pending = note(acme)
    assert audittree.inclusion(acme, pending) is None


def test_stored_nodes_serve_proofs_in_a_large_tree(acme):
    """300 events: level-8 nodes are stored and a proof reads them (and verifies)."""
    with transaction.atomic():
        audit.audit_record_many(tenant=acme, actor=None, events=[
            {"action": "test.note", "target_type": "tenant", "target_id": i}
            for i in range(300)])
    assert services.audit_integrate(acme, limit=1000) > 300
    assert audittree.AuditTreeNode.objects.filter(tenant=acme, level=8).count() == 1
    e = AuditEvent.objects.filter(tenant=acme).order_by("seq")[5]
    proof = audittree.inclusion(acme, e)
    head = audittree.newest_head(acme.pk)
    assert merkle.verify_inclusion(proof["leaf_index"], head.tree_size,
                                   bytes.fromhex(proof["leaf_hash"]),
                                   [bytes.fromhex(h) for h in proof["audit_path"]],
                                   bytes.fromhex(head.root_hash))
    assert verify(acme) == ""


# --- detected ------------------------------------------------------------------------------

def integrated(tenant) -> list[AuditLeaf]:
    services.audit_integrate(tenant)
    return list(AuditLeaf.objects.filter(tenant=tenant).order_by("index"))


def test_a_rewritten_event_and_its_leaf_are_found(acme, history):
    leaves = integrated(acme)
    victim = AuditEvent.objects.get(pk=leaves[2].event_id)
    tampering.rewrite_event(victim, leaf=True, reason="nothing to see")
    assert verify(acme) == f"event seq {victim.seq} (id {victim.pk}) does not match its hash (HMAC)"


def test_a_rewritten_leaf_is_found(acme, history):
    leaves = integrated(acme)
    tampering.raw(f'UPDATE {tampering.LEAVES} SET hash = %s WHERE id = %s', ["ab" * 32, leaves[1].pk])
    e = AuditEvent.objects.get(pk=leaves[1].event_id)
    assert verify(acme) == (f"leaf 1 does not match event seq {e.seq} (id {e.pk}): the leaf or "
                            "the event was rewritten")


@pytest.mark.django_db(transaction=True)
def test_an_integrated_event_deleted_is_found(acme, history):
    leaves = integrated(acme)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE id = %s", [leaves[1].event_id])
    assert verify(acme) == (f"leaf 1 names event id {leaves[1].event_id}, which is not one of "
                            "the tenant's events (deleted?)")


def test_a_deleted_leaf_is_found(acme, history):
    leaves = integrated(acme)
    tampering.raw(f"DELETE FROM {tampering.LEAVES} WHERE id = %s", [leaves[1].pk])
    assert verify(acme) == "gap in the tree before leaf 2 (leaf 1 expected: deleted)"


def test_the_newest_leaf_deleted_is_found_under_its_head(acme, history):
    leaves = integrated(acme)
    tampering.raw(f"DELETE FROM {tampering.LEAVES} WHERE id = %s", [leaves[-1].pk])
    n = len(leaves)
    assert verify(acme) == (f"the newest tree head covers {n} leaves but the tree has {n - 1} "
                            "(events were cut)")


def test_reordered_leaves_are_found(acme, history):
    leaves = integrated(acme)
    a, b = leaves[1], leaves[2]
    tampering.raw(f'UPDATE {tampering.LEAVES} SET "index" = -1 WHERE id = %s', [a.pk])
    tampering.raw(f'UPDATE {tampering.LEAVES} SET "index" = 1 WHERE id = %s', [b.pk])
    tampering.raw(f'UPDATE {tampering.LEAVES} SET "index" = 2 WHERE id = %s', [a.pk])
    assert verify(acme) == (f"tree head size {len(leaves)}: its root is not the leaves' "
                            "(leaves rewritten or reordered)")


def test_a_forged_head_is_found(acme, history):
    integrated(acme)
    head = audittree.newest_head(acme.pk)
    forged = base64.b64encode(b"\x01" * 64).decode()
    tampering.raw(f"UPDATE {tampering.TREE_HEADS} SET signature = %s WHERE id = %s",
                  [forged, head.pk])
    assert verify(acme) == (f"tree head size {head.tree_size}: the signature does not verify "
                            "(forged?)")


def test_a_head_past_the_leaves_signed_with_an_unknown_key_is_found(acme, history):
    leaves = integrated(acme)
    tampering.raw(f"INSERT INTO {tampering.TREE_HEADS} (tenant_id, tree_size, root_hash, "
                  "created_at, key_id, signature, frontier) VALUES (%s, %s, %s, "
                  "CURRENT_TIMESTAMP, %s, %s, '[]')",
                  [acme.pk, len(leaves) + 1, "ab" * 32, "0" * 16, "AA=="])
    assert verify(acme) == (f"tree head size {len(leaves) + 1} is signed with unknown key id "
                            "'0000000000000000' (an old audit key missing from "
                            "RECOVERY_AUDIT_KEYS?)")


def test_a_deleted_queue_row_is_found(acme, history):
    victim = note(acme)
    tampering.raw(f"DELETE FROM {tampering.PENDING} WHERE event_id = %s", [victim.pk])
    services.audit_integrate(acme)
    assert verify(acme) == (f"event seq {victim.seq} (id {victim.pk}) is neither in the tree "
                            "nor queued (its queue row was deleted)")


@pytest.mark.django_db(transaction=True)
def test_a_queued_event_deleted_with_its_row_is_the_bounded_window(acme, history):
    """What the tree cannot see (docs/security/audit.md): an event deleted together with
    its queue row before the sequencer ran. Bounded by the integration lag."""
    victim = note(acme)
    tampering.raw(f"DELETE FROM {tampering.PENDING} WHERE event_id = %s", [victim.pk])
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE id = %s", [victim.pk])
    services.audit_integrate(acme)
    assert verify(acme) == ""


@pytest.mark.django_db(transaction=True)
def test_a_queued_event_deleted_without_its_row_is_found(acme, history):
    victim = note(acme)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE id = %s", [victim.pk])
    assert verify(acme) == f"queued event id {victim.pk} is gone (deleted before it was integrated)"
    tampering.raw(f"DELETE FROM {tampering.PENDING} WHERE event_id = %s", [victim.pk])


@pytest.mark.django_db(transaction=True)
def test_queue_rows_of_deleted_events_do_not_stall_the_sequencer(acme, history):
    """(stop 32, a newcomer's finding) Queue rows whose events were deleted past the
    triggers, as many as a batch holds, used to fill every batch (the oldest ``limit``
    rows were taken, then their events read): the tenant's sealing stopped for good. The
    rows stay as evidence; the events queued after them are still integrated."""
    victims = [note(acme) for _ in range(3)]
    for victim in victims:
        tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE id = %s", [victim.pk])
    later = note(acme)
    assert audittree.audit_integrate(acme, limit=3) > 0
    while audittree.audit_integrate(acme, limit=3):
        pass
    assert AuditLeaf.objects.filter(event_id=later.pk).exists()
    assert verify(acme) == (f"queued event id {victims[0].pk} is gone "
                            "(deleted before it was integrated)")
    for victim in victims:
        tampering.raw(f"DELETE FROM {tampering.PENDING} WHERE event_id = %s", [victim.pk])


@pytest.mark.django_db(transaction=True)
def test_a_queue_row_of_a_deleted_event_is_no_backlog_for_readyz(acme, history, settings):
    """(stop 32, the attack's finding) The row is tampering's evidence, which the
    verifier names; counted as backlog it aged past ``RECOVERY_AUDIT_LAG_MAX_S`` and
    failed every node's ``/readyz`` for good, saying the running sequencer was down. A
    real backlog still fails it."""
    victim = note(acme)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE id = %s", [victim.pk])
    audittree.audit_integrate_all()
    then = db_now() - timedelta(seconds=3600)
    tampering.raw(f"UPDATE {tampering.PENDING} SET queued_at = %s", [then])
    assert audittree.integration_lag() == {"pending": 0, "lag_s": 0.0}
    assert audittree.tenant_lag(acme)["pending"] == 0
    assert audittree.audit_health() is None
    waiting = note(acme)
    tampering.raw(f"UPDATE {tampering.PENDING} SET queued_at = %s WHERE event_id = %s",
                  [then, waiting.pk])
    with pytest.raises(audittree.AuditLate):
        audittree.audit_health()
    tampering.raw(f"DELETE FROM {tampering.PENDING} WHERE event_id = %s", [victim.pk])


def test_the_lag_is_measured_on_the_database_clock(acme, history):
    lag = audittree.tenant_lag(acme)
    assert lag["pending"] > 0 and lag["lag_s"] >= 0 and lag["tree_size"] == 0
    services.audit_integrate(acme)
    lag = audittree.tenant_lag(acme)
    assert (lag["pending"], lag["lag_s"]) == (0, 0.0) and lag["tree_size"] > 0


def test_the_lag_reads_one_clock_whatever_the_process_clock_says(acme, globex, history):
    """``queued_at`` is the database's (a column default), so a process whose clock is an
    hour off changes nothing; the age is the database's now minus the oldest queued_at,
    per tenant and over every tenant."""
    services.audit_integrate(acme)
    services.audit_integrate(globex)
    ahead = timezone.now() + timedelta(hours=1)
    with mock.patch("django.utils.timezone.now", return_value=ahead):
        [queued] = [note(acme)]
    # The event's own time is the database's too (stop 32), not the process's.
    assert AuditEvent.objects.get(pk=queued.pk).created_at < ahead - timedelta(minutes=30)
    lag = audittree.tenant_lag(acme)
    assert lag["pending"] == 1 and 0 <= lag["lag_s"] < 60
    assert audittree.tenant_lag(globex)["pending"] == 0
    then = db_now() - timedelta(seconds=90)
    tampering.raw(f"UPDATE {tampering.PENDING} SET queued_at = %s WHERE event_id = %s",
                  [then, queued.pk])
    assert 90 <= audittree.tenant_lag(acme)["lag_s"] < 150
    everyone = audittree.integration_lag()
    assert everyone["pending"] == 1 and 90 <= everyone["lag_s"] < 150
