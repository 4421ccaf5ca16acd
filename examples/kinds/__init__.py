"""Kinds written outside the server, as a user's own package would write them
(docs/kinds.md). Name a module here in ``RECOVERY_KIND_MODULES`` to load it, e.g.
``RECOVERY_KIND_MODULES=examples.kinds.acme_refunds``."""
