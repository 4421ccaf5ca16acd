"""Signed tree heads kept outside the database (issue 6, fault 2; issue 22, item 1;
docs/security/audit.md): ``audit_head_export`` writes an ``audit.export_head`` event,
integrates it, and returns the tenant's newest signed tree head, which covers it;
``audit_head_parse`` reads a line of ``export_audit_head`` and ``audit_head_check`` proves
that the tree still extends it (a consistency proof, RFC 9162). Lines exported before the
Merkle tree (an HMAC over a chain position: ``LEGACY_FIELDS``) still parse and check as
they did.
"""

from __future__ import annotations

import base64
import hmac
import time

from django.db import transaction

from . import audittree, roles
from .audit import HEX64_RE, MISSING_KEY_HINT, _mac, audit_keys, audit_record
from .exceptions import InvalidPayload
from .jsonparse import loads_object
from .models import AuditChainHead, AuditEvent, AuditLeaf, AuditTreeHead, Tenant
from .permissions import require
from .vocab import AuditAction, TargetType

#: A line exported before issue 22: an HMAC over a chain position.
LEGACY_FIELDS = ("tenant", "seq", "last_hash", "exported_at", "key_id", "signature")
#: A signed tree head (``audittree.head_json`` and the tenant's slug).
FIELDS = ("tenant", "origin", "tree_size", "root_hash", "created_at", "key_id",
          "public_key", "signature", "checkpoint")
EXPORT_FIELDS = FIELDS
#: How long an export waits for its event's integration (another sequencer may hold the
#: tenant's lease), in seconds.
INTEGRATE_WAIT_S = 30.0


def _legacy_signature(secret: bytes, record: dict) -> str:
    return _mac(secret, {"purpose": "audit-head-export",
                         **{k: record[k] for k in LEGACY_FIELDS if k != "signature"}})


def audit_head_export(*, tenant: Tenant, actor=None) -> dict:
    """Export the tenant's newest signed tree head, to keep outside the database.

    Writes an ``audit.export_head`` event (an export is an operator action, audited like
    the others) in its own transaction, then integrates the tenant's queue
    (``audittree.audit_integrate``; waits up to ``INTEGRATE_WAIT_S`` when another
    sequencer holds the lease) and returns the newest head, which covers the export's
    own event: ``{"tenant" (slug), "origin", "tree_size", "root_hash", "created_at",
    "key_id", "public_key" (base64 Ed25519), "signature" (base64, over "checkpoint"),
    "checkpoint" (C2SP tlog checkpoint text)}``. ``actor`` must be an admin of the tenant,
    or ``None`` for the operator's command line; raises ``NotFound``/``Forbidden``
    otherwise, ``TimeoutError`` when the event was not integrated in time.
    """
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    keys = audit_keys()
    with transaction.atomic():
        event = audit_record(tenant=tenant, actor=actor, action=AuditAction.AUDIT_EXPORT_HEAD,
                             target_type=TargetType.TENANT, target_id=tenant.slug,
                             after={"key_id": keys.newest_id})
    deadline = time.monotonic() + INTEGRATE_WAIT_S
    while not AuditLeaf.objects.for_tenant(tenant).filter(event_id=event.pk).exists():
        if not audittree.audit_integrate(tenant) and time.monotonic() > deadline:
            raise TimeoutError("the export's audit event was not integrated in time "
                               "(is another sequencer stuck?)")
        time.sleep(0.01)
    head = audittree.newest_head(tenant.pk)
    return {"tenant": tenant.slug, **audittree.head_json(head)}


