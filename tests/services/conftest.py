"""Fixtures for the service tests: a controllable clock and small state builders."""

from __future__ import annotations

import pytest

from tests.helpers import age_world


class Clock:
    """Moves time forward for the rules without sleeping (no timed assertions): the
    stored times they compare with the database's clock move into the past."""

    def advance(self, seconds: float) -> None:
        age_world(seconds)


@pytest.fixture
def clock(db) -> Clock:
    return Clock()
