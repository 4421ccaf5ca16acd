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

A package by what each part does: ``parse`` (the bodies and field checks), ``common``
(a namespace's head, the envelope revision, a refused write), ``put`` (``graph_put``),
``writes`` (``graph_put_writes``), ``reads`` (``graph_list``) and ``threads`` (deleting,
pruning, copying). It sits above the services (``checkpoints.interop``, docs/
architecture.md): callers write ``from checkpoints.interop import langgraph`` then
``langgraph.graph_put(...)``.
"""

# ruff: noqa: F401 - this module is the package's interface: it re-exports its operations.

from .parse import (
    GraphPut,
    GraphWrites,
    WriteItem,
    breakpoint_of,
    check_checkpoint_id,
    check_lg_run_id,
    check_ns,
    check_thread_id,
    next_nodes,
    parse_filter,
    parse_put,
    parse_writes,
)
from .put import graph_put
from .reads import FILTER_SCAN_MAX, graph_list
from .threads import (
    CLOSED_REASON,
    PRUNE_STRATEGIES,
    graph_runs_delete,
    graph_thread_copy,
    graph_thread_delete,
    graph_threads_prune,
)
from .writes import graph_put_writes
