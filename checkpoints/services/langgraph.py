"""LangGraph threads on recovery (issue 10; docs/langgraph.md, "Server").

A LangGraph thread is one run (``recovery_client.protocol.thread_run_id``); each (thread,
namespace) is one checkpoint envelope of kind ``langgraph.checkpoint``
(``thread_checkpoint_id``) whose revisions summarise the namespace's head; each LangGraph
checkpoint is a ``GraphCheckpoint`` row and each pending write a ``GraphWrite`` row.

The head of a namespace is its checkpoint with the greatest id (ids compare byte-wise,
as LangGraph's own savers order them: what ``get_tuple`` answers is what a resuming
graph names as its parent). Every accepted put, and every ``put_writes`` that stores
something on the head, writes one envelope revision through ``checkpoint_put`` (the
compare-and-swap, fencing, phase class, recovery state and audit event of any other
checkpoint). Each write takes the run's lock, then the envelope's, before it reads the
head, so a put and a ``put_writes`` of one thread are serialised and never make a
spurious conflict of each other (lock order of DESIGN.md 5: run, object, audit head).

Refusals are kept like every other refused write (CONTRACT.md 3): the conflict row, the
run's count and its audit event commit, and the error (``ThreadConflict`` 412,
``Fenced`` 409) is raised after the commit.

Every value from the body is checked against its column and the limits of
``recovery_client.protocol`` before any query (``parse_put``, ``parse_writes``,
``check_thread_id``...): 400 ``invalid_payload`` naming the field.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from recovery_client import protocol as T

from .. import crypto, kinds, locks, roles
from ..audit import audit_record
from ..exceptions import (
    DomainError,
    Fenced,
    InvalidPayload,
    NotFound,
    StaleRevision,
    ThreadConflict,
)
from ..jsonparse import dumps, loads_any, printable, text_problem
from ..models import (
    Checkpoint,
    Conflict,
    Effect,
    GraphCheckpoint,
    GraphWrite,
    ReconcileRequest,
    RetryRequest,
    Run,
    Tenant,
)
from ..permissions import require
from ..vocab import AuditAction, ConflictReason, TargetType
from .checkpoints import Envelope, _envelope_json, checkpoint_put
from .runs import _check_fence, _drop_if_empty, _lock_run, _record_conflict, run_save

# LangGraph's own channel and task names (langgraph._internal._constants), read from
# checkpoints: the server never imports LangGraph.
START = "__start__"
BRANCH_TO = "branch:to:"
TASKS_CHANNEL = "__pregel_tasks"
INTERRUPT = "__interrupt__"
ERROR = "__error__"
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"

#: Characters no thread, namespace, checkpoint, task id or channel may hold (C0, DEL, C1).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: At most this many checkpoints are read (and their metadata decrypted) to answer one
#: filtered list page; the page then ends early with ``next_before`` set.
FILTER_SCAN_MAX = 5000
#: Checkpoints read per query while a list page is assembled.
_SCAN_BATCH = 200
_I32 = 2**31
_I63 = 2**63
CLOSED_REASON = "thread deleted"


# --------------------------------------------------------------------------------------
# Field checks (CONTRACT.md 6: every value fits its column before any query)
# --------------------------------------------------------------------------------------

def _text(value: Any, field: str, *, max_len: int, min_len: int = 1) -> str:
    if not isinstance(value, str):
        raise InvalidPayload(f"{field}: must be a string")
    if not min_len <= len(value) <= max_len:
        raise InvalidPayload(f"{field}: must be {min_len}..{max_len} characters")
    problem = text_problem(value)
    if problem:
        raise InvalidPayload(f"{field}: {problem}")
    if _CONTROL_RE.search(value):
        raise InvalidPayload(f"{field}: control characters are not allowed")
    return value


def check_thread_id(value: Any, field: str = "thread_id") -> str:
    """A LangGraph thread id: a string of 1..256 characters, no control characters."""
    return _text(value, field, max_len=T.MAX_THREAD_ID)


def check_ns(value: Any, field: str = "checkpoint_ns") -> str:
    """A LangGraph checkpoint namespace: 0..256 characters ("" is the root graph)."""
    return _text(value, field, max_len=T.MAX_CHECKPOINT_NS, min_len=0)


def check_checkpoint_id(value: Any, field: str = "checkpoint_id") -> str:
    """A LangGraph checkpoint id: 1..128 characters (LangGraph's are 36)."""
    return _text(value, field, max_len=T.MAX_CHECKPOINT_ID)


def check_lg_run_id(value: Any, field: str = "run_id") -> str:
    """A LangGraph run id (``metadata["run_id"]``): 1..128 characters."""
    return _text(value, field, max_len=T.MAX_LG_RUN_ID)


def _typed(value: Any, field: str) -> dict:
    """The serializer's output ``{"type": str, "b64": str}``: the type 1..64 characters,
    ``b64`` standard base64. Never decoded further."""
    if not isinstance(value, dict) or set(value) != {"type", "b64"}:
        raise InvalidPayload(f'{field}: must be {{"type": str, "b64": str}}')
    _text(value["type"], f"{field}.type", max_len=T.MAX_TYPE)
    raw = value["b64"]
    if not isinstance(raw, str):
        raise InvalidPayload(f"{field}.b64: must be a string")
    try:
        base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidPayload(f"{field}.b64: not standard base64") from None
    return value


#: A string channel version as LangGraph's savers make them (``"{int:032}.{random}"``):
#: ASCII digits, then optionally a dot and anything. ``str.isdigit`` is not the rule:
#: it takes "²" or "①", which ``int()`` refuses (issue 10, hostile finding).
_STR_VERSION_RE = re.compile(r"[0-9]+(?:\..*)?", re.DOTALL)


def _version(value: Any, field: str) -> Any:
    """A channel version as LangGraph writes them: an integer (64-bit), a finite number,
    or a string of at most 128 characters that starts with ASCII digits, optionally
    followed by ``.`` and anything (``"<int>.<random>"``). Checked here, so comparing
    versions (``_version_key``) cannot fail later. Raises ``InvalidPayload`` naming
    ``field``."""
    if isinstance(value, bool):
        raise InvalidPayload(f"{field}: must be an integer, a number or a string")
    if isinstance(value, int):
        if not -_I63 <= value < _I63:
            raise InvalidPayload(f"{field}: must fit in 64 bits")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        _text(value, field, max_len=128)
        if not _STR_VERSION_RE.fullmatch(value):
            raise InvalidPayload(f'{field}: a string version must be ASCII digits, '
                                 f'optionally followed by "." and anything')
        return value
    raise InvalidPayload(f"{field}: must be an integer, a number or a string")


def _versions(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidPayload(f"{field}: must be an object")
    for key, version in value.items():
        where = f"{field}.{printable(key)}"
        _text(key, where, max_len=T.MAX_CHANNEL)
        _version(version, where)
    return value


def _version_key(value: Any) -> tuple:
    """How LangGraph compares versions: numbers numerically; ``"<int>.<frac>"`` strings
    by their integer prefix, then as strings (docs/langgraph.md, "Mapping"). A body's
    versions passed ``_version``; a string that does not (a row stored before that rule)
    counts as prefix 0 rather than failing."""
    if isinstance(value, str):
        return (int(value.split(".", 1)[0]) if _STR_VERSION_RE.fullmatch(value) else 0,
                value)
    return (value, "")


def next_nodes(checkpoint: dict) -> list[str]:
    """The nodes the checkpoint triggers next, sorted: a channel ``branch:to:<node>`` (or
    ``__start__``, node ``__start__``) with a value, whose version is newer than the one
    ``versions_seen[node]`` holds for it (LangGraph's ``_triggers``)."""
    values, versions = checkpoint["channel_values"], checkpoint["channel_versions"]
    seen = checkpoint["versions_seen"]
    nodes = set()
    for channel, version in versions.items():
        if channel not in values:
            continue
        if channel == START:
            node = START
        elif channel.startswith(BRANCH_TO) and len(channel) > len(BRANCH_TO):
            node = channel[len(BRANCH_TO):]
        else:
            continue
        saw = seen.get(node)
        saw = saw.get(channel) if isinstance(saw, dict) else None
        if saw is None or _version_key(saw) < _version_key(version):
            nodes.add(node)
    return sorted(nodes)


def _task_count(checkpoint: dict, nxt: list[str], sends: int | None = None) -> int:
    """``len(next)`` plus the pending sends: ``pending_sends`` of an old checkpoint, and
    the ``Send`` packets in ``__pregel_tasks``: ``sends`` when the saver counted them (the
    value is serialized: an emptied channel still has one), else one for a value there."""
    old = checkpoint.get("pending_sends")
    count = len(nxt) + (len(old) if isinstance(old, list) else 0)
    if sends is not None:
        count += sends
    elif TASKS_CHANNEL in checkpoint["channel_values"]:
        count += 1
    return count


def _breakpoint_nodes(value: Any, field: str) -> str | tuple[str, ...] | None:
    """A put's ``interrupt_before``/``interrupt_after``: null, ``"*"`` or node names."""
    if value is None or value == "*":
        return value
    if not isinstance(value, list) or len(value) > T.MAX_WRITES:
        raise InvalidPayload(f"{field}: must be null, \"*\" or an array of at most "
                             f"{T.MAX_WRITES} node names")
    return tuple(_text(node, f"{field}[{i}]", max_len=T.MAX_CHANNEL)
                 for i, node in enumerate(value))


def _pick(nodes: Iterable[str], wanted: str | tuple[str, ...] | None) -> list[str]:
    if wanted is None:
        return []
    return sorted({n for n in nodes if n != START and (wanted == "*" or n in wanted)})


def breakpoint_of(checkpoint: dict, nxt: list[str], parent_next: list[str] | None,
                  before, after) -> dict | None:
    """Where a graph compiled with static breakpoints stops at this checkpoint, by
    LangGraph's own rule (``pregel._algo.should_interrupt``): some channel's version is
    newer than ``versions_seen["__interrupt__"]`` holds for it, and a task about to run
    (``nxt``; ``interrupt_before``) or the tasks that just ran (the parent's next,
    ``parent_next``; ``interrupt_after``) is a breakpoint node. ``{"when": "before" |
    "after", "nodes": [...]}``, or None. LangGraph writes nothing at such a pause (no
    ``__interrupt__`` write, the checkpoint is the one it put before checking), so only
    the breakpoints the saver sends tell it from a checkpoint whose node is running."""
    seen = checkpoint["versions_seen"].get(INTERRUPT)
    seen = seen if isinstance(seen, dict) else {}
    updated = any(chan not in seen or _version_key(seen[chan]) < _version_key(version)
                  for chan, version in checkpoint["channel_versions"].items())
    if not updated:
        return None
    nodes = _pick(nxt, before)
    if nodes:
        return {"when": "before", "nodes": nodes}
    nodes = _pick(parent_next or (), after)
    if nodes:
        return {"when": "after", "nodes": nodes}
    return None


def _identity(value: Any, field: str = "identity") -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidPayload(f"{field}: must be an object")
    out = {}
    for name, part in value.items():
        if name not in kinds.IDENTITY_LIMITS:
            raise InvalidPayload(f"{field}.{printable(name)}: unknown field (agent, model, "
                                 f"workflow, definition_version)")
        out[name] = _text(part, f"{field}.{name}", max_len=kinds.IDENTITY_LIMITS[name],
                          min_len=0)
    return out


def _only(body: dict, allowed: set[str], where: str = "") -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidPayload(f"{where}{printable(unknown[0])}: unknown field")


# --------------------------------------------------------------------------------------
# Bodies
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GraphPut:
    """A validated put (``parse_put``): ``checkpoint`` with ``channel_values`` kept only
    for channels in ``channel_versions``; ``checkpoint_json``/``metadata_json`` its
    canonical JSON text; ``next``/``tasks`` computed from it."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: dict
    metadata: dict
    identity: dict[str, str] | None
    lg_run_id: str
    checkpoint_json: str
    metadata_json: str
    next: list[str]
    tasks: int
    interrupt_before: str | tuple[str, ...] | None = None
    interrupt_after: str | tuple[str, ...] | None = None


def parse_put(body: dict) -> GraphPut:
    """Validate a ``POST …/langgraph/checkpoints`` body (docs/langgraph.md).

    Fields: ``thread_id``, ``checkpoint_ns`` (default ""), ``parent_checkpoint_id`` (str
    or null, default null), ``checkpoint`` (LangGraph's checkpoint, channel values as
    ``{"type", "b64"}``), ``metadata`` (object), ``identity`` (optional object of the
    four identity strings); the saver's hints, each optional: ``sends`` (int
    0..2^31-1: the ``Send`` packets pending in ``__pregel_tasks``), ``interrupt_before``
    and ``interrupt_after`` (null, ``"*"`` or node names: the graph's static breakpoints,
    ``breakpoint_of``). Raises ``InvalidPayload`` naming the first bad field.
    """
    _only(body, {"thread_id", "checkpoint_ns", "parent_checkpoint_id", "checkpoint",
                 "metadata", "identity", "sends", "interrupt_before", "interrupt_after"})
    thread_id = check_thread_id(body.get("thread_id"))
    ns = check_ns(body.get("checkpoint_ns", ""))
    parent = body.get("parent_checkpoint_id")
    if parent is not None:
        parent = check_checkpoint_id(parent, "parent_checkpoint_id")
    cp = body.get("checkpoint")
    if not isinstance(cp, dict):
        raise InvalidPayload("checkpoint: must be an object")
    checkpoint_id = check_checkpoint_id(cp.get("id"), "checkpoint.id")
    if parent == checkpoint_id:
        raise InvalidPayload("parent_checkpoint_id: equals checkpoint.id")
    if "v" in cp and (type(cp["v"]) is not int or not 0 <= cp["v"] < _I32):
        raise InvalidPayload("checkpoint.v: must be an integer in 0..2^31-1")
    if "ts" in cp:
        _text(cp["ts"], "checkpoint.ts", max_len=64, min_len=0)
    versions = _versions(cp.get("channel_versions"), "checkpoint.channel_versions")
    seen = cp.get("versions_seen")
    if not isinstance(seen, dict):
        raise InvalidPayload("checkpoint.versions_seen: must be an object")
    for node, node_versions in seen.items():
        where = f"checkpoint.versions_seen.{printable(node)}"
        _text(node, where, max_len=T.MAX_CHANNEL)
        _versions(node_versions, where)
    values = cp.get("channel_values")
    if not isinstance(values, dict):
        raise InvalidPayload("checkpoint.channel_values: must be an object")
    for channel, value in values.items():
        where = f"checkpoint.channel_values.{printable(channel)}"
        _text(channel, where, max_len=T.MAX_CHANNEL)
        _typed(value, where)
    updated = cp.get("updated_channels")
    if updated is not None and (not isinstance(updated, list)
                                or not all(isinstance(c, str) for c in updated)):
        raise InvalidPayload("checkpoint.updated_channels: must be null or an array of strings")
    if "pending_sends" in cp and not isinstance(cp["pending_sends"], list):
        raise InvalidPayload("checkpoint.pending_sends: must be an array")
    checkpoint = dict(cp, channel_values={c: v for c, v in values.items() if c in versions})
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InvalidPayload("metadata: must be an object")
    run_value = metadata.get("run_id")
    lg_run_id = ""
    if isinstance(run_value, str) and run_value:
        lg_run_id = _text(run_value, "metadata.run_id", max_len=T.MAX_LG_RUN_ID)
    identity = _identity(body["identity"]) if body.get("identity") is not None else None
    sends = body.get("sends")
    if sends is not None and (type(sends) is not int or not 0 <= sends < _I32):
        raise InvalidPayload("sends: must be an integer in 0..2^31-1")
    before = _breakpoint_nodes(body.get("interrupt_before"), "interrupt_before")
    after = _breakpoint_nodes(body.get("interrupt_after"), "interrupt_after")
    nxt = next_nodes(checkpoint)
    return GraphPut(thread_id, ns, checkpoint_id, parent, checkpoint, metadata, identity,
                    lg_run_id, dumps(checkpoint), dumps(metadata), nxt,
                    _task_count(checkpoint, nxt, sends), before, after)


@dataclass(frozen=True)
class WriteItem:
    idx: int
    channel: str
    value_json: str


@dataclass(frozen=True)
class GraphWrites:
    """A validated ``put_writes`` body (``parse_writes``)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    writes: tuple[WriteItem, ...]


def parse_writes(body: dict) -> GraphWrites:
    """Validate a ``POST …/langgraph/writes`` body: ``thread_id``, ``checkpoint_ns``
    (default ""), ``checkpoint_id``, ``task_id`` (1..128), ``task_path`` (0..1024,
    default ""), ``writes`` (at most 1000 of ``{"idx": int in -2^31..2^31-1, "channel":
    str, "value": {"type", "b64"}}``). A non-negative ``idx`` given twice is refused (one
    write named twice: LangGraph numbers a task's writes by position); a negative one
    (LangGraph's special channels, ``WRITES_IDX_MAP``) given twice keeps the last, as
    LangGraph's savers do (a resumed node sends ``__resume__`` once per answer it
    consumed). Raises ``InvalidPayload``."""
    _only(body, {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "task_path",
                 "writes"})
    thread_id = check_thread_id(body.get("thread_id"))
    ns = check_ns(body.get("checkpoint_ns", ""))
    checkpoint_id = check_checkpoint_id(body.get("checkpoint_id"))
    task_id = _text(body.get("task_id"), "task_id", max_len=T.MAX_TASK_ID)
    task_path = _text(body.get("task_path", ""), "task_path", max_len=T.MAX_TASK_PATH,
                      min_len=0)
    writes = body.get("writes")
    if not isinstance(writes, list) or len(writes) > T.MAX_WRITES:
        raise InvalidPayload(f"writes: must be an array of at most {T.MAX_WRITES} writes")
    items: list[WriteItem] = []
    seen: dict[int, int] = {}  # idx -> its position in items
    for i, write in enumerate(writes):
        where = f"writes[{i}]"
        if not isinstance(write, dict):
            raise InvalidPayload(f"{where}: must be an object")
        _only(write, {"idx", "channel", "value"}, f"{where}.")
        idx = write.get("idx")
        if type(idx) is not int or not -_I32 <= idx < _I32:
            raise InvalidPayload(f"{where}.idx: must be an integer in -2^31..2^31-1")
        if idx >= 0 and idx in seen:
            raise InvalidPayload(f"{where}.idx: given twice")
        channel = _text(write.get("channel"), f"{where}.channel", max_len=T.MAX_CHANNEL)
        item = WriteItem(idx, channel, dumps(_typed(write.get("value"), f"{where}.value")))
        if idx in seen:  # a special channel written again: the last write is the one
            items[seen[idx]] = item
        else:
            seen[idx] = len(items)
            items.append(item)
    return GraphWrites(thread_id, ns, checkpoint_id, task_id, task_path, tuple(items))


def parse_filter(text: str | None) -> dict | None:
    """The list's ``filter`` query parameter: JSON object text (strict, ``jsonparse``),
    metadata keys to values; ``None`` when not given. Raises ``InvalidPayload`` naming
    ``filter``."""
    if text is None:
        return None
    from ..jsonparse import loads_object

    return loads_object(text, what="filter")


# --------------------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------------------

def _scoped(tenant) -> Any:
    return GraphCheckpoint.objects.for_tenant(tenant)


def _head(tenant, thread_id: str, ns: str) -> dict | None:
    """The namespace's head: its checkpoint with the greatest id, or ``None``."""
    return (_scoped(tenant).filter(thread_id=thread_id, checkpoint_ns=ns)
            .order_by("-checkpoint_id")
            .values("pk", "checkpoint_id", "parent_checkpoint_id", "envelope_revision").first())


def _lock_envelope(tenant, envelope_id: uuid.UUID) -> Checkpoint | None:
    return (locks.lock_rows(Checkpoint.objects.for_tenant(tenant))
            .filter(uuid=envelope_id).first())


def _envelope_payload(envelope: Checkpoint | None) -> dict:
    if envelope is None:
        return {}
    payload = loads_any(crypto.decrypt_text(envelope.payload_ciphertext))
    return payload if isinstance(payload, dict) else {}


def _write_facts(tenant, gc_pk: int) -> tuple[int, bool, bool]:
    """``(written_tasks, interrupted, errored)`` of one checkpoint's pending writes: the
    distinct tasks that wrote (LangGraph's null task left out), and whether any wrote
    ``__interrupt__`` / ``__error__``. One query."""
    pairs = set(GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint_id=gc_pk)
                .values_list("task_id", "channel").distinct())
    tasks = {task for task, _ in pairs if task != NULL_TASK_ID}
    channels = {channel for _, channel in pairs}
    return len(tasks), INTERRUPT in channels, ERROR in channels


