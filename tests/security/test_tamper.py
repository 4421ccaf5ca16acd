"""The tamper set (issue 6, fault 2; issue 22, item 1): every way found to empty or rewrite
the audit trail, each refused (by a trigger or the app role's rights) or detected (by
``verify_audit_chain``, which integrates the queue then runs ``services.audit_verify``,
or by ``--against`` a signed tree head exported earlier). Prints the results as a table.

The trail since issue 22: events keyed alone (scheme 4, ``seq`` = the row's id), queued
(``AuditPending``) and integrated by the sequencer into the tenant's Merkle tree
(``AuditLeaf``, stored ``AuditTreeNode``, Ed25519-signed ``AuditTreeHead``). The chains
written before it (schemes 1-3, seq 1..n, ``AuditChainHead`` at the last) stay, sealed
under the first tree head: the attacks on their links run on the ``upgraded`` world.

Attackers: the **app role** the service runs as (``setup_database_roles``), the **owner**
(or a superuser) issuing plain SQL, and a **superuser with the triggers off**
(``session_replication_role = replica``), who gets past every refusal; none of them has
the audit key. The refusals need PostgreSQL; on SQLite (no triggers, no roles: anyone
with the file is the last attacker) only the detections run, and the table says so.

What no check sees (docs/security/audit.md): an event deleted together with its queue row
before the sequencer integrated it, by someone past the triggers
(``test_a_queued_event_deleted_with_its_queue_row_is_the_bounded_window``); the window is
the integration lag, which ``/readyz`` fails past ``RECOVERY_AUDIT_LAG_MAX_S``.
"""

from __future__ import annotations

import base64
import io
import json

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from checkpoints import audittree, merkle, services
from checkpoints.audit import (
    GENESIS,
    audit_fields,
    audit_keys,
    audit_record_many,
    event_mac,
    legacy_hash,
)
from checkpoints.models import (
    AuditChainHead,
    AuditEvent,
    AuditHashScheme,
    AuditLeaf,
    AuditPending,
    AuditTenant,
    AuditTreeHead,
    AuditTreeNode,
    Tenant,
)
from tests.helpers import age_world, envelope, put_checkpoint
from tests.lifecycle.governance import DAY, keep_tombstones, purged_runs
from tests.security import tampering

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS, HEADS = tampering.EVENTS, tampering.HEADS
LEAVES, NODES, TREE_HEADS = tampering.LEAVES, tampering.NODES, tampering.TREE_HEADS
PENDING = tampering.PENDING
REGISTRY = AuditTenant._meta.db_table
_WORLD = {"suffix": ""}
#: The tree's tables, as the table of results names them.
TREE_NAMES = {LEAVES: "leaves", NODES: "stored nodes", TREE_HEADS: "signed tree heads"}


def record(attack: str, by: str, outcome: str, how: str) -> None:
    """A row of the table printed at the end (tests/security/conftest.py), the attack
    marked with the world it ran on (after deletions, upgraded chain)."""
    tampering.record(attack + _WORLD["suffix"], by, outcome, how)


def _after_deletions(acme, wendy, adam, april, out_dir) -> None:
    """Issue 20: retention deletes two runs (tombstones), the audit is exported, and a
    four-eyes purge deletes the tombstones; the trail must still verify, and every
    attack below must still be refused or detected."""
    purged_runs(wendy, acme, 2)
    keep_tombstones(acme, 30)
    services.audit_export(actor=None, tenant=acme, out_dir=out_dir)
    age_world(31 * DAY)
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    services.tombstone_purge_execute(actor=adam, tenant=acme, purge_id=purge.uuid)


def _as_chained_before_the_tree(tenant) -> int:
    """Turn the tenant's events (all queued, none integrated yet) into the keyed chain a
    deployment upgraded from before issue 22 holds (scheme 3, seq 1..n, each linked to
    the one before, the chain head at the last), as the key holder wrote them: not an
    attack, the world the chain attacks start from. The first tree head seals them.
    Returns n."""
    assert not AuditLeaf.objects.filter(tenant=tenant).exists()
    keys, prev = audit_keys(), GENESIS
    events = list(AuditEvent.objects.filter(tenant=tenant).order_by("pk"))
    for seq, e in enumerate(events, start=1):  # ascending: no seq collides on the way
        e.seq, e.prev_hash, e.hash_scheme = seq, prev, AuditHashScheme.HMAC_SHA256_ACTOR
        e.hash = event_mac(keys.newest, tenant_id=tenant.pk, key_id=keys.newest_id,
                           prev_hash=prev, fields=audit_fields(e), scheme=e.hash_scheme)
        tampering.raw(f"UPDATE {EVENTS} SET seq = %s, prev_hash = %s, hash = %s, "
                      "hash_scheme = %s WHERE id = %s",
                      [seq, prev, e.hash, e.hash_scheme, e.pk])
        prev = e.hash
    AuditChainHead.objects.update_or_create(tenant=tenant,
                                            defaults={"seq": len(events), "last_hash": prev})
    return len(events)


