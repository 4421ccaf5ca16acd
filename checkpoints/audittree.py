"""The tenant's audit Merkle tree (issue 22, item 1; docs/security/audit.md): the
sequencer that integrates queued events into it and signs a tree head per batch, the
store's subtree reads the proofs are built from, and the tree's verification.

- **Leaves.** Leaf ``i`` of a tenant holds one event; its hash is RFC 6962's
  SHA-256(0x00 || ``leaf_input(event)``), canonical JSON of the event's fields and MAC,
  so anyone holding the event's fields recomputes it without a key.
- **Sequencer** (``audit_integrate``): under a per-tenant lease (a PostgreSQL transaction
  advisory lock, ``locks.try_transaction_key``), in one transaction, takes the queued
  events (``AuditPending``) in id order, appends them as leaves, stores the completed
  subtree roots of ``TILE_LEVELS`` (``AuditTreeNode``), signs the new head with Ed25519
  (``AuditTreeHead``) and deletes the queue rows. Run every second by Celery beat
  (``tasks.audit_integrate``), by the in-process worker, and before a verification or a
  head export.
- **Signing keys.** Each ``RECOVERY_AUDIT_KEYS`` key derives an Ed25519 key (seed =
  HMAC-SHA256(key, ``SEED_LABEL``)); its id is the first 16 hex digits of SHA-256 of the
  raw public key. The signed text is a C2SP tlog checkpoint (``merkle.checkpoint_text``)
  with origin ``recovery.audit/<tenant id>``: an outsider verifies it with the public key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, Max, Min, OuterRef

from . import heartbeat, intranges, locks, merkle, roles, sql
from .audit import GENESIS, _event_problem, _seal_problem, audit_fields, audit_keys, event_mac
from .dbclock import NOW
from .exceptions import InvalidPayload, NotFound, NotIntegrated, TreeIncomplete
from .jsonparse import dumps
from .models import (
    AuditChainHead,
    AuditEvent,
    AuditHashScheme,
    AuditLeaf,
    AuditPending,
    AuditTreeHead,
    AuditTreeNode,
    Tenant,
)
from .permissions import require

SEED_LABEL = b"recovery.audit.ed25519-seed"
#: The levels whose complete subtree roots are stored (``AuditTreeNode``): a proof reads
#: at most 256 rows per subtree it needs.
TILE_LEVELS = (8, 16, 24, 32)
#: How many queued events one transaction integrates at most.
BATCH = 5000
#: The advisory lock class of the sequencer's per-tenant lease ("AUDT").
INTEGRATE_LOCK = 0x41554454
HEARTBEAT = "audit.integrate"


# --------------------------------------------------------------------------------------
# Signing keys
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 key derived from an audit key: ``key_id``, the raw public key."""

    key_id: str
    private: Ed25519PrivateKey
    public_raw: bytes

    @property
    def public_b64(self) -> str:
        return base64.b64encode(self.public_raw).decode("ascii")


@lru_cache(maxsize=16)
def _derive(secret: bytes) -> SigningKey:
    seed = hmac.new(secret, SEED_LABEL, hashlib.sha256).digest()
    private = Ed25519PrivateKey.from_private_bytes(seed)
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return SigningKey(hashlib.sha256(raw).hexdigest()[:16], private, raw)


def signing_keys() -> tuple[SigningKey, dict[str, SigningKey]]:
    """``(newest, {key_id: key})``: the Ed25519 keys of ``RECOVERY_AUDIT_KEYS`` (newest
    first). Raises ``ImproperlyConfigured`` for bad keys."""
    keys = audit_keys()
    by_id = {k.key_id: k for k in (_derive(s) for s in keys.by_id.values())}
    return _derive(keys.newest), by_id


def origin_of(tenant_id: int) -> str:
    """The checkpoint's origin line for the tenant's tree."""
    return f"recovery.audit/{tenant_id}"


