"""Fixtures for the issue-5 fault tests: a stub status service, misbehaving plugins, and
in-doubt runs built through the real services."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from checkpoints import services
from checkpoints.models import ReconcileRequest
from tests.faults import stubs
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect


@pytest.fixture
def stub(settings):
    """A stub status service; ``payments`` (every tenant's default) looks up through it."""
    service = stubs.StatusStub().start()
    settings.RECOVERY_RECONCILERS = {"payments": service.url}
    yield service
    service.stop()


@pytest.fixture
def hang_released():
    """Lets a hanging plugin's thread end when the test is over."""
    stubs.HANG.clear()
    yield stubs.HANG
    stubs.HANG.set()


@dataclass
class InDoubt:
    run_id: uuid.UUID
    effects: dict[str, uuid.UUID]  # operation key -> effect id
    token: int | None


def in_doubt_run(writer, tenant, keys=("charge:A-1",), *, lease_ttl: int | None = None,
                 service: str = "payments") -> InDoubt:
    """A run in flight with one ``submitted`` effect per key, as a runtime leaves it
    between writing ``submitted`` and ``confirmed``. With ``lease_ttl`` the runtime holds a
    lease of that many seconds and writes with its fencing token."""
    body = envelope(payload={"phase": "charging", "order_id": "A-1"})
    put_checkpoint(writer, tenant, body)
    run_id = uuid.UUID(body["run_id"])
    token = None
    if lease_ttl is not None:
        token = services.lease_acquire(actor=writer, tenant=tenant, run_id=run_id,
                                       owner="worker-1", ttl_s=lease_ttl).fencing_token
    effects = {}
    for key in keys:
        fx = effect_body(run_id=run_id, operation_key=key, service=service)
        put_effect(writer, tenant, fx, token=token)
        put_effect(writer, tenant, dict(fx, revision=1, state="submitted"), expected=0,
                   token=token)
        effects[key] = uuid.UUID(fx["id"])
    return InDoubt(run_id, effects, token)


def request_for(effect_id) -> ReconcileRequest:
    return ReconcileRequest.objects.get(effect__uuid=effect_id)
