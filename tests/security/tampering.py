"""What an attacker does to the audit tables once past the triggers: a PostgreSQL
superuser who switches them off (``session_replication_role = replica``), or anyone with
the SQLite file. None of these functions has the audit key: rewritten hashes are plain
SHA-256, the best a key-less attacker can compute.
"""

from __future__ import annotations

from django.db import connection, transaction

from checkpoints import audittree
from checkpoints.audit import audit_fields, legacy_hash
from checkpoints.models import (
    AuditChainHead,
    AuditEvent,
    AuditHashScheme,
    AuditLeaf,
    AuditPending,
    AuditTreeHead,
    AuditTreeNode,
)

EVENTS = AuditEvent._meta.db_table
HEADS = AuditChainHead._meta.db_table
LEAVES = AuditLeaf._meta.db_table
NODES = AuditTreeNode._meta.db_table
TREE_HEADS = AuditTreeHead._meta.db_table
PENDING = AuditPending._meta.db_table
#: The tables that only grow (triggers refuse UPDATE, DELETE, TRUNCATE on PostgreSQL).
TREE = (LEAVES, NODES, TREE_HEADS)


def raw(sql: str, params: list | tuple = ()) -> int:
    """Run ``sql`` with the triggers off (PostgreSQL superuser: foreign keys off too) or
    as is (SQLite, which has no triggers; its foreign keys switched off when outside a
    transaction, as anyone with the file can: a test that deletes an event a leaf or a
    queue row names runs with ``transaction=True``); returns the row count."""
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        with connection.cursor() as cur:
            cur.execute("PRAGMA foreign_keys = OFF")
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(sql, params)
                return cur.rowcount
        finally:
            with connection.cursor() as cur:
                cur.execute("PRAGMA foreign_keys = ON")
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute(sql, params)
        count = cur.rowcount
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = origin")
    return count


def set_head(tenant, seq: int, last_hash: str) -> None:
    raw(f"UPDATE {HEADS} SET seq = %s, last_hash = %s WHERE tenant_id = %s",
        [seq, last_hash, tenant.pk])


def rewrite(tenant, seq: int, *, downgrade: bool = False, **changes) -> None:
    """Change chained event ``seq``'s fields (schemes 1-3, written before issue 22), then recompute its hash and every later one with plain
    SHA-256 and move the head along, so that every link and the head agree. With
    ``downgrade`` the rewritten events also claim the unkeyed legacy scheme."""
    events = list(AuditEvent.objects.filter(tenant=tenant).order_by("seq")
                  .exclude(hash_scheme=AuditHashScheme.HMAC_SHA256_LEAF))  # the chained ones
    prev = events[seq - 2].hash if seq > 1 else "0" * 64
    for name, value in changes.items():
        setattr(events[seq - 1], name, value)
    for e in events[seq - 1:]:
        e.prev_hash = prev
        scheme = AuditHashScheme.SHA256 if downgrade else e.hash_scheme
        e.hash_scheme = scheme  # the fields the claimed scheme covers
        e.hash = legacy_hash(prev, audit_fields(e))
        raw(f"UPDATE {EVENTS} SET reason = %s, actor_name = %s, action = %s, prev_hash = %s, "
            f"hash = %s, hash_scheme = %s WHERE id = %s",
            [e.reason, e.actor_name, e.action, e.prev_hash, e.hash, scheme, e.pk])
        prev = e.hash
    set_head(tenant, events[-1].seq, prev)


def rewrite_event(event: AuditEvent, *, leaf: bool = False, **changes) -> None:
    """Change one event (keyed alone, scheme 4) and rehash it with plain SHA-256, the best
    a key-less attacker can do; with ``leaf``, also recompute its leaf's hash so that the
    leaf agrees with the rewritten event."""
    for name, value in changes.items():
        setattr(event, name, value)
    event.hash = legacy_hash("", audit_fields(event))
    raw(f"UPDATE {EVENTS} SET reason = %s, actor_name = %s, action = %s, hash = %s "
        "WHERE id = %s", [event.reason, event.actor_name, event.action, event.hash, event.pk])
    if leaf:
        raw(f"UPDATE {LEAVES} SET hash = %s WHERE event_id = %s",
            [audittree.event_leaf_hash(event).hex(), event.pk])


