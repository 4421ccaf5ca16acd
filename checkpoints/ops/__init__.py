"""Operations (docs/architecture.md): what an operator's tools and the edge of the service
need, above the job layer and below the surfaces.

- ``health``: ``/healthz``, ``/readyz``, ``/metrics``, request ids;
- ``security``: private no-store headers, login slots, the client address behind proxies;
- ``keepalive``: a refused body drained so the kept-alive connection serves the next
  request (CONTRACT.md 6);
- ``outage``: whether an exception means the database or broker is down (503);
- ``staticcheck``: whether the static manifest the pages need is there;
- ``operatorfiles``: the bounded, regular-file inputs and atomic outputs of operator
  commands.
"""