def _world(mode, acme, globex, wendy, wes, adam, april, tmp_path):
    """Two tenants with a few events each, integrated (the sequencer runs every
    second); the attacks are on acme."""
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    put_checkpoint(wendy, acme, dict(body, revision=2), expected=1)
    put_checkpoint(wes, globex, envelope())
    _WORLD["suffix"] = ""
    if mode == "after deletions":
        _after_deletions(acme, wendy, adam, april, tmp_path / "export")
        _WORLD["suffix"] = " (after deletions)"
    if mode == "upgraded":
        _as_chained_before_the_tree(acme)
        put_checkpoint(wendy, acme, envelope())  # keyed alone, after the chain
        _WORLD["suffix"] = " (upgraded chain)"
    services.audit_integrate_all()
    assert not AuditPending.objects.exists()
    return acme


@pytest.fixture(params=["fresh", "after deletions"])
def chain(request, acme, globex, wendy, wes, adam, april, tmp_path):
    """Each attack runs on a fresh trail and on one after a retention purge and a
    tombstone purge."""
    return _world(request.param, acme, globex, wendy, wes, adam, april, tmp_path)


@pytest.fixture
def upgraded(acme, globex, wendy, wes, adam, april, tmp_path):
    """acme's first events chained as before issue 22 (scheme 3), sealed under the first
    tree head, then events keyed alone: the attacks on chain links run here."""
    return _world("upgraded", acme, globex, wendy, wes, adam, april, tmp_path)


@pytest.fixture
def big(chain):
    """The chain plus 300 events: the tree has a stored node (level 8)."""
    with transaction.atomic():
        audit_record_many(tenant=chain, actor=None, events=[
            {"action": "test.note", "target_type": "tenant", "target_id": i}
            for i in range(300)])
    services.audit_integrate_all()
    assert AuditTreeNode.objects.filter(tenant=chain, level=8).exists()
    return chain


def n_events(tenant) -> int:
    return AuditEvent.objects.filter(tenant=tenant).count()


def leaves(tenant) -> list[AuditLeaf]:
    return list(AuditLeaf.objects.filter(tenant=tenant).order_by("index"))


def newest_head(tenant) -> AuditTreeHead:
    return audittree.newest_head(tenant.pk)


def note(tenant) -> AuditEvent:
    """A new event, queued (not integrated yet)."""
    with transaction.atomic():
        return services.audit_record(tenant=tenant, actor=None, action="test.note",
                                     target_type="tenant", target_id=tenant.slug)


def broken(*args, **options) -> str:
    """Run ``verify_audit_chain``; it must fail. Returns its message."""
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", *args, stdout=io.StringIO(), **options)
    return str(caught.value)


def intact(*args, **options) -> None:
    call_command("verify_audit_chain", *args, stdout=io.StringIO(), **options)


def export_head(tmp_path, *slugs: str):
    """``export_audit_head`` into a file; returns (path, the first line parsed)."""
    exported = tmp_path / "heads.jsonl"
    call_command("export_audit_head", *slugs, out=str(exported), stdout=io.StringIO())
    return exported, json.loads(exported.read_text().splitlines()[0])


def refused_for_app(db_roles, sql: str, error: str, params=()) -> str:
    """Run ``sql`` as the app role; it must be refused. Returns PostgreSQL's message."""
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=error) as caught:
            cur.execute(sql, params)
    return str(caught.value).splitlines()[0]


def refused_for_owner(sql: str, params=()) -> str:
    """Run plain ``sql`` as the owner/superuser (triggers on); it must be refused."""
    with pytest.raises(DatabaseError, match="append-only") as caught, connection.cursor() as cur:
        cur.execute(sql, params)
    return str(caught.value).splitlines()[0]


def trail_size(tenant) -> tuple[int, int, int]:
    """(events, leaves, signed heads) of the tenant: what a refused attack leaves alone."""
    return (n_events(tenant), AuditLeaf.objects.filter(tenant=tenant).count(),
            AuditTreeHead.objects.filter(tenant=tenant).count())


postgres_only = pytest.mark.postgres


# --- refused ---------------------------------------------------------------------------------

DENIED = "permission denied for table"
_APP_REFUSED = [
    ("truncate", f"TRUNCATE {EVENTS}", DENIED),
    ("delete", f"DELETE FROM {EVENTS}", DENIED),
    ("rewrite one event", f"UPDATE {EVENTS} SET reason = 'x' WHERE id = "
     f"(SELECT max(id) FROM {EVENTS})", DENIED),
    ("disable trigger", f"ALTER TABLE {EVENTS} DISABLE TRIGGER ALL", "must be owner"),
    ("drop trigger", f"DROP TRIGGER checkpoints_audit_append_only ON {EVENTS}",
     "must be owner"),
    ("drop the queueing trigger", f"DROP TRIGGER checkpoints_audit_queue ON {EVENTS}",
     "must be owner"),
    ("triggers off (replica)", "SET session_replication_role = replica",
     "permission denied to set parameter"),
    ("delete the chain heads", f"DELETE FROM {HEADS}", DENIED),
    ("delete a tenant registration", f"DELETE FROM {REGISTRY}", DENIED),
    ("rewrite a tenant registration", f"UPDATE {REGISTRY} SET slug = 'x'", DENIED),
    ("truncate the tenant registry", f"TRUNCATE {REGISTRY}", DENIED),
    ("rewrite a queue row", f"UPDATE {PENDING} SET tenant_id = tenant_id", DENIED),
    ("truncate the queue", f"TRUNCATE {PENDING}", DENIED),
    *[(f"{verb} the {name}", sql, DENIED) for table, name in TREE_NAMES.items()
      for verb, sql in (("rewrite", f"UPDATE {table} SET tenant_id = tenant_id"),
                        ("delete", f"DELETE FROM {table}"),
                        ("truncate", f"TRUNCATE {table}"))],
    *[(f"disable the trigger of the {name}", f"ALTER TABLE {table} DISABLE TRIGGER ALL",
       "must be owner") for table, name in TREE_NAMES.items()],
]