def head_problem(head: AuditTreeHead, by_id: dict[str, SigningKey]) -> str:
    """Why ``head``'s signature does not verify, or ""."""
    key = by_id.get(head.key_id)
    if key is None:
        return (f"tree head size {head.tree_size} is signed with unknown key id "
                f"{head.key_id!r} (an old audit key missing from RECOVERY_AUDIT_KEYS?)")
    text = merkle.checkpoint_text(origin_of(head.tenant_id), head.tree_size,
                                  bytes.fromhex(head.root_hash))
    try:
        Ed25519PublicKey.from_public_bytes(key.public_raw).verify(
            base64.b64decode(head.signature), text.encode("utf-8"))
    except (InvalidSignature, ValueError):
        return f"tree head size {head.tree_size}: the signature does not verify (forged?)"
    return ""


# --------------------------------------------------------------------------------------
# Leaves and subtrees
# --------------------------------------------------------------------------------------

def leaf_input(e: AuditEvent) -> bytes:
    """The leaf's input for event ``e``: canonical JSON (``jsonparse.dumps``) of the
    tenant, the event's seq, scheme, key id, chain link and MAC, and the fields its MAC
    covers (``audit.audit_fields``). Public: anyone with the event's fields recomputes
    the leaf hash (``merkle.leaf_hash``) without a key."""
    return dumps({"tenant": e.tenant_id, "seq": e.seq, "scheme": int(e.hash_scheme),
                  "key_id": e.key_id, "prev_hash": e.prev_hash, "hash": e.hash,
                  "event": audit_fields(e)}).encode("utf-8")


def event_leaf_hash(e: AuditEvent) -> bytes:
    """``merkle.leaf_hash(leaf_input(e))``."""
    return merkle.leaf_hash(leaf_input(e))


def perfect_reader(tenant_id: int):
    """A ``merkle.Perfect`` callback over the tenant's stored leaves and nodes: a stored
    node when its level is stored, else the 2**k rows of the nearest stored level below,
    folded. Raises ``TreeIncomplete`` when rows are missing."""
    cache: dict[tuple[int, int], bytes] = {}

    def perfect(level: int, index: int) -> bytes:
        if (level, index) in cache:
            return cache[(level, index)]
        base = max([lvl for lvl in TILE_LEVELS if lvl <= level], default=0)
        span = 1 << (level - base)
        first = index * span
        if base == 0:
            rows = (AuditLeaf.objects.for_tenant(tenant_id)
                    .filter(index__gte=first, index__lt=first + span).order_by("index")
                    .values_list("index", "hash"))
        else:
            rows = (AuditTreeNode.objects.for_tenant(tenant_id)
                    .filter(level=base, index__gte=first, index__lt=first + span)
                    .order_by("index").values_list("index", "hash"))
        rows = list(rows)
        if [i for i, _ in rows] != list(range(first, first + span)):
            raise TreeIncomplete(f"level {base} rows {first}..{first + span - 1} are not all "
                                 "stored")
        hashes = [bytes.fromhex(h) for _, h in rows]
        while len(hashes) > 1:
            hashes = [merkle.node_hash(hashes[i], hashes[i + 1])
                      for i in range(0, len(hashes), 2)]
        cache[(level, index)] = hashes[0]
        return hashes[0]

    return perfect


# --------------------------------------------------------------------------------------
# The sequencer
# --------------------------------------------------------------------------------------

def newest_head(tenant_id: int) -> AuditTreeHead | None:
    """The tenant's newest signed tree head (largest size), or None."""
    return AuditTreeHead.objects.for_tenant(tenant_id).order_by("-tree_size").first()


