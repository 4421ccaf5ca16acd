"""Fixtures for the saver against the real API (pytest-django ``live_server``): tenant
acme, as wendy (writer). Every saver made is closed at the end of its test."""

from __future__ import annotations

import pytest

from checkpoints import services


@pytest.fixture
def wendy_token(wendy) -> str:
    return services.token_issue(user=wendy)


@pytest.fixture
def make_saver(live_server, wendy_token):
    """``make_saver(**kw)`` -> a ``RecoverySaver`` of tenant acme (``kw`` as the class)."""
    from recovery_client.langgraph import RecoverySaver

    made = []

    def make(**kw) -> RecoverySaver:
        saver = RecoverySaver(live_server.url, kw.pop("tenant", "acme"),
                              kw.pop("token", wendy_token), **kw)
        made.append(saver)
        return saver

    yield make
    for saver in made:
        saver.close()


@pytest.fixture
def saver(make_saver):
    return make_saver()