@postgres_only
@pytest.mark.parametrize("attack, sql, error", _APP_REFUSED, ids=[a[0] for a in _APP_REFUSED])
def test_the_app_role_is_refused(db_roles, big, attack, sql, error):
    """The app role may only read and append events, leaves, nodes, heads and the
    registry, and read, append and delete queue rows (dbroles.role_lockdown_sql)."""
    before = trail_size(big)
    message = refused_for_app(db_roles, sql, error)
    assert trail_size(big) == before
    intact()
    record(attack, "app role", "refused", f"role rights: {message}")


_OWNER_REFUSED = [
    # TRUNCATE events alone is refused by the leaves' and queue's foreign keys whatever
    # the triggers; with CASCADE the append-only trigger refuses it.
    ("truncate", f"TRUNCATE {EVENTS} CASCADE"),
    ("truncate events and heads", f"TRUNCATE {EVENTS}, {HEADS}, {LEAVES}, {NODES}, "
                                  f"{TREE_HEADS}, {PENDING}"),
    ("delete", f"DELETE FROM {EVENTS} WHERE id = (SELECT max(id) FROM {EVENTS})"),
    ("rewrite one event", f"UPDATE {EVENTS} SET reason = 'x' WHERE id = "
                          f"(SELECT max(id) FROM {EVENTS})"),
    ("delete the chain heads", f"DELETE FROM {HEADS}"),
    ("delete a tenant registration", f"DELETE FROM {REGISTRY}"),
    ("rewrite a tenant registration", f"UPDATE {REGISTRY} SET slug = 'x'"),
    *[(f"{verb} the {name}", sql) for table, name in TREE_NAMES.items()
      for verb, sql in (("rewrite", f"UPDATE {table} SET tenant_id = tenant_id"),
                        ("delete", f"DELETE FROM {table}"),
                        ("truncate", f"TRUNCATE {table}"))],
]


@postgres_only
@pytest.mark.parametrize("attack, sql", _OWNER_REFUSED, ids=[a[0] for a in _OWNER_REFUSED])
def test_plain_sql_of_the_owner_is_refused(big, attack, sql):
    before = trail_size(big)
    message = refused_for_owner(sql)
    assert trail_size(big) == before
    intact()
    record(attack, "owner / superuser", "refused", f"trigger: {message}")


# --- detected --------------------------------------------------------------------------------

def bypass() -> str:
    """Who gets past every refusal: on PostgreSQL a superuser with the triggers off (as
    the owner could do with ALTER TABLE ... DISABLE TRIGGER), on SQLite anyone with the file."""
    return "superuser, triggers off" if connection.vendor == "postgresql" else "anyone with the file"


NO_TRAIL = "no audit chain at all (every tenant's creation is audited)"


def test_truncate_is_detected(chain):
    """The fault: TRUNCATE, then "intact (0 events)". The leaves and the queue name the
    events (foreign keys TRUNCATE honours even with the triggers off), so they go too."""
    tampering.empty(LEAVES, PENDING, EVENTS, truncate=True)
    assert broken() == f"audit chain broken for: acme: {NO_TRAIL}; globex: {NO_TRAIL}"
    record("truncate", bypass(), "detected", "verifier: tenant without events")


def test_truncating_events_and_heads_is_detected(chain):
    """With the chain heads, and the whole tree (leaves, nodes, signed heads) and queue."""
    tampering.empty(LEAVES, NODES, TREE_HEADS, PENDING, EVENTS, HEADS, truncate=True)
    assert broken("acme") == f"audit chain broken for: acme: {NO_TRAIL}"
    record("truncate events and heads (chain and tree)", bypass(), "detected",
           "verifier: tenant without events")


def test_deleting_an_integrated_event_is_detected(chain):
    """Was "delete one event: gap in seq": a gap in seq is no evidence any more (seq is
    the row id, shared by the tenants), the event's leaf is."""
    leaf = leaves(chain)[2]
    tampering.raw(f"DELETE FROM {EVENTS} WHERE id = %s", [leaf.event_id])
    assert broken("acme") == (f"audit chain broken for: acme: leaf 2 names event id "
                              f"{leaf.event_id}, which is not one of the tenant's events "
                              "(deleted?)")
    record("delete one event", bypass(), "detected", "verifier: its leaf names it")


