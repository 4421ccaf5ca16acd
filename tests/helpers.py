"""Test helpers that build state through the real services (never raw rows for audited data)."""

from __future__ import annotations

import hashlib
import time
import uuid

from checkpoints import services

FP = hashlib.sha256(b"charge A-1042 2599").hexdigest()


def envelope(checkpoint_id=None, run_id=None, revision=0, kind="acme.order",
             schema_version=1, payload=None, **extra) -> dict:
    """A checkpoint body as a runtime would send it."""
    body = {
        "id": str(checkpoint_id or uuid.uuid4()),
        "run_id": str(run_id or uuid.uuid4()),
        "revision": revision,
        "kind": kind,
        "schema_version": schema_version,
        "payload": {"phase": "ready", "order_id": "A-1042"} if payload is None else payload,
        "updated_at_ms": int(time.time() * 1000),
    }
    body.update(extra)
    return body


def effect_body(effect_id=None, run_id=None, revision=0, state="planned",
                operation_key="charge:A-1042", service="payments", fingerprint=FP,
                receipt=None, effect_class="non_idempotent") -> dict:
    return {
        "id": str(effect_id or uuid.uuid4()),
        "run_id": str(run_id or uuid.uuid4()),
        "revision": revision,
        "operation_key": operation_key,
        "service": service,
        "effect_class": effect_class,
        "request_fingerprint": fingerprint,
        "state": state,
        "receipt": receipt,
    }


def put_checkpoint(writer, tenant, body: dict, expected=None, token=None):
    env = services.parse_envelope(body, url_id=uuid.UUID(body["id"]))
    return services.checkpoint_put(actor=writer, tenant=tenant, envelope=env,
                                   expected_revision=expected, fencing_token=token)[0]


def put_effect(writer, tenant, body: dict, expected=None, token=None):
    eb = services.parse_effect(body, url_id=uuid.UUID(body["id"]))
    return services.effect_put(actor=writer, tenant=tenant, body=eb,
                               expected_revision=expected, fencing_token=token)[0]


def walk_effect(writer, tenant, body: dict, *states, token=None):
    """Create ``body`` as planned, then move it through ``states`` one revision at a time."""
    effect = put_effect(writer, tenant, dict(body, revision=0, state="planned"), token=token)
    for i, state in enumerate(states, start=1):
        receipt = {"charge_id": "ch_1"} if state == "confirmed" else None
        effect = put_effect(writer, tenant, dict(body, revision=i, state=state, receipt=receipt),
                            expected=i - 1, token=token)
    return effect


# Every stored time that a rule compares with the database's clock (checkpoints.dbclock).
_AGED = {
    "Run": ("last_write_at", "lease_expires_at", "state_changed_at", "closed_at"),
    "Effect": ("submitted_at", "state_changed_at"),
    "ReconcileRequest": ("next_attempt_at", "claimed_until"),
}


def age_world(seconds: float) -> None:
    """Make ``seconds`` pass for the rules without sleeping: every stored time they
    compare with the database's clock moves that far into the past. (The services read
    the database's clock, never the process's, so patching ``timezone.now`` would not.)"""
    from datetime import timedelta

    from django.db.models import F

    from checkpoints import models

    delta = timedelta(seconds=seconds)
    for model_name, columns in _AGED.items():
        model = getattr(models, model_name)
        for column in columns:
            model.objects.filter(**{f"{column}__isnull": False}).update(
                **{column: F(column) - delta})


def sweep_later(hours: float = 1):
    """Run the stale-run sweep as if ``hours`` had passed: quiet in-flight runs become
    ambiguous and their submitted effects unresolved (what beat does in production)."""
    age_world(hours * 3600)
    return services.sweep_stale_runs()


def ambiguous_run(writer, tenant, body: dict | None = None):
    """Write an in-flight checkpoint with no lease and sweep: the run is ``ambiguous`` and
    a reviewer may request a retry. Returns the run id (UUID)."""
    body = body or envelope(payload={"phase": "charging", "order_id": "A-1042"})
    put_checkpoint(writer, tenant, body)
    sweep_later()
    return uuid.UUID(body["run_id"])
