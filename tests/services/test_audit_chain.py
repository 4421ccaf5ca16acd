"""The keyed audit chain (issue 6, fault 2; ``checkpoints.audit``): HMAC with a key the
database does not hold, key rotation, the sealed legacy SHA-256 range, the head and count
checks, and signed head exports. Runs on both backends: these checks need no trigger.
The triggers and the database roles are tests/security/."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from checkpoints import services
from checkpoints.audit import (
    audit_fields,
    audit_keys,
    event_mac,
    key_id_of,
    legacy_hash,
    seal_legacy_chains,
)
from checkpoints.exceptions import Forbidden, InvalidPayload, NotFound
from checkpoints.models import AuditChainHead, AuditEvent, AuditHashScheme, Tenant
from tests.helpers import envelope, put_checkpoint
from tests.security import tampering

KEY_A = "key-a-0123456789-0123456789-0123456789"
KEY_B = "key-b-9876543210-9876543210-9876543210"


@pytest.fixture
def history(acme, globex, wendy, wes):
    """A few events in each tenant, written by the services."""
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    put_checkpoint(wendy, acme, dict(body, revision=2), expected=1)
    put_checkpoint(wes, globex, envelope())
    return body


def events_of(tenant) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(tenant=tenant).order_by("seq"))


def verify(tenant) -> str:
    """The first problem of the tenant's chain, or "" when intact."""
    intact, _, problem = services.audit_verify(tenant=tenant)
    assert intact == (problem == "")
    return problem


# --- the keyed hash ---------------------------------------------------------------------

def note(tenant, action: str = "test.note") -> AuditEvent:
    """One audit event written the way every service writes it."""
    with transaction.atomic():
        return services.audit_record(tenant=tenant, actor=None, action=action,
                                     target_type="tenant", target_id=tenant.slug)