def _summary(*, thread_id: str, ns: str, checkpoint_id: str, parent: str | None,
             metadata: dict, nxt: list[str], tasks: int, written: int, interrupted: bool,
             errored: bool, identity: dict, breakpoint: dict | None = None) -> dict:
    """The envelope payload of kind ``langgraph.checkpoint`` v1 (``kinds``): no channel
    value, no metadata value but ``step`` and ``source``; ``breakpoint`` only when the
    graph is paused at a static one (``breakpoint_of``)."""
    step = metadata.get("step")
    source = metadata.get("source")
    extra = {"breakpoint": breakpoint} if breakpoint else {}
    return {
        "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent,
        "step": step if type(step) is int and -_I63 <= step < _I63 else None,
        "source": source if isinstance(source, str) and len(source) <= 64 else "",
        "next": nxt, "tasks": tasks, "written_tasks": written, "interrupted": interrupted,
        "errored": errored, "identity": identity, **extra,
    }


def _summary_of_row(tenant, row: dict, thread_id: str, ns: str, identity: dict) -> dict:
    """The summary of a stored checkpoint (``row``: pk, checkpoint_id,
    parent_checkpoint_id), read back: decrypts it and its metadata, counts its writes."""
    stored = (_scoped(tenant).filter(pk=row["pk"])
              .values("checkpoint_ciphertext", "metadata_ciphertext").get())
    cp = loads_any(crypto.decrypt_text(stored["checkpoint_ciphertext"]))
    md = loads_any(crypto.decrypt_text(stored["metadata_ciphertext"]))
    nxt = next_nodes(cp)
    written, interrupted, errored = _write_facts(tenant, row["pk"])
    return _summary(thread_id=thread_id, ns=ns, checkpoint_id=row["checkpoint_id"],
                    parent=row["parent_checkpoint_id"] or None, metadata=md, nxt=nxt,
                    tasks=_task_count(cp, nxt), written=written, interrupted=interrupted,
                    errored=errored, identity=identity)