def test_deleting_an_event_and_its_leaf_is_detected(chain):
    leaf = leaves(chain)[2]
    tampering.raw(f"DELETE FROM {LEAVES} WHERE id = %s", [leaf.pk])
    tampering.raw(f"DELETE FROM {EVENTS} WHERE id = %s", [leaf.event_id])
    assert broken("acme") == ("audit chain broken for: acme: gap in the tree before leaf 3 "
                              "(leaf 2 expected: deleted)")
    record("delete one event and its leaf", bypass(), "detected", "verifier: gap in the leaves")


def test_deleting_an_event_and_closing_the_gap_in_the_leaves_is_detected(chain):
    """The tree equivalent of relinking the chain round a deleted event: renumber the
    later leaves. Every signed head past it no longer has the leaves' root (one more
    batch first, so that a head covers exactly the leaves left)."""
    note(chain)
    services.audit_integrate(chain)
    rows = leaves(chain)
    tampering.raw(f"DELETE FROM {LEAVES} WHERE id = %s", [rows[2].pk])
    tampering.raw(f"DELETE FROM {EVENTS} WHERE id = %s", [rows[2].event_id])
    for leaf in rows[3:]:
        tampering.raw(f'UPDATE {LEAVES} SET "index" = %s WHERE id = %s',
                      [leaf.index - 1, leaf.pk])
    first_after = min(h.tree_size for h in AuditTreeHead.objects.filter(
        tenant=chain, tree_size__gt=2))
    assert broken("acme") == (f"audit chain broken for: acme: tree head size {first_after}: "
                              "its root is not the leaves' (leaves rewritten or reordered)")
    record("delete one event, renumber the later leaves", bypass(), "detected",
           "verifier: signed head's root")


def test_a_rewritten_event_and_its_leaf_are_detected(chain):
    """Was "rewrite one event, rehash the rest": events keyed alone have no rest to
    rehash; the attacker rehashes the event (SHA-256, no key) and its leaf."""
    event = AuditEvent.objects.get(pk=leaves(chain)[3].event_id)
    tampering.rewrite_event(event, leaf=True, reason="nothing to see", actor_name="mallory")
    assert broken() == (f"audit chain broken for: acme: event seq {event.seq} (id {event.pk}) "
                        "does not match its hash (HMAC)")
    record("rewrite one event, rehash it and its leaf (SHA-256)", bypass(), "detected",
           "verifier: HMAC of the rewritten event")


def test_swapped_leaves_with_every_head_root_recomputed_are_detected(chain):
    """The rest of a rehash, on the tree: two leaves swapped and every signed head's root
    recomputed from the leaves (``test_reordered_leaves_are_detected`` without it); there
    is no Ed25519 key to sign them."""
    rows = leaves(chain)
    a, b = rows[1:3]
    for leaf, index in ((a, -1), (b, 1), (a, 2)):
        tampering.raw(f'UPDATE {LEAVES} SET "index" = %s WHERE id = %s', [index, leaf.pk])
    hashes = [bytes.fromhex(leaf.hash) for leaf in leaves(chain)]
    for head in AuditTreeHead.objects.filter(tenant=chain, tree_size__gt=1):
        tampering.raw(f"UPDATE {TREE_HEADS} SET root_hash = %s WHERE id = %s",
                      [merkle.root_of(hashes[:head.tree_size]).hex(), head.pk])
    first = AuditTreeHead.objects.filter(tenant=chain, tree_size__gt=1).order_by("tree_size")[0]
    assert broken("acme") == (f"audit chain broken for: acme: tree head size "
                              f"{first.tree_size}: the signature does not verify (forged?)")
    record("swap two leaves, recompute every signed head's root", bypass(), "detected",
           "verifier: Ed25519 head signature")


def test_a_rewrite_passed_off_as_legacy_sha256_is_detected(chain):
    """An event keyed alone relabelled as an unkeyed legacy one (scheme 1, linked to
    nothing before it, rehashed): it falls into the chain's numbering, which it breaks."""
    event = AuditEvent.objects.get(pk=leaves(chain)[3].event_id)
    event.reason, event.hash_scheme = "nothing to see", AuditHashScheme.SHA256
    tampering.raw(f"UPDATE {EVENTS} SET reason = %s, hash_scheme = 1, prev_hash = %s, "
                  "hash = %s WHERE id = %s",
                  [event.reason, GENESIS, legacy_hash(GENESIS, audit_fields(event)), event.pk])
    assert broken("acme") == (f"audit chain broken for: acme: gap before seq {event.seq} "
                              "(seq 1 expected)")
    record("same, labelled legacy SHA-256", bypass(), "detected",
           "verifier: not in the sealed legacy chain")


