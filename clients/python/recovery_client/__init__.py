"""recovery-client: the runtime SDK of the recovery service (issue 18, item 3).

- ``recovery_client.client``: ``HttpCheckpointStore`` and ``perform_effect``, standard
  library only, on ``recovery_client.core``, the sans-IO protocol core all clients share
  (a runtime may vendor those two files, ``core.py`` and ``client.py``);
- ``recovery_client.aclient``: the same for asyncio, on httpx (extra ``async``);
- ``recovery_client.langgraph``: ``RecoverySaver``, a LangGraph checkpointer (extra
  ``langgraph``);
- ``recovery_client.effects``: ``@recorded_effect``, side effects recorded write-ahead;
- ``recovery_client.protocol``: what the server and the clients agree on (thread ids to
  run ids, limits); the only module the server imports.

This package imports nothing at import time: each module is imported on its own.
"""
