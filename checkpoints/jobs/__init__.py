"""The job layer (docs/architecture.md): work that runs after a request has answered.

- ``reconciliation``: a reconcile job's claim, look-up with the external service, and
  apply (DESIGN.md 4);
- ``migrations``: a stored migration job's claim, walk and finish (issue 19, item 2),
  the same pattern;
- ``tasks``: the Celery tasks that run it and the stale-run sweep (their names stay
  ``checkpoints.tasks.*``: queued messages and the beat schedule carry them);
- ``inprocess``: the broker-less worker and the catch-up sweep of the embedded default.

The services hand work to this layer by name only; nothing below imports it.
"""