@pytest.mark.parametrize("relabel", [False, True], ids=["as is", "labelled scheme 2"])
def test_changing_an_events_actor_id_is_detected(chain, wendy, wes, relabel):
    """Issue 17, item 13: ``actor_id`` is covered by the event's HMAC (schemes 3 and 4),
    so pointing an event at another account is found; relabelling it as scheme 2 (which
    does not cover it) puts it in the chain's numbering, which it breaks."""
    victim = (AuditEvent.objects.filter(tenant=chain, action="checkpoint.write")
              .order_by("seq").first())
    assert victim.actor_id == wendy.pk and victim.hash_scheme == AuditHashScheme.HMAC_SHA256_LEAF
    tampering.raw(f"UPDATE {EVENTS} SET actor_id = %s" + (", hash_scheme = 2" if relabel else "")
                  + " WHERE id = %s", [wes.pk, victim.pk])
    expected = (f"gap before seq {victim.seq} (seq 1 expected)" if relabel else
                f"event seq {victim.seq} (id {victim.pk}) does not match its hash (HMAC)")
    assert broken() == f"audit chain broken for: acme: {expected}"
    record("point an event at another account (actor_id)"
           + (", labelled scheme 2" if relabel else ""), bypass(), "detected",
           "verifier: " + ("not in the chain" if relabel else "HMAC covers actor_id"))


def test_a_renumbered_event_is_detected(chain):
    """``seq`` is given by the database after the MAC, so the MAC does not cover it; the
    leaf does (``audittree.leaf_input``)."""
    leaf = leaves(chain)[3]
    tampering.raw(f"UPDATE {EVENTS} SET seq = -seq WHERE id = %s", [leaf.event_id])
    event = AuditEvent.objects.get(pk=leaf.event_id)
    assert broken("acme") == (f"audit chain broken for: acme: leaf 3 does not match event seq "
                              f"{event.seq} (id {event.pk}): the leaf or the event was rewritten")
    record("renumber an event (seq)", bypass(), "detected", "verifier: its leaf")


def test_a_rewritten_leaf_is_detected(chain):
    leaf = leaves(chain)[1]
    tampering.raw(f"UPDATE {LEAVES} SET hash = %s WHERE id = %s", ["ab" * 32, leaf.pk])
    event = AuditEvent.objects.get(pk=leaf.event_id)
    assert broken("acme") == (f"audit chain broken for: acme: leaf 1 does not match event seq "
                              f"{event.seq} (id {event.pk}): the leaf or the event was rewritten")
    record("rewrite a leaf", bypass(), "detected", "verifier: leaf recomputed from the event")


def test_reordered_leaves_are_detected(chain):
    a, b = leaves(chain)[1:3]
    tampering.raw(f'UPDATE {LEAVES} SET "index" = -1 WHERE id = %s', [a.pk])
    tampering.raw(f'UPDATE {LEAVES} SET "index" = 1 WHERE id = %s', [b.pk])
    tampering.raw(f'UPDATE {LEAVES} SET "index" = 2 WHERE id = %s', [a.pk])
    first_after = min(h.tree_size for h in AuditTreeHead.objects.filter(
        tenant=chain, tree_size__gt=1))
    assert broken("acme") == (f"audit chain broken for: acme: tree head size {first_after}: "
                              "its root is not the leaves' (leaves rewritten or reordered)")
    record("swap two leaves", bypass(), "detected", "verifier: signed head's root")


def test_a_rewritten_stored_node_is_detected(big):
    node = AuditTreeNode.objects.get(tenant=big, level=8, index=0)
    tampering.raw(f"UPDATE {NODES} SET hash = %s WHERE id = %s", ["cd" * 32, node.pk])
    assert broken("acme") == ("audit chain broken for: acme: stored node level 8 index 0 is "
                              "not the leaves' subtree")
    record("rewrite a stored node (what proofs read)", bypass(), "detected",
           "verifier: node recomputed from the leaves")


def test_a_forged_tree_head_is_detected(chain):
    head = newest_head(chain)
    tampering.raw(f"UPDATE {TREE_HEADS} SET signature = %s WHERE id = %s",
                  [base64.b64encode(b"\x01" * 64).decode(), head.pk])
    assert broken("acme") == (f"audit chain broken for: acme: tree head size {head.tree_size}: "
                              "the signature does not verify (forged?)")
    record("rewrite a signed tree head's signature", bypass(), "detected",
           "verifier: Ed25519 head signature")


def test_the_newest_leaf_deleted_is_detected_under_its_head(chain):
    rows = leaves(chain)
    tampering.raw(f"DELETE FROM {LEAVES} WHERE id = %s", [rows[-1].pk])
    n = len(rows)
    assert broken("acme") == (f"audit chain broken for: acme: the newest tree head covers {n} "
                              f"leaves but the tree has {n - 1} (events were cut)")
    record("delete the newest leaf", bypass(), "detected", "verifier: newest head's size")


