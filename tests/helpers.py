"""Test helpers that build state through the real services (never raw rows for audited data)."""

from __future__ import annotations

import hashlib
import re
import socket
import time
import uuid
from html.parser import HTMLParser

from checkpoints import services
from checkpoints.interop import langgraph

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


def plumbing_token(user) -> str:
    """A bearer token for ``user``, stored exactly as ``services.token_issue`` stores it
    (SHA-256 and the 12-character prefix), without the ``token.issue`` audit event: for
    test set-up after a snapshot of the audit trail (``tests.conftest.bearer_client``).
    Refuses a deactivated account as ``token_issue`` does. tests/test_commands.py checks
    that the real command stores the same."""
    import secrets

    from checkpoints.models import ApiToken

    assert user.is_active, "token_issue refuses a deactivated account"
    raw = "rcv_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, prefix=raw[:12],
                            key_hash=hashlib.sha256(raw.encode()).hexdigest())
    return raw


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
    "Run": ("last_write_at", "lease_expires_at", "state_changed_at", "closed_at",
            "payloads_deleted_at", "lease_ended_at"),
    "CleanupLease": ("expires_at",),
    "Effect": ("submitted_at", "state_changed_at"),
    "ReconcileRequest": ("next_attempt_at", "claimed_until"),
    "MigrationJob": ("next_attempt_at", "claimed_until"),
    "TombstonePurge": ("deadline",),
    "DataPolicy": ("updated_at",),
    "NotificationOutbox": ("at",),
    "NotificationAgingMark": ("since", "at"),
    "NotificationIncident": ("opened_at", "window_ends_at", "message_at"),
    "NotificationIncidentRun": ("at",),
    "NotificationMessage": ("next_attempt_at", "claimed_until", "created_at"),
    "NotificationEndpoint": ("failing_since", "last_sent_at", "previous_secret_until"),
}
#: Aged with the triggers off (PostgreSQL refuses every UPDATE of a tombstone: migration
#: 0027), as the test database's superuser may.
_AGED_PAST_TRIGGERS = {"Tombstone": ("deleted_at",)}


def age_world(seconds: float) -> None:
    """Make ``seconds`` pass for the rules without sleeping: every stored time they
    compare with the database's clock moves that far into the past. (The services read
    the database's clock, never the process's, so patching ``timezone.now`` would not.)"""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.db.models import F

    from checkpoints import models

    delta = timedelta(seconds=seconds)
    for model_name, columns in _AGED.items():
        model = getattr(models, model_name)
        for column in columns:
            model.objects.filter(**{f"{column}__isnull": False}).update(
                **{column: F(column) - delta})
    for model_name, columns in _AGED_PAST_TRIGGERS.items():
        model = getattr(models, model_name)
        with transaction.atomic():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL session_replication_role = replica")
            for column in columns:
                model.objects.filter(**{f"{column}__isnull": False}).update(
                    **{column: F(column) - delta})
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL session_replication_role = origin")


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


# --- LangGraph bodies (issue 10, docs/langgraph.md) ---------------------------------------

def typed(value) -> dict:
    """A value as LangGraph's serializer would carry it: ``{"type": "json", "b64": ...}``
    (the server never decodes it; any bytes would do)."""
    import base64
    import json

    return {"type": "json", "b64": base64.b64encode(json.dumps(value).encode()).decode()}


def lg_checkpoint(checkpoint_id: str, *, values: dict | None = None,
                  versions: dict | None = None, seen: dict | None = None) -> dict:
    """A LangGraph checkpoint dict with channel values already typed."""
    values = values or {}
    return {"v": 4, "id": checkpoint_id, "ts": "2026-12-01T00:00:00+00:00",
            "channel_values": {c: typed(v) for c, v in values.items()},
            "channel_versions": versions if versions is not None else {c: 1 for c in values},
            "versions_seen": seen or {}, "updated_channels": None}


