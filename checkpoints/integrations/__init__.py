"""Integrations of outside runtimes with the service (issue 10).

``threads`` maps LangGraph thread ids onto recovery run and checkpoint ids and holds the
limits both sides check; ``langgraph`` holds the ``RecoverySaver`` (an optional extra).
This package imports nothing third-party at import time.
"""