def _envelope(run: Run, thread_id: str, ns: str, summary: dict, revision: int) -> Envelope:
    return Envelope(checkpoint_id=T.thread_checkpoint_id(thread_id, ns), run_id=run.uuid,
                    revision=revision, kind=T.KIND, schema_version=T.SCHEMA_VERSION,
                    payload=summary, payload_json=dumps(summary),
                    updated_at_ms=int(run.db_now.timestamp() * 1000))


def _write_envelope(actor, tenant, run: Run, thread_id: str, ns: str, summary: dict,
                    expected: int | None, token: int | None) -> Checkpoint | DomainError:
    """One envelope revision through ``checkpoint_put`` (the caller holds the run's and
    the envelope's locks). A refusal (``StaleRevision``, ``Fenced``) is returned, not
    raised: its conflict record stays in the caller's transaction, which commits it."""
    env = _envelope(run, thread_id, ns, summary, 0 if expected is None else expected + 1)
    try:
        checkpoint, _ = checkpoint_put(actor=actor, tenant=tenant, envelope=env,
                                       expected_revision=expected, fencing_token=token)
    except (StaleRevision, Fenced) as exc:
        return exc
    return checkpoint


def _refuse(tenant, actor, run: Run, *, envelope_id, expected, actual, attempted,
            refused: Envelope | None, reason: str, token: int | None = None) -> None:
    """Keep a refused LangGraph write as a conflict of ``run`` (locked, read with the
    database time), in the caller's transaction (``runs._record_conflict``)."""
    _record_conflict(tenant=tenant, run=run, actor=actor, target_type=TargetType.CHECKPOINT,
                     target_id=envelope_id, expected=expected, actual=actual,
                     attempted=attempted, reason=reason, token_sent=token,
                     refused=dumps(_envelope_json(refused)) if refused is not None else "")