def cut_tree(tenant, keep: int) -> None:
    """Delete every leaf from index ``keep`` on, their events, the stored nodes and the
    signed heads past ``keep`` leaves: a consistent, shorter tree (the newest surviving
    head covers exactly the leaves left, when a head of that size exists)."""
    ids = list(AuditLeaf.objects.filter(tenant=tenant, index__gte=keep)
               .values_list("event_id", flat=True))
    raw(f"DELETE FROM {LEAVES} WHERE tenant_id = %s AND \"index\" >= %s", [tenant.pk, keep])
    raw(f"DELETE FROM {TREE_HEADS} WHERE tenant_id = %s AND tree_size > %s", [tenant.pk, keep])
    for node_id, level, index in AuditTreeNode.objects.filter(tenant=tenant).values_list(
            "id", "level", "index"):
        if (index + 1) << level > keep:
            raw(f"DELETE FROM {NODES} WHERE id = %s", [node_id])
    for event_id in ids:
        raw(f"DELETE FROM {EVENTS} WHERE id = %s", [event_id])


def cut_tail(tenant, keep: int) -> None:
    """Delete every event after seq ``keep`` and rewind the head to it: a consistent,
    shorter chain."""
    raw(f"DELETE FROM {EVENTS} WHERE tenant_id = %s AND seq > %s", [tenant.pk, keep])
    kept = AuditEvent.objects.get(tenant=tenant, seq=keep)
    set_head(tenant, keep, kept.hash)


def delete_tenant(tenant, *, registration: bool = False) -> None:
    """Delete the tenant altogether, as its owner would with the triggers off: every row
    of every table that names it, its audit events and head, the tenant row; with
    ``registration``, its row of the tenant registry too (issue 17, item 13)."""
    from django.apps import apps

    from checkpoints.models import AuditTenant, Tenant

    tables = [m._meta.db_table for m in apps.get_app_config("checkpoints").get_models()
              if any(f.name == "tenant" for f in m._meta.fields)]
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = replica")  # triggers and FKs off
        else:
            cur.execute("PRAGMA defer_foreign_keys = ON")  # checked at commit: all gone then
        for table in tables:
            cur.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [tenant.pk])
        cur.execute(f"DELETE FROM {Tenant._meta.db_table} WHERE id = %s", [tenant.pk])
        if registration:
            cur.execute(f"DELETE FROM {AuditTenant._meta.db_table} WHERE tenant_pk = %s",
                        [tenant.pk])
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = origin")


def empty(*tables: str, truncate: bool = False) -> None:
    """DELETE every row of ``tables``; with ``truncate``, TRUNCATE them on PostgreSQL (not
    inside a test's transaction: PostgreSQL refuses it there with pending FK checks)."""
    if truncate and connection.vendor == "postgresql":
        raw("TRUNCATE " + ", ".join(tables))
    else:
        for table in tables:
            raw(f"DELETE FROM {table}")


# The tamper set's results (tests/security/test_tamper.py), printed at the end of the run.
RESULTS: list[tuple[str, str, str, str]] = []


def record(attack: str, by: str, outcome: str, how: str) -> None:
    """Note what one attack met: ``refused`` or ``detected``, and by what."""
    RESULTS.append((attack, by, outcome, how))


def results_table(vendor: str) -> list[str]:
    """``RESULTS`` as aligned text lines, titled with the backend."""
    head = ("attack", "by", "result", "how")
    widths = [max(len(r[i]) for r in [head, *RESULTS]) for i in range(4)]
    title = f"tamper set on {vendor}: {len(RESULTS)} attack(s), " + ", ".join(
        f"{sum(r[2] == o for r in RESULTS)} {o}"
        for o in ("refused", "detected", *sorted({r[2] for r in RESULTS} - {"refused", "detected"})))
    if vendor != "postgresql":
        title += " (SQLite has no triggers or roles: only the detections apply)"
    rows = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [head, *RESULTS]]
    return [title, rows[0], "-+-".join("-" * w for w in widths), *rows[1:]]