def test_a_tree_head_rewound_is_detected(chain, wendy):
    """Was "rewind the chain head" (app role): the app role may not delete a signed head
    (refused above); past the triggers, deleting the newest heads leaves leaves past the
    newest one."""
    keep = newest_head(chain).tree_size
    put_checkpoint(wendy, chain, envelope())
    services.audit_integrate(chain)
    size = newest_head(chain).tree_size
    tampering.raw(f"DELETE FROM {TREE_HEADS} WHERE tenant_id = %s AND tree_size > %s",
                  [chain.pk, keep])
    assert broken("acme") == (f"audit chain broken for: acme: leaves {keep}..{size - 1} lie "
                              f"past the newest tree head (size {keep})")
    record("rewind the signed tree head", bypass(), "detected", "verifier: leaves past the head")


def test_a_tenant_deleted_whole_is_named(chain):
    """Issue 17, item 13: the owner deletes a tenant's row, events, queue, tree and heads
    (and every other row of it); the verifier used to list nothing and exit 0. The
    tenant registry names it."""
    globex = Tenant.objects.get(slug="globex")
    tampering.delete_tenant(globex)
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", stdout=out)
    assert str(caught.value).startswith("audit chain broken for: globex: the tenant "
                                        "registered on ")
    assert f"(id {globex.pk}) is gone: its row, events and chain head were deleted" in str(
        caught.value)
    assert "acme: intact" in out.getvalue()
    record("delete a whole tenant (row, events, tree, heads)", bypass(), "detected",
           "verifier: tenant registry")


def test_a_tenant_deleted_with_its_registration_leaves_a_gap(chain):
    tampering.delete_tenant(chain, registration=True)  # acme, registered before globex
    assert broken() == ("audit chain broken for: (tenant registry): gap before seq 2 (seq 1 "
                        "expected: a tenant's registration was deleted)")
    record("delete a tenant and its registration", bypass(), "detected",
           "verifier: gap in the tenant registry")


def test_a_rewritten_registration_is_detected(chain):
    tampering.raw(f"UPDATE {REGISTRY} SET slug = 'initech' WHERE slug = 'globex'")
    assert "globex: the tenant is not in the tenant registry" in broken()
    assert "does not match its MAC (changed?)" in broken()
    record("rewrite a tenant registration", bypass(), "detected", "verifier: registry MAC")


def test_the_last_tenant_deleted_with_its_registration_is_detected_against_an_export(
        chain, tmp_path):
    """Deleting the newest registration leaves no gap: the verifier alone cannot tell (as
    for a cut of the newest events); a head exported before names the tenant."""
    exported, _ = export_head(tmp_path)
    tampering.delete_tenant(Tenant.objects.get(slug="globex"), registration=True)
    intact()
    assert broken(against=str(exported)).startswith(
        "audit chain broken for: globex: the tenant no longer exists")
    record("delete the newest tenant and its registration", bypass(), "detected",
           "--against exported head (verifier alone: intact)")


def test_a_cut_of_the_newest_events_is_detected_against_an_exported_head(chain, wendy,
                                                                         tmp_path):
    """Was "cut the tail, rewind the head": delete the newest events with their leaves,
    the stored nodes past them and the signed heads past them (``tampering.cut_tree``):
    a consistent, smaller tree the verifier alone cannot tell from an honest one. The
    head exported before it is larger than the tree."""
    keep = newest_head(chain).tree_size
    exported, line = export_head(tmp_path, "acme")
    put_checkpoint(wendy, chain, envelope())
    services.audit_integrate(chain)
    tampering.cut_tree(chain, keep=keep)
    assert newest_head(chain).tree_size == keep
    intact()
    assert broken(against=str(exported)) == (
        f"audit chain broken for: acme: the tree (size {keep}) is behind the exported head "
        f"size {line['tree_size']} (events were cut)")
    record("cut the newest events, their leaves and heads", bypass(), "detected",
           "--against exported head (verifier alone: intact)")


def test_a_cut_and_regrown_tree_is_detected_against_an_exported_head(chain, wendy, tmp_path):
    """The cut above, then new events integrated by the sequencer until the tree is as
    large as the exported head again: the consistency proof fails."""
    keep = newest_head(chain).tree_size
    exported, line = export_head(tmp_path, "acme")
    tampering.cut_tree(chain, keep=keep)
    for _ in range(line["tree_size"] - keep):
        note(chain)
    services.audit_integrate(chain)
    assert newest_head(chain).tree_size == line["tree_size"]
    intact()
    assert broken(against=str(exported)) == (
        f"audit chain broken for: acme: the tree's root at size {line['tree_size']} is not the "
        "exported head's (history was rewritten)")
    record("cut the newest events, append others to the same size", bypass(), "detected",
           "--against: consistency proof (verifier alone: intact)")


def test_an_altered_export_is_detected(chain, tmp_path):
    """After the cut above, the attacker also edits the outside copy to match the tree
    left (its size, root and checkpoint text); the signature is over the old ones."""
    keep = newest_head(chain)
    exported, line = export_head(tmp_path, "acme")
    tampering.cut_tree(chain, keep=keep.tree_size)
    root = bytes.fromhex(keep.root_hash)
    exported.write_text(json.dumps(dict(
        line, tree_size=keep.tree_size, root_hash=keep.root_hash,
        checkpoint=merkle.checkpoint_text(line["origin"], keep.tree_size, root))) + "\n")
    assert broken(against=str(exported)) == (
        f"audit chain broken for: acme: exported head size {keep.tree_size}: the signature "
        "does not verify (altered?)")
    record("cut the newest events and edit the exported head", bypass(), "detected",
           "--against: export signature (Ed25519)")