def audit_integrate(tenant: Tenant | int, *, limit: int = BATCH) -> int:
    """Integrate up to ``limit`` of the tenant's queued audit events into its Merkle tree
    and sign the new head, in one transaction under the tenant's sequencer lease (issue
    22, item 1). Returns how many events it integrated: 0 when none were queued or
    another sequencer holds the lease (it integrates them). A queue row whose event is
    gone (deleted past the triggers) is left in place for the verifier to name. Raises
    ``ImproperlyConfigured`` for bad ``RECOVERY_AUDIT_KEYS``."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    with transaction.atomic():
        if not locks.try_transaction_key(INTEGRATE_LOCK, tenant_id):
            return 0
        # The oldest ``limit`` queued events that exist: a queue row whose event is gone
        # is skipped, not counted, so no number of them can stall the tenant's sealing
        # (they filled every batch of 5,000 before: the newcomer's finding).
        events = list(AuditEvent.objects.for_tenant(tenant_id).filter(
            pk__in=AuditPending.objects.for_tenant(tenant_id).values("event_id"))
            .order_by("pk")[:limit])
        if not events:  # none queued, or only rows of deleted events (kept as evidence)
            return 0
        head = newest_head(tenant_id)
        size = head.tree_size if head else 0
        frontier = [bytes.fromhex(h) for h in head.frontier] if head else []
        leaves, nodes = [], []
        for e in events:
            leaf = event_leaf_hash(e)
            leaves.append({"tenant_id": tenant_id, "index": size, "event_id": e.pk,
                           "hash": leaf.hex()})
            frontier, completed = merkle.append(frontier, size, leaf)
            nodes.extend({"tenant_id": tenant_id, "level": lvl, "index": idx, "hash": h.hex()}
                         for lvl, idx, h in completed if lvl in TILE_LEVELS)
            size += 1
        sql.insert_rows(AuditLeaf, leaves)
        sql.insert_rows(AuditTreeNode, nodes)
        _sign_head(tenant_id, size, merkle.frontier_root(frontier), frontier)
        # Only the rows of the events integrated: a row whose event is gone (deleted
        # past the triggers) stays as evidence (``tree_problem``: "queued event ... gone").
        AuditPending.objects.for_tenant(tenant_id).filter(
            event_id__in=[e.pk for e in events]).delete()
    return len(events)


def _sign_head(tenant_id: int, size: int, root: bytes, frontier: list[bytes]) -> None:
    newest, _ = signing_keys()
    text = merkle.checkpoint_text(origin_of(tenant_id), size, root)
    signature = base64.b64encode(newest.private.sign(text.encode("utf-8"))).decode("ascii")
    AuditTreeHead.objects.create(tenant_id=tenant_id, tree_size=size, root_hash=root.hex(),
                                 created_at=NOW, key_id=newest.key_id, signature=signature,
                                 frontier=[h.hex() for h in frontier])


def audit_integrate_all(*, limit: int = BATCH) -> int:
    """One sequencer round over every tenant with queued events (ascending tenant id),
    each drained in batches of ``limit``; records the ``audit.integrate`` heartbeat
    (database clock). Returns how many events were integrated. What Celery beat
    (``tasks.audit_integrate``, every ``RECOVERY_AUDIT_INTEGRATE_INTERVAL_S``) and the
    in-process worker run."""
    total = 0
    tenant_ids = sorted(set(AuditPending.objects.for_all_tenants(
        reason="the sequencer looks for every tenant with queued audit events")
        .values_list("tenant_id", flat=True).distinct()))
    for tenant_id in tenant_ids:
        while True:
            done = audit_integrate(tenant_id, limit=limit)
            total += done
            if done < limit:
                break
    heartbeat.beat(HEARTBEAT)
    return total


def _lag(qs) -> tuple[int, float]:
    """``(queued, age in seconds of the oldest)`` of a queue queryset: one aggregate
    query, ``queued_at`` (written by the database) against the database clock. A queue
    row whose event is gone (deleted past the triggers) is no backlog: the sequencer
    skips it (``audit_integrate``) and the verifier names it; counted, one such row
    failed every node's ``/readyz`` for good, blaming a running sequencer."""
    events = AuditEvent.objects.for_all_tenants(
        reason="whether a queued event still exists (the row's own tenant)")
    row = (qs.filter(Exists(events.filter(pk=OuterRef("event_id"),
                                          tenant_id=OuterRef("tenant_id"))))
           .aggregate(n=Count("pk"), first=Min("queued_at"), now=Max(NOW)))
    if not row["n"] or row["first"] is None:
        return 0, 0.0
    return row["n"], max(0.0, (row["now"] - row["first"]).total_seconds())


