"""Legal holds (issue 20, item 4; CONTRACT.md 8 ``…/legal-holds``; DESIGN.md 3a;
docs/security/retention.md): a tenant admin places a hold on runs, on every run of a
subject, or on the whole tenant, with a reason; while it is active neither retention nor
erasure touches what it covers (``services.lifecycle.run_blockers``); a release keeps the
row (who, when, why).

Also the input rules erasure requests share (``services.erasure``): the reason (1..1024
bytes, printable), a list of run ids of the tenant, a subject (a declared field name and
its value, kept only as its keyed digest).
"""

from __future__ import annotations

import uuid

from django.db import transaction

from .. import locks, roles
from ..audit import audit_record
from ..dbclock import db_now
from ..exceptions import AlreadyDecided, InvalidPayload, NotFound, ReasonRequired
from ..jsonparse import printable_problem, text_problem
from ..models import LIFECYCLE_MAX_RUNS, HeldRun, LegalHold, Run, Tenant, Tombstone
from ..models.lifecycle import REASON_MAX
from ..permissions import require
from ..vocab import AuditAction, HoldScope, TargetType
from .common import _actor_name, _run_ids_check
from .lifecycle import policy_for, subject_digest, subject_value


def _lifecycle_reason(reason, field: str = "reason", *, required: bool = True) -> str:
    """A lifecycle reason: a string of 1..``REASON_MAX`` (1024) UTF-8 bytes once trimmed,
    printable (no control character but tab and newline, no U+0000, no lone surrogate).
    ``required=False``: empty is allowed (an approval's optional note). Raises
    ``ReasonRequired`` (missing or blank) or ``InvalidPayload`` naming ``field``."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidPayload(f"{field}: must be a string")
    reason = (reason or "").strip()
    if not reason:
        if required:
            raise ReasonRequired(f"{field}: a reason is required")
        return ""
    problem = printable_problem(reason)
    if problem:
        raise InvalidPayload(f"{field}: {problem}")
    if len(reason.encode("utf-8")) > REASON_MAX:
        raise InvalidPayload(f"{field}: at most {REASON_MAX} bytes (UTF-8)")
    return reason


def _lifecycle_runs(tenant: Tenant, values, field: str = "runs") -> list[uuid.UUID]:
    """A hold's or an erasure request's run ids: a list of 1..``LIFECYCLE_MAX_RUNS`` UUIDs
    (duplicates dropped, order kept), every one a run of ``tenant`` (one query). Raises
    ``InvalidPayload`` naming ``field`` and, for unknown runs, the first few of them: a
    hold or an erasure names runs that exist, or whose tombstone does (a run of another
    tenant is unknown here)."""
    runs = _run_ids_check(values, field=field, most=LIFECYCLE_MAX_RUNS, what="per request",
                          empty="name at least one run")
    known = set(Run.objects.for_tenant(tenant).filter(uuid__in=runs)
                .values_list("uuid", flat=True))
    if len(known) < len(runs):  # a run whose records expired: its tombstone may be held
        known |= set(Tombstone.objects.for_tenant(tenant).filter(run_uuid__in=runs)
                     .values_list("run_uuid", flat=True))
    unknown = [str(r) for r in runs if r not in known]
    if unknown:
        more = f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else ""
        raise InvalidPayload(f"{field}: no such run in this tenant: "
                             f"{', '.join(unknown[:3])}{more}")
    return runs


def _lifecycle_subject(tenant: Tenant, value, field: str = "subject") -> tuple[str, str]:
    """A subject ``{"field": <a declared subject field>, "value": <a non-empty string
    or an integer>}`` as ``(field name, keyed digest of the value)``: the value is judged
    by the subject index's own rule (``lifecycle.subject_value``: every value a write can
    index, of any length its body carries, taken as it is, unstripped), so whatever a
    write indexed can be held and erased by value. The value itself is never kept,
    logged nor put in an error. One query (the tenant's data policy). Raises
    ``InvalidPayload`` naming ``subject.field`` / ``subject.value``."""
    if not isinstance(value, dict):
        raise InvalidPayload(f"{field}: must be an object {{\"field\", \"value\"}}")
    unknown = sorted(set(value) - {"field", "value"})
    if unknown:
        raise InvalidPayload(f"{field}.{str(unknown[0])[:40]}: unknown field")
    name = value.get("field")
    if not isinstance(name, str) or not name or len(name) > 64 or text_problem(name):
        raise InvalidPayload(f"{field}.field: must be the name of a declared subject field")
    raw = subject_value(value.get("value"))
    if raw is None:
        raise InvalidPayload(f"{field}.value: must be a non-empty string or an integer "
                             "(the value a payload's subject field holds)")
    declared = policy_for(tenant).subject_fields or {}
    if name not in declared:
        raise InvalidPayload(f"{field}.field: {name[:64]!r} is not a subject field of this "
                             "tenant's data policy")
    return name, subject_digest(tenant, name, raw)


def _scope(tenant: Tenant, runs, subject, whole_tenant) -> tuple[str, list, str, str]:
    given = [n for n, v in (("runs", runs is not None), ("subject", subject is not None),
                            ("tenant", whole_tenant is not False)) if v]
    if len(given) != 1:
        raise InvalidPayload("runs: give exactly one of runs, subject or tenant: true")
    if given == ["tenant"]:
        if whole_tenant is not True:
            raise InvalidPayload("tenant: must be true (a hold on every run of the tenant)")
        return HoldScope.TENANT, [], "", ""
    if given == ["subject"]:
        name, digest = _lifecycle_subject(tenant, subject)
        return HoldScope.SUBJECT, [], name, digest
    return HoldScope.RUNS, _lifecycle_runs(tenant, runs), "", ""


def legal_hold_place(*, actor, tenant: Tenant, runs=None, subject=None,
                     whole_tenant: bool = False, reason: str) -> LegalHold:
    """A tenant admin (``roles.MANAGE``) places a legal hold on exactly one of: ``runs``
    (1..``LIFECYCLE_MAX_RUNS`` run ids of the tenant; a ``HeldRun`` row each), ``subject``
    (``{"field", "value"}``, the field declared in the data policy; the value kept as its
    digest only), or the whole tenant (``whole_tenant=True``), with ``reason`` (1..1024
    bytes). Returns the saved hold. Writes it and one ``legal_hold.place`` audit event
    (scope, run count, subject field name; never the subject value) in one transaction,
    under the tenant's audit head, the lock every deletion takes first, so no deletion
    that sees the hold missing commits after it.

    Raises ``NotFound``/``Forbidden`` (rights), ``ReasonRequired``, ``InvalidPayload``
    naming the field (``runs``, ``subject.field``, ``subject.value``, ``tenant``,
    ``reason``), before writing anything."""
    require(actor, tenant, roles.MANAGE)
    reason = _lifecycle_reason(reason)
    scope, run_ids, field, digest = _scope(tenant, runs, subject, whole_tenant)
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        hold = LegalHold.objects.create(
            tenant=tenant, uuid=uuid.uuid4(), scope=scope, run_uuids=[str(r) for r in run_ids],
            subject_field=field, subject_digest=digest, reason=reason, placed_by=actor,
            placed_by_name=_actor_name(actor))
        if run_ids:
            HeldRun.objects.bulk_create([HeldRun(tenant=tenant, hold=hold, run_uuid=r)
                                         for r in run_ids])
        audit_record(tenant=tenant, actor=actor, action=AuditAction.LEGAL_HOLD_PLACE,
                     target_type=TargetType.LEGAL_HOLD, target_id=hold.uuid, reason=reason,
                     after={"scope": scope, "runs": len(run_ids),
                            "subject_field": field or None})
    hold.refresh_from_db()
    return hold


def legal_hold_release(*, actor, tenant: Tenant, hold_id, reason: str) -> LegalHold:
    """A tenant admin releases legal hold ``hold_id`` (its UUID) with ``reason``: the row
    stays, with who released it, when (database clock) and why; what it covered may be
    deleted again (by retention, or by a later erasure request). One
    ``legal_hold.release`` audit event in the same transaction.

    Raises ``NotFound`` (no such hold in the tenant, or a malformed id), ``Forbidden``,
    ``ReasonRequired``/``InvalidPayload`` naming ``reason``, ``AlreadyDecided`` (409)
    when it was released already (naming by whom and when)."""
    require(actor, tenant, roles.MANAGE)
    reason = _lifecycle_reason(reason)
    hid = _hold_uuid(hold_id)
    with transaction.atomic():
        locks.lock_audit_head(tenant)  # every hold write takes it: the row is ours now
        hold = LegalHold.objects.for_tenant(tenant).filter(uuid=hid).first()
        if hold is None:
            raise NotFound("no such legal hold")
        if hold.released_at is not None:
            raise AlreadyDecided(f"hold: already released by {hold.released_by_name} at "
                                 f"{hold.released_at.isoformat()}")
        now = db_now()
        LegalHold.objects.for_tenant(tenant).filter(pk=hold.pk).update(
            released_at=now, released_by=actor, released_by_name=_actor_name(actor),
            release_reason=reason)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.LEGAL_HOLD_RELEASE,
                     target_type=TargetType.LEGAL_HOLD, target_id=hold.uuid, reason=reason,
                     before={"active": True, "scope": hold.scope},
                     after={"active": False, "scope": hold.scope})
    hold.refresh_from_db()
    return hold


def _hold_uuid(value) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value)[:64])
    except ValueError:
        raise NotFound("no such legal hold") from None