def audit_head_parse(line: str) -> dict:
    """Parse one line written by ``export_audit_head`` (a JSON object): a signed tree
    head (``FIELDS``) or a line exported before issue 22 (``LEGACY_FIELDS``).

    Returns the record with exactly those fields. Raises ``InvalidPayload`` naming the
    field: not one strict JSON object, a missing or unknown field, a string field that is
    not a non-empty string, ``seq``/``tree_size`` not an integer >= 1, a hash not 64
    lower-case hex digits, a signature or public key not base64.
    """
    record = loads_object(line, max_depth=2, what="line")
    names = FIELDS if "tree_size" in record else LEGACY_FIELDS
    for name in names:
        if name not in record:
            raise InvalidPayload(f"{name}: missing")
    for name in record:
        if name not in names:
            raise InvalidPayload(f"{str(name)[:40]}: unknown field")
    strings = (("tenant", "origin", "created_at", "key_id", "public_key", "signature",
                "checkpoint") if names is FIELDS else ("tenant", "exported_at", "key_id"))
    for name in strings:
        if not isinstance(record[name], str) or not 0 < len(record[name]) <= 1000:
            raise InvalidPayload(f"{name}: must be a non-empty string")
    size = "tree_size" if names is FIELDS else "seq"
    if type(record[size]) is not int or not 1 <= record[size] < 2**63:
        raise InvalidPayload(f"{size}: must be an integer >= 1")
    hashes = ("root_hash",) if names is FIELDS else ("last_hash", "signature")
    for name in hashes:
        if not isinstance(record[name], str) or not HEX64_RE.match(record[name]):
            raise InvalidPayload(f"{name}: must be 64 lower-case hex digits")
    if names is FIELDS:
        for name in ("signature", "public_key"):
            try:
                base64.b64decode(record[name], validate=True)
            except ValueError:
                raise InvalidPayload(f"{name}: must be base64") from None
    return record


def audit_head_check(*, record: dict) -> str:
    """Check that the tenant's audit trail still holds an exported head; returns the
    problem, or "". ``record`` comes from ``audit_head_parse``.

    A signed tree head: its key must be one this deployment derives from
    ``RECOVERY_AUDIT_KEYS`` (same id and public key), its signature verify over its
    checkpoint text (``merkle.verify_head_line``, what an outsider runs with the public
    key alone) and its origin name the tenant's tree; then the tree must be at least as
    large and a consistency proof from the exported head to the newest one must verify
    (``audittree.consistency_problem``): fewer leaves means events were cut, a failed
    proof that history was rewritten. A line exported before issue 22: its HMAC, and
    the event at its seq still has its hash. Together with ``audit_verify`` this proves
    nothing up to the export was cut or changed since. Reads only.
    """
    if "tree_size" not in record:
        return _legacy_check(record)
    size = record["tree_size"]
    problem = audittree.head_signature_problem(record)
    if problem:
        return f"exported head size {size}: {problem}"
    tenant = Tenant.objects.filter(slug=record["tenant"]).first()
    if tenant is None:
        return "the tenant no longer exists"
    if record["origin"] != audittree.origin_of(tenant.pk):
        return f"exported head size {size} is another tree's ({record['origin']!r})"
    problem = audittree.consistency_problem(tenant, size=size,
                                            root=bytes.fromhex(record["root_hash"]))
    if problem:
        return problem
    # ``created_at`` is not signed (the C2SP checkpoint text has no time): with the tree
    # consistent, it must still be the stored head's, or the line was altered (an
    # attack's finding: an edited date was echoed back as fact).
    stored = (AuditTreeHead.objects.for_tenant(tenant).filter(tree_size=size)
              .values_list("created_at", flat=True).first())
    if stored is not None and record.get("created_at") not in (None, stored.isoformat()):
        return (f"exported head size {size}: its created_at is not the signed head's "
                f"({stored.isoformat()}; altered?)")
    return ""


def _legacy_check(record: dict) -> str:
    keys = audit_keys()
    secret = keys.by_id.get(record["key_id"])
    if secret is None:
        return (f"exported head seq {record['seq']} is signed with unknown audit key id "
                f"{record['key_id']!r} {MISSING_KEY_HINT}")
    if not hmac.compare_digest(_legacy_signature(secret, record), record["signature"]):
        return f"exported head seq {record['seq']}: the signature does not verify (altered?)"
    tenant = Tenant.objects.filter(slug=record["tenant"]).first()
    if tenant is None:
        return "the tenant no longer exists"
    seq = record["seq"]
    head_seq = (AuditChainHead.objects.for_tenant(tenant)
                .values_list("seq", flat=True).first())
    stored = (AuditEvent.objects.for_tenant(tenant).filter(seq=seq)
              .values_list("hash", flat=True).first())
    if stored is None:
        return (f"exported head seq {seq} of {record['exported_at']} is no longer in the "
                "chain (events were cut)")
    if not hmac.compare_digest(stored, record["last_hash"]):
        return (f"event seq {seq} no longer has the hash exported on {record['exported_at']} "
                "(history was rewritten)")
    if head_seq is None or head_seq < seq:
        return f"the chain head (seq {head_seq}) is behind the exported head seq {seq}"
    return ""