# --------------------------------------------------------------------------------------
# put
# --------------------------------------------------------------------------------------

def graph_put(*, actor, tenant: Tenant, put: GraphPut,
              fencing_token: int | None = None) -> tuple[dict, bool]:
    """Store one LangGraph checkpoint (``POST …/langgraph/checkpoints``).

    Accepted when its parent is the head of its (thread, namespace), or when it has no
    parent (appended after the head, as LangGraph's savers accept it), and its id sorts
    after the head's: one new ``GraphCheckpoint`` and one envelope revision
    (``checkpoint_put``, audited) in one transaction. Returns ``(answer, created)``,
    answer ``{"thread_id", "checkpoint_ns", "checkpoint_id", "run_id", "revision"}``;
    the same id with the same content again answers the first put's body with
    ``created=False`` (a retry after a lost answer) and writes nothing.

    Raises ``ThreadConflict`` (412) for a parent that is not the head, an id taken by
    other content, or an id that does not sort after the head's, ``Fenced`` (409) for
    an old or missing fencing token once the run had an owner: both after committing
    the conflict record (when the run exists). ``Forbidden``/``NotFound`` as
    ``permissions.require``.
    """
    require(actor, tenant, roles.WRITE)
    run_id = T.thread_run_id(put.thread_id)
    envelope_id = T.thread_checkpoint_id(put.thread_id, put.checkpoint_ns)
    checkpoint_ct = crypto.encrypt_text(put.checkpoint_json)
    metadata_ct = crypto.encrypt_text(put.metadata_json)
    size = len(put.checkpoint_json.encode()) + len(put.metadata_json.encode())
    refusal: DomainError | None = None
    answer: dict = {}
    created = False
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        new_run = False
        for _attempt in range(2):
            outcome = _decide_put(actor, tenant, run, put, envelope_id, fencing_token,
                                  new_run=new_run)
            if outcome != "create_run":
                break
            new_run = run is None
            run = _lock_run(tenant, run_id, create=True)  # then decide again, locked
        if isinstance(outcome, DomainError):
            refusal = outcome
            if new_run and isinstance(outcome, Fenced):
                # A token this new run never issued: nothing is kept, as the checkpoint
                # API's ``_record_fenced`` keeps nothing for a run new in the write.
                _drop_if_empty(run)
        elif isinstance(outcome, dict):
            answer = outcome
        else:
            envelope, identity = outcome
            head = _envelope_payload(envelope)
            parent_next = head.get("next") if (
                put.parent_checkpoint_id is not None
                and head.get("checkpoint_id") == put.parent_checkpoint_id) else None
            summary = _summary(thread_id=put.thread_id, ns=put.checkpoint_ns,
                               checkpoint_id=put.checkpoint_id, parent=put.parent_checkpoint_id,
                               metadata=put.metadata, nxt=put.next, tasks=put.tasks, written=0,
                               interrupted=False, errored=False, identity=identity,
                               breakpoint=breakpoint_of(put.checkpoint, put.next, parent_next,
                                                        put.interrupt_before,
                                                        put.interrupt_after))
            written = _write_envelope(actor, tenant, run, put.thread_id, put.checkpoint_ns,
                                      summary, envelope.revision if envelope else None,
                                      fencing_token)
            if isinstance(written, DomainError):
                refusal = _as_conflict(written, tenant, put.thread_id, put.checkpoint_ns)
            else:
                GraphCheckpoint.objects.create(
                    tenant=tenant, run=run, envelope_id=written.pk, thread_id=put.thread_id,
                    checkpoint_ns=put.checkpoint_ns, checkpoint_id=put.checkpoint_id,
                    parent_checkpoint_id=put.parent_checkpoint_id or "",
                    lg_run_id=put.lg_run_id, checkpoint_ciphertext=checkpoint_ct,
                    metadata_ciphertext=metadata_ct, payload_size=size,
                    envelope_revision=written.revision, created_at=run.db_now,
                    written_by=actor)
                answer = _put_answer(put, run_id, written.revision)
                created = True
    if refusal is not None:
        raise refusal
    return answer, created


