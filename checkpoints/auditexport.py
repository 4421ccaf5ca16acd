"""The audit export's files: a tenant's audit events and tombstones as JSON Lines, and a
signed manifest (issue 20, item 5; docs/security/audit.md, "The audit export").
``services.audit_export`` writes them and records the export; this module holds the
format, the manifest's signature and the verifier, which needs the files and the audit
keys only (not the database), so an export proves what it holds after the database, or
the tenant's data in it, is gone.

An export covers a prefix of the tenant's sealed Merkle tree (``FORMAT``, v2): the events
of leaves 0..S-1, S the size of a signed tree head (``AuditTreeHead``). Leaves are only
appended from committed events and a signed head fixes its leaves for ever, so the
export claims exactly what it holds; a watermark by ``seq`` (the row's id, given at
INSERT, not at commit) could not (an event with a lower seq can commit later). A
directory holds one export:

- ``audit.jsonl``: one event a line, in leaf order (0..S-1), each with every field its
  hash covers (``EVENT_FIELDS``), so each line's HMAC and its leaf hash
  (``audittree.leaf_input``) recompute from the file;
- ``tombstones.jsonl``: one tombstone a line, ascending id, up to ``through_tombstone``
  (the newest one the exported deletions name; those still there: a purged tombstone is
  gone, its event stays);
- ``manifest.json``: ``MANIFEST_FIELDS``, among them ``tree_head`` (the signed tree head
  of size ``through_tree_size``, the line ``export_audit_head`` prints, with its Ed25519
  public key) and ``signature`` an HMAC-SHA256 (newest audit key) over the others.

An export written before (``FORMAT_V1``: events by seq 1..``through_seq``, no tree head,
``MANIFEST_FIELDS_V1``) still verifies as it did. Each line is canonical JSON
(``jsonparse.dumps``) and a newline.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from contextlib import closing
from datetime import datetime
from pathlib import Path

from django.utils.dateparse import parse_datetime

from . import audittree, merkle
from .audit import GENESIS, HEX64_RE, MISSING_KEY_HINT, _event_problem, audit_keys
from .audithead import audit_head_parse
from .audittree import event_alone_problem, event_leaf_hash
from .exceptions import InvalidPayload, TreeIncomplete
from .jsonparse import dumps, loads_object
from .models import (
    AuditChainHead,
    AuditEvent,
    AuditHashScheme,
    AuditLeaf,
    AuditTreeHead,
    Tenant,
    Tombstone,
)
from .vocab import AuditAction

#: An export of a prefix of the tenant's Merkle tree (leaves 0..through_tree_size-1).
FORMAT = "recovery.audit-export.v2"
#: An export by seq (1..through_seq), written before the tree prefix: verifies as it did.
FORMAT_V1 = "recovery.audit-export.v1"
AUDIT_FILE, TOMBSTONE_FILE, MANIFEST_FILE = "audit.jsonl", "tombstones.jsonl", "manifest.json"
FILES = (AUDIT_FILE, TOMBSTONE_FILE)
EVENT_FIELDS = ("seq", "created_at", "actor", "actor_id", "action", "target_type",
                "target_id", "run_id", "reason", "before", "after", "prev_hash", "hash",
                "hash_scheme", "key_id")
#: Present only on an event that has it (issue 21): the incident its actor worked on.
OPTIONAL_EVENT_FIELD = "incident_ref"
MANIFEST_FIELDS_V1 = ("format", "tenant", "tenant_id", "through_seq", "last_hash",
                      "through_tombstone", "legacy_seq", "counts", "sha256", "exported_at",
                      "key_id", "signature")
#: ``through_seq`` is the highest seq exported and ``last_hash`` that event's hash (for
#: the readers of v1); ``through_tree_size`` and ``tree_head`` say what is exported.
MANIFEST_FIELDS = (*MANIFEST_FIELDS_V1[:-2], "through_tree_size", "tree_head",
                   *MANIFEST_FIELDS_V1[-2:])
#: The events whose ``after.tombstone`` names the tombstone their deletion wrote.
DELETIONS = (AuditAction.RUN_PURGE, AuditAction.RUN_ERASE)
MANIFEST_MAX_BYTES = 64 * 1024


def event_line(e: AuditEvent) -> dict:
    """One ``audit.jsonl`` line: the event's hashed fields and its chain fields."""
    return {"seq": e.seq, "created_at": e.created_at.isoformat(), "actor": e.actor_name,
            "actor_id": e.actor_id, "action": e.action, "target_type": e.target_type,
            "target_id": e.target_ref, "run_id": str(e.run_uuid) if e.run_uuid else None,
            "reason": e.reason, "before": e.before, "after": e.after,
            "prev_hash": e.prev_hash, "hash": e.hash, "hash_scheme": e.hash_scheme,
            "key_id": e.key_id, **({"incident_ref": e.incident_ref} if e.incident_ref else {})}


