"""Erasure on request (issue 20, item 2; CONTRACT.md 8 ``…/erasure-requests``;
docs/security/retention.md "Erasure"): a reviewer or admin files a request to erase the
payloads of runs, or of every run of a subject; an approver who is not the requester
approves it (four eyes; also a database check) or rejects it; the approval executes it.

Execution (``erasure_approve``, in the approval's transaction): every run the request
covers (its run ids, or the runs the subject index ``RunSubject`` finds for the subject's
digest) is locked (the tenant's audit head, then the runs in ascending id), judged at
once by ``services.runs_blockers`` and, when nothing blocks it, purged by the one
deletion core ``services.purge_run_payloads`` (``cause=erasure``: a tombstone linked to
the request and a ``run.erase`` audit event each). A run something blocks (a legal hold, not ended, an
effect in doubt, already deleted) is **not** erased and not retried later: the request
ends ``executed`` with ``counts`` saying how many runs were erased and how many each
blocker stopped; erasing them needs a new request once the blocker is gone (the hold
released, the run ended). Evidence kept: the request row (who asked, who decided, when,
why, the counts) and its events ``erasure.request``, ``erasure.approve``,
``erasure.execute`` (or ``erasure.reject``); never a payload value nor a subject value
(a subject is its field's name and a keyed digest).
"""

from __future__ import annotations

import uuid

from django.db import transaction

from .. import locks, roles
from ..audit import audit_record
from ..dbclock import db_now
from ..exceptions import AlreadyDecided, Forbidden, InvalidPayload, NotFound
from ..models import ErasureRequest, Run, RunSubject, Tenant
from ..permissions import require
from ..vocab import AuditAction, DeletionCause, ErasureState, TargetType
from .common import _actor_name
from .holds import _lifecycle_reason, _lifecycle_runs, _lifecycle_subject
from .lifecycle import Blocker, NotDeletable, purge_run_payloads, runs_blockers

#: The words of an executed request's ``counts`` besides ``runs``, ``erased`` and
#: ``blocked``: how many runs each blocker stopped (a run may have several).
BLOCKERS = (Blocker.HELD, Blocker.NOT_ENDED, Blocker.IN_DOUBT, Blocker.DELETED)


def erasure_request(*, actor, tenant: Tenant, runs=None, subject=None,
                    reason: str) -> ErasureRequest:
    """A reviewer or admin (``roles.REVIEW`` or ``roles.MANAGE``) asks to erase the
    payloads of ``runs`` (1..``LIFECYCLE_MAX_RUNS`` run ids of the tenant) or of every
    run of ``subject`` (``{"field": <declared subject field>, "value": ...}``; kept as
    its digest), with ``reason`` (1..1024 bytes). Exactly one of ``runs`` and
    ``subject``. Returns the stored request (``requested``); nothing is erased until an
    approver approves it. One ``erasure.request`` audit event (scope, run count, subject
    field name) in the same transaction.

    Raises ``NotFound``/``Forbidden``, ``ReasonRequired``, ``InvalidPayload`` naming the
    field (``runs``, ``subject.field``, ``subject.value``, ``reason``), before writing."""
    require(actor, tenant, roles.REVIEW)  # reviewers and admins (who hold every right)
    reason = _lifecycle_reason(reason)
    if (runs is None) == (subject is None):
        raise InvalidPayload("runs: give exactly one of runs or subject")
    run_ids, field, digest = [], "", ""
    if runs is not None:
        run_ids = _lifecycle_runs(tenant, runs)
    else:
        field, digest = _lifecycle_subject(tenant, subject)
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        request = ErasureRequest.objects.create(
            tenant=tenant, uuid=uuid.uuid4(), run_uuids=[str(r) for r in run_ids],
            subject_field=field, subject_digest=digest, reason=reason, requested_by=actor,
            requested_by_name=_actor_name(actor))
        audit_record(tenant=tenant, actor=actor, action=AuditAction.ERASURE_REQUEST,
                     target_type=TargetType.ERASURE_REQUEST, target_id=request.uuid,
                     reason=reason,
                     after={"state": ErasureState.REQUESTED,
                            "scope": "subject" if field else "runs", "runs": len(run_ids),
                            "subject_field": field or None})
    request.refresh_from_db()
    return request