def _put_answer(put: GraphPut, run_id: uuid.UUID, revision: int) -> dict:
    return {"thread_id": put.thread_id, "checkpoint_ns": put.checkpoint_ns,
            "checkpoint_id": put.checkpoint_id, "run_id": str(run_id), "revision": revision}


def _as_conflict(exc: DomainError, tenant, thread_id: str, ns: str) -> DomainError:
    """A ``StaleRevision`` from ``checkpoint_put`` (the envelope moved under a write
    that did not come through here) as the LangGraph 412; ``Fenced`` as it is."""
    if isinstance(exc, StaleRevision) and not isinstance(exc, ThreadConflict):
        head = _head(tenant, thread_id, ns)
        return ThreadConflict(exc.current_revision, head["checkpoint_id"] if head else None,
                              "checkpoint: the namespace's envelope moved meanwhile")
    return exc


def _decide_put(actor, tenant, run: Run | None, put: GraphPut, envelope_id: uuid.UUID,
                token: int | None, *, new_run: bool = False):
    """Under the run's lock (``run`` None: no run yet): a refusal (``DomainError``,
    its conflict recorded), the retry's answer (a dict), ``"create_run"`` (accept, but
    create and lock the run first, then decide again), or ``(envelope, identity)``:
    accept, the envelope locked (None: the first checkpoint of the namespace).
    ``new_run``: this write has just created ``run``; a fenced refusal of it records no
    conflict (the caller drops the run, CONTRACT.md 3 as ``runs._record_fenced``)."""
    envelope = head = None
    if run is not None:
        try:
            _check_fence(run, token, run.db_now)
        except Fenced as exc:
            if new_run:
                return exc
            envelope = _lock_envelope(tenant, envelope_id)
            current = envelope.revision if envelope else None
            _refuse(tenant, actor, run, envelope_id=envelope_id, expected=current,
                    actual=current, attempted=None if current is None else current + 1,
                    refused=None, reason=ConflictReason.FENCED, token=token)
            return exc
        envelope = _lock_envelope(tenant, envelope_id)
        head = _head(tenant, put.thread_id, put.checkpoint_ns)
    current = envelope.revision if envelope is not None else None
    head_id = head["checkpoint_id"] if head else None
    existing = None
    if head_id is not None and put.checkpoint_id <= head_id:  # else it cannot be stored
        existing = (_scoped(tenant).filter(thread_id=put.thread_id,
                                           checkpoint_ns=put.checkpoint_ns,
                                           checkpoint_id=put.checkpoint_id)
                    .values("checkpoint_ciphertext", "metadata_ciphertext",
                            "parent_checkpoint_id", "envelope_revision").first())
    if existing is not None:
        same = (existing["parent_checkpoint_id"] == (put.parent_checkpoint_id or "")
                and crypto.decrypt_text(existing["checkpoint_ciphertext"]) == put.checkpoint_json
                and crypto.decrypt_text(existing["metadata_ciphertext"]) == put.metadata_json)
        if same:
            return _put_answer(put, run.uuid, existing["envelope_revision"])
        _refuse(tenant, actor, run, envelope_id=envelope_id, expected=None, actual=current,
                attempted=None, refused=None, reason=ConflictReason.ID_EXISTS)
        return ThreadConflict(current, head_id, "checkpoint.id: this thread's namespace "
                                                "holds that id with other content")
    identity = put.identity
    if identity is None:  # the namespace's previous one, else the run's (a new subgraph)
        identity = _envelope_payload(envelope).get("identity")
        if identity is None and run is not None:
            identity = {name: getattr(run, name) for name in kinds.IDENTITY_LIMITS
                        if getattr(run, name)}
        identity = identity or {}
    if put.parent_checkpoint_id is not None and put.parent_checkpoint_id != head_id:
        detail = (f"parent_checkpoint_id: not the head of the thread's namespace (the head "
                  f"is {head_id})" if head_id else
                  "parent_checkpoint_id: the thread's namespace has no checkpoint")
        if run is None or envelope is None:
            if run is not None:
                _refuse(tenant, actor, run, envelope_id=envelope_id, expected=None,
                        actual=None, attempted=None, refused=None,
                        reason=ConflictReason.STALE_REVISION)
            return ThreadConflict(current, head_id, detail)
        refused = _envelope(run, put.thread_id, put.checkpoint_ns, _summary(
            thread_id=put.thread_id, ns=put.checkpoint_ns, checkpoint_id=put.checkpoint_id,
            parent=put.parent_checkpoint_id, metadata=put.metadata, nxt=put.next,
            tasks=put.tasks, written=0, interrupted=False, errored=False, identity=identity),
            current + 1)
        parent = (_scoped(tenant).filter(thread_id=put.thread_id,
                                         checkpoint_ns=put.checkpoint_ns,
                                         checkpoint_id=put.parent_checkpoint_id)
                  .values_list("envelope_revision", flat=True).first())
        if parent is not None and parent < current:
            # The writer continues from the revision its parent was written at: the
            # compare-and-swap from there is refused and kept by checkpoint_put itself.
            stale = _write_envelope(actor, tenant, run, put.thread_id, put.checkpoint_ns,
                                    refused.payload, parent, token)
            if isinstance(stale, DomainError):
                return ThreadConflict(current, head_id, detail)
            raise AssertionError("a stale compare-and-swap was accepted under the lock")
        _refuse(tenant, actor, run, envelope_id=envelope_id, expected=None, actual=current,
                attempted=current + 1, refused=refused, reason=ConflictReason.STALE_REVISION)
        return ThreadConflict(current, head_id, detail)
    if head_id is not None and put.checkpoint_id <= head_id:
        _refuse(tenant, actor, run, envelope_id=envelope_id, expected=current, actual=current,
                attempted=current + 1, refused=None, reason=ConflictReason.STALE_REVISION)
        return ThreadConflict(current, head_id, f"checkpoint.id: must sort after the head's "
                                                f"id {head_id} (LangGraph's ids grow)")
    if run is None:
        return "create_run"
    return envelope, identity


# --------------------------------------------------------------------------------------
# put_writes
# --------------------------------------------------------------------------------------

