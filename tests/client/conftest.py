"""Fixtures for the client tests: ``HttpCheckpointStore`` instances against ``live_server``."""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.client import HttpCheckpointStore


@pytest.fixture
def store(live_server, wendy) -> HttpCheckpointStore:
    """Tenant acme, as wendy (writer)."""
    return HttpCheckpointStore(live_server.url, "acme", services.token_issue(user=wendy))


@pytest.fixture
def make_store(live_server):
    """``make_store(user, tenant="acme")`` -> a store with a fresh token of ``user``."""

    def make(user, tenant="acme") -> HttpCheckpointStore:
        return HttpCheckpointStore(live_server.url, tenant, services.token_issue(user=user))

    return make
