"""``acme.refund`` v1: the worked example of docs/kinds.md, a kind in the user's own package.

A refund workflow's checkpoint payload::

    {"refund_id": "R-77", "order_id": "A-1042", "amount_cents": 1200,
     "definition_version": 1, "phase": "refunding", "attempt": 1}

``phase`` is where the workflow stands:

==============  =============  ==========================================================
phase           phase class    meaning
==============  =============  ==========================================================
``requested``   stable         a customer asked; nothing was sent anywhere yet
``approved``    stable         a person approved it; the refund call is next
``refunding``   in_flight      the refund call to the payment service was started; its
                               outcome is not recorded (``attempt`` counts the calls)
``refunded``    completed      the payment service confirmed the refund
``rejected``    completed      a person said no; nothing will be sent
==============  =============  ==========================================================

Load it with ``RECOVERY_KIND_MODULES=examples.kinds.acme_refunds``. Its fixtures, one per
phase: ``tests/fixtures/kinds/acme.refund/v1/`` (run by ``tests/test_kind_fixtures.py``);
its refusals: ``tests/test_kind_modules.py``.
"""

from __future__ import annotations

from typing import Any

from checkpoints.kinds import Identity, Phase, SchemaError, VersionSpec, register
from checkpoints.vocab import PhaseClass

KIND = "acme.refund"

PHASES = {
    "requested": PhaseClass.STABLE,
    "approved": PhaseClass.STABLE,
    "refunding": PhaseClass.IN_FLIGHT,
    "refunded": PhaseClass.COMPLETED,
    "rejected": PhaseClass.COMPLETED,
}


def _positive_int(p: dict, key: str) -> int:
    value = p.get(key)
    # ``type(...) is int``: JSON's true/false are Python bools, which are ints too.
    if type(value) is not int or value < 1:
        # The field and the rule, never the value: this message is shown to viewers.
        raise SchemaError(f"payload.{key} must be an integer >= 1")
    return value


def validate(payload: Any) -> None:
    """Raise ``SchemaError`` naming the field when ``payload`` is not an ``acme.refund``
    v1 payload; return nothing when it is."""
    if not isinstance(payload, dict):
        raise SchemaError("payload must be an object")
    for key in ("refund_id", "order_id"):
        value = payload.get(key)
        if not isinstance(value, str) or not 0 < len(value) <= 64:
            raise SchemaError(f"payload.{key} must be a string of 1..64 characters")
    _positive_int(payload, "amount_cents")
    _positive_int(payload, "definition_version")
    if payload.get("phase") not in PHASES:
        raise SchemaError(f"payload.phase must be one of {sorted(PHASES)}")
    if payload["phase"] == "refunding":
        _positive_int(payload, "attempt")


def phase(payload: dict) -> Phase:
    """The phase class and a label made of the phase and the attempt only (no refund id,
    no amount: labels are shown to viewers, who may not see payloads)."""
    name = payload["phase"]
    if name == "refunding":
        return Phase(PHASES[name], f"refunding attempt {payload['attempt']}")
    return Phase(PHASES[name], name)


def identity(payload: dict) -> Identity:
    """Who may resume it: this workflow at this definition version."""
    return Identity(workflow=KIND, definition_version=str(payload["definition_version"]))


register(KIND, 1, VersionSpec(validate=validate, phase=phase, identity=identity),
         "refund of an order: approve, then one refund call to the payment service")