def graph_put_writes(*, actor, tenant: Tenant, body: GraphWrites,
                     fencing_token: int | None = None) -> int:
    """Store a task's pending writes on one checkpoint (``POST …/langgraph/writes``).

    A write whose (task, idx) is stored already is kept when ``idx >= 0`` (a retry) and
    replaced when ``idx < 0`` (LangGraph's special channels), write by write, as
    LangGraph's ``InMemorySaver.put_writes`` (``parse_writes`` keeps the last of a
    special idx the body repeats). Returns how many rows were
    inserted or replaced. When that is not 0: on the namespace's head, one envelope
    revision with the new counts (phase: tasks written, interrupted, errored), audited
    as ``checkpoint.write``; on an older checkpoint, one ``langgraph.writes`` event.
    Raises ``NotFound`` (no such checkpoint), ``Fenced`` (409, after committing its
    conflict record).
    """
    require(actor, tenant, roles.WRITE)
    run_id = T.thread_run_id(body.thread_id)
    envelope_id = T.thread_checkpoint_id(body.thread_id, body.checkpoint_ns)
    sealed = [(w, crypto.encrypt_text(w.value_json), len(w.value_json.encode()))
              for w in body.writes]
    refusal: DomainError | None = None
    stored = 0
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("checkpoint_id: no such checkpoint")
        envelope = _lock_envelope(tenant, envelope_id)
        try:
            _check_fence(run, fencing_token, run.db_now)
        except Fenced as exc:
            current = envelope.revision if envelope else None
            _refuse(tenant, actor, run, envelope_id=envelope_id, expected=current,
                    actual=current, attempted=None, refused=None,
                    reason=ConflictReason.FENCED, token=fencing_token)
            refusal = exc
        else:
            gc = (_scoped(tenant).filter(thread_id=body.thread_id,
                                         checkpoint_ns=body.checkpoint_ns,
                                         checkpoint_id=body.checkpoint_id)
                  .values("pk", "checkpoint_id").first()) if envelope is not None else None
            if gc is None:
                raise NotFound("checkpoint_id: no such checkpoint")
            stored = _store_writes(tenant, gc["pk"], body, sealed, run.db_now)
            if stored:
                refusal = _after_writes(actor, tenant, run, envelope, gc, body, stored,
                                        fencing_token)
    if refusal is not None:
        raise refusal
    return stored


def _store_writes(tenant, gc_pk: int, body: GraphWrites, sealed, now) -> int:
    writes = GraphWrite.objects.for_tenant(tenant)
    existing = dict(writes.filter(graph_checkpoint_id=gc_pk, task_id=body.task_id,
                                  idx__in=[w.idx for w, _, _ in sealed])
                    .values_list("idx", "pk"))
    new, replaced = [], 0
    for write, ciphertext, size in sealed:
        if write.idx in existing:
            if write.idx < 0:
                replaced += writes.filter(pk=existing[write.idx]).update(
                    channel=write.channel, value_ciphertext=ciphertext, value_size=size,
                    task_path=body.task_path, created_at=now)
            continue
        new.append(GraphWrite(tenant=tenant, graph_checkpoint_id=gc_pk, task_id=body.task_id,
                              task_path=body.task_path, idx=write.idx, channel=write.channel,
                              value_ciphertext=ciphertext, value_size=size, created_at=now))
    GraphWrite.objects.bulk_create(new)
    return len(new) + replaced


def _after_writes(actor, tenant, run: Run, envelope: Checkpoint, gc: dict, body: GraphWrites,
                  stored: int, token: int | None) -> DomainError | None:
    head = _head(tenant, body.thread_id, body.checkpoint_ns)
    if head is None or head["pk"] != gc["pk"]:
        audit_record(tenant=tenant, actor=actor, action=AuditAction.LANGGRAPH_WRITES,
                     target_type=TargetType.CHECKPOINT, target_id=envelope.uuid,
                     run_id=run.uuid,
                     after={"checkpoint_id": body.checkpoint_id, "task_id": body.task_id,
                            "stored": stored})
        return None
    payload = _envelope_payload(envelope)
    identity = payload.get("identity") or {}
    if payload.get("checkpoint_id") == gc["checkpoint_id"] and _is_summary(payload):
        written, interrupted, errored = _write_facts(tenant, gc["pk"])
        summary = dict(payload, written_tasks=written, interrupted=interrupted,
                       errored=errored)
    else:
        summary = _summary_of_row(tenant, head, body.thread_id, body.checkpoint_ns, identity)
    result = _write_envelope(actor, tenant, run, body.thread_id, body.checkpoint_ns, summary,
                             envelope.revision, token)
    if isinstance(result, DomainError):
        return _as_conflict(result, tenant, body.thread_id, body.checkpoint_ns)
    return None


def _is_summary(payload: dict) -> bool:
    return kinds.classify(T.KIND, T.SCHEMA_VERSION, payload).supported


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
    page, more, last_id = _page(rows, limit, max_bytes, metadata_filter)
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


def _page(rows: Iterator[dict], limit: int, max_bytes: int,
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
        hits = [r for r in group if _matches(r, metadata_filter)]
        hits_size = sum(r["payload_size"] + r["writes_bytes"] for r in hits)
        if page and (len(page) + len(hits) > limit or size + hits_size > max_bytes):
            return page, True, last_id
        page += hits
        size += hits_size
        scanned += len(group)
        last_id = checkpoint_id
    return page, False, last_id


def _matches(row: dict, metadata_filter: dict | None) -> bool:
    if not metadata_filter:
        return True
    metadata = loads_any(crypto.decrypt_text(row["metadata_ciphertext"]))
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
            "value": loads_any(crypto.decrypt_text(w["value_ciphertext"])), "idx": w["idx"]})
    out = []
    for row in page:
        s = stored[row["pk"]]
        metadata = row.get("metadata")
        if metadata is None:
            metadata = loads_any(crypto.decrypt_text(s["metadata_ciphertext"]))
        out.append({
            "thread_id": row["thread_id"], "checkpoint_ns": row["checkpoint_ns"],
            "checkpoint_id": row["checkpoint_id"],
            "parent_checkpoint_id": row["parent_checkpoint_id"] or None,
            "run_id": str(s["run__uuid"]),
            "checkpoint": loads_any(crypto.decrypt_text(s["checkpoint_ciphertext"])),
            "metadata": metadata, "pending_writes": writes[row["pk"]],
        })
    return out


# --------------------------------------------------------------------------------------
# Deleting, pruning, copying
# --------------------------------------------------------------------------------------

def _referenced(tenant, run: Run) -> bool:
    """Whether anything but checkpoints refers to the run: effects (the evidence of side
    effects), conflicts, retry or reconcile requests."""
    return (Effect.objects.for_tenant(tenant).filter(run=run).exists()
            or Conflict.objects.for_tenant(tenant).filter(run=run).exists()
            or RetryRequest.objects.for_tenant(tenant).filter(run=run).exists()
            or ReconcileRequest.objects.for_tenant(tenant).filter(run=run).exists())


