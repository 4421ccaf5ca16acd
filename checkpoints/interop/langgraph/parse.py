"""LangGraph bodies and their checks (issue 10; docs/langgraph.md, "Server"): the
``GraphPut`` and ``GraphWrites`` a put and a ``put_writes`` carry (``parse_put``,
``parse_writes``), the list's metadata filter (``parse_filter``), the field checks of
every id, namespace and channel version (``check_thread_id``...), and what the server
reads of a LangGraph checkpoint without importing LangGraph (``next_nodes``,
``breakpoint_of``).

Every value from the body is checked against its column and the limits of
``recovery_client.protocol`` before any query: 400 ``invalid_payload`` naming the field
(CONTRACT.md 6).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from recovery_client import protocol as T

from ... import kinds
from ...exceptions import InvalidPayload
from ...jsonparse import check_name, dumps, loads_object, printable

START = "__start__"
BRANCH_TO = "branch:to:"
TASKS_CHANNEL = "__pregel_tasks"
INTERRUPT = "__interrupt__"
ERROR = "__error__"
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"

_I32 = 2**31
_I63 = 2**63


# --------------------------------------------------------------------------------------
# Field checks (CONTRACT.md 6: every value fits its column before any query)
# --------------------------------------------------------------------------------------

def _text(value: Any, field: str, *, max_len: int, min_len: int = 1) -> str:
    """A LangGraph id of ``min_len..max_len`` characters that is a name
    (``jsonparse.check_name``); a required one (``min_len`` 1) that shows nothing is
    refused as blank, as every required name is (the stop-35 attack: a thread id of a
    braille blank was stored)."""
    if not isinstance(value, str):
        raise InvalidPayload(f"{field}: must be a string")
    if not min_len <= len(value) <= max_len:
        raise InvalidPayload(f"{field}: must be {min_len}..{max_len} characters")
    return check_name(value, field, blank_words=(
        f"must be {min_len}..{max_len} characters that show" if min_len else None))


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
    return loads_object(text, what="filter")
