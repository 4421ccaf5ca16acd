"""Interoperation with outside formats, a layer above the services (docs/architecture.md):
``langgraph`` (the server side of the LangGraph checkpointer API: puts, pending writes,
lists, deletions, copies, prunes; issue 10) and ``runifold`` (runifold JSON Lines in and
out; issue 10, item 4). Both are built on the services (``checkpoint_put``, the run lock,
the audit chain); the services never import them.

Callers write ``from checkpoints.interop import langgraph`` then
``langgraph.graph_put(...)``.
"""

# The submodules, for tests that read the operations' source (the audit, fence and race
# matrices, tests/matrixhelpers.py), as ``services.MODULES``.
MODULES = ("langgraph.parse", "langgraph.common", "langgraph.put", "langgraph.writes",
           "langgraph.reads", "langgraph.threads",
           "runifold.lines", "runifold.imports", "runifold.writes", "runifold.exports")
