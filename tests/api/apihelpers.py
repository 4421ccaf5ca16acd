"""Helpers for the API tests: URLs, raw-body requests and store snapshots."""

from __future__ import annotations

import json
import uuid

from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    NotificationEndpoint,
    NotificationMessage,
    RetryRequest,
    Run,
)
from tests.helpers import effect_body, envelope


def url(tenant: str, rest: str) -> str:
    """``/api/v1/tenants/{tenant}/{rest}``."""
    return f"/api/v1/tenants/{tenant}/{rest}"


def put(client, tenant: str, what: str, body, *, create: bool = False, match=None,
        token=None, headers: dict | None = None):
    """PUT a checkpoint or effect (``what`` is "checkpoints" or "effects").

    ``body`` is a dict (sent as JSON), or ``str``/``bytes`` sent as-is; the id in the URL
    comes from the dict, or pass ``headers={"url_id": ...}``.
    """
    headers = dict(headers or {})
    url_id = headers.pop("url_id", None) or (body["id"] if isinstance(body, dict) else None)
    raw = json.dumps(body) if isinstance(body, dict) else body
    extra = {}
    if create:
        extra["HTTP_IF_NONE_MATCH"] = "*"
    if match is not None:
        extra["HTTP_IF_MATCH"] = match if isinstance(match, str) else f'"{match}"'
    if token is not None:
        extra["HTTP_FENCING_TOKEN"] = str(token)
    extra.update(headers)
    return client.put(url(tenant, f"{what}/{url_id}"), data=raw,
                      content_type="application/json", **extra)


def put_cp(client, tenant: str, body, **kw):
    return put(client, tenant, "checkpoints", body, **kw)


def put_fx(client, tenant: str, body, **kw):
    return put(client, tenant, "effects", body, **kw)


def post(client, tenant: str, rest: str, body=None, raw: str | bytes | None = None):
    data = raw if raw is not None else json.dumps(body if body is not None else {})
    return client.post(url(tenant, rest), data=data, content_type="application/json")


def get(client, tenant: str, rest: str, **params):
    return client.get(url(tenant, rest), params)


def snapshot() -> dict:
    """Row counts and revisions of everything the API can change, to prove nothing did."""
    return {
        "runs": sorted(Run.objects.values_list("uuid", "recovery_state", "fencing_token",
                                               "lease_owner", "unacknowledged_conflicts")),
        "checkpoints": sorted(Checkpoint.objects.values_list("uuid", "revision")),
        "checkpoint_revisions": CheckpointRevision.objects.count(),
        "effects": sorted(Effect.objects.values_list("uuid", "revision", "state")),
        "effect_revisions": EffectRevision.objects.count(),
        "conflicts": sorted(Conflict.objects.values_list("pk", "acknowledged_at")),
        "retries": sorted(RetryRequest.objects.values_list("pk", "state")),
        "audit": AuditEvent.objects.count(),
        "endpoints": sorted(NotificationEndpoint.objects.values_list(
            "uuid", "name", "enabled", "secret")),
        "messages": sorted(NotificationMessage.objects.values_list("event_id", "state",
                                                                   "attempts")),
    }


def new_checkpoint(client, tenant: str, *, payload=None, kind="acme.order", run_id=None,
                   schema_version=1):
    """Create a checkpoint through the API; returns its body (asserts 201)."""
    body = envelope(run_id=run_id or uuid.uuid4(), payload=payload, kind=kind,
                    schema_version=schema_version)
    r = put_cp(client, tenant, body, create=True)
    assert r.status_code == 201, r.content
    return body


def walk(client, tenant: str, body: dict, *states: str) -> dict:
    """Create effect ``body`` as planned and move it through ``states`` (asserts each)."""
    r = put_fx(client, tenant, dict(body, revision=0, state="planned"), create=True)
    assert r.status_code == 201, r.content
    for i, state in enumerate(states, start=1):
        receipt = {"charge_id": "ch_1"} if state == "confirmed" else None
        r = put_fx(client, tenant, dict(body, revision=i, state=state, receipt=receipt), match=i - 1)
        assert r.status_code == 200, r.content
    return r.json()


__all__ = ["effect_body", "envelope"]