def integration_lag() -> dict:
    """The sequencer's backlog over every tenant: ``{"pending": n, "lag_s": age of the
    oldest queued event in seconds (its ``AuditPending.queued_at`` against the database
    clock, one clock; 0 with none queued)}``. One query; for ``/readyz`` and the
    dashboard."""
    pending, lag = _lag(AuditPending.objects.for_all_tenants(
        reason="the sequencer's backlog, all tenants"))
    return {"pending": pending, "lag_s": lag}


def tenant_lag(tenant: Tenant) -> dict:
    """The tenant's backlog and newest head, for the audit page: ``{"pending",
    "lag_s" (the oldest queued event's age, database clock, 0 when none), "tree_size"
    (the newest signed head's, 0 before the first), "head_at" (its signing time, or
    None)}``. Two queries; reads only."""
    pending, lag = _lag(AuditPending.objects.for_tenant(tenant))
    head = newest_head(tenant.pk)
    return {"pending": pending, "lag_s": lag, "tree_size": head.tree_size if head else 0,
            "head_at": head.created_at if head else None}


# --------------------------------------------------------------------------------------
# Proofs
# --------------------------------------------------------------------------------------

def head_json(head: AuditTreeHead) -> dict:
    """A signed tree head as the API and the head export give it: everything an
    outsider needs to check its signature (``merkle.verify_head_line``)."""
    _, by_id = signing_keys()
    key = by_id.get(head.key_id)
    origin = origin_of(head.tenant_id)
    return {"origin": origin, "tree_size": head.tree_size, "root_hash": head.root_hash,
            "created_at": head.created_at.isoformat(), "key_id": head.key_id,
            "public_key": key.public_b64 if key else None, "signature": head.signature,
            "checkpoint": merkle.checkpoint_text(origin, head.tree_size,
                                                 bytes.fromhex(head.root_hash))}


def head_signature_problem(head: dict) -> str:
    """"" when the exported head line ``head`` (``head_json``'s keys) is signed with a key
    this deployment derives from ``RECOVERY_AUDIT_KEYS`` (its id and public key both) and
    its Ed25519 signature verifies over its checkpoint text (``merkle.verify_head_line``);
    else what is wrong, in words. For the head checks of ``verify_audit_chain --against``
    (``audithead``) and of an export's manifest (``auditexport``)."""
    _, by_id = signing_keys()
    key = by_id.get(head["key_id"])
    if key is None:  # a head's id is its Ed25519 key's, not the audit key's (audit.md)
        return (f"signed with a key this deployment does not hold (Ed25519 key id "
                f"{head['key_id']!r}, derived from an audit key: an old audit key missing "
                f"from RECOVERY_AUDIT_KEYS?)")
    if key.public_b64 != head["public_key"]:
        return (f"signed with a key this deployment does not hold (key id "
                f"{head['key_id']!r} names another public key: altered?)")
    problem = merkle.verify_head_line(head)
    return f"{problem} (altered?)" if problem else ""


def inclusion(tenant: Tenant, event: AuditEvent, tree_size: int | None = None) -> dict | None:
    """The inclusion proof of ``event`` (the tenant's) under the newest signed head, or
    under the signed head of ``tree_size`` leaves: ``{"leaf_index", "leaf_input" (the
    text whose leaf hash is proved), "leaf_hash", "tree_head" (``head_json``),
    "audit_path" (hex, bottom up, RFC 6962 2.1.1)}``. None when the event is not
    integrated yet (queued). Raises ``InvalidPayload`` naming ``tree_size`` when it is
    not in ``leaf index + 1`` .. the newest head's size, or no signed head has that size
    (heads are signed per sequencer batch). Reads only (it never integrates); a proof
    reads at most a few hundred stored rows per level of the path (``TILE_LEVELS``)."""
    leaf = AuditLeaf.objects.for_tenant(tenant).filter(event_id=event.pk).first()
    if leaf is None:
        return None
    newest = newest_head(tenant.pk)
    newest_size = newest.tree_size if newest else 0
    head = newest
    if tree_size is not None:
        if not leaf.index < tree_size <= newest_size:
            raise InvalidPayload(
                f"tree_size: must be in {leaf.index + 1}..{newest_size} (the event is leaf "
                f"{leaf.index}; the newest signed tree head has {newest_size} leaves)")
        if tree_size != newest_size:
            head = AuditTreeHead.objects.for_tenant(tenant).filter(tree_size=tree_size).first()
        if head is None:
            raise InvalidPayload(f"tree_size: no signed tree head has {tree_size} leaves "
                                 "(a head is signed per sequencer batch)")
    if head is None or leaf.index >= head.tree_size:  # a leaf past every head: broken tree
        raise TreeIncomplete(f"leaf {leaf.index} lies past the newest signed tree head")
    path = merkle.inclusion_proof(leaf.index, head.tree_size, perfect_reader(tenant.pk))
    return {"leaf_index": leaf.index, "leaf_input": leaf_input(event).decode("utf-8"),
            "leaf_hash": leaf.hash, "tree_head": head_json(head),
            "audit_path": [h.hex() for h in path]}