def test_it_keys_every_new_event_with_the_newest_audit_key(settings, acme, history):
    settings.RECOVERY_AUDIT_KEYS = [KEY_A, *settings.RECOVERY_AUDIT_KEYS]
    event = note(acme)
    assert event.hash_scheme == AuditHashScheme.HMAC_SHA256_ACTOR
    assert event.key_id == key_id_of(KEY_A.encode())
    assert audit_fields(event)["actor_id"] is None  # the system; an account's pk otherwise
    assert event.hash == hmac.new(KEY_A.encode(), json.dumps(
        {"purpose": "audit-event", "scheme": 3, "tenant": acme.pk, "key_id": event.key_id,
         "prev_hash": event.prev_hash, "event": audit_fields(event)},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(),
        hashlib.sha256).hexdigest()
    assert event.hash != legacy_hash(event.prev_hash, audit_fields(event))
    assert verify(acme) == ""
    head = AuditChainHead.objects.get(tenant=acme)
    assert (head.seq, head.last_hash) == (event.seq, event.hash)


def test_events_keyed_before_the_actor_id_was_covered_still_verify(acme, wendy):
    """Issue 17, item 13: events written before carry scheme 2 (no actor id in the MAC)
    and verify as they were made; the chain then goes on with scheme 3."""
    from django.utils import timezone

    head = AuditChainHead.objects.get(tenant=acme)
    keys = audit_keys()
    e = AuditEvent(tenant=acme, seq=head.seq + 1, created_at=timezone.now(), actor=wendy,
                   actor_name="wendy", action="test.old", target_type="tenant",
                   target_ref="acme", prev_hash=head.last_hash,
                   hash_scheme=AuditHashScheme.HMAC_SHA256, key_id=keys.newest_id)
    assert "actor_id" not in audit_fields(e)
    e.hash = event_mac(keys.newest, tenant_id=acme.pk, key_id=keys.newest_id,
                       prev_hash=e.prev_hash, fields=audit_fields(e),
                       scheme=AuditHashScheme.HMAC_SHA256)
    e.save()
    AuditChainHead.objects.filter(pk=head.pk).update(seq=e.seq, last_hash=e.hash)
    assert verify(acme) == ""
    later = note(acme)
    assert [x.hash_scheme for x in events_of(acme)][-2:] == [2, 3] and later.seq == e.seq + 1
    assert verify(acme) == ""


def test_it_costs_two_queries_per_event_on_postgresql_three_elsewhere(
        acme, django_assert_num_queries, on_postgres):
    """audit_record is on every write's hot path. PostgreSQL: move and lock the head
    (``UPDATE … RETURNING``), then insert and store the hash in one statement; SQLite:
    lock the head, insert, move the head."""
    with transaction.atomic(), django_assert_num_queries(2 if on_postgres else 3):
        services.audit_record(tenant=acme, actor=None, action="test.cost",
                              target_type="tenant", target_id="acme")


def test_it_detects_an_event_rewritten_and_rehashed_without_the_key(acme, globex, history):
    """The fault: before, a rewritten event with every later hash recomputed verified."""
    victim = events_of(acme)[2]
    tampering.rewrite(acme, victim.seq, reason="nothing to see", actor_name="mallory")
    # Every link and the head now agree: only the key tells.
    events = events_of(acme)
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
    assert AuditChainHead.objects.get(tenant=acme).last_hash == events[-1].hash
    assert verify(acme) == f"event seq {victim.seq} (id {victim.pk}) does not match its hash (HMAC)"
    assert verify(globex) == ""


def test_it_refuses_rewritten_events_that_claim_the_legacy_scheme(acme, history):
    """A downgrade: rehashed with plain SHA-256 and labelled scheme 1, outside the sealed
    legacy range (this chain has none)."""
    tampering.rewrite(acme, 2, downgrade=True, reason="rewritten")
    assert "uses the unkeyed legacy hash outside the sealed legacy range" in verify(acme)
    assert "event seq 2 " in verify(acme)


def test_it_detects_a_chain_rehashed_with_a_guessed_key(acme, history):
    """The attacker re-MACs the whole chain, naming the real key id, with a key he guessed."""
    events = events_of(acme)
    prev = "0" * 64
    for e in events:
        e.prev_hash = prev
        e.hash = hmac.new(b"guessed", (prev + json.dumps(audit_fields(e))).encode(),
                          hashlib.sha256).hexdigest()
        tampering.raw(f"UPDATE {tampering.EVENTS} SET prev_hash = %s, hash = %s WHERE id = %s",
                      [e.prev_hash, e.hash, e.pk])
        prev = e.hash
    tampering.set_head(acme, events[-1].seq, prev)
    assert verify(acme) == f"event seq 1 (id {events[0].pk}) does not match its hash (HMAC)"


def test_it_ties_each_chain_to_its_tenant(acme, globex, history):
    """Tenant A's events and head copied over tenant B's do not verify as B's."""
    a_events = events_of(acme)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s", [globex.pk])
    for e in a_events:  # INSERT is allowed; every field and hash as in acme
        e.pk, e.tenant = None, globex
        e.save(force_insert=True)
    tampering.set_head(globex, a_events[-1].seq, a_events[-1].hash)
    assert "event seq 1 " in verify(globex) and "(HMAC)" in verify(globex)


# --- key rotation -----------------------------------------------------------------------

def test_it_verifies_events_of_every_listed_key_after_a_rotation(settings, db):
    settings.RECOVERY_AUDIT_KEYS = [KEY_A]
    tenant = services.tenant_create(slug="initech")
    note(tenant)
    settings.RECOVERY_AUDIT_KEYS = [KEY_B, KEY_A]  # rotate: prepend the new key
    note(tenant)
    a_id, b_id = key_id_of(KEY_A.encode()), key_id_of(KEY_B.encode())
    assert [e.key_id for e in events_of(tenant)] == [a_id, a_id, b_id]
    assert verify(tenant) == ""


def test_it_names_the_missing_key_when_an_old_key_is_dropped(settings, db):
    settings.RECOVERY_AUDIT_KEYS = [KEY_A]
    tenant = services.tenant_create(slug="initech")
    settings.RECOVERY_AUDIT_KEYS = [KEY_B]
    first = events_of(tenant)[0]
    assert verify(tenant) == (
        f"event seq 1 (id {first.pk}) is signed with unknown audit key id "
        f"'{key_id_of(KEY_A.encode())}' (an old key missing from RECOVERY_AUDIT_KEYS?)")


@pytest.mark.parametrize("keys, message", [
    ([], "at least one key"),
    (["short"], "key 1 is shorter than 32 characters"),
    ([KEY_A, "x" * 31], "key 2 is shorter than 32 characters"),
])
def test_it_refuses_missing_or_short_keys(settings, keys, message):
    settings.RECOVERY_AUDIT_KEYS = keys
    with pytest.raises(ImproperlyConfigured, match=message):
        audit_keys()


# --- events written before the keyed scheme ----------------------------------------------

def legacy_chain(slug: str, n: int) -> Tenant:
    """A tenant whose chain was written before migration 0005: ``n`` plain SHA-256 events
    (scheme 1, no key id), then sealed as that migration does."""
    from django.utils import timezone

    tenant = Tenant.objects.create(slug=slug, name=slug)
    prev = "0" * 64
    for seq in range(1, n + 1):
        e = AuditEvent(tenant=tenant, seq=seq, created_at=timezone.now(), actor_name="system",
                       action="legacy.event", target_type="tenant", target_ref=slug,
                       reason=f"old event {seq}", prev_hash=prev,
                       hash_scheme=AuditHashScheme.SHA256)
        e.hash = legacy_hash(prev, audit_fields(e))
        e.save()
        prev = e.hash
    AuditChainHead.objects.create(tenant=tenant, seq=n, last_hash=prev)
    assert seal_legacy_chains(AuditChainHead) == 1
    return tenant


def test_it_still_verifies_sha256_events_older_than_the_keyed_scheme(db):
    old = legacy_chain("initech", 3)
    assert verify(old) == ""
    note(old, "test.after_upgrade")  # the chain goes on, keyed
    assert [e.hash_scheme for e in events_of(old)] == [1, 1, 1, 3]
    assert services.audit_verify(tenant=old) == (True, 4, "")
    assert seal_legacy_chains(AuditChainHead) == 0  # sealed once only


def test_it_detects_a_rewritten_legacy_event(db):
    """Rehashed with SHA-256 like the original: the seal (keyed) no longer matches."""
    old = legacy_chain("initech", 3)
    tampering.rewrite(old, 2, reason="rewritten")
    assert verify(old) == "the legacy seal (seq 3) does not match the events"


def test_it_detects_a_rewritten_legacy_event_under_later_keyed_events(db):
    old = legacy_chain("initech", 3)
    note(old, "test.after_upgrade")
    tampering.rewrite(old, 1, downgrade=True, reason="rewritten")
    assert verify(old) == "the legacy seal (seq 3) does not match the events"


def test_it_refuses_to_stretch_the_legacy_range(db):
    """Moving the seal's seq (to pass later, rehashed events off as legacy) breaks its MAC."""
    old = legacy_chain("initech", 2)
    note(old, "test.after_upgrade")
    tampering.rewrite(old, 3, downgrade=True, reason="rewritten")
    AuditChainHead.objects.filter(tenant=old).update(legacy_seq=3)
    assert verify(old) == "the legacy seal (seq 3) does not match the events"
    AuditChainHead.objects.filter(tenant=old).update(legacy_seq=0, legacy_mac="")
    assert "uses the unkeyed legacy hash outside the sealed legacy range" in verify(old)
    assert "event seq 1 " in verify(old)


# --- the head and the count ---------------------------------------------------------------

def test_it_finds_a_chain_emptied_under_its_head(acme, history):
    """The fault: TRUNCATE, then "intact (0 events)"."""
    n = len(events_of(acme))
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s", [acme.pk])
    assert services.audit_verify(tenant=acme) == (
        False, 0, f"the chain head is at seq {n} but the events end at seq 0 (events missing)")


def test_it_finds_a_tenant_without_any_chain(acme, globex, history):
    tampering.empty(tampering.EVENTS, tampering.HEADS)
    for tenant in (acme, globex):
        assert verify(tenant) == "no audit chain at all (every tenant's creation is audited)"


def test_it_finds_events_without_a_head(acme, history):
    tampering.raw(f"DELETE FROM {tampering.HEADS} WHERE tenant_id = %s", [acme.pk])
    assert verify(acme) == "the chain head is missing but events exist"


def test_it_finds_events_cut_from_the_end_while_the_head_stayed(acme, history):
    n = len(events_of(acme))
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s AND seq > %s",
                  [acme.pk, n - 2])
    assert verify(acme) == (
        f"the chain head is at seq {n} but the events end at seq {n - 2} (events missing)")