def lg_put(thread_id: str, checkpoint_id: str, *, parent: str | None = None, ns: str = "",
           metadata: dict | None = None, identity: dict | None = None, nodes=(), done=(),
           **checkpoint) -> dict:
    """A ``POST …/langgraph/checkpoints`` body. ``nodes``: nodes triggered next (a
    ``branch:to:<node>`` channel with a value newer than what the node saw); ``done``:
    nodes that saw their trigger already (not next)."""
    values = dict(checkpoint.pop("values", {}) or {})
    versions = dict(checkpoint.pop("versions", {}) or {})
    seen = dict(checkpoint.pop("seen", {}) or {})
    for node in (*nodes, *done):
        values[f"branch:to:{node}"] = None
        versions.setdefault(f"branch:to:{node}", 2)
    for node in done:
        seen.setdefault(node, {}).setdefault(f"branch:to:{node}", 2)
    for channel in values:
        versions.setdefault(channel, 1)
    body = {"thread_id": thread_id, "checkpoint_ns": ns, "parent_checkpoint_id": parent,
            "checkpoint": lg_checkpoint(checkpoint_id, values=values, versions=versions,
                                        seen=seen),
            "metadata": {"source": "loop", "step": 1, "parents": {}} if metadata is None
            else metadata}
    if identity is not None:
        body["identity"] = identity
    return body


def lg_writes(thread_id: str, checkpoint_id: str, task_id: str, writes, *, ns: str = "",
              task_path: str = "") -> dict:
    """A ``POST …/langgraph/writes`` body; ``writes`` is ``[(idx, channel, value)]``."""
    return {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id,
            "task_id": task_id, "task_path": task_path,
            "writes": [{"idx": i, "channel": c, "value": typed(v)} for i, c, v in writes]}


def graph_put(writer, tenant, body: dict, token=None):
    """Store a LangGraph checkpoint through the service; returns its answer dict."""
    return langgraph.graph_put(actor=writer, tenant=tenant, put=langgraph.parse_put(body),
                               fencing_token=token)[0]


def graph_writes(writer, tenant, body: dict, token=None) -> int:
    return langgraph.graph_put_writes(actor=writer, tenant=tenant,
                                      body=langgraph.parse_writes(body), fencing_token=token)


class _FormReader(HTMLParser):
    """The fields one ``<form id=…>`` of a page would send, as a browser sends them."""

    def __init__(self, form_id: str):
        super().__init__(convert_charrefs=True)
        self.form_id, self.inside, self.fields = form_id, False, []
        self._textarea: list | None = None
        self._select: list | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        if not self.inside or "name" not in a and tag != "option":
            return
        if tag == "input" and a.get("type", "text") not in ("submit", "button", "reset"):
            if a.get("type") not in ("checkbox", "radio") or "checked" in a:
                self.fields.append((a["name"], a.get("value", "on" if a.get("type") else "")))
        elif tag == "textarea":
            self._textarea = [a["name"], ""]
        elif tag == "select":
            self._select = [a["name"], None]
        elif tag == "option" and self._select is not None:
            if self._select[1] is None or "selected" in a:
                self._select[1] = a.get("value", "")

    def handle_data(self, data):
        if self._textarea is not None:
            self._textarea[1] += data

    def handle_endtag(self, tag):
        if tag == "form":
            self.inside = False
        elif tag == "textarea" and self._textarea is not None:
            name, text = self._textarea
            text = text[1:] if text.startswith("\n") else text  # as HTML parses a textarea
            self.fields.append((name, re.sub(r"\r\n|\r|\n", "\r\n", text)))  # sent as CR LF
            self._textarea = None
        elif tag == "select" and self._select is not None:
            self.fields.append(tuple(self._select))
            self._select = None


def form_fields(page: str, form_id: str) -> dict:
    """What submitting the form ``form_id`` of the HTML ``page`` unchanged sends: its
    fields as a browser sends them (checked boxes only, a textarea's lines as CR LF),
    ``{name: value}``, or ``{name: [values]}`` for a name sent more than once (for
    ``Client.post``). A test changes one field and posts it: what a person does."""
    reader = _FormReader(form_id)
    reader.feed(page)
    out: dict = {}
    for name, value in reader.fields:
        if name in out:
            out[name] = (out[name] if isinstance(out[name], list) else [out[name]]) + [value]
        else:
            out[name] = value
    return out


def documented_block(doc, marker: str) -> str:
    """The ```sh block that follows ``marker`` in the document ``doc`` (a ``Path``): what
    a doc-driven test runs verbatim (tests/lifecycle/test_restore_doc.py,
    tests/security/test_role_setup_doc.py). Fails the test when the marker or its block
    is gone."""
    import re

    text = doc.read_text(encoding="utf-8")
    assert marker in text, f"the tested block's marker is gone from {doc.name}"
    match = re.search(r"```sh\n(.*?)```", text[text.index(marker):], re.S)
    assert match, "no ```sh block after the marker"
    return match.group(1)


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then closed again): a server that is
    down, for the outage tests."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