def audit_proof(*, user, tenant: Tenant, event_id: str, tree_size: int | None = None) -> dict:
    """``GET …/audit-events/{id}/proof`` (issue 22, item 1; CONTRACT.md 8): the event
    (``{"event": AuditEvent}``, the id the audit list gives) and its inclusion proof
    (``inclusion``'s keys) under the newest signed head or the one of ``tree_size``.

    Viewer and up (``roles.VIEW``, from the tenant's grants). Raises ``NotFound`` for an
    id that is not one of the tenant's events (malformed ids included),
    ``NotIntegrated`` (409, ``Retry-After``) while the event is queued, ``InvalidPayload``
    naming ``tree_size`` (``inclusion``). Reads only: a GET never integrates."""
    require(user, tenant, roles.VIEW)
    pk = int(event_id) if _ID_RE.fullmatch(event_id or "") else 0
    event = (AuditEvent.objects.for_tenant(tenant).filter(pk=pk).first()
             if intranges.ROW_ID.contains(pk) else None)
    if event is None:
        raise NotFound("no such audit event")
    proof = inclusion(tenant, event, tree_size)
    if proof is None:
        raise NotIntegrated(f"audit event {event.pk} is queued for the audit sequencer, not "
                            "yet in a signed tree head: retry after Retry-After seconds")
    return {"event": event, **proof}


_ID_RE = re.compile(r"[1-9][0-9]{0,18}")


def consistency_problem(tenant: Tenant, *, size: int, root: bytes) -> str:
    """Whether the tenant's tree still extends a head of ``size`` leaves with ``root``
    (one exported earlier): the stored tree's root at ``size`` must be ``root``, and the
    consistency proof from it to the newest signed head, built from the stored tree,
    must verify (RFC 9162 2.1.4.2). Returns the problem, or
    "". Reads only."""
    newest = newest_head(tenant.pk)
    have = newest.tree_size if newest else 0
    if have < size:
        return (f"the tree (size {have}) is behind the exported head size {size} "
                "(events were cut)")
    perfect = perfect_reader(tenant.pk)
    try:
        here = merkle.frontier_root(merkle.frontier_of(size, perfect))
        proof = merkle.consistency_proof(size, have, perfect)
    except TreeIncomplete as exc:
        return f"the tree cannot prove the exported head size {size}: {exc} (cut?)"
    if here != root:
        return (f"the tree's root at size {size} is not the exported head's (history was "
                "rewritten)")
    new_root = bytes.fromhex(newest.root_hash) if newest else merkle.EMPTY_ROOT
    if not merkle.verify_consistency(size, have, root, new_root, proof):
        return (f"the tree (size {have}) is not consistent with the exported head size "
                f"{size} (history was rewritten)")
    return ""


# --------------------------------------------------------------------------------------
# Verifying the tree
# --------------------------------------------------------------------------------------