def test_a_rewritten_queued_event_is_detected(chain):
    """Before the sequencer integrates it, an event is covered by its own HMAC only:
    rewriting it is still found."""
    event = note(chain)
    tampering.rewrite_event(event, reason="nothing to see")
    assert broken("acme") == (f"audit chain broken for: acme: event seq {event.seq} "
                              f"(id {event.pk}) does not match its hash (HMAC)")
    record("rewrite a queued event", bypass(), "detected", "verifier: HMAC")


def test_a_queued_event_deleted_without_its_queue_row_is_detected(chain):
    """The sequencer integrates what is left and keeps the queue row of the missing
    event (evidence), which the verifier names."""
    event = note(chain)
    tampering.raw(f"DELETE FROM {EVENTS} WHERE id = %s", [event.pk])
    assert broken("acme") == (f"audit chain broken for: acme: queued event id {event.pk} is "
                              "gone (deleted before it was integrated)")
    record("delete a queued event", bypass(), "detected", "verifier: its queue row")


def test_a_queued_event_deleted_with_its_queue_row_is_the_bounded_window(chain):
    """The one attack not detected (docs/security/audit.md): an event deleted with its
    queue row before the sequencer integrated it leaves no trace. It needs the triggers
    off (the app role may not delete events), and the time the sequencer leaves: the
    integration lag (p99 under 2 s in bench/bench_audit.py; ``/readyz`` fails past
    ``RECOVERY_AUDIT_LAG_MAX_S``). Once integrated, the same deletion is detected
    (``test_deleting_an_integrated_event_is_detected``)."""
    event = note(chain)
    tampering.raw(f"DELETE FROM {PENDING} WHERE event_id = %s", [event.pk])
    tampering.raw(f"DELETE FROM {EVENTS} WHERE id = %s", [event.pk])
    intact()
    record("delete a queued event and its queue row", bypass(), "NOT detected",
           "the bounded window: integration lag (/readyz past RECOVERY_AUDIT_LAG_MAX_S)")


# --- on a chain written before issue 22 (sealed under the first tree head) -------------------

def test_a_rewrite_of_a_chained_event_with_every_later_hash_recomputed_is_detected(upgraded):
    victim = AuditEvent.objects.get(tenant=upgraded, seq=3)
    tampering.rewrite(upgraded, 3, reason="nothing to see", actor_name="mallory")
    assert broken() == (f"audit chain broken for: acme: event seq 3 (id {victim.pk}) does not "
                        "match its hash (HMAC)")
    record("rewrite one event, rehash the rest (SHA-256)", bypass(), "detected",
           "verifier: HMAC of the rewritten event")


def test_a_chained_rewrite_passed_off_as_legacy_sha256_is_detected(upgraded):
    tampering.rewrite(upgraded, 3, downgrade=True, reason="nothing to see")
    assert "event seq 3 " in broken("acme")
    assert "uses the unkeyed legacy hash outside the sealed legacy range" in broken("acme")
    record("same, labelled legacy SHA-256", bypass(), "detected",
           "verifier: unkeyed hash outside the sealed range")


@pytest.mark.parametrize("relabel", [False, True], ids=["as is", "labelled scheme 2"])
def test_changing_a_chained_events_actor_id_is_detected(upgraded, wendy, wes, relabel):
    victim = (AuditEvent.objects.filter(tenant=upgraded, action="checkpoint.write")
              .order_by("seq").first())
    assert victim.actor_id == wendy.pk and victim.hash_scheme == AuditHashScheme.HMAC_SHA256_ACTOR
    tampering.raw(f"UPDATE {EVENTS} SET actor_id = %s" + (", hash_scheme = 2" if relabel else "")
                  + " WHERE id = %s", [wes.pk, victim.pk])
    assert broken() == (f"audit chain broken for: acme: event seq {victim.seq} (id {victim.pk}) "
                        "does not match its hash (HMAC)")
    record("point an event at another account (actor_id)"
           + (", labelled scheme 2" if relabel else ""), bypass(), "detected",
           "verifier: HMAC covers actor_id (scheme 3)")


def test_deleting_a_chained_event_is_detected(upgraded):
    victim = AuditEvent.objects.get(tenant=upgraded, seq=2)
    tampering.raw(f"DELETE FROM {LEAVES} WHERE event_id = %s", [victim.pk])
    tampering.raw(f"DELETE FROM {EVENTS} WHERE id = %s", [victim.pk])
    assert broken("acme") == "audit chain broken for: acme: gap before seq 3 (seq 2 expected)"
    record("delete one event", bypass(), "detected", "verifier: gap in seq")