def _decide(*, actor, tenant: Tenant, request_id, reason, approve: bool) -> ErasureRequest:
    require(actor, tenant, roles.APPROVE)
    reason = _lifecycle_reason(reason, required=not approve)
    rid = _request_uuid(request_id)
    with transaction.atomic():
        locks.lock_audit_head(tenant)  # every erasure write takes it: the row is ours now
        request = ErasureRequest.objects.for_tenant(tenant).filter(uuid=rid).first()
        if request is None:
            raise NotFound("no such erasure request")
        if request.requested_by_id == actor.pk:
            raise Forbidden("approver: the requester may not approve or reject their own "
                            "erasure request; another approver must decide it")
        if request.state != ErasureState.REQUESTED:
            raise AlreadyDecided(f"state: already {request.state} by "
                                 f"{request.decided_by_name} at "
                                 f"{request.decided_at.isoformat()}")
        state = ErasureState.APPROVED if approve else ErasureState.REJECTED
        now = db_now()
        ErasureRequest.objects.for_tenant(tenant).filter(pk=request.pk).update(
            state=state, decided_by=actor, decided_by_name=_actor_name(actor),
            decided_at=now, decision_reason=reason)
        audit_record(tenant=tenant, actor=actor,
                     action=AuditAction.ERASURE_APPROVE if approve else AuditAction.ERASURE_REJECT,
                     target_type=TargetType.ERASURE_REQUEST, target_id=request.uuid,
                     reason=reason, before={"state": ErasureState.REQUESTED},
                     after={"state": state})
        if approve:
            request.refresh_from_db()
            _execute(actor=actor, tenant=tenant, request=request)
    request.refresh_from_db()
    return request


def erasure_approve(*, actor, tenant: Tenant, request_id, reason: str = "") -> ErasureRequest:
    """An approver (``roles.APPROVE``) who is not the requester approves erasure request
    ``request_id`` (its UUID; ``reason`` optional, up to 1024 bytes), and it is executed
    in the same transaction (the module docstring: each run locked, judged by
    ``run_blockers``, purged with a tombstone, or counted by blocker). Returns the request,
    ``executed`` with its ``counts``. Audited: ``erasure.approve``, one ``run.erase`` per
    erased run, ``erasure.execute`` (the counts).

    Raises ``NotFound`` (no such request here), ``Forbidden`` (403: the requester, or a
    role without approval), ``InvalidPayload`` naming ``reason``, ``AlreadyDecided``
    (409) when the request was approved, rejected or executed already."""
    return _decide(actor=actor, tenant=tenant, request_id=request_id, reason=reason,
                   approve=True)


def erasure_reject(*, actor, tenant: Tenant, request_id, reason: str) -> ErasureRequest:
    """An approver who is not the requester rejects erasure request ``request_id`` with
    ``reason`` (required): ``rejected``, nothing erased, the row kept. One
    ``erasure.reject`` audit event. Raises as ``erasure_approve`` (and ``ReasonRequired``)."""
    return _decide(actor=actor, tenant=tenant, request_id=request_id, reason=reason,
                   approve=False)


def _covered_runs(tenant: Tenant, request: ErasureRequest) -> list[uuid.UUID]:
    """The run ids ``request`` covers: its list, or the runs the subject index finds."""
    if request.subject_field:
        return list(Run.objects.for_tenant(tenant).filter(
            pk__in=RunSubject.objects.for_tenant(tenant).filter(
                field=request.subject_field, digest=request.subject_digest).values("run_id"))
            .order_by("uuid").values_list("uuid", flat=True))
    return [uuid.UUID(r) for r in request.run_uuids]