def tree_problem(tenant: Tenant, event_ids: dict[int, int]) -> str:
    """Check the tenant's tree against its events (``{id: seq}``, every event of the
    tenant, already verified on their own): leaves numbered 0..n-1, each naming a
    distinct event of the tenant and matching it (``leaf_input``), stored nodes equal to
    the leaves' subtrees, every head signed (Ed25519) with a root equal to the leaves' at
    its size, the newest head covering exactly the leaves, and every event in the tree or
    still queued. Returns the first problem, or "". Reads only."""
    # Long on purpose: one pass over the leaves, each check where its data is at hand.
    _, by_id = signing_keys()
    heads = list(AuditTreeHead.objects.for_tenant(tenant).order_by("tree_size"))
    for head in heads:
        problem = head_problem(head, by_id)
        if problem:
            return problem
    roots = {h.tree_size: h.root_hash for h in heads}
    nodes = dict(((lvl, idx), h) for lvl, idx, h in AuditTreeNode.objects.for_tenant(tenant)
                 .values_list("level", "index", "hash"))
    frontier: list[bytes] = []
    seen: set[int] = set()
    size = 0
    chunk: list[tuple[int, int, str]] = []
    rows = (AuditLeaf.objects.for_tenant(tenant).order_by("index")
            .values_list("index", "event_id", "hash").iterator(chunk_size=2000))
    done = False
    while not done:
        chunk.clear()
        for row in rows:
            chunk.append(row)
            if len(chunk) == 2000:
                break
        done = len(chunk) < 2000
        events = AuditEvent.objects.for_tenant(tenant).in_bulk([r[1] for r in chunk])
        for index, event_id, stored in chunk:
            if index != size:
                return f"gap in the tree before leaf {index} (leaf {size} expected: deleted)"
            e = events.get(event_id)
            if e is None:
                return (f"leaf {index} names event id {event_id}, which is not one of the "
                        "tenant's events (deleted?)")
            if event_id in seen:
                return f"leaf {index} holds event seq {e.seq} (id {event_id}) a second time"
            seen.add(event_id)
            leaf = event_leaf_hash(e)
            if not hmac.compare_digest(leaf.hex(), stored):
                return (f"leaf {index} does not match event seq {e.seq} (id {event_id}): the "
                        "leaf or the event was rewritten")
            frontier, completed = merkle.append(frontier, size, leaf)
            for lvl, idx, h in completed:
                if lvl in TILE_LEVELS and nodes.get((lvl, idx)) != h.hex():
                    return f"stored node level {lvl} index {idx} is not the leaves' subtree"
            size += 1
            if size in roots and roots[size] != merkle.frontier_root(frontier).hex():
                return (f"tree head size {size}: its root is not the leaves' (leaves "
                        "rewritten or reordered)")
    newest = heads[-1].tree_size if heads else 0
    if newest > size:
        return (f"the newest tree head covers {newest} leaves but the tree has {size} "
                "(events were cut)")
    if newest < size:
        return f"leaves {newest}..{size - 1} lie past the newest tree head (size {newest})"
    pending = set(AuditPending.objects.for_tenant(tenant).values_list("event_id", flat=True))
    for event_id, seq in sorted(event_ids.items(), key=lambda item: item[1]):
        if event_id not in seen and event_id not in pending:
            return (f"event seq {seq} (id {event_id}) is neither in the tree nor queued (its "
                    "queue row was deleted)")
        if event_id in seen and event_id in pending:
            return f"event seq {seq} (id {event_id}) is in the tree and queued again"
    gone = sorted(pending - set(event_ids))
    if gone:
        return f"queued event id {gone[0]} is gone (deleted before it was integrated)"
    return ""


def event_alone_problem(e: AuditEvent, keys) -> str:
    """Why a scheme-4 event (keyed on its own) does not verify, or ""."""
    where = f"event seq {e.seq} (id {e.pk})"
    if e.prev_hash:
        return f"{where} is keyed alone (scheme 4) but names a previous hash"
    secret = keys.by_id.get(e.key_id)
    if secret is None:
        return (f"{where} is signed with unknown audit key id {e.key_id!r} "
                "(an old key missing from RECOVERY_AUDIT_KEYS?)")
    expected = event_mac(secret, tenant_id=e.tenant_id, key_id=e.key_id, prev_hash="",
                         fields=audit_fields(e), scheme=e.hash_scheme)
    if not hmac.compare_digest(expected, e.hash):
        return f"{where} does not match its hash (HMAC)"
    return ""


