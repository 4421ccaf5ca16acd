"""LangGraph thread identity on recovery, shared by the server and the saver (issue 10).

Pure Python, no third-party and no Django imports: the saver runs in the runtime's process.
The one module of the SDK the server imports (issue 18, ``tests/test_sdk_boundary.py``):
what both sides must agree on lives here.

A LangGraph thread (``configurable.thread_id``) is one recovery run, and each (thread,
``checkpoint_ns``) is one checkpoint envelope of kind ``langgraph.checkpoint``
(docs/langgraph.md, "Mapping"). Both ids are UUIDv5 under ``NAMESPACE``, so the saver
knows a thread's run id without asking. Ids are unique per tenant on the server side
(two tenants' thread "t-1" are two runs even though the UUIDs are equal in each tenant).

The limits below are checked by both sides before anything is sent or queried.
"""

from __future__ import annotations

import uuid

# Fixed forever: changing it would move every existing thread onto a new run.
NAMESPACE = uuid.UUID("6f1c2b0e-4a7d-5c3e-9b8f-1d2e3f405162")

KIND = "langgraph.checkpoint"
SCHEMA_VERSION = 1

MAX_THREAD_ID = 256  # characters, at least 1
MAX_CHECKPOINT_NS = 256  # characters, may be empty
MAX_CHECKPOINT_ID = 128  # characters, at least 1 (LangGraph's ids are 36)
MAX_TASK_ID = 128  # characters, at least 1
MAX_TASK_PATH = 1024  # characters, may be empty
MAX_CHANNEL = 256  # characters, at least 1
MAX_TYPE = 64  # characters of a serializer type tag (``{"type", "b64"}``)
MAX_LG_RUN_ID = 128  # characters of ``metadata["run_id"]`` kept for delete_for_runs
MAX_WRITES = 1000  # writes in one put_writes call
MAX_LIMIT = 1000  # checkpoints in one list answer
DEFAULT_LIMIT = 100
MAX_RUN_IDS = 1000  # LangGraph run ids in one delete_for_runs call
MAX_THREAD_IDS = 1000  # thread ids in one prune call
MAX_BODY_BYTES = 1024 * 1024  # CONTRACT.md section 6: a larger body is 413


def _text(value: str, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")


def thread_run_id(thread_id: str) -> uuid.UUID:
    """The recovery run id of LangGraph thread ``thread_id`` (a str): UUIDv5 under NAMESPACE.

    Raises TypeError for a non-string (UnicodeEncodeError for an unpaired surrogate,
    which the server refuses before it gets here). Deterministic, so a saver and the
    server agree.
    """
    _text(thread_id, "thread_id")
    return uuid.uuid5(NAMESPACE, "thread\x1f" + thread_id)


def thread_checkpoint_id(thread_id: str, checkpoint_ns: str) -> uuid.UUID:
    """The recovery checkpoint (envelope) id of (thread, namespace): UUIDv5 under NAMESPACE.

    ``checkpoint_ns`` is LangGraph's namespace ("" for the root graph). The separator
    U+001F cannot appear in a valid thread id (no control characters), so distinct
    pairs never share a name. Raises TypeError for non-strings.
    """
    _text(thread_id, "thread_id")
    _text(checkpoint_ns, "checkpoint_ns")
    return uuid.uuid5(NAMESPACE, "checkpoint\x1f" + thread_id + "\x1f" + checkpoint_ns)
