"""A working kind module: ``testmod.ticket`` v1 and v2 (v2 renamed ``state`` to ``phase``).

A ticket payload: ``{"queue": str, "state" (v1) | "phase" (v2): "open" | "working" | "done"}``.
"""

from __future__ import annotations

from checkpoints.kinds import Identity, Phase, SchemaError, VersionSpec, register
from checkpoints.vocab import PhaseClass

KIND = "testmod.ticket"
CLASSES = {"open": PhaseClass.STABLE, "working": PhaseClass.IN_FLIGHT,
           "done": PhaseClass.COMPLETED}


def _spec(key: str) -> VersionSpec:
    def validate(payload):
        if not isinstance(payload, dict):
            raise SchemaError("payload must be an object")
        if not isinstance(payload.get("queue"), str) or not payload["queue"]:
            raise SchemaError("payload.queue must be a non-empty string")
        if payload.get(key) not in CLASSES:
            raise SchemaError(f"payload.{key} must be one of {sorted(CLASSES)}")

    def phase(payload):
        return Phase(CLASSES[payload[key]], f"ticket {payload[key]}")

    def identity(payload):
        return Identity(workflow=f"tickets/{payload['queue']}")

    return VersionSpec(validate, phase, identity)


register(KIND, 1, _spec("state"), "a test ticket")
register(KIND, 2, _spec("phase"))