def audit_verify(*, tenant: Tenant) -> tuple[bool, int, str]:
    """Check the tenant's whole audit trail against its keys, chain head and tree.

    Returns ``(intact, events checked, first problem or "")``. The chained events
    (schemes 1-3, written before issue 22) as before: seq 1..m without gap, each linked to
    the one before and matching its HMAC (plain SHA-256 only inside the sealed legacy
    range), the chain head (``AuditChainHead``) exactly at the last of them. Every event
    keyed alone (scheme 4) matches its HMAC. Then the tree (``tree_problem``): leaves,
    stored nodes, signed heads, and every event in the tree or still queued. Broken too
    when the tenant has no event at all (its creation is always audited). Reads only:
    run ``audit_integrate`` first to verify everything committed. Raises
    ``ImproperlyConfigured`` for bad ``RECOVERY_AUDIT_KEYS``.

    On PostgreSQL, outside a caller's transaction, every read is of one snapshot
    (``REPEATABLE READ``): the events are read before the queue, and an event committed
    between the two reads was taken for a queued event that is gone, a false "BROKEN"
    while the service wrote (a newcomer's finding: 2 runs in 4 beside a token issue).
    """
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return _audit_verify(tenant)
    return _audit_verify(tenant)


def _audit_verify(tenant: Tenant) -> tuple[bool, int, str]:
    """``audit_verify``'s reads, in the caller's transaction or snapshot."""
    keys = audit_keys()
    head = AuditChainHead.objects.for_tenant(tenant).first()
    legacy_seq = head.legacy_seq if head is not None else 0
    prev, chained, n = GENESIS, 0, 0
    event_ids: dict[int, int] = {}
    for e in AuditEvent.objects.for_tenant(tenant).order_by("seq").iterator(chunk_size=2000):
        n += 1
        event_ids[e.pk] = e.seq
        if e.hash_scheme == AuditHashScheme.HMAC_SHA256_LEAF:
            problem = event_alone_problem(e, keys)
            if problem:
                return False, n, problem
            continue
        chained += 1
        if head is None:
            return False, n, "the chain head is missing but chained events exist"
        if e.seq != chained:
            return False, n, f"gap before seq {e.seq} (seq {chained} expected)"
        if e.seq > head.seq:
            return False, n, f"event seq {e.seq} is past the chain head (seq {head.seq})"
        problem = _event_problem(e, prev, keys, legacy_seq)
        if not problem and e.seq == legacy_seq:
            problem = _seal_problem(head, e.hash, keys)
        if problem:
            return False, n, problem
        prev = e.hash
    if n == 0:
        return False, 0, "no audit chain at all (every tenant's creation is audited)"
    if head is not None and head.seq != chained:
        return False, n, (f"the chain head is at seq {head.seq} but the chained events end "
                          f"at seq {chained} (events missing)")
    if head is not None and chained and head.last_hash != prev:
        return False, n, f"the chain head's hash is not event seq {chained}'s"
    if legacy_seq > chained:
        return False, n, f"the legacy seal (seq {legacy_seq}) lies past the last event"
    problem = tree_problem(tenant, event_ids)
    return (not problem), n, problem


class AuditLate(Exception):
    """An audit event waited longer than ``RECOVERY_AUDIT_LAG_MAX_S`` to be integrated."""


def audit_health() -> str | None:
    """The ``audit`` check of ``/readyz``: None (ok) unless the oldest queued audit event
    is older than ``RECOVERY_AUDIT_LAG_MAX_S`` (database clock), then raises
    ``AuditLate`` (the sequencer is not running: beat, the worker, or the in-process
    worker is down). Two queries at most."""
    lag = integration_lag()
    bound = settings.RECOVERY_AUDIT_LAG_MAX_S
    if lag["lag_s"] > bound:
        raise AuditLate(f"{lag['pending']} audit event(s) queued, the oldest {lag['lag_s']:.0f} s "
                        f"(more than {bound} s: is the audit sequencer running?)")
    return None
