"""Fixtures for the service tests: a controllable clock and small state builders."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone


class Clock:
    """Moves ``django.utils.timezone.now`` forward without sleeping (no timed assertions)."""

    def __init__(self, monkeypatch):
        self._real_now = timezone.now
        self.offset = timedelta(0)
        monkeypatch.setattr(timezone, "now", lambda: self._real_now() + self.offset)

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)

    def now(self):
        return timezone.now()


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return Clock(monkeypatch)
