"""The keyed audit chain (issue 6, fault 2; ``checkpoints.audit``): HMAC with a key the
database does not hold, key rotation, the sealed legacy SHA-256 range, the head and count
checks, and signed head exports. Runs on both backends: these checks need no trigger.
The triggers and the database roles are tests/security/."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from checkpoints import audithead, audittree, merkle, services
from checkpoints.audit import (
    audit_fields,
    audit_keys,
    event_mac,
    key_id_of,
    legacy_hash,
    seal_legacy_chains,
)
from checkpoints.dbclock import db_now
from checkpoints.exceptions import Forbidden, InvalidPayload, NotFound
from checkpoints.models import (
    AuditChainHead,
    AuditEvent,
    AuditHashScheme,
    AuditPending,
    AuditTreeHead,
    Tenant,
)
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


def test_it_keys_every_new_event_alone_with_the_newest_audit_key(settings, acme, history):
    """Issue 22: scheme 4, the MAC over the event alone (no previous hash, no seq); the
    database gives seq (the row's id) and queues it; the chain head does not move."""
    settings.RECOVERY_AUDIT_KEYS = [KEY_A, *settings.RECOVERY_AUDIT_KEYS]
    head_before = AuditChainHead.objects.get(tenant=acme)
    event = note(acme)
    assert event.hash_scheme == AuditHashScheme.HMAC_SHA256_LEAF
    assert event.seq == event.pk == AuditEvent.objects.get(pk=event.pk).seq
    assert event.prev_hash == "" and "seq" not in audit_fields(event)
    assert event.key_id == key_id_of(KEY_A.encode())
    assert audit_fields(event)["actor_id"] is None  # the system; an account's pk otherwise
    assert event.hash == hmac.new(KEY_A.encode(), json.dumps(
        {"purpose": "audit-event", "scheme": 4, "tenant": acme.pk, "key_id": event.key_id,
         "event": audit_fields(event)},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(),
        hashlib.sha256).hexdigest()
    assert AuditPending.objects.filter(event_id=event.pk, tenant=acme).exists()
    assert verify(acme) == ""  # queued, not yet integrated: fine
    head = AuditChainHead.objects.get(tenant=acme)
    assert (head.seq, head.last_hash) == (head_before.seq, head_before.last_hash)


def test_it_costs_one_query_per_event(acme, django_assert_num_queries):
    """audit_record is on every write's hot path: one INSERT (a trigger gives seq and
    queues the event), no per-tenant row read or locked (issue 22, item 1), when its
    caller passes the database time it read with its lock, as every write does. Without
    one (a reveal, a tenant-level event) it asks the database for its time first."""
    now = db_now()
    with transaction.atomic(), django_assert_num_queries(1):
        services.audit_record(tenant=acme, actor=None, action="test.cost",
                              target_type="tenant", target_id="acme", created_at=now)
    with transaction.atomic(), django_assert_num_queries(2):
        services.audit_record(tenant=acme, actor=None, action="test.cost",
                              target_type="tenant", target_id="acme")


def test_it_detects_an_event_rewritten_and_rehashed_without_the_key(acme, globex, history):
    victim = events_of(acme)[2]
    tampering.rewrite_event(victim, reason="nothing to see", actor_name="mallory")
    assert verify(acme) == f"event seq {victim.seq} (id {victim.pk}) does not match its hash (HMAC)"
    assert verify(globex) == ""


@pytest.mark.parametrize("scheme", [1, 2, 3])
def test_it_refuses_an_event_relabelled_with_an_older_scheme(acme, history, scheme):
    victim = events_of(acme)[1]
    tampering.raw(f"UPDATE {tampering.EVENTS} SET hash_scheme = %s WHERE id = %s",
                  [scheme, victim.pk])
    assert verify(acme).startswith(("gap before seq", "event seq"))


def test_it_detects_events_rehashed_with_a_guessed_key(acme, history):
    events = events_of(acme)
    for e in events:
        e.hash = hmac.new(b"guessed", json.dumps(audit_fields(e)).encode(),
                          hashlib.sha256).hexdigest()
        tampering.raw(f"UPDATE {tampering.EVENTS} SET hash = %s WHERE id = %s", [e.hash, e.pk])
    assert verify(acme) == f"event seq {events[0].seq} (id {events[0].pk}) does not match its hash (HMAC)"


def test_it_ties_each_event_to_its_tenant(acme, globex, history):
    """Tenant A's events copied into tenant B do not verify as B's."""
    a_events = events_of(acme)
    for e in a_events:  # INSERT is allowed; every field and hash as in acme
        e.pk, e.tenant, e.seq = None, globex, None
        e.save(force_insert=True)
    assert "(HMAC)" in verify(globex)


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
        f"event seq {first.seq} (id {first.pk}) is signed with unknown audit key id "
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
    assert [e.hash_scheme for e in events_of(old)] == [1, 1, 1, 4]
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
    """Moving the seal's seq (to pass a later, rehashed event off as legacy) breaks its MAC."""
    old = legacy_chain("initech", 2)
    later = note(old, "test.after_upgrade")
    prev = events_of(old)[1].hash
    later.seq, later.prev_hash, later.hash_scheme = 3, prev, AuditHashScheme.SHA256
    later.hash = legacy_hash(prev, audit_fields(later))
    tampering.raw(f"UPDATE {tampering.EVENTS} SET seq = 3, prev_hash = %s, hash = %s, "
                  "hash_scheme = 1 WHERE id = %s", [prev, later.hash, later.pk])
    tampering.set_head(old, 3, later.hash)
    AuditChainHead.objects.filter(tenant=old).update(legacy_seq=3)
    assert verify(old) == "the legacy seal (seq 3) does not match the events"
    AuditChainHead.objects.filter(tenant=old).update(legacy_seq=0, legacy_mac="")
    assert "uses the unkeyed legacy hash outside the sealed legacy range" in verify(old)
    assert "event seq 1 " in verify(old)


# --- the legacy chain's head and count (events written before issue 22) -------------------

def keyed_chain(slug: str, n: int, scheme: int = AuditHashScheme.HMAC_SHA256_ACTOR) -> Tenant:
    """A tenant whose chain was written before issue 22: ``n`` chained keyed events."""
    from django.utils import timezone

    tenant = Tenant.objects.create(slug=slug, name=slug)
    keys, prev = audit_keys(), "0" * 64
    for seq in range(1, n + 1):
        e = AuditEvent(tenant=tenant, seq=seq, created_at=timezone.now(), actor_name="system",
                       action="legacy.event", target_type="tenant", target_ref=slug,
                       reason=f"old event {seq}", prev_hash=prev, hash_scheme=scheme,
                       key_id=keys.newest_id)
        e.hash = event_mac(keys.newest, tenant_id=tenant.pk, key_id=keys.newest_id,
                           prev_hash=prev, fields=audit_fields(e), scheme=scheme)
        e.save()
        prev = e.hash
    AuditChainHead.objects.create(tenant=tenant, seq=n, last_hash=prev)
    return tenant


def test_chained_events_of_every_scheme_verify_and_the_tree_seals_them(db):
    old = keyed_chain("initech", 3, AuditHashScheme.HMAC_SHA256)
    assert verify(old) == ""
    note(old, "test.after_upgrade")
    assert services.audit_integrate(old) == 4
    assert [e.hash_scheme for e in events_of(old)] == [2, 2, 2, 4]
    assert services.audit_verify(tenant=old) == (True, 4, "")


@pytest.mark.django_db(transaction=True)
def test_it_finds_a_chain_emptied_under_its_head(db):
    old = keyed_chain("initech", 3)
    note(old)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s AND hash_scheme < 4",
                  [old.pk])
    assert verify(old) == ("the chain head is at seq 3 but the chained events end at seq 0 "
                           "(events missing)")


@pytest.mark.django_db(transaction=True)
def test_it_finds_a_tenant_without_any_event(acme, globex, history):
    tampering.empty(tampering.LEAVES, tampering.PENDING, tampering.EVENTS, tampering.HEADS)
    for tenant in (acme, globex):
        assert verify(tenant) == "no audit chain at all (every tenant's creation is audited)"


def test_it_finds_chained_events_without_a_head(db):
    old = keyed_chain("initech", 2)
    tampering.raw(f"DELETE FROM {tampering.HEADS} WHERE tenant_id = %s", [old.pk])
    assert verify(old) == "the chain head is missing but chained events exist"


@pytest.mark.django_db(transaction=True)
def test_it_finds_chained_events_cut_from_the_end_while_the_head_stayed(db):
    old = keyed_chain("initech", 4)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s AND seq > 2", [old.pk])
    assert verify(old) == ("the chain head is at seq 4 but the chained events end at seq 2 "
                           "(events missing)")


def test_it_finds_chained_events_past_the_head(db):
    old = keyed_chain("initech", 3)
    events = events_of(old)
    tampering.set_head(old, 2, events[1].hash)
    assert verify(old) == "event seq 3 is past the chain head (seq 2)"


def test_it_finds_a_head_whose_hash_is_not_the_last_chained_events(db):
    old = keyed_chain("initech", 3)
    tampering.set_head(old, 3, "e" * 64)
    assert verify(old) == "the chain head's hash is not event seq 3's"


@pytest.mark.django_db(transaction=True)
def test_it_finds_a_gap_in_the_chain(db):
    old = keyed_chain("initech", 3)
    tampering.raw(f"DELETE FROM {tampering.EVENTS} WHERE tenant_id = %s AND seq = 2", [old.pk])
    assert verify(old) == "gap before seq 3 (seq 2 expected)"


# --- signed head exports --------------------------------------------------------------------

def test_it_exports_the_signed_tree_head_that_covers_its_own_event(settings, acme, history):
    settings.RECOVERY_AUDIT_KEYS = [KEY_A, *settings.RECOVERY_AUDIT_KEYS]
    record = services.audit_head_export(tenant=acme)
    assert set(record) == {"tenant", "origin", "tree_size", "root_hash", "created_at",
                           "key_id", "public_key", "signature", "checkpoint"}
    event = events_of(acme)[-1]
    assert (event.action, event.actor_name, event.target_ref) == (
        "audit.export_head", "system", "acme")
    assert event.leaf.index == record["tree_size"] - 1  # the head covers the export
    newest, _ = audittree.signing_keys()
    assert record["key_id"] == newest.key_id
    assert record["checkpoint"] == (f"recovery.audit/{acme.pk}\n{record['tree_size']}\n"
                                    f"{base64.b64encode(bytes.fromhex(record['root_hash'])).decode()}\n")
    assert merkle.verify_head_line(record) == ""  # with the public key alone
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


def test_a_later_tree_proves_consistent_with_an_exported_head(acme, wendy, history):
    record = services.audit_head_export(tenant=acme)
    for _ in range(5):
        put_checkpoint(wendy, acme, envelope())
        services.audit_integrate(acme)
    assert services.audit_head_check(record=record) == ""


@pytest.mark.django_db(transaction=True)
def test_it_proves_a_cut_tail_only_against_an_exported_head(acme, wendy, history):
    """Deleting the newest leaves, their events and the heads past them leaves a
    consistent, shorter tree: the verifier alone cannot tell. The exported head can."""
    services.audit_integrate(acme)
    keep = AuditTreeHead.objects.filter(tenant=acme).order_by("-tree_size")[0].tree_size
    record = services.audit_head_export(tenant=acme)
    put_checkpoint(wendy, acme, envelope())
    services.audit_integrate(acme)
    tampering.cut_tree(acme, keep=keep)
    assert verify(acme) == ""
    assert services.audit_head_check(record=record) == (
        f"the tree (size {keep}) is behind the exported head size {record['tree_size']} "
        "(events were cut)")


def test_it_proves_a_rewritten_leaf_against_an_exported_head(acme, history):
    record = services.audit_head_export(tenant=acme)
    tampering.raw(f"UPDATE {tampering.LEAVES} SET hash = %s WHERE tenant_id = %s AND \"index\" = 1",
                  ["ab" * 32, acme.pk])
    assert services.audit_head_check(record=record) == (
        f"the tree's root at size {record['tree_size']} is not the exported head's (history "
        "was rewritten)")


@pytest.mark.parametrize("change, problem", [
    ({"tree_size": 1}, "the checkpoint text does not match"),
    ({"root_hash": "a" * 64}, "the checkpoint text does not match"),
    ({"checkpoint": "x"}, "the checkpoint text does not match"),
    ({"tenant": "globex"}, "is another tree's"),
    ({"key_id": "0123456789abcdef"}, "signed with a key this deployment does not hold"),
    ({"public_key": base64.b64encode(b"k" * 32).decode()}, "a key this deployment does not hold"),
])
def test_it_refuses_an_altered_export(acme, globex, history, change, problem):
    record = dict(services.audit_head_export(tenant=acme), **change)
    assert problem in services.audit_head_check(record=record)


def test_it_refuses_a_re_signed_export_whose_checkpoint_was_changed(acme, history):
    record = services.audit_head_export(tenant=acme)
    size = record["tree_size"] - 1
    root = bytes.fromhex("ab" * 32)
    record = dict(record, tree_size=size, root_hash=root.hex(),
                  checkpoint=merkle.checkpoint_text(record["origin"], size, root))
    assert "the signature does not verify" in services.audit_head_check(record=record)


def test_a_head_line_exported_before_the_tree_still_checks(db):
    """Issue 22: lines exported before (an HMAC over a chained event's position) parse
    and check as they did."""
    old = keyed_chain("initech", 3)
    e = events_of(old)[-1]
    keys = audit_keys()
    line = {"tenant": "initech", "seq": 3, "last_hash": e.hash, "exported_at": "then",
            "key_id": keys.newest_id}
    line["signature"] = audithead._legacy_signature(keys.newest, line)
    record = services.audit_head_parse(json.dumps(line))
    assert services.audit_head_check(record=record) == ""
    assert "does not verify" in services.audit_head_check(record=dict(record, seq=2))


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


def test_a_dropped_key_points_to_the_fix_in_every_message(settings, db, tmp_path):
    """(the operator's walk, item 5) With only the new key listed, ``verify_audit_chain
    --against`` said "signed with a key this deployment does not hold (key id …)" of the
    exported head and "tenant registry seq 1 … is signed with unknown audit key id …" of
    the registry, one key under two ids, and neither said what audit.md's table does.
    Each message now ends with the hint; the head's names its id as the Ed25519 key's."""
    settings.RECOVERY_AUDIT_KEYS = [KEY_A]
    services.tenant_create(slug="initech")
    heads = tmp_path / "heads.jsonl"
    call_command("export_audit_head", out=str(heads), stdout=io.StringIO())
    settings.RECOVERY_AUDIT_KEYS = [KEY_B]
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", against=str(heads), stdout=out)
    text = out.getvalue() + "\n" + str(caught.value)
    hint = "an old audit key missing from RECOVERY_AUDIT_KEYS?"
    head = [x for x in text.splitlines() if "does not hold" in x]
    registry = [x for x in text.splitlines() if "tenant registry seq 1" in x]
    assert head and registry, text
    assert all(hint in x for x in head + registry), text
    assert "(Ed25519 key id" in head[0]