def _delete_in_namespace(actor, tenant, run: Run, thread_id: str, ns: str,
                         pks: list[int]) -> int:
    """Delete the graph checkpoints ``pks`` (and their writes) of one namespace, under
    the run's lock. A namespace whose head went gets an envelope revision describing the
    newest remaining checkpoint; one left empty loses its envelope and its revision
    history. Deletions are not fenced: LangGraph calls them outside any invocation
    (docs/langgraph.md). Returns how many checkpoints went."""
    envelope = _lock_envelope(tenant, T.thread_checkpoint_id(thread_id, ns))
    head_before = _head(tenant, thread_id, ns)
    GraphWrite.objects.for_tenant(tenant).filter(graph_checkpoint_id__in=pks).delete()
    deleted = _scoped(tenant).filter(pk__in=pks).delete()[1].get(GraphCheckpoint._meta.label, 0)
    head = _head(tenant, thread_id, ns)
    if envelope is None:
        return deleted
    if head is None:
        Checkpoint.objects.for_tenant(tenant).filter(pk=envelope.pk).delete()
    elif head_before is None or head["pk"] != head_before["pk"]:
        identity = _envelope_payload(envelope).get("identity") or {}
        summary = _summary_of_row(tenant, head, thread_id, ns, identity)
        current = _lock_run(tenant, run.uuid, create=False)  # fresh: an earlier write moved it
        result = _write_envelope(actor, tenant, current, thread_id, ns, summary,
                                 envelope.revision, current.fencing_token)
        if isinstance(result, DomainError):  # cannot happen under the locks held
            raise RuntimeError(f"langgraph: deleting moved no envelope ({result.error})")
    return deleted


def _settle_run(tenant, run: Run) -> str:
    """After deletions: the run's latest checkpoint is its newest remaining envelope
    (``"kept"``). With none left: deleted when nothing else refers to it
    (``"deleted"``); kept open, its recovery state recomputed without a checkpoint,
    while something awaits a reviewer (``review.awaits_review``: an effect in doubt or
    of unknown outcome, an open retry or reconcile request), so a writer's deletion
    never takes a run out of the inbox (``"awaiting_review"``); else closed as a
    reviewer's close does (``review.close_locked``, reason "thread deleted",
    ``"closed"``)."""
    from .review import awaits_review, close_locked

    run = _lock_run(tenant, run.uuid, create=False)  # fresh, under the lock held
    now = run.db_now
    latest = (Checkpoint.objects.for_tenant(tenant).filter(run=run)
              .order_by("-received_at", "-pk").first())
    if latest is not None:
        run_save(run, now, latest_checkpoint=latest, kind=latest.kind,
                 schema_version=latest.schema_version, phase_class=latest.phase_class,
                 phase_label=latest.phase_label)
        return "kept"
    if not _referenced(tenant, run):
        Run.objects.for_tenant(tenant).filter(pk=run.pk).delete()
        return "deleted"
    # No checkpoint: no phase (resume answers no_checkpoint, nothing is "in flight").
    run_save(run, now, latest_checkpoint=None, phase_class="", phase_label="")
    if run.closed_at is not None:  # a reviewer's own close stays as they left it
        return "closed"
    if awaits_review(run):
        return "awaiting_review"
    close_locked(run, now, closed_by=None, reason=CLOSED_REASON)
    return "closed"


def _delete_from_thread(actor, tenant, thread_id: str, rows_qs, action: str,
                        after: dict) -> int:
    """One thread's deletion in one transaction, under its run's lock: the graph
    checkpoints ``rows_qs`` selects (a queryset of this thread's rows, read after the
    lock), namespace by namespace, then the run settled and one ``action`` audit event
    (``after`` plus ``deleted`` and what became of the run) when anything went."""
    with transaction.atomic():
        run = _lock_run(tenant, T.thread_run_id(thread_id), create=False)
        if run is None:
            return 0
        by_ns: dict[str, list[int]] = {}
        for pk, ns in rows_qs.filter(thread_id=thread_id).values_list("pk", "checkpoint_ns"):
            by_ns.setdefault(ns, []).append(pk)
        deleted = sum(_delete_in_namespace(actor, tenant, run, thread_id, ns, pks)
                      for ns, pks in sorted(by_ns.items()))
        if not deleted:
            return 0
        outcome = _settle_run(tenant, run)
        audit_record(tenant=tenant, actor=actor, action=action, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid,
                     after={**after, "thread_id": thread_id, "deleted": deleted,
                            "run": outcome})
    return deleted


def graph_thread_delete(*, actor, tenant: Tenant, thread_id: str) -> int:
    """Delete every checkpoint and pending write of a LangGraph thread (``POST
    …/langgraph/threads/delete``), every namespace's envelope with its revision history,
    and the thread's run unless something else refers to it (then it is closed, reason
    "thread deleted"). Effects are never deleted. One ``langgraph.thread_delete`` audit
    event in the same transaction. Returns how many checkpoints went (0 for an unknown
    thread: nothing written, nothing audited)."""
    require(actor, tenant, roles.WRITE)
    return _delete_from_thread(actor, tenant, thread_id, _scoped(tenant),
                               AuditAction.LANGGRAPH_THREAD_DELETE, {})


PRUNE_STRATEGIES = ("keep_latest", "delete")


def graph_threads_prune(*, actor, tenant: Tenant, thread_ids: list[str],
                        strategy: str) -> int:
    """LangGraph's ``prune`` (``POST …/langgraph/threads/prune``): ``keep_latest`` keeps
    the head of each namespace and its writes, ``delete`` deletes the threads as
    ``graph_thread_delete``. Each thread in its own transaction with one
    ``langgraph.thread_prune`` event when something went. Returns the checkpoints
    deleted. Raises ``InvalidPayload`` for another strategy."""
    require(actor, tenant, roles.WRITE)
    if strategy not in PRUNE_STRATEGIES:
        raise InvalidPayload("strategy: must be keep_latest or delete")
    total = 0
    for thread_id in sorted(set(thread_ids)):
        rows = _scoped(tenant)
        if strategy == "keep_latest":
            heads = (_scoped(tenant).filter(thread_id=thread_id,
                                            checkpoint_ns=OuterRef("checkpoint_ns"))
                     .order_by("-checkpoint_id").values("pk")[:1])
            rows = rows.exclude(pk=Subquery(heads))
        total += _delete_from_thread(actor, tenant, thread_id, rows,
                                     AuditAction.LANGGRAPH_THREAD_PRUNE,
                                     {"strategy": strategy})
    return total


def graph_runs_delete(*, actor, tenant: Tenant, run_ids: list[str]) -> int:
    """LangGraph's ``delete_for_runs`` (``POST …/langgraph/runs/delete``): delete the
    checkpoints whose ``metadata["run_id"]`` is one of ``run_ids`` (LangGraph run ids,
    not recovery runs), with their writes, in every thread and namespace. Each thread
    in its own transaction with one ``langgraph.runs_delete`` event. Returns the
    checkpoints deleted."""
    require(actor, tenant, roles.WRITE)
    ids = sorted(set(run_ids))
    if not ids:
        return 0
    selected = _scoped(tenant).filter(lg_run_id__in=ids)
    threads = sorted(set(selected.values_list("thread_id", flat=True)))
    return sum(_delete_from_thread(actor, tenant, thread_id, selected,
                                   AuditAction.LANGGRAPH_RUNS_DELETE,
                                   {"run_ids": ids[:20], "run_ids_given": len(ids)})
               for thread_id in threads)