def test_it_finds_events_past_the_head(acme, history):
    """A rewound head (the service's role may UPDATE the head, not delete events)."""
    events = events_of(acme)
    tampering.set_head(acme, events[-2].seq, events[-2].hash)
    assert verify(acme) == (f"event seq {events[-1].seq} is past the chain head "
                            f"(seq {events[-2].seq})")


def test_it_finds_a_head_whose_hash_is_not_the_last_events(acme, history):
    n = len(events_of(acme))
    tampering.set_head(acme, n, "e" * 64)
    assert verify(acme) == f"the chain head's hash is not event seq {n}'s"


def test_it_finds_a_gap(acme, history):
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s AND seq = 2", [acme.pk])
    assert verify(acme) == "gap before seq 3 (seq 2 expected)"


# --- signed head exports --------------------------------------------------------------------

def test_it_exports_a_signed_head_as_an_audited_event(settings, acme, history):
    settings.RECOVERY_AUDIT_KEYS = [KEY_A, *settings.RECOVERY_AUDIT_KEYS]
    record = services.audit_head_export(tenant=acme)
    assert set(record) == {"tenant", "seq", "last_hash", "exported_at", "key_id", "signature"}
    event = events_of(acme)[-1]
    assert (event.action, event.actor_name, event.target_ref) == (
        "audit.export_head", "system", "acme")
    assert (record["tenant"], record["seq"], record["last_hash"], record["key_id"]) == (
        "acme", event.seq, event.hash, key_id_of(KEY_A.encode()))
    assert record["exported_at"] == event.created_at.isoformat()
    assert services.audit_head_check(record=record) == ""
    assert verify(acme) == ""