def _tally(tenant: Tenant, covered: list[uuid.UUID], runs: list[Run], erase=None) -> dict:
    """The counts of erasing ``covered`` (run ids) of which ``runs`` still exist:
    ``{"runs", "erased", "blocked", <each Blocker word>}``. Every run is judged at once by
    ``runs_blockers`` (the one judgement of a deletion, set-based: at most three queries
    whatever the number of runs); ``erase(run)``, when given, erases a run nothing blocks
    and returns the blockers its deletion core found (``[]``: erased); without it (the
    preview) such a run counts as erased. A covered run whose records expired since the
    request (only its tombstone is left) is already deleted. The one count of the
    execution and of its preview (``erasure_preview``)."""
    counts = {"runs": len(covered), "erased": 0, "blocked": 0, **dict.fromkeys(BLOCKERS, 0)}
    gone = len(covered) - len(runs)
    counts["blocked"] += gone
    counts[Blocker.DELETED] += gone
    judged = runs_blockers(tenant, runs)
    for run in runs:
        blockers = judged[run.pk]
        if not blockers and erase is not None:
            blockers = erase(run)
        if blockers:
            counts["blocked"] += 1
            for word in blockers:
                counts[word] += 1
        else:
            counts["erased"] += 1
    return counts


def _execute(*, actor, tenant: Tenant, request: ErasureRequest) -> dict:
    """Erase what ``request`` (approved) covers, in the caller's transaction: the runs are
    locked in the store's order (``locks.lock_runs``), judged (``_tally``) and each one
    nothing blocks purged, or counted (module docstring); the request ends ``executed``
    with its counts and one ``erasure.execute`` event. Returns the counts."""
    covered = _covered_runs(tenant, request)
    runs = locks.lock_runs(tenant, covered)
    policy = {"erasure_request": str(request.uuid)}

    def purge(run: Run) -> list[str]:
        try:  # the core judges the run's blockers again, under the lock taken above
            purge_run_payloads(actor=actor, tenant=tenant, run=run, now=run.db_now,
                               cause=DeletionCause.ERASURE, policy=policy, erasure=request)
        except NotDeletable as refused:
            return refused.blockers
        return []

    counts = _tally(tenant, covered, runs, purge)
    ErasureRequest.objects.for_tenant(tenant).filter(pk=request.pk).update(
        state=ErasureState.EXECUTED, executed_at=db_now(), counts=counts)
    audit_record(tenant=tenant, actor=actor, action=AuditAction.ERASURE_EXECUTE,
                 target_type=TargetType.ERASURE_REQUEST, target_id=request.uuid,
                 before={"state": ErasureState.APPROVED},
                 after={"state": ErasureState.EXECUTED, "counts": counts})
    return counts


def erasure_preview(*, user, tenant: Tenant, request: ErasureRequest) -> dict | None:
    """What approving ``request`` (an erasure request of ``tenant``) now would do, for the
    approver to see before approving (the dashboard's queue, the API's ``preview``): the
    counts ``_execute`` would write (``{"runs", "erased", "blocked", "legal_hold",
    "not_ended", "effect_in_doubt", "already_deleted"}``, run counts), computed by the
    execution's own ``_tally`` (``runs_blockers``, the judgement ``purge_run_payloads``
    applies under the lock; holds: ``selectors.held_runs_q``) without erasing. ``None``
    once decided (the request's ``counts`` then say what was done). Read without locks:
    a hold placed or released before the approval changes the answer. Writes nothing; a
    bounded number of queries whatever the number of covered runs (the covered runs,
    then at most three; issue 20). Raises what
    ``permissions.require`` raises (any role of the tenant reads it), ``NotFound`` for
    another tenant's request."""
    require(user, tenant, roles.VIEW)
    if request.tenant_id != tenant.pk:  # another tenant's request is not this one's
        raise NotFound("no such erasure request")
    if request.state != ErasureState.REQUESTED:
        return None
    covered = _covered_runs(tenant, request)
    runs = list(Run.objects.for_tenant(tenant).filter(uuid__in=covered))
    return _tally(tenant, covered, runs)


def _request_uuid(value) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value)[:64])
    except ValueError:
        raise NotFound("no such erasure request") from None
