"""``graph_list``: LangGraph checkpoints with their pending writes, newest first (issue
10; docs/langgraph.md, "list" and "get_tuple"), in pages bounded in rows, bytes and (for
a metadata filter) checkpoints read; each page's payloads are read and audited once per
thread namespace.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from recovery_client import protocol as T

from ... import crypto, roles
from ...audit import audit_record
from ...jsonparse import loads_any
from ...models import Checkpoint, GraphWrite, Tenant
from ...permissions import require
from ...vocab import AuditAction, TargetType
from .common import _scoped

#: At most this many checkpoints are read (and their metadata decrypted) to answer one
#: filtered list page; the page then ends early with ``next_before`` set.
FILTER_SCAN_MAX = 5000
#: Checkpoints read per query while a list page is assembled.
_SCAN_BATCH = 200


# --------------------------------------------------------------------------------------
# list / get_tuple
# --------------------------------------------------------------------------------------

_ORDER = ("-checkpoint_id", "thread_id", "checkpoint_ns")
_ROW = ("pk", "thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id",
        "payload_size", "envelope_id", "run_id")


def _ordered_rows(qs, fields: Iterable[str], batch: int | None = None) -> Iterator[dict]:
    """``qs`` in list order (checkpoint id descending, then thread and namespace), read
    ``batch`` (default ``_SCAN_BATCH``) rows per query by keyset, lazily."""
    fields = tuple(fields)
    batch = batch or _SCAN_BATCH
    last = None
    while True:
        page = qs
        if last is not None:
            cid, tid, ns = last["checkpoint_id"], last["thread_id"], last["checkpoint_ns"]
            page = page.filter(Q(checkpoint_id__lt=cid)
                               | Q(checkpoint_id=cid, thread_id__gt=tid)
                               | Q(checkpoint_id=cid, thread_id=tid, checkpoint_ns__gt=ns))
        rows = list(page.order_by(*_ORDER).values(*fields)[:batch])
        yield from rows
        if len(rows) < batch:
            return
        last = rows[-1]


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0), booleans never equal to numbers,
    objects and arrays member by member."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def graph_list(*, actor, tenant: Tenant, thread_id: str | None = None,
               checkpoint_ns: str | None = None, checkpoint_id: str | None = None,
               before: str | None = None, limit: int = T.DEFAULT_LIMIT,
               metadata_filter: dict | None = None,
               max_bytes: int | None = None) -> tuple[list[dict], str | None]:
    """One page of LangGraph checkpoints, newest first (``GET …/langgraph/checkpoints``,
    LangGraph's ``get_tuple`` and ``list``).

    Narrowed by ``thread_id``, ``checkpoint_ns`` (None: every namespace),
    ``checkpoint_id``, ``before`` (ids sorting strictly before it) and
    ``metadata_filter`` (top-level metadata keys equal, as JSON, to the values given).
    Ordered by checkpoint id descending, then thread and namespace; a page never splits
    checkpoints of several threads that share an id, holds at most ``limit`` tuples
    (unless one such group alone is larger) and about ``max_bytes`` (default four times
    ``RECOVERY_MAX_BODY_BYTES``; at least one tuple), and a filtered page reads at most
    ``FILTER_SCAN_MAX`` checkpoints. Returns ``(tuples, next_before)``: ``next_before``
    (an id to pass as ``before``) is set when more checkpoints remain, even if this
    page holds fewer than ``limit`` (or none). A tuple is ``{"thread_id",
    "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "run_id", "checkpoint",
    "metadata", "pending_writes": [{"task_id", "channel", "value", "idx"}]}``, pending
    writes ordered by task path, task id and idx (as LangGraph's PostgreSQL saver).

    Reads: the scan, then one query each for the page's ciphertexts, its writes and its
    envelopes (no query per tuple). Writes one ``payload.read`` audit event per envelope
    (thread namespace) answered, in one transaction. Raises ``Forbidden``/``NotFound``
    as ``permissions.require``.
    """
    require(actor, tenant, roles.WRITE)
    if max_bytes is None:
        max_bytes = 4 * settings.RECOVERY_MAX_BODY_BYTES
    qs = _scoped(tenant)
    if thread_id is not None:
        qs = qs.filter(thread_id=thread_id)
    if checkpoint_ns is not None:
        qs = qs.filter(checkpoint_ns=checkpoint_ns)
    if checkpoint_id is not None:
        qs = qs.filter(checkpoint_id=checkpoint_id)
    if before is not None:
        qs = qs.filter(checkpoint_id__lt=before)
    fields = _ROW + (("metadata_ciphertext", "writes_bytes") if metadata_filter else
                     ("writes_bytes",))
    # Unfiltered, one query usually reads the page and the row that says more remain.
    rows = _ordered_rows(qs.annotate(writes_bytes=_writes_bytes(tenant)), fields,
                         None if metadata_filter else limit + 1)
    page, more, last_id = _page(tenant, rows, limit, max_bytes, metadata_filter)
    if not page:
        return [], last_id if more else None
    with transaction.atomic():
        tuples = _tuples(tenant, page)
        envelopes = (Checkpoint.objects.for_tenant(tenant)
                     .filter(pk__in={row["envelope_id"] for row in page})
                     .values("pk", "uuid", "revision", "run__uuid"))
        counts: dict[int, int] = {}
        for row in page:
            counts[row["envelope_id"]] = counts.get(row["envelope_id"], 0) + 1
        for env in sorted(envelopes, key=lambda e: str(e["uuid"])):
            audit_record(tenant=tenant, actor=actor, action=AuditAction.PAYLOAD_READ,
                         target_type=TargetType.CHECKPOINT, target_id=env["uuid"],
                         run_id=env["run__uuid"],
                         after={"revision": env["revision"],
                                "graph_checkpoints": counts[env["pk"]]})
    return tuples, last_id if more else None


def _writes_bytes(tenant):
    """Bytes of a row's pending writes (a correlated sum over ``graph_write_unique``,
    which starts with the checkpoint), so a page is bounded before anything is read."""
    return Coalesce(Subquery(
        GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint=OuterRef("pk"))
        .order_by().values("graph_checkpoint").annotate(n=Sum("value_size")).values("n")[:1]),
        0)


def _page(tenant, rows: Iterator[dict], limit: int, max_bytes: int,
          metadata_filter: dict | None) -> tuple[list[dict], bool, str | None]:
    """Take whole groups of equal checkpoint id from ``rows`` while the page has room:
    ``(page, more, last id taken)``."""
    page: list[dict] = []
    size = scanned = 0
    last_id = None
    for checkpoint_id, rest in itertools.groupby(rows, key=lambda r: r["checkpoint_id"]):
        # Stop before reading the group's end: that could cost one more query.
        if page and (len(page) >= limit or size >= max_bytes):
            return page, True, last_id
        if metadata_filter and scanned >= FILTER_SCAN_MAX:
            return page, True, last_id
        group = list(rest)
        hits = [r for r in group if _matches(tenant, r, metadata_filter)]
        hits_size = sum(r["payload_size"] + r["writes_bytes"] for r in hits)
        if page and (len(page) + len(hits) > limit or size + hits_size > max_bytes):
            return page, True, last_id
        page += hits
        size += hits_size
        scanned += len(group)
        last_id = checkpoint_id
    return page, False, last_id


def _matches(tenant, row: dict, metadata_filter: dict | None) -> bool:
    if not metadata_filter:
        return True
    metadata = loads_any(crypto.decrypt_text(row["metadata_ciphertext"], tenant=tenant))
    row["metadata"] = metadata
    return isinstance(metadata, dict) and all(
        key in metadata and _json_equal(metadata[key], value)
        for key, value in metadata_filter.items())


def _tuples(tenant, page: list[dict]) -> list[dict]:
    """The answer's tuples for the page's rows: ciphertexts, writes and run ids read in
    one query each."""
    pks = [row["pk"] for row in page]
    stored = {r["pk"]: r for r in _scoped(tenant).filter(pk__in=pks).values(
        "pk", "checkpoint_ciphertext", "metadata_ciphertext", "run__uuid")}
    writes: dict[int, list[dict]] = {pk: [] for pk in pks}
    for w in (GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint_id__in=pks)
              .order_by("graph_checkpoint_id", "task_path", "task_id", "idx")
              .values("graph_checkpoint_id", "task_id", "channel", "idx", "value_ciphertext")):
        writes[w["graph_checkpoint_id"]].append({
            "task_id": w["task_id"], "channel": w["channel"],
            "value": loads_any(crypto.decrypt_text(w["value_ciphertext"], tenant=tenant)), "idx": w["idx"]})
    out = []
    for row in page:
        s = stored[row["pk"]]
        metadata = row.get("metadata")
        if metadata is None:
            metadata = loads_any(crypto.decrypt_text(s["metadata_ciphertext"], tenant=tenant))
        out.append({
            "thread_id": row["thread_id"], "checkpoint_ns": row["checkpoint_ns"],
            "checkpoint_id": row["checkpoint_id"],
            "parent_checkpoint_id": row["parent_checkpoint_id"] or None,
            "run_id": str(s["run__uuid"]),
            "checkpoint": loads_any(crypto.decrypt_text(s["checkpoint_ciphertext"], tenant=tenant)),
            "metadata": metadata, "pending_writes": writes[row["pk"]],
        })
    return out
