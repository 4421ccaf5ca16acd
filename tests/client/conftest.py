"""Fixtures for the client tests: stores of both clients against ``live_server``.

``store`` and ``make_store`` are parametrized over the sync ``HttpCheckpointStore`` and
the async ``AsyncHttpCheckpointStore`` (run through ``drivers.Driven``), so every
scenario written for one runs against both (issue 10, client parity).
"""

from __future__ import annotations

import asyncio

import pytest

from checkpoints import services
from recovery_client.aclient import AsyncHttpCheckpointStore
from recovery_client.client import HttpCheckpointStore
from tests.client.drivers import Driven, FakeServer


@pytest.fixture(params=["sync", "async"])
def open_store(request):
    """``open_store(base_url, tenant, token, **settings)`` -> a store of the test's
    client (sync, or async driven on one event loop); all closed at teardown."""
    made = []
    runner = asyncio.Runner() if request.param == "async" else None

    def open_(base_url, tenant, token, **settings):
        if runner is None:
            made.append(HttpCheckpointStore(base_url, tenant, token, **settings))
        else:
            made.append(Driven(AsyncHttpCheckpointStore(base_url, tenant, token, **settings),
                               runner))
        return made[-1]

    yield open_
    for store in made:
        store.close()
    if runner is not None:
        runner.close()


@pytest.fixture
def store(live_server, wendy, open_store):
    """Tenant acme, as wendy (writer)."""
    return open_store(live_server.url, "acme", services.token_issue(user=wendy))


@pytest.fixture
def make_store(live_server, open_store):
    """``make_store(user, tenant="acme")`` -> a store with a fresh token of ``user``."""

    def make(user, tenant="acme"):
        return open_store(live_server.url, tenant, services.token_issue(user=user))

    return make


@pytest.fixture
def fake_server():
    """``fake_server(script, default=...)`` -> a started ``drivers.FakeServer``."""
    made = []

    def make(script=(), **kw) -> FakeServer:
        made.append(FakeServer(script, **kw))
        return made[-1]

    yield make
    for server in made:
        server.close()