def test_it_lets_only_an_admin_export(acme, globex, adam, rita, omar, history):
    assert services.audit_head_export(tenant=acme, actor=adam)["tenant"] == "acme"
    assert events_of(acme)[-1].actor_name == "adam"
    n = len(events_of(acme))
    with pytest.raises(Forbidden):
        services.audit_head_export(tenant=acme, actor=rita)
    with pytest.raises(NotFound):
        services.audit_head_export(tenant=acme, actor=omar)
    assert len(events_of(acme)) == n


def test_it_proves_a_cut_tail_only_against_an_exported_head(acme, wendy, history):
    """Deleting the last events *and* rewinding the head leaves a consistent, shorter
    chain: the verifier alone cannot tell. The exported head can."""
    record = services.audit_head_export(tenant=acme)
    put_checkpoint(wendy, acme, envelope())
    tampering.cut_tail(acme, keep=record["seq"] - 1)
    assert verify(acme) == ""
    assert services.audit_head_check(record=record) == (
        f"exported head seq {record['seq']} of {record['exported_at']} is no longer in the "
        "chain (events were cut)")


def test_it_proves_a_rewrite_against_an_exported_head(acme, history):
    record = services.audit_head_export(tenant=acme)
    tampering.rewrite(acme, 2, reason="rewritten")
    assert services.audit_head_check(record=record) == (
        f"event seq {record['seq']} no longer has the hash exported on "
        f"{record['exported_at']} (history was rewritten)")


def test_it_proves_a_rewound_head_against_an_exported_head(acme, history):
    record = services.audit_head_export(tenant=acme)
    kept = events_of(acme)[-2]
    tampering.set_head(acme, kept.seq, kept.hash)
    assert services.audit_head_check(record=record) == (
        f"the chain head (seq {kept.seq}) is behind the exported head seq {record['seq']}")


@pytest.mark.parametrize("change, problem", [
    ({"seq": 1}, "the signature does not verify"),
    ({"last_hash": "a" * 64}, "the signature does not verify"),
    ({"tenant": "globex"}, "the signature does not verify"),
    ({"key_id": "0123456789abcdef"}, "signed with unknown audit key id '0123456789abcdef'"),
])
def test_it_refuses_an_altered_export(acme, globex, history, change, problem):
    record = dict(services.audit_head_export(tenant=acme), **change)
    assert problem in services.audit_head_check(record=record)


def test_it_finds_an_exported_tenant_that_no_longer_exists(acme, history):
    record = services.audit_head_export(tenant=acme)
    Tenant.objects.filter(pk=acme.pk).update(slug="renamed")
    assert services.audit_head_check(record=record) == "the tenant no longer exists"


@pytest.mark.parametrize("line, field", [
    ("not json", "line: malformed JSON"),
    ("[1]", "line: must be a JSON object"),
    ('{"tenant": "acme", "tenant": "acme"}', "line: duplicated key 'tenant'"),
    ("{}", "tenant: missing"),
    ("EXTRA", "extra: unknown field"),
    ("SEQ=true", "seq: must be an integer >= 1"),
    ("SEQ=0", "seq: must be an integer >= 1"),
    ('SEQ="3"', "seq: must be an integer >= 1"),
    ('HASH="ABC"', "last_hash: must be 64 lower-case hex digits"),
    ("TENANT=7", "tenant: must be a non-empty string"),
])
def test_it_names_the_field_of_a_malformed_export_line(line, field):
    good = {"tenant": "acme", "seq": 3, "last_hash": "a" * 64, "exported_at": "now",
            "key_id": "0" * 16, "signature": "b" * 64}
    if line == "EXTRA":
        line = json.dumps(dict(good, extra=1))
    elif line.startswith(("SEQ=", "HASH=", "TENANT=")):
        name, value = line.split("=", 1)
        key = {"SEQ": "seq", "HASH": "last_hash", "TENANT": "tenant"}[name]
        line = json.dumps(dict(good, **{key: json.loads(value)}))
    with pytest.raises(InvalidPayload) as caught:
        services.audit_head_parse(line)
    assert field in caught.value.detail
    assert services.audit_head_parse(json.dumps(good)) == good