def tombstone_line(t: Tombstone, erasure_uuid) -> dict:
    """One ``tombstones.jsonl`` line: every column of the tombstone (no payload value is
    in one), the erasure request by its public id."""
    return {"id": t.pk, "run_id": str(t.run_uuid), "kind": t.kind,
            "schema_version": t.schema_version, "final_state": t.final_state,
            "cause": t.cause, "run_created_at": t.run_created_at.isoformat(),
            "ended_at": t.ended_at.isoformat() if t.ended_at else None,
            "deleted_at": t.deleted_at.isoformat(), "policy": t.policy, "counts": t.counts,
            "erasure": str(erasure_uuid) if erasure_uuid else None}


class LineWriter:
    """Writes canonical JSON lines to a new file (never over an existing one), counting
    them and hashing what it writes; ``close`` flushes to disk."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "x", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.sha = hashlib.sha256()
        self.count = 0

    def write(self, line: dict) -> None:
        text = dumps(line) + "\n"
        self.fh.write(text)
        self.sha.update(text.encode("utf-8"))
        self.count += 1

    def close(self) -> str:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        return self.sha.hexdigest()


def write_files(tenant: Tenant, out: Path, head: AuditTreeHead) -> dict:
    """Write ``audit.jsonl`` (the events of leaves 0..``head.tree_size``-1, in leaf order)
    and ``tombstones.jsonl`` (the tombstones up to the newest one those events' deletions
    name) into ``out``; returns ``{"through_seq" (the highest seq exported),
    "last_hash" (that event's hash), "through_tombstone", "counts", "sha256"}``.

    The leaves' hashes are recomputed from the events written and must fold into
    ``head``'s root: else the files are removed and ``exceptions.TreeIncomplete`` is raised
    (the tree is broken: ``verify_audit_chain`` names how). Reads committed, immutable
    rows without locks. Raises ``FileExistsError``/``OSError`` from the files."""
    events = LineWriter(out / AUDIT_FILE)
    try:
        try:
            found = _write_leaves(tenant, head, events)
        finally:
            events_sha = events.close()
    except TreeIncomplete:
        (out / AUDIT_FILE).unlink(missing_ok=True)
        raise
    stones = LineWriter(out / TOMBSTONE_FILE)
    try:
        for t, erasure in _tombstones(tenant, found["through_tombstone"]):
            stones.write(tombstone_line(t, erasure))
    finally:
        stones_sha = stones.close()
    return {**found, "counts": {"events": events.count, "tombstones": stones.count},
            "sha256": {AUDIT_FILE: events_sha, TOMBSTONE_FILE: stones_sha}}


def _write_leaves(tenant: Tenant, head: AuditTreeHead, events: LineWriter) -> dict:
    """Write the events of leaves 0..head.tree_size-1 and check their root (``write_files``)."""
    through_tombstone, through_seq, last_hash = 0, 0, GENESIS
    frontier: list[bytes] = []
    size = 0
    leaves = (AuditLeaf.objects.for_tenant(tenant).filter(index__lt=head.tree_size)
              .order_by("index").select_related("event").iterator(chunk_size=2000))
    with closing(leaves):  # its cursor closed when a broken leaf stops the walk
        for leaf in leaves:
            e = leaf.event
            if leaf.index != size or e.tenant_id != tenant.pk:
                raise TreeIncomplete(f"leaf {size} is missing or not one of the tenant's "
                                     "events")
            events.write(event_line(e))
            frontier, _ = merkle.append(frontier, size, event_leaf_hash(e))
            size += 1
            if e.seq > through_seq:
                through_seq, last_hash = e.seq, e.hash
            if e.action in DELETIONS and isinstance(e.after, dict):
                named = e.after.get("tombstone")
                if type(named) is int and named > through_tombstone:
                    through_tombstone = named
    if size != head.tree_size or merkle.frontier_root(frontier).hex() != head.root_hash:
        raise TreeIncomplete(f"the events of leaves 0..{head.tree_size - 1} do not hash to "
                             f"the signed tree head's root (run verify_audit_chain)")
    return {"through_seq": through_seq, "last_hash": last_hash,
            "through_tombstone": through_tombstone}


def _tombstones(tenant: Tenant, through: int):
    qs = (Tombstone.objects.for_tenant(tenant).filter(id__lte=through).order_by("id")
          .select_related("erasure"))
    for t in qs.iterator(chunk_size=2000):
        yield t, (t.erasure.uuid if t.erasure_id else None)


def manifest_fields(manifest: dict) -> tuple[str, ...]:
    """The fields of ``manifest``'s format: ``MANIFEST_FIELDS_V1`` for ``FORMAT_V1``,
    else ``MANIFEST_FIELDS``."""
    return MANIFEST_FIELDS_V1 if manifest.get("format") == FORMAT_V1 else MANIFEST_FIELDS


def manifest_signature(secret: bytes, manifest: dict) -> str:
    """HMAC-SHA256 hex over the manifest's fields (those of its format) other than
    ``signature``."""
    message = {"purpose": "audit-export-manifest",
               **{k: manifest[k] for k in manifest_fields(manifest) if k != "signature"}}
    return hmac.new(secret, dumps(message).encode("utf-8"), hashlib.sha256).hexdigest()


def sign_manifest(manifest: dict) -> dict:
    """``manifest`` with ``key_id`` and ``signature`` (the newest audit key) set."""
    keys = audit_keys()
    manifest = dict(manifest, key_id=keys.newest_id)
    manifest["signature"] = manifest_signature(keys.newest, manifest)
    return manifest


def legacy_seq_of(tenant: Tenant) -> int:
    """Where the tenant's sealed unkeyed events end (0: none)."""
    return (AuditChainHead.objects.for_tenant(tenant)
            .values_list("legacy_seq", flat=True).first()) or 0


# --------------------------------------------------------------------------------------
# Verifying an export (files and keys only)
# --------------------------------------------------------------------------------------

def regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (never a FIFO or device to block on), symlinks
    not followed."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_manifest(directory: Path) -> dict:
    """Parse ``manifest.json`` of an export directory (``FORMAT`` or ``FORMAT_V1``).
    Raises ``InvalidPayload`` naming the field: unreadable, not strict JSON, an unknown
    format, a field missing or unknown, or of the wrong type (``tree_head`` as
    ``audithead.audit_head_parse`` reads a head line)."""
    path = directory / MANIFEST_FILE
    if not regular(path):
        raise InvalidPayload(f"manifest: {path} is missing or not a regular file")
    try:
        raw = path.read_bytes()[: MANIFEST_MAX_BYTES + 1]
    except OSError as exc:
        raise InvalidPayload(f"manifest: cannot read {path} ({exc.strerror})") from None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise InvalidPayload(f"manifest: larger than {MANIFEST_MAX_BYTES} bytes")
    m = loads_object(raw, max_depth=3, what="manifest")
    if m.get("format") not in (FORMAT, FORMAT_V1):
        raise InvalidPayload(f"manifest.format: must be {FORMAT} or {FORMAT_V1}")
    fields = manifest_fields(m)
    missing = [k for k in fields if k not in m]
    unknown = [str(k)[:40] for k in m if k not in fields]
    if missing or unknown:
        raise InvalidPayload(f"manifest: {'missing ' + ', '.join(missing) if missing else ''}"
                             f"{'unknown ' + ', '.join(unknown) if unknown else ''}")
    for name in ("through_seq", "through_tombstone", "legacy_seq", "tenant_id",
                 "through_tree_size"):
        if name in fields and (type(m[name]) is not int or not 0 <= m[name] < 2**63):
            raise InvalidPayload(f"manifest.{name}: must be an integer >= 0")
    for name in ("format", "tenant", "exported_at", "key_id"):
        if not isinstance(m[name], str):
            raise InvalidPayload(f"manifest.{name}: must be a string")
    for name in ("last_hash", "signature"):
        if not isinstance(m[name], str) or not HEX64_RE.match(m[name]):
            raise InvalidPayload(f"manifest.{name}: must be 64 lower-case hex digits")
    if not (isinstance(m["sha256"], dict) and set(m["sha256"]) == set(FILES)
            and all(isinstance(v, str) and HEX64_RE.match(v) for v in m["sha256"].values())):
        raise InvalidPayload(f"manifest.sha256: must map {', '.join(FILES)} to hex digests")
    if not (isinstance(m["counts"], dict) and set(m["counts"]) == {"events", "tombstones"}
            and all(type(v) is int for v in m["counts"].values())):
        raise InvalidPayload("manifest.counts: must be {events, tombstones} integers")
    if "tree_head" in fields:
        if not isinstance(m["tree_head"], dict):
            raise InvalidPayload("manifest.tree_head: must be a signed tree head object")
        try:
            audit_head_parse(dumps(m["tree_head"]))
        except InvalidPayload as exc:
            raise InvalidPayload(f"manifest.tree_head.{exc.detail}") from None
        if "tree_size" not in m["tree_head"]:
            raise InvalidPayload("manifest.tree_head: must be a signed tree head (tree_size)")
    return m


def tree_head_problem(m: dict) -> str:
    """Why the manifest's ``tree_head`` (a ``FORMAT`` export) is not the signed head of
    the export's tree prefix, or "": its size must be ``through_tree_size``, it must name
    the manifest's tenant and that tenant's tree (origin), its key must be one this
    deployment derives from ``RECOVERY_AUDIT_KEYS`` and its Ed25519 signature verify over
    its checkpoint text with the public key it carries (``merkle.verify_head_line``)."""
    head = m["tree_head"]
    where = f"manifest.tree_head (size {head['tree_size']})"
    if head["tree_size"] != m["through_tree_size"]:
        return f"{where}: not the size the manifest exports ({m['through_tree_size']})"
    if head["tenant"] != m["tenant"] or head["origin"] != audittree.origin_of(m["tenant_id"]):
        return f"{where}: another tree's ({head['origin']!r}, tenant {head['tenant']!r})"
    problem = audittree.head_signature_problem(head)
    return f"{where}: {problem}" if problem else ""


def _event_of(line: dict, tenant_id: int) -> AuditEvent:
    created = parse_datetime(line["created_at"]) if isinstance(line["created_at"], str) \
        else None
    if not isinstance(created, datetime):
        raise InvalidPayload("created_at: not an ISO 8601 time")
    return AuditEvent(
        tenant_id=tenant_id, seq=line["seq"], created_at=created, actor_name=line["actor"],
        actor_id=line["actor_id"], action=line["action"], target_type=line["target_type"],
        target_ref=line["target_id"], run_uuid=line["run_id"], reason=line["reason"],
        before=line["before"], after=line["after"], prev_hash=line["prev_hash"],
        hash=line["hash"], hash_scheme=line["hash_scheme"], key_id=line["key_id"],
        incident_ref=line.get("incident_ref"))


def _line_event(raw: bytes, m: dict) -> AuditEvent:
    """An ``audit.jsonl`` line as an (unsaved) event. Raises ``InvalidPayload``."""
    line = loads_object(raw, what="line")
    if set(line) - {OPTIONAL_EVENT_FIELD} != set(EVENT_FIELDS):
        raise InvalidPayload("line: not an audit event's fields")
    event = _event_of(line, m["tenant_id"])
    if type(event.seq) is not int or type(event.hash_scheme) is not int:
        raise InvalidPayload("line: seq and hash_scheme must be integers")
    return event


def _check_events(path: Path, m: dict, problems: list[str]) -> None:
    """Each event's HMAC (and, chained, its link: seq 1..m in order); a ``FORMAT_V1``
    export's scheme-4 seqs increasing; a ``FORMAT`` export's leaf hashes folding into its
    signed head's root (RFC 6962). Then the manifest's ``through_seq``/``last_hash``: the
    highest seq in the file and its hash."""
    keys, prev, seq, top, top_hash, chained = audit_keys(), GENESIS, 0, 0, GENESIS, 0
    tree = m["format"] == FORMAT
    frontier: list[bytes] = []
    size = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            where = f"{AUDIT_FILE} line {number}"
            try:
                event = _line_event(raw, m)
            except InvalidPayload as exc:
                problems.append(f"{where}: {exc.detail}")
                return
            if event.hash_scheme == AuditHashScheme.HMAC_SHA256_LEAF:
                # Keyed alone (issue 22): its MAC; by seq (v1), seq increasing (the row's
                # id); in a tree prefix (v2), the leaf order places it, not its seq.
                problem = event_alone_problem(event, keys)
                if not problem and not tree and event.seq <= seq:
                    problem = f"seq {event.seq} is not after seq {seq}"
            else:
                chained += 1
                problem = (f"seq {event.seq} where {chained} was expected"
                           if event.seq != chained
                           else _event_problem(event, prev, keys, m["legacy_seq"]))
                prev = event.hash
            if problem:
                problems.append(f"{where}: {problem.replace(' (id None)', '')}")
                return
            if tree:
                frontier, _ = merkle.append(frontier, size, event_leaf_hash(event))
            size += 1
            seq = event.seq
            if seq > top:
                top, top_hash = seq, event.hash
    if tree and not _root_holds(m, size, frontier, problems):
        return
    if top != m["through_seq"]:
        problems.append(f"{AUDIT_FILE}: ends at seq {top}, the manifest says {m['through_seq']}")
    elif top_hash != m["last_hash"]:
        problems.append(f"{AUDIT_FILE}: the last event's hash is not the manifest's last_hash")


def _root_holds(m: dict, size: int, frontier: list[bytes], problems: list[str]) -> bool:
    """Whether the file's ``size`` leaves (``frontier``) are the signed head's tree."""
    head = m["tree_head"]
    if size != head["tree_size"]:
        problems.append(f"{AUDIT_FILE}: {size} event(s), the signed tree head covers "
                        f"{head['tree_size']} leaves (a line dropped or added?)")
        return False
    if merkle.frontier_root(frontier).hex() != head["root_hash"]:
        problems.append(f"{AUDIT_FILE}: the Merkle root of its {size} leaves is not the "
                        "signed tree head's (an event altered, dropped or reordered?)")
        return False
    return True


def verify_export(directory: str | Path) -> tuple[dict | None, list[str]]:
    """Check an export directory with the audit keys alone: the manifest's signature
    (with the key its ``key_id`` names); a ``FORMAT`` export's signed tree head
    (``tree_head_problem``); each file's SHA-256 and line count; every event's HMAC (the
    chained ones linked, seq 1..m), and, in a tree prefix, the RFC 6962 root of the
    file's leaves (each recomputed from its line, ``audittree.leaf_input``, in file
    order) equal to the signed head's, the file holding exactly its ``tree_size``
    leaves; a ``FORMAT_V1`` export's seqs increasing; the highest seq and its hash the
    manifest's ``through_seq`` and ``last_hash``; the tombstones' ids (ascending, none
    past ``through_tombstone``). Returns ``(manifest or None, problems)``, each problem
    naming the file or field; no problem means the files are as exported. Reads only
    (no database query)."""
    directory = Path(directory)
    try:
        m = read_manifest(directory)
    except InvalidPayload as exc:
        return None, [exc.detail]
    secret = audit_keys().by_id.get(m["key_id"])
    if secret is None:
        return m, [f"manifest: signed with unknown audit key id {m['key_id']!r} "
                   f"{MISSING_KEY_HINT}"]
    if not hmac.compare_digest(manifest_signature(secret, m), m["signature"]):
        return m, ["manifest: the signature does not verify (altered?)"]
    problem = tree_head_problem(m) if m["format"] == FORMAT else ""
    if problem:
        return m, [problem]
    problems: list[str] = []
    for name, count_key in ((AUDIT_FILE, "events"), (TOMBSTONE_FILE, "tombstones")):
        sha, lines = hashlib.sha256(), 0
        if not regular(directory / name):
            problems.append(f"{name}: missing or not a regular file")
            continue
        try:
            with open(directory / name, "rb") as fh:
                for chunk in fh:
                    sha.update(chunk)
                    lines += 1
        except OSError as exc:
            problems.append(f"{name}: cannot read ({exc.strerror})")
            continue
        if not hmac.compare_digest(sha.hexdigest(), m["sha256"][name]):
            problems.append(f"{name}: its SHA-256 is not the manifest's (altered?)")
        if lines != m["counts"][count_key]:
            problems.append(f"{name}: {lines} line(s), the manifest says "
                            f"{m['counts'][count_key]}")
    if not problems:
        _check_events(directory / AUDIT_FILE, m, problems)
        _check_tombstones(directory / TOMBSTONE_FILE, m, problems)
    return m, problems


def _check_tombstones(path: Path, m: dict, problems: list[str]) -> None:
    last = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                ident = loads_object(raw, what="line").get("id")
            except InvalidPayload as exc:
                problems.append(f"{TOMBSTONE_FILE} line {number}: {exc.detail}")
                return
            if type(ident) is not int or not last < ident <= m["through_tombstone"]:
                problems.append(f"{TOMBSTONE_FILE} line {number}: id {ident!r} is not "
                                f"ascending up to through_tombstone {m['through_tombstone']}")
                return
            last = ident


def export_db_problem(m: dict) -> str:
    """Whether the database still holds what the export holds; "" when it does or the
    export is empty. A ``FORMAT`` export: the tenant's tree still extends the exported
    signed head (``audittree.consistency_problem``: a consistency proof, RFC 9162), as
    ``audit_head_check`` does for a head line. Both formats: the database still holds
    the event at ``through_seq`` with ``last_hash``. Reads only."""
    tenant = Tenant.objects.filter(slug=m["tenant"]).first()
    if tenant is None:
        return "the tenant no longer exists"
    if m["format"] == FORMAT:
        problem = audittree.consistency_problem(
            tenant, size=m["through_tree_size"],
            root=bytes.fromhex(m["tree_head"]["root_hash"]))
        if problem:
            return problem
    if m["through_seq"] == 0:
        return ""
    stored = (AuditEvent.objects.for_tenant(tenant).filter(seq=m["through_seq"])
              .values_list("hash", flat=True).first())
    if stored is None:
        return f"exported seq {m['through_seq']} is no longer in the chain (events were cut)"
    if not hmac.compare_digest(stored, m["last_hash"]):
        return f"event seq {m['through_seq']} no longer has the exported hash (rewritten)"
    return ""


def erased_event_count(tenant: Tenant) -> int:
    """How many of the tenant's audit events refer to a run whose payloads were deleted
    (its ``run_uuid`` has a ``Tombstone``): one query. A tombstone purged later no longer
    counts (its run's events stay; the export that preceded the purge lists it)."""
    return (AuditEvent.objects.for_tenant(tenant)
            .filter(run_uuid__in=Tombstone.objects.for_tenant(tenant).values("run_uuid"))
            .count())
