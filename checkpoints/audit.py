"""The tamper-evident audit trail: keyed events, their keys and hash schemes, the legacy
chain's pieces, and the tenant registry. The tenant's Merkle tree, its sequencer and the
verifier are ``checkpoints.audittree``; signed head exports ``checkpoints.audithead``.
What each piece proves, and what it does not, is written up in docs/security/audit.md;
the short version:

- **Keyed events.** An event's ``hash`` is HMAC-SHA256 with a key from
  ``RECOVERY_AUDIT_KEYS`` (which the database never holds) over the tenant, the key id
  and the event's fields, the actor's id included. Events written since issue 22 are
  keyed alone (scheme 4): their order is their leaf in the tenant's Merkle tree, given
  after the commit by the sequencer. Events written before are chained (schemes 1-3: the
  previous event's hash covered, seq 1..n, ``AuditChainHead`` at the last) and verify as
  they were made; the tree's first head covers them too. Events older than migration
  0005 are plain SHA-256 (scheme 1), accepted only inside the range that migration sealed.
- **Key rotation.** Each event names its key (``key_id``: the first 16 hex digits of
  HMAC-SHA256(key, "recovery.audit.key-id")). Prepend a new key; keep the old ones listed
  so the events they signed still verify.
- **Tenant registry.** ``tenant_create`` also registers the tenant (``AuditTenant``: keyed
  rows numbered 1..n), so ``registry_verify`` names a tenant deleted whole.

``audit_record`` is on every write's hot path: one HMAC and one INSERT, no per-tenant row
read or locked (a trigger gives ``seq`` and queues the event: migration 0035).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from . import auditshape, dbclock, locks, sql
from .exceptions import InvalidPayload
from .jsonparse import dumps
from .models import AuditChainHead, AuditEvent, AuditHashScheme, AuditTenant, Tenant

SYSTEM = "system"
GENESIS = "0" * 64
KEY_MIN_LENGTH = 32
KEY_ID_LABEL = b"recovery.audit.key-id"
HEX64_RE = re.compile(r"[0-9a-f]{64}\Z")


# --------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditKeys:
    """The configured audit keys: ``newest_id`` signs, ``by_id`` verifies."""

    newest_id: str
    by_id: dict[str, bytes]

    @property
    def newest(self) -> bytes:
        return self.by_id[self.newest_id]


#: What an unknown key id most often means (the operator's walk, item 5).
MISSING_KEY_HINT = "(an old audit key missing from RECOVERY_AUDIT_KEYS?)"


def key_id_of(secret: bytes) -> str:
    """The public id of an audit key: 16 hex digits of HMAC-SHA256(key, label)."""
    return hmac.new(secret, KEY_ID_LABEL, hashlib.sha256).hexdigest()[:16]


@lru_cache(maxsize=8)
def _keys(raw: tuple[str, ...]) -> AuditKeys:
    if not raw:
        raise ImproperlyConfigured("RECOVERY_AUDIT_KEYS: at least one key is required")
    by_id: dict[str, bytes] = {}
    for i, key in enumerate(raw, start=1):
        if len(key) < KEY_MIN_LENGTH:
            raise ImproperlyConfigured(
                f"RECOVERY_AUDIT_KEYS: key {i} is shorter than {KEY_MIN_LENGTH} characters "
                "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        secret = key.encode("utf-8")
        by_id.setdefault(key_id_of(secret), secret)
    return AuditKeys(newest_id=key_id_of(raw[0].encode("utf-8")), by_id=by_id)


def audit_keys() -> AuditKeys:
    """The keys of ``settings.RECOVERY_AUDIT_KEYS`` (newest first), parsed once per value.

    Raises ``ImproperlyConfigured`` when the list is empty or a key is shorter than 32
    characters.
    """
    return _keys(tuple(settings.RECOVERY_AUDIT_KEYS))


def _mac(secret: bytes, message: dict) -> str:
    return hmac.new(secret, dumps(message).encode("utf-8"), hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------------------
# Hash schemes
# --------------------------------------------------------------------------------------

def audit_fields(e: AuditEvent) -> dict:
    """The fields an event's hash covers, as canonical-JSON-ready values, for the event's
    ``hash_scheme``: schemes 1 and 2 the ten below; scheme 3 also ``actor_id`` (the
    account's primary key, or ``None`` for the system), so that the column the
    ``actor_name`` is shown for cannot be changed unseen (issue 17, item 13)."""
    fields = {
        "seq": e.seq,
        "created_at": e.created_at.isoformat(),
        "actor": e.actor_name,
        "action": e.action,
        "target_type": e.target_type,
        "target_id": e.target_ref,
        "run_id": str(e.run_uuid) if e.run_uuid else None,
        "reason": e.reason,
        "before": e.before,
        "after": e.after,
    }
    if e.hash_scheme >= AuditHashScheme.HMAC_SHA256_ACTOR:
        fields["actor_id"] = e.actor_id
        if e.incident_ref:  # only when set: older events hash as they always did
            fields["incident_ref"] = e.incident_ref
    if e.hash_scheme >= AuditHashScheme.HMAC_SHA256_LEAF:
        del fields["seq"]  # given by the database after the MAC: the leaf places it
    return fields


def legacy_hash(prev_hash: str, fields: dict) -> str:
    """Scheme 1 (before migration 0005): SHA-256 hex of ``prev_hash`` + canonical JSON."""
    return hashlib.sha256((prev_hash + dumps(fields)).encode("utf-8")).hexdigest()


def event_mac(secret: bytes, *, tenant_id: int, key_id: str, prev_hash: str,
              fields: dict, scheme: int = AuditHashScheme.HMAC_SHA256_ACTOR) -> str:
    """Schemes 2 and 3: HMAC-SHA256 hex over the tenant, key id, previous hash and the
    fields (``audit_fields``); scheme 3 also names itself in the MAC input, so that an
    event cannot be relabelled with another scheme and still verify.

    The tenant is covered so that one tenant's chain cannot be passed off as another's.
    Raises ``ValueError`` for scheme 1 (unkeyed: ``legacy_hash``) or an unknown one.
    """
    message = {"purpose": "audit-event", "tenant": tenant_id, "key_id": key_id,
               "prev_hash": prev_hash, "event": fields}
    if scheme == AuditHashScheme.HMAC_SHA256_LEAF:
        message = {"purpose": "audit-event", "tenant": tenant_id, "key_id": key_id,
                   "scheme": int(scheme), "event": fields}
    elif scheme == AuditHashScheme.HMAC_SHA256_ACTOR:
        message["scheme"] = int(scheme)
    elif scheme != AuditHashScheme.HMAC_SHA256:
        raise ValueError(f"hash_scheme: {scheme} is not a keyed scheme")
    return _mac(secret, message)


def legacy_seal_mac(secret: bytes, *, tenant_id: int, seq: int, last_hash: str) -> str:
    """The seal of a chain's unkeyed prefix: HMAC over (tenant, its last seq, its hash)."""
    return _mac(secret, {"purpose": "audit-legacy-seal", "tenant": tenant_id, "seq": seq,
                         "hash": last_hash})


def seal_legacy_chains(head_model) -> int:
    """Seal every chain's existing (unkeyed, scheme 1) events with the newest audit key.

    Called once by migration 0005, with its historical ``AuditChainHead`` model: each head
    with events gets ``legacy_seq = seq`` and ``legacy_mac`` over (tenant, seq, last_hash).
    The verifier then accepts scheme 1 only up to ``legacy_seq``. Returns how many chains
    were sealed. Raises ``ImproperlyConfigured`` for bad ``RECOVERY_AUDIT_KEYS``.
    """
    keys = audit_keys()
    sealed = 0
    for head in head_model.objects.filter(seq__gt=0, legacy_seq=0):
        head.legacy_seq = head.seq
        head.legacy_key_id = keys.newest_id
        head.legacy_mac = legacy_seal_mac(keys.newest, tenant_id=head.tenant_id,
                                          seq=head.seq, last_hash=head.last_hash)
        head.save(update_fields=["legacy_seq", "legacy_key_id", "legacy_mac"])
        sealed += 1
    return sealed


# --------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------

_INCIDENT: ContextVar[str] = ContextVar("audit_incident_ref", default="")
#: Whether the system's events (``actor=None``) carry ``_INCIDENT`` too: inside a stored
#: job a person's request started (``working_on(..., system=True)``).
_SYSTEM_TOO: ContextVar[bool] = ContextVar("audit_incident_system_too", default=False)
#: The longest incident reference (``INC-2041``): the column's length
#: (``AuditEvent.incident_ref``), read from the model.
INCIDENT_REF_MAX = AuditEvent._meta.get_field("incident_ref").max_length


def incident_ref_problem(text: str) -> str | None:
    """What is wrong with ``text`` (already stripped) as an incident reference, in words,
    or ``None``: the rule, its one home (issue 21, item 10): at most
    ``INCIDENT_REF_MAX`` characters of printable text (``str.isprintable``: no control
    character, no line break); "" is no incident. No query."""
    if len(text) > INCIDENT_REF_MAX:
        return f"at most {INCIDENT_REF_MAX} characters"
    if not text.isprintable():
        return "no control characters"
    return None


def incident_ref_checked(value: str | None, *, name: str) -> str:
    """``value`` stripped of surrounding white space as an incident reference ("" or
    ``None``: none), checked by ``incident_ref_problem``. Returns it ("" for none).
    Raises ``InvalidPayload`` naming ``name`` (the API's ``Incident-Ref`` header; the
    dashboard's ``IncidentForm`` asks ``incident_ref_problem`` itself)."""
    text = (value or "").strip()
    problem = incident_ref_problem(text)
    if problem:
        raise InvalidPayload(f"{name}: {problem}")
    return text


def incident_now() -> str:
    """The incident the events recorded now carry ("" when none): ``working_on``'s, for
    work stored to run later under the same incident (a bulk job: ``services.bulk``; a
    reconcile request: ``services.reconcile_requests``; a migration job:
    ``services.migration_jobs``), read back by its job (``working_on(..., system=True)``)."""
    return _INCIDENT.get()


@contextmanager
def working_on(incident_ref: str, *, system: bool = False):
    """Events a person causes inside carry ``incident_ref`` (checked: ``IncidentForm``).
    ``system``: the system's events too (``actor=None``: a reconcile request's answer, a
    stored job's ``*.fail``), for a stored job run on behalf of the request that stored
    its incident (bulk, reconcile and migration jobs; the newcomer's finding: the
    answers to an on-call engineer's reconcile carried no incident). Outside, in a
    request, the system's events carry none (what the service does on its own)."""
    token = _INCIDENT.set(incident_ref or "")
    system_token = _SYSTEM_TOO.set(system)
    try:
        yield
    finally:
        _SYSTEM_TOO.reset(system_token)
        _INCIDENT.reset(token)

def audit_record(
    *,
    tenant: Tenant,
    actor,
    action: str,
    target_type: str,
    target_id: Any,
    run_id: uuid.UUID | str | None = None,
    reason: str = "",
    before: dict | None = None,
    after: dict | None = None,
    created_at=None,
) -> AuditEvent:
    """Append one event to the tenant's audit trail. Must run inside the caller's
    transaction (the rule of DESIGN.md 5: the change and its audit event commit together).

    One ``INSERT`` and nothing else: no per-tenant row is read or locked (issue 22, item
    1). The event is keyed on its own (scheme 4, ``new_event``); the database gives it
    its ``seq`` and queues it for the sequencer (migration 0035), which integrates it into
    the tenant's Merkle tree after the commit (``audit_integrate``). Returns the saved
    event, ``seq`` set. Raises ``ImproperlyConfigured`` for bad keys.
    """
    assert transaction.get_connection().in_atomic_block, "audit_record needs a transaction"
    # ``created_at``: the database time its caller read with its run lock, when it has
    # one; else the database's time now (one query: a reveal or a tenant-level event),
    # never this process's clock (docs/security/audit.md, "Clocks").
    event = new_event(tenant=tenant, created_at=created_at or dbclock.db_now(), actor=actor,
                      action=action,
                      target_type=target_type, target_id=target_id, run_id=run_id,
                      reason=reason, before=before, after=after)
    event.save()
    event.seq = event.pk  # what the insert trigger stored (migration 0035)
    return event


def audit_record_many(*, tenant: Tenant, actor, events: list[dict], created_at=None) -> int:
    """Append ``events`` to the tenant's chain, in their order, inside the caller's
    transaction: what ``audit_record`` does once per event, in one multi-row insert for
    all of them (``sql.insert_rows``; no per-tenant row is read or locked). For a service that
    writes many objects in one transaction, one event per object (the runifold import,
    issue 10). Each item holds ``audit_record``'s keyword arguments other than
    ``tenant`` and ``actor``: ``action``, ``target_type``, ``target_id`` and optionally
    ``run_id``, ``reason``, ``before``, ``after``. Events are built by ``new_event``,
    like every other append. Returns how many were appended. Raises
    ``ImproperlyConfigured`` for bad keys. ``created_at``: as ``audit_record``'s (the
    database time its caller read under its run locks; else the database's time now)."""
    assert transaction.get_connection().in_atomic_block, "audit_record_many needs a transaction"

    if not events:
        return 0
    created_at = created_at or dbclock.db_now()
    rows = [new_event(tenant=tenant, created_at=created_at, actor=actor, **item)
            for item in events]
    fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
    sql.insert_rows(AuditEvent, [{f.attname: getattr(e, f.attname) for f in fields}
                                 for e in rows])
    return len(rows)


def new_event(*, tenant: Tenant, created_at, actor, action: str,
              target_type: str, target_id: Any, run_id: uuid.UUID | str | None = None,
              reason: str = "", before: dict | None = None,
              after: dict | None = None) -> AuditEvent:
    """The unsaved event, keyed on its own (scheme 4: ``event_mac``) with the newest
    ``RECOVERY_AUDIT_KEYS`` key; ``seq`` is left to the insert trigger (migration 0035). Every append builds its event here, the ORM one
    (``audit_record``) and the checkpoint write's SQL one (``checkpoints.services.writepath``), so
    the two cannot hash differently (and a test that makes the audit store fail breaks
    both here). ``created_at`` is an aware datetime. Raises ``ImproperlyConfigured`` for
    bad keys. With ``auditshape.ENFORCE`` (the test suite) an event whose ``before`` or
    ``after`` holds a key its action's allow-list lacks raises ``AssertionError``."""
    auditshape.check(action, before, after)
    keys = audit_keys()
    event = AuditEvent(
        tenant=tenant,
        seq=None,
        created_at=created_at,
        actor=actor,
        actor_name=actor.get_username() if actor is not None else SYSTEM,
        action=action,
        target_type=target_type,
        target_ref=str(target_id),
        # As the database gives it back, so that the hash recomputes the same.
        run_uuid=uuid.UUID(str(run_id)) if run_id else None,
        reason=reason,
        before=before,
        after=after,
        prev_hash="",
        hash_scheme=AuditHashScheme.HMAC_SHA256_LEAF,
        key_id=keys.newest_id,
        incident_ref=((_INCIDENT.get() or None) if actor is not None or _SYSTEM_TOO.get()
                      else None),
    )
    event.hash = event_mac(keys.newest, tenant_id=tenant.pk, key_id=keys.newest_id,
                           prev_hash="", fields=audit_fields(event),
                           scheme=event.hash_scheme)
    return event


# --------------------------------------------------------------------------------------
# Verifying
# --------------------------------------------------------------------------------------

def _event_problem(e: AuditEvent, prev: str, keys: AuditKeys, legacy_seq: int) -> str:
    """Why event ``e`` does not verify after ``prev``, or ""."""
    where = f"event seq {e.seq} (id {e.pk})"
    if e.prev_hash != prev:
        return f"{where} does not link to the event before it"
    if e.hash_scheme == AuditHashScheme.SHA256:
        if e.seq > legacy_seq:
            return (f"{where} uses the unkeyed legacy hash outside the sealed legacy range "
                    f"(seq 1..{legacy_seq})")
        if legacy_hash(prev, audit_fields(e)) != e.hash:
            return f"{where} does not match its hash"
        return ""
    if e.hash_scheme not in (AuditHashScheme.HMAC_SHA256, AuditHashScheme.HMAC_SHA256_ACTOR):
        return f"{where} has unknown hash scheme {e.hash_scheme}"
    secret = keys.by_id.get(e.key_id)
    if secret is None:
        return (f"{where} is signed with unknown audit key id {e.key_id!r} "
                "(an old key missing from RECOVERY_AUDIT_KEYS?)")
    expected = event_mac(secret, tenant_id=e.tenant_id, key_id=e.key_id, prev_hash=prev,
                         fields=audit_fields(e), scheme=e.hash_scheme)
    if not hmac.compare_digest(expected, e.hash):
        return f"{where} does not match its hash (HMAC)"
    return ""


def _seal_problem(head: AuditChainHead, sealed_hash: str, keys: AuditKeys) -> str:
    secret = keys.by_id.get(head.legacy_key_id)
    if secret is None:
        return (f"the legacy seal (seq {head.legacy_seq}) is signed with unknown audit key id "
                f"{head.legacy_key_id!r} (an old key missing from RECOVERY_AUDIT_KEYS?)")
    expected = legacy_seal_mac(secret, tenant_id=head.tenant_id, seq=head.legacy_seq,
                               last_hash=sealed_hash)
    if not hmac.compare_digest(expected, head.legacy_mac):
        return f"the legacy seal (seq {head.legacy_seq}) does not match the events"
    return ""


# --------------------------------------------------------------------------------------
# The tenant registry: every tenant the verifier must find
# --------------------------------------------------------------------------------------

#: The name ``registry_verify`` reports registry-wide problems under (not a slug).
REGISTRY = "(tenant registry)"
#: The advisory lock that serialises registrations (PostgreSQL; SQLite's writes are).
REGISTRY_LOCK = 0x52435654  # "RCVT"


def registry_mac(secret: bytes, *, seq: int, tenant_pk: int, slug: str, created_at: str,
                 key_id: str) -> str:
    """HMAC-SHA256 hex of one tenant registration (``AuditTenant``)."""
    return _mac(secret, {"purpose": "audit-tenant", "seq": seq, "tenant": tenant_pk,
                         "slug": slug, "created_at": created_at, "key_id": key_id})


def _register(registry_model, tenant_pk: int, slug: str, created_at) -> None:
    keys = audit_keys()
    last = registry_model.objects.order_by("-seq").values_list("seq", flat=True).first()
    seq = (last or 0) + 1
    registry_model.objects.create(
        seq=seq, tenant_pk=tenant_pk, slug=slug, created_at=created_at, key_id=keys.newest_id,
        mac=registry_mac(keys.newest, seq=seq, tenant_pk=tenant_pk, slug=slug,
                         created_at=created_at.isoformat(), key_id=keys.newest_id))


def tenant_register(tenant: Tenant) -> None:
    """Add ``tenant`` to the tenant registry, inside the caller's transaction (the one that
    creates the tenant: ``tenant_create``). On PostgreSQL an advisory transaction lock
    serialises registrations, so ``seq`` has no gap or repeat. Raises
    ``ImproperlyConfigured`` for bad keys."""
    assert transaction.get_connection().in_atomic_block, "tenant_register needs a transaction"
    locks.lock_transaction_key(REGISTRY_LOCK)
    _register(AuditTenant, tenant.pk, tenant.slug, dbclock.db_now())


def register_existing_tenants(tenant_model, registry_model) -> int:
    """Register every tenant that exists and is not registered yet, in primary-key order,
    as created now: the migration that adds the registry calls it with its historical
    models. Returns how many. Raises ``ImproperlyConfigured`` for bad keys."""
    known = set(registry_model.objects.values_list("tenant_pk", flat=True))
    added = 0
    for pk, slug in tenant_model.objects.order_by("pk").values_list("pk", "slug"):
        if pk not in known:
            _register(registry_model, pk, slug, timezone.now())
            added += 1
    return added


def registry_verify(*, slug: str | None = None) -> list[tuple[str, str]]:
    """Check the tenant registry against the tenants; returns ``[(slug, problem)]``, empty
    when it holds (``REGISTRY`` instead of a slug for a gap, whose tenant is unknown).
    With ``slug``, only that tenant's registration is checked.

    Problems: the registry is not numbered 1..n without gaps (a registration was deleted),
    a registration does not match its MAC (changed, or forged without the key) or names an
    unknown key; a registered tenant is gone or carries another slug (its row, events and
    head deleted: ``verify_audit_chain`` would otherwise not know to look for it); a
    tenant is not registered (made outside ``tenant_create``, or its registration
    deleted). What it cannot see: the *last* registrations deleted together with their
    tenants; a head exported before (``--against``) names them. Reads only.
    """
    keys = audit_keys()
    problems: list[tuple[str, str]] = []
    tenants = dict(Tenant.objects.values_list("pk", "slug"))
    registered: set[int] = set()
    rows = AuditTenant.objects.order_by("seq")
    if slug is not None:
        pk = next((p for p, s in tenants.items() if s == slug), None)
        rows = rows.filter(Q(slug=slug) | Q(tenant_pk=pk))
    expected = 1
    for r in rows.iterator():
        where = f"tenant registry seq {r.seq} (tenant id {r.tenant_pk}, {r.slug!r})"
        if slug is None and r.seq != expected:
            problems.append((REGISTRY, f"gap before seq {r.seq} (seq {expected} expected: "
                                       "a tenant's registration was deleted)"))
        expected = r.seq + 1
        secret = keys.by_id.get(r.key_id)
        if secret is None:
            problems.append((r.slug, f"{where} is signed with unknown audit key id "
                                     f"{r.key_id!r} {MISSING_KEY_HINT}"))
            continue
        mac = registry_mac(secret, seq=r.seq, tenant_pk=r.tenant_pk, slug=r.slug,
                           created_at=r.created_at.isoformat(), key_id=r.key_id)
        if not hmac.compare_digest(mac, r.mac):
            problems.append((r.slug, f"{where} does not match its MAC (changed?)"))
            continue
        registered.add(r.tenant_pk)
        if r.tenant_pk not in tenants:
            problems.append((r.slug, f"the tenant registered on {r.created_at.isoformat()} "
                                     f"(id {r.tenant_pk}) is gone: its row, events and chain "
                                     "head were deleted"))
        elif tenants[r.tenant_pk] != r.slug:
            problems.append((r.slug, f"tenant id {r.tenant_pk} was registered as {r.slug!r} "
                                     f"but is now {tenants[r.tenant_pk]!r}"))
    for pk, s in sorted(tenants.items(), key=lambda item: item[1]):
        if (slug is None or s == slug) and pk not in registered:
            problems.append((s, "the tenant is not in the tenant registry (made outside "
                                "tenant_create, or its registration was deleted)"))
    return problems
