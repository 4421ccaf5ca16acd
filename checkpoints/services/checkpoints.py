"""Checkpoints: envelope validation and the compare-and-swap write (CONTRACT.md 2, 3 and
6; RUNIFOLD.md 1), payload reveals and revision exports.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from .. import crypto, declared, intranges, kinds, roles
from ..audit import (
    audit_record,
)
from ..exceptions import (
    Fenced,
    Forbidden,
    InvalidPayload,
    NotFound,
    StaleRevision,
    UsageDecreased,
)
from ..jsonparse import dumps, loads_any
from ..models import (
    Checkpoint,
    CheckpointRevision,
    Effect,
    Tenant,
)
from ..permissions import require, tenant_perms
from ..vocab import (
    AuditAction,
    TargetType,
)
from . import screening, writepath
from .common import _require_reason, _uuid_field, cas_revisions_check
from .runs import (
    _record_fenced,
)

# --------------------------------------------------------------------------------------
# Envelope validation (CONTRACT.md sections 2 and 6)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """A validated checkpoint envelope; ``payload_json`` is its canonical JSON text."""

    checkpoint_id: uuid.UUID
    run_id: uuid.UUID
    revision: int
    kind: str
    schema_version: int
    payload: Any
    payload_json: str
    updated_at_ms: int

    def as_json(self) -> dict:
        """The envelope as its runtime sent it (RUNIFOLD.md 1), e.g. to keep a refused
        write with its conflict."""
        return {"id": str(self.checkpoint_id), "run_id": str(self.run_id),
                "revision": self.revision, "kind": self.kind,
                "schema_version": self.schema_version, "payload": self.payload,
                "updated_at_ms": self.updated_at_ms}


def parse_envelope(body: dict, *, url_id: uuid.UUID) -> Envelope:
    """Validate a checkpoint body against CONTRACT.md sections 2 and 6.

    Raises ``InvalidPayload`` naming the first bad field.
    """
    cid = _uuid_field(body, "id")
    if cid != url_id:
        raise InvalidPayload("id: differs from the id in the URL")
    run_id = _uuid_field(body, "run_id")
    revision = intranges.REVISION.check(body.get("revision"), "revision")
    kind = body.get("kind")
    if not kinds.is_kind_name(kind):
        raise InvalidPayload(
            "kind: must match ^[a-z][a-z0-9_]*(\\.[a-z0-9_-]+)+$ (e.g. acme.order)"
        )
    schema_version = intranges.SCHEMA_VERSION.check(body.get("schema_version"),
                                                    "schema_version")
    if "payload" not in body:
        raise InvalidPayload("payload: required")
    updated_at_ms = intranges.UPDATED_AT_MS.check(body.get("updated_at_ms"), "updated_at_ms")
    unknown = set(body) - {"id", "run_id", "revision", "kind", "schema_version", "payload",
                           "updated_at_ms"}
    if unknown:
        raise InvalidPayload(f"{sorted(unknown)[0]}: unknown field")
    return Envelope(cid, run_id, revision, kind, schema_version, body["payload"],
                    dumps(body["payload"]), updated_at_ms)


# --------------------------------------------------------------------------------------
# Checkpoints: compare-and-swap
# --------------------------------------------------------------------------------------

def checkpoint_put(
    *,
    actor,
    tenant: Tenant,
    envelope: Envelope,
    expected_revision: int | None,
    fencing_token: int | None = None,
) -> tuple[Checkpoint, bool]:
    """Compare-and-swap one checkpoint (CONTRACT.md 3, RUNIFOLD.md 1).

    ``expected_revision=None`` creates (the envelope's revision must be 0); an integer N
    updates from N to N+1. Returns ``(checkpoint, created)``.

    Raises ``InvalidPayload`` (400: revision not 0 / N+1, run_id or kind changed),
    ``NotFound`` (404: update of a missing checkpoint), ``Fenced`` (409),
    ``StaleRevision`` (412, after committing the conflict record), ``UsageDecreased``
    (422: a usage counter below the stored revision's, CONTRACT.md 8; also after
    committing the conflict record), ``SecretDetected`` (422: a credential-like value
    under a ``refuse`` data policy; nothing written, docs/security/secrets.md).
    """
    require(actor, tenant, roles.WRITE)
    cas_revisions_check(expected_revision, envelope.revision)
    try:
        checkpoint = writepath.checkpoint_write(
            actor=actor, tenant=tenant, envelope=envelope, expected_revision=expected_revision,
            fencing_token=fencing_token, **_stored_form(envelope, tenant))
    except Fenced as exc:
        _record_fenced(exc, tenant=tenant, actor=actor, target_type=TargetType.CHECKPOINT,
                       target_id=envelope.checkpoint_id, expected=expected_revision,
                       attempted=envelope.revision, token=fencing_token,
                       refused=dumps(envelope.as_json()))
        raise
    if isinstance(checkpoint, (StaleRevision, UsageDecreased)):
        raise checkpoint
    return checkpoint, expected_revision is None


def _stored_form(envelope: Envelope, tenant: Tenant, *, refuse: bool = True) -> dict:
    """What the write path stores of ``envelope`` besides its fields (the keywords of
    ``writepath.checkpoint_write``): its classification (``cls``, by the kinds in code or
    ``tenant``'s declared ones), the phase label (for an unsupported payload, the schema
    error), the encrypted payload, its size, and what screening found in it
    (``screened``, ``services.screening``; the write path applies the tenant's policy
    in its transaction and raises ``SecretDetected`` before writing anything), which a
    refuse policy does not refuse when ``refuse`` is false (a migration rewrites what is
    stored: it records)."""
    size = len(envelope.payload_json.encode("utf-8"))
    screened = screening.screen_payload(envelope.payload, size, refuse=refuse)
    lookup = declared.lookup(tenant)
    cls = kinds.classify(envelope.kind, envelope.schema_version, envelope.payload,
                         lookup=lookup)
    # A kind not in code is classified by the tenant's declaration (or its absence): the
    # write path checks, under the tenant's audit head, that it has not changed since.
    by = (None if kinds.in_code(envelope.kind)
          else writepath.DeclaredBy(envelope.kind, envelope.schema_version,
                                    lookup.digest(envelope.kind, envelope.schema_version),
                                    lambda: _stored_form(envelope, tenant, refuse=refuse)))
    return {"cls": cls, "phase_label": (cls.error if not cls.supported else cls.phase.label)[:256],
            "ciphertext": crypto.encrypt_text(envelope.payload_json, tenant=tenant),
            "size": size, "declared_by": by, "screened": screened}


def checkpoint_envelope(checkpoint: Checkpoint | CheckpointRevision, *, run_id=None,
                        checkpoint_id=None) -> dict:
    """The runifold-core JSON envelope of a checkpoint or one of its revisions (decrypts)."""
    if isinstance(checkpoint, Checkpoint):
        run_id = run_id or checkpoint.run.uuid
        checkpoint_id = checkpoint.uuid
    return {
        "id": str(checkpoint_id),
        "run_id": str(run_id),
        "revision": checkpoint.revision,
        "kind": checkpoint.kind,
        "schema_version": checkpoint.schema_version,
        "payload": loads_any(crypto.decrypt_text(checkpoint.payload_ciphertext,
                                                       tenant=checkpoint.tenant_id)),
        "updated_at_ms": checkpoint.updated_at_ms,
    }


def _require_own(tenant: Tenant, checkpoint: Checkpoint) -> None:
    """``NotFound`` unless ``checkpoint`` is ``tenant``'s: a checkpoint object handed in
    by the caller is checked like an id in a URL, so a caller that looked it up in the
    wrong tenant cannot have the twin's payload revealed and audited here (CONTRACT.md 3:
    an object of another tenant is answered as if it did not exist)."""
    if checkpoint.tenant_id != tenant.pk:
        raise NotFound("no such checkpoint")


def payload_reveal(*, actor, tenant: Tenant, checkpoint: Checkpoint, revision: int | None = None,
                   reason: str = "", action: str = AuditAction.PAYLOAD_REVEAL) -> dict:
    """Decrypt one revision's envelope for ``actor``; audited in the same transaction.

    Needs ``reveal_payload`` (reviewer, approver, admin) or, for the runtime's own
    ``GET`` of a checkpoint, ``write_runs`` (``action=AuditAction.PAYLOAD_READ``).
    Raises ``Forbidden``/``NotFound`` as ``permissions.require``; ``NotFound`` for a
    revision that does not exist, or a checkpoint that is not ``tenant``'s.
    """
    require(actor, tenant, roles.WRITE if action == AuditAction.PAYLOAD_READ else roles.REVEAL)
    _require_own(tenant, checkpoint)
    with transaction.atomic():
        if revision is None or revision == checkpoint.revision:
            source = Checkpoint.objects.for_tenant(tenant).select_related("run").get(
                pk=checkpoint.pk)
            envelope = checkpoint_envelope(source)
        else:
            rev = (CheckpointRevision.objects.for_tenant(checkpoint.tenant_id)
                   .filter(checkpoint=checkpoint, revision=revision).first())
            if rev is None:
                raise NotFound(f"revision {revision} does not exist")
            envelope = checkpoint_envelope(rev, run_id=checkpoint.run.uuid,
                                           checkpoint_id=checkpoint.uuid)
        audit_record(tenant=tenant, actor=actor, action=action, target_type=TargetType.CHECKPOINT,
                     target_id=checkpoint.uuid, run_id=checkpoint.run.uuid,
                     reason=reason, after={"revision": envelope["revision"]})
    return envelope


def revisions_export(*, actor, tenant: Tenant, checkpoint: Checkpoint, after: int | None = None,
                     limit: int = 20, max_bytes: int | None = None) -> tuple[list[dict], bool]:
    """One page of a checkpoint's accepted revisions, oldest first, decrypted; one audit
    event per page (CONTRACT.md 3 "every accepted revision, oldest first", paged by issue 6
    fault 6 so that one answer stays bounded).

    The page holds the revisions after ``after`` (``None``: from the first), at most
    ``limit`` of them and no more payload bytes than ``max_bytes`` (default four times
    ``RECOVERY_MAX_BODY_BYTES``; always at least one revision). Returns
    ``(envelopes, more)``; ``more`` says whether revisions follow the page. Raises
    ``Forbidden`` for a role that may not read payloads (viewer), ``NotFound`` for a
    checkpoint that is not ``tenant``'s, and what ``permissions.require`` raises.
    """
    require(actor, tenant, roles.VIEW)
    perms = tenant_perms(actor, tenant)
    if not perms & {roles.WRITE, roles.REVEAL}:
        raise Forbidden("your role may not read payloads")
    _require_own(tenant, checkpoint)
    if max_bytes is None:
        max_bytes = 4 * settings.RECOVERY_MAX_BODY_BYTES
    revs = (CheckpointRevision.objects.for_tenant(checkpoint.tenant_id)
            .filter(checkpoint=checkpoint).order_by("revision"))
    if after is not None:
        revs = revs.filter(revision__gt=after)
    # Choose the page from the sizes first, so no ciphertext beyond it is read.
    sizes = list(revs.values_list("revision", "payload_size")[: max(1, limit) + 1])
    page, total = [], 0
    for revision, size in sizes[:limit]:
        if page and total + size > max_bytes:
            break
        page.append(revision)
        total += size
    more = len(sizes) > len(page)
    with transaction.atomic():
        rows = list(revs.filter(revision__in=page)) if page else []
        out = [checkpoint_envelope(r, run_id=checkpoint.run.uuid,
                                   checkpoint_id=checkpoint.uuid) for r in rows]
        audit_record(tenant=tenant, actor=actor, action=AuditAction.PAYLOAD_EXPORT,
                     target_type=TargetType.CHECKPOINT, target_id=checkpoint.uuid,
                     run_id=checkpoint.run.uuid,
                     after={"revisions": len(out),
                            "from": page[0] if page else None,
                            "to": page[-1] if page else None})
    return out, more


def receipt_reveal(*, actor, tenant: Tenant, effect_id, reason: str) -> dict:
    """Decrypt an effect's current receipt for a role that may reveal payloads
    (reviewer, approver, admin), with one ``receipt.reveal`` audit event carrying the
    reason, in the same transaction (CONTRACT.md 4: receipts are treated like payloads;
    issue 6, fault 3). Runtimes read receipts in the effect answers instead
    (``permissions.receipts_in_answers``).

    Returns ``{"id": effect UUID str, "run_id": str, "revision": int, "receipt": dict or
    None}``; ``None`` (and nothing audited: nothing was revealed) when the effect has no
    receipt. Raises ``NotFound`` (no role in the tenant, or no such effect, also a
    malformed id), ``Forbidden`` (the role may not reveal), ``ReasonRequired`` /
    ``InvalidPayload`` for a missing or bad reason.
    """
    require(actor, tenant, roles.REVEAL)
    reason = _require_reason(reason)
    try:
        eid = uuid.UUID(str(effect_id))
    except ValueError:
        raise NotFound("no such effect") from None
    with transaction.atomic():
        effect = (Effect.objects.for_tenant(tenant).filter(uuid=eid)
                  .select_related("run").first())
        if effect is None:
            raise NotFound("no such effect")
        answer = {"id": str(effect.uuid), "run_id": str(effect.run.uuid),
                  "revision": effect.revision, "receipt": effect.receipt}
        if effect.has_receipt:
            audit_record(tenant=tenant, actor=actor, action=AuditAction.RECEIPT_REVEAL,
                         target_type=TargetType.EFFECT, target_id=effect.uuid,
                         run_id=effect.run.uuid, reason=reason,
                         after={"revision": effect.revision})
    return answer