def graph_thread_copy(*, actor, tenant: Tenant, source_thread_id: str,
                      target_thread_id: str) -> int:
    """LangGraph's ``copy_thread`` (``POST …/langgraph/threads/copy``): every checkpoint
    and pending write of the source thread, in every namespace, onto the target thread
    (same checkpoint ids, parents and metadata), each target namespace getting its
    envelope (revision 0, the source head's summary). Both runs are locked, in run-id
    order. Returns how many checkpoints were copied (0 for an unknown source: nothing
    written). Raises ``InvalidPayload`` when source and target are the same thread,
    ``ThreadConflict`` (412, kept as a conflict of the target's run) when the target has
    checkpoints. One ``langgraph.thread_copy`` event on the target run."""
    require(actor, tenant, roles.WRITE)
    if source_thread_id == target_thread_id:
        raise InvalidPayload("target_thread_id: must differ from source_thread_id")
    source_run_id = T.thread_run_id(source_thread_id)
    target_run_id = T.thread_run_id(target_thread_id)
    if not _scoped(tenant).filter(thread_id=source_thread_id).exists():
        return 0
    refusal = None
    copied = 0
    with transaction.atomic():
        runs = {}
        for run_id in sorted((source_run_id, target_run_id), key=str):
            runs[run_id] = _lock_run(tenant, run_id, create=run_id == target_run_id)
        source, target = runs[source_run_id], runs[target_run_id]
        taken = (_scoped(tenant).filter(thread_id=target_thread_id).order_by("checkpoint_ns")
                 .values("checkpoint_ns").first())
        if source is None or not _scoped(tenant).filter(thread_id=source_thread_id).exists():
            _drop_empty_run(tenant, target)
        elif taken is not None:
            envelope = _lock_envelope(tenant, T.thread_checkpoint_id(target_thread_id,
                                                                     taken["checkpoint_ns"]))
            head = _head(tenant, target_thread_id, taken["checkpoint_ns"])
            _refuse(tenant, actor, target, envelope_id=envelope.uuid, expected=None,
                    actual=envelope.revision, attempted=None, refused=None,
                    reason=ConflictReason.ID_EXISTS)
            refusal = ThreadConflict(envelope.revision, head["checkpoint_id"] if head else None,
                                     "target_thread_id: the target thread has checkpoints")
        else:
            namespaces = sorted(set(_scoped(tenant).filter(thread_id=source_thread_id)
                                    .values_list("checkpoint_ns", flat=True)))
            for ns in namespaces:
                copied += _copy_namespace(actor, tenant, source_thread_id, target_thread_id,
                                          ns)
            target = _lock_run(tenant, target_run_id, create=False)
            audit_record(tenant=tenant, actor=actor, action=AuditAction.LANGGRAPH_THREAD_COPY,
                         target_type=TargetType.RUN, target_id=target.uuid, run_id=target.uuid,
                         after={"source_thread_id": source_thread_id,
                                "target_thread_id": target_thread_id,
                                "source_run_id": str(source_run_id), "copied": copied,
                                "namespaces": len(namespaces)})
    if refusal is not None:
        raise refusal
    return copied


def _drop_empty_run(tenant, run: Run | None) -> None:
    if run is not None and not (
            Checkpoint.objects.for_tenant(tenant).filter(run=run).exists()
            or _referenced(tenant, run)):
        Run.objects.for_tenant(tenant).filter(pk=run.pk).delete()


def _copy_namespace(actor, tenant, source_thread: str, target_thread: str, ns: str) -> int:
    """Copy one namespace (the caller holds both runs' locks): the target envelope
    first (revision 0), then the rows in batches, ciphertexts as they are (one tenant,
    one key ring), writes mapped onto the new rows."""
    source_envelope = _lock_envelope(tenant, T.thread_checkpoint_id(source_thread, ns))
    head = _head(tenant, source_thread, ns)
    payload = _envelope_payload(source_envelope)
    identity = payload.get("identity") or {}
    if payload.get("checkpoint_id") == head["checkpoint_id"] and _is_summary(payload):
        summary = dict(payload, thread_id=target_thread)
    else:
        summary = _summary_of_row(tenant, head, target_thread, ns, identity)
    run = _lock_run(tenant, T.thread_run_id(target_thread), create=False)
    envelope = _write_envelope(actor, tenant, run, target_thread, ns, summary, None,
                               run.fencing_token)
    if isinstance(envelope, DomainError):  # cannot happen: the target namespace is empty
        raise RuntimeError(f"langgraph: copying made no envelope ({envelope.error})")
    copied = 0
    rows = _ordered_rows(_scoped(tenant).filter(thread_id=source_thread, checkpoint_ns=ns),
                         ("pk", "thread_id", "checkpoint_ns", "checkpoint_id",
                          "parent_checkpoint_id", "lg_run_id", "checkpoint_ciphertext",
                          "metadata_ciphertext", "payload_size"))
    while batch := list(itertools.islice(rows, _SCAN_BATCH)):
        GraphCheckpoint.objects.bulk_create([GraphCheckpoint(
            tenant=tenant, run=run, envelope_id=envelope.pk, thread_id=target_thread,
            checkpoint_ns=ns, checkpoint_id=r["checkpoint_id"],
            parent_checkpoint_id=r["parent_checkpoint_id"], lg_run_id=r["lg_run_id"],
            checkpoint_ciphertext=r["checkpoint_ciphertext"],
            metadata_ciphertext=r["metadata_ciphertext"], payload_size=r["payload_size"],
            envelope_revision=envelope.revision, created_at=run.db_now, written_by=actor)
            for r in batch])
        new_pk = dict(_scoped(tenant).filter(
            thread_id=target_thread, checkpoint_ns=ns,
            checkpoint_id__in=[r["checkpoint_id"] for r in batch])
            .values_list("checkpoint_id", "pk"))
        old = {r["pk"]: new_pk[r["checkpoint_id"]] for r in batch}
        GraphWrite.objects.bulk_create([GraphWrite(
            tenant=tenant, graph_checkpoint_id=old[w["graph_checkpoint_id"]],
            task_id=w["task_id"], task_path=w["task_path"], idx=w["idx"],
            channel=w["channel"], value_ciphertext=w["value_ciphertext"],
            value_size=w["value_size"], created_at=run.db_now)
            for w in GraphWrite.objects.for_tenant(tenant)
            .filter(graph_checkpoint_id__in=list(old))
            .values("graph_checkpoint_id", "task_id", "task_path", "idx", "channel",
                    "value_ciphertext", "value_size")])
        copied += len(batch)
    return copied