@postgres_only
def test_an_owner_who_disables_the_triggers_is_detected(db_roles, chain):
    """Was "delete an event": the event's leaf names it (a foreign key the owner's
    DISABLE TRIGGER USER keeps), so the owner deletes the leaf too."""
    leaf = leaves(chain)[2]
    with db_roles.connect(db_roles.owner) as owner, owner.cursor() as cur:
        for table in (EVENTS, LEAVES):
            cur.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        cur.execute(f"DELETE FROM {LEAVES} WHERE id = %s", [leaf.pk])
        cur.execute(f"DELETE FROM {EVENTS} WHERE id = %s", [leaf.event_id])
        for table in (EVENTS, LEAVES):
            cur.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
    assert broken("acme") == ("audit chain broken for: acme: gap in the tree before leaf 3 "
                              "(leaf 2 expected: deleted)")
    record("disable the triggers, delete an event and its leaf", "owner", "detected",
           "verifier: gap in the leaves")


@postgres_only
def test_a_forged_event_appended_by_the_app_role_is_detected(db_roles, chain):
    """The app role may INSERT events (queued by the trigger), but has no key. Was
    "append a forged event, move the head": there is no chain head to move any more; the
    sequencer integrates the forgery, and its HMAC fails."""
    key_id = audit_keys().newest_id
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(
            f"INSERT INTO {EVENTS} (tenant_id, created_at, actor_name, action, target_type, "
            "target_ref, reason, prev_hash, hash, hash_scheme, key_id) VALUES "
            "(%s, now(), 'rita', 'retry.approve', 'run', 'x', 'looks fine', '', %s, 4, %s) "
            "RETURNING id, seq", [chain.pk, "f" * 64, key_id])
        forged, seq = cur.fetchone()
    assert seq == forged
    assert broken("acme") == (f"audit chain broken for: acme: event seq {seq} (id {forged}) "
                              "does not match its hash (HMAC)")
    record("append a forged event", "app role", "detected", "verifier: HMAC (no key)")


@postgres_only
def test_a_forged_tree_head_appended_by_the_app_role_is_detected(db_roles, chain):
    """The app role may INSERT signed heads (the sequencer does), but has no signing key."""
    head = newest_head(chain)
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(f"INSERT INTO {TREE_HEADS} (tenant_id, tree_size, root_hash, created_at, "
                    "key_id, signature, frontier) VALUES (%s, %s, %s, now(), %s, %s, '[]')",
                    [chain.pk, head.tree_size + 1, "ab" * 32, head.key_id, head.signature])
    assert broken("acme") == (f"audit chain broken for: acme: tree head size "
                              f"{head.tree_size + 1}: the signature does not verify (forged?)")
    record("append a forged signed tree head", "app role", "detected",
           "verifier: Ed25519 head signature (no key)")


@postgres_only
def test_a_queue_row_deleted_by_the_app_role_is_detected(db_roles, chain):
    """The app role may delete queue rows (the sequencer does) but not events: the
    event left behind is neither in the tree nor queued."""
    event = note(chain)
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(f"DELETE FROM {PENDING} WHERE event_id = %s", [event.pk])
    assert broken("acme") == (f"audit chain broken for: acme: event seq {event.seq} "
                              f"(id {event.pk}) is neither in the tree nor queued (its queue "
                              "row was deleted)")
    record("delete an event's queue row", "app role", "detected",
           "verifier: event neither in the tree nor queued")


@postgres_only
def test_a_chain_head_moved_by_the_app_role_is_detected(db_roles, chain):
    """The app role may still UPDATE the chain head (its row is the tenant's write
    gate). With no chain (every event keyed alone) moving it is found; rewinding one is
    ``test_a_chain_head_rewound_by_the_app_role_is_detected``."""
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(f"UPDATE {HEADS} SET seq = 2 WHERE tenant_id = %s", [chain.pk])
    assert broken("acme") == ("audit chain broken for: acme: the chain head is at seq 2 but "
                              "the chained events end at seq 0 (events missing)")
    record("move the chain head", "app role", "detected", "verifier: head past the chain")


@postgres_only
def test_a_chain_head_rewound_by_the_app_role_is_detected(db_roles, upgraded):
    kept = AuditEvent.objects.get(tenant=upgraded, seq=2)
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(f"UPDATE {HEADS} SET seq = 2, last_hash = %s WHERE tenant_id = %s",
                    [kept.hash, upgraded.pk])
    assert broken("acme") == ("audit chain broken for: acme: event seq 3 is past the chain head "
                              "(seq 2)")
    record("rewind the head", "app role", "detected", "verifier: events past the head")


def test_the_untouched_trail_verifies(chain):
    """Control: the trails the attacks start from verify, so each detection above is the
    attack's doing."""
    intact()
    for tenant in Tenant.objects.all():
        assert services.audit_verify(tenant=tenant) == (True, n_events(tenant), "")


def test_the_untouched_upgraded_trail_verifies(upgraded):
    intact()
    events = list(AuditEvent.objects.filter(tenant=upgraded).order_by("seq"))
    assert {e.hash_scheme for e in events} == {AuditHashScheme.HMAC_SHA256_ACTOR,
                                              AuditHashScheme.HMAC_SHA256_LEAF}
    assert services.audit_verify(tenant=upgraded) == (True, len(events), "")
