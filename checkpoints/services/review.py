"""Review actions (CONTRACT.md 3 "Review actions"): retry requests and decisions, mark
unknown, close, acknowledge conflicts. The dashboard's buttons and the API call these.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Coalesce

from .. import locks, policy, roles, selectors
from ..audit import (
    audit_record,
)
from ..exceptions import (
    AlreadyDone,
    Forbidden,
    InvalidTransition,
    NotFound,
    PossibleDuplicate,
    StaleRevision,
)
from ..models import (
    Conflict,
    Effect,
    EffectRevision,
    ReconcileRequest,
    RetryRequest,
    Run,
    Tenant,
)
from ..permissions import require
from ..vocab import (
    AuditAction,
    EffectSource,
    EffectState,
    ReconcileState,
    RecoveryState,
    RetryState,
    TargetType,
)
from .common import _require_reason, _with_bulk
from .effects import KEEP_RECEIPT, _effect_transition
from .runs import _lock_run, require_owner_gone, run_facts, run_refresh_state

# --------------------------------------------------------------------------------------
# Review actions (CONTRACT.md 3 "Review actions"; the dashboard's buttons call these too)
# --------------------------------------------------------------------------------------

def _get_run(tenant: Tenant, run_id) -> Run:
    run = _lock_run(tenant, run_id, create=False)
    if run is None:
        raise NotFound("no such run")
    return run


def _username(user) -> str:
    return user.get_username() if user is not None else ""


def _retry_done(retry: RetryRequest, run: Run, field: str = "state",
                detail: str = "") -> AlreadyDone:
    """The refusal for acting on a retry request someone already moved on: who moved it
    and when, as the row says (read under the run lock, inside the caller's transaction).
    Expired requests name who closed the run; a consumed one, the runtime (nobody)."""
    state = retry.state
    by, at, what = "", retry.decided_at, str(state)
    if state in RetryState.DECIDED:
        by = _username(retry.decided_by)
    elif state == RetryState.WITHDRAWN:
        by = _username(retry.requested_by)
    elif state == RetryState.EXPIRED:
        what, at = "expired (the run was closed)", retry.expired_at or retry.decided_at
        by = _username(run.closed_by) if run.closed_at is not None else ""
    elif state == RetryState.CONSUMED:
        what, at = "approved and consumed by the runtime's resume", retry.consumed_at
    else:  # requested
        by, at = _username(retry.requested_by), retry.created_at
    return AlreadyDone(field, what=what, by=by, at=at, run_id=run.uuid,
                       detail=detail and f"{detail}, {what}")


def retry_request(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str,
                  bulk_id: uuid.UUID | None = None) -> RetryRequest:
    """A reviewer asks for a retry of an in-doubt run; a different approver must decide.

    Raises ``InvalidTransition`` (422) unless the run is ``ambiguous`` or
    ``unknown_outcome`` with no effect ``submitted``/``unresolved`` and no open request;
    ``OwnerLive`` (409) while the run's owner is live, whatever its state (CONTRACT.md 3);
    ``ReasonRequired`` (400), ``NotFound``/``Forbidden``. ``bulk_id``: the bulk action
    this is part of, written into the audit event's ``after``.
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        # Judge the run as it is now (database clock), not as the last sweep left it: an
        # owner that went quiet since is gone, whether or not a sweeper ran.
        run_refresh_state(run)
        open_retry = (RetryRequest.objects.for_tenant(run.tenant_id)
                      .filter(run=run, state__in=RetryState.OPEN)
                      .select_related("requested_by", "decided_by").first())
        if open_retry is not None:
            raise _retry_done(open_retry, run, "run", "a retry request is already open")
        # A retry fences the current owner, so it is offered only for runs a human must
        # decide; and never over an effect still in doubt, which reconciliation (or
        # "mark unknown") must settle first, or the approval would be spent on it.
        if not policy.retry_applies(run.phase_class):
            raise InvalidTransition("run: it completed; a completed run is replayed, never "
                                    "retried")
        # A retry fences the owner: never over one that is alive (it may come back).
        # Judged before the state: a run whose owner is live reads healthy, and
        # CONTRACT.md 3 answers its retry request 409 owner_live, as reconcile's (a
        # newcomer's finding, stop 39: it was 422 "this run is healthy").
        require_owner_gone(run, run_facts(run), "request a retry")
        if run.recovery_state not in RecoveryState.RETRYABLE:
            raise InvalidTransition(
                f"run: a retry is for ambiguous or unknown-outcome runs; this run is "
                f"{run.recovery_state}")
        if (Effect.objects.for_tenant(run.tenant_id)
            .filter(run=run, state__in=EffectState.IN_DOUBT).exists()):
            raise InvalidTransition(
                "run: an effect is still in doubt; reconcile it or mark it unknown first")
        retry = RetryRequest.objects.create(tenant=tenant, run=run, requested_by=actor,
                                            reason=reason)
        before = run.recovery_state
        run_refresh_state(run)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RETRY_REQUEST,
                     target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                     reason=reason, before={"recovery_state": before},
                     after=_with_bulk({"state": RetryState.REQUESTED,
                                       "recovery_state": run.recovery_state,
                                       "preview": retry_preview(run)}, bulk_id),
                     created_at=run.db_now)
    return retry


def retry_preview(run: Run) -> list[dict]:
    """What an approved retry of ``run`` would do to each of its effects
    (``policy.retry_outcome``): ``[{effect_id, service, operation_key, state, outcome,
    words}]``, oldest effect first. ``possible_duplicate`` rows are what the approver
    accepts. Shown before the request and the approval, and stored in both audit events.
    The approver's queue reads the same rows for many runs at once
    (``selectors.retry_previews``, which this is for one run).
    """
    return selectors.retry_previews(run.tenant_id, [run.pk])[run.pk]


def _retry_decide(*, actor, tenant: Tenant, retry_id: int, reason: str, approve: bool,
                  refuse_duplicate: bool = False):
    require(actor, tenant, roles.APPROVE)
    reason = _require_reason(reason)
    with transaction.atomic():
        retry = RetryRequest.objects.for_tenant(tenant).filter(pk=retry_id).first()
        if retry is None:
            raise NotFound("no such retry request")
        run = _get_run(tenant, retry.run.uuid)
        retry = locks.lock_rows(RetryRequest.objects.for_tenant(retry.tenant_id)).get(
            pk=retry.pk)
        if retry.requested_by_id == actor.pk:
            raise Forbidden("approver: the requester may not decide their own retry request")
        if retry.state != RetryState.REQUESTED:
            raise _retry_done(retry, run)
        if approve and not policy.retry_applies(run.phase_class):
            # The run completed after the request: it could never be consumed while it
            # stays completed (its runtime may write on, which makes it count again).
            # Rejecting or withdrawing it stays possible.
            raise InvalidTransition("retry: the run completed; a completed run is "
                                    "replayed, never retried (reject the request)")
        new_state = RetryState.APPROVED if approve else RetryState.REJECTED
        retry.state = new_state
        retry.decided_by = actor
        retry.decision_reason = reason
        retry.decided_at = run.db_now
        if approve:
            retry.approved_preview = retry_preview(run)
            if refuse_duplicate and selectors.duplicates_in(retry.approved_preview):
                # Judged under the run's lock, on the preview being approved: a
                # possible duplicate is approved one at a time (issue 21, item 9).
                raise PossibleDuplicate(
                    "retry: approving accepts a possible duplicate; approve it on its own")
        retry.save(update_fields=["state", "decided_by", "decision_reason", "decided_at",
                                  "approved_preview", "updated_at"])
        run_refresh_state(run)
        after = {"state": new_state, "recovery_state": run.recovery_state}
        if approve:
            after["preview"] = retry.approved_preview
        audit_record(tenant=tenant, actor=actor,
                     action=AuditAction.RETRY_APPROVE if approve else AuditAction.RETRY_REJECT,
                     target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                     reason=reason, before={"state": RetryState.REQUESTED}, after=after,
                     created_at=run.db_now)
    return retry


def retry_approve(*, actor, tenant: Tenant, retry_id: int, reason: str,
                  refuse_duplicate: bool = False) -> RetryRequest:
    """Approve someone else's retry request (approver role; four eyes). The runtime's next
    resume call consumes it. Raises ``Forbidden`` for the requester, ``InvalidTransition``
    unless the request is ``requested``. ``refuse_duplicate`` (the queue's bulk approve):
    ``PossibleDuplicate`` (422) when the retry would send an effect again that may have
    happened (a possible duplicate is approved one at a time), judged under the run's
    lock; nothing is written then."""
    return _retry_decide(actor=actor, tenant=tenant, retry_id=retry_id, reason=reason,
                         approve=True, refuse_duplicate=refuse_duplicate)


def retry_reject(*, actor, tenant: Tenant, retry_id: int, reason: str) -> RetryRequest:
    """Reject someone else's retry request; same rules as ``retry_approve``."""
    return _retry_decide(actor=actor, tenant=tenant, retry_id=retry_id, reason=reason,
                         approve=False)


def retry_withdraw(*, actor, tenant: Tenant, retry_id: int, reason: str) -> RetryRequest:
    """The requester takes back their own retry request while no approver has decided it
    (issue 9): ``requested`` -> ``withdrawn``, ``decided_at`` set (database clock),
    ``decided_by`` left empty (nobody decided it; the four-eyes constraint forbids the
    requester there), the reason kept as ``decision_reason``; the run's recovery state is
    recomputed, so it leaves ``awaiting_approval``. Audited (``retry.withdraw``) in the
    same transaction.

    Raises ``Forbidden`` (403) for someone else's request, ``AlreadyDone`` (422
    ``invalid_transition``) once it is approved, rejected, withdrawn, expired or consumed,
    ``ReasonRequired`` (400), ``NotFound``/``Forbidden`` for the tenant and role
    (reviewer).
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        retry = (RetryRequest.objects.for_tenant(tenant).filter(pk=retry_id)
                 .select_related("run").first())
        if retry is None:
            raise NotFound("no such retry request")
        run = _get_run(tenant, retry.run.uuid)
        retry = locks.lock_rows(RetryRequest.objects.for_tenant(retry.tenant_id)).get(
            pk=retry.pk)
        if retry.requested_by_id != actor.pk:
            raise Forbidden("requested_by: only the requester may withdraw a retry request")
        if retry.state != RetryState.REQUESTED:
            raise _retry_done(retry, run)
        retry.state = RetryState.WITHDRAWN
        retry.decided_at = run.db_now
        retry.decision_reason = reason
        retry.save(update_fields=["state", "decided_at", "decision_reason", "updated_at"])
        before = run.recovery_state
        run_refresh_state(run)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RETRY_WITHDRAW,
                     target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                     reason=reason,
                     before={"state": RetryState.REQUESTED, "recovery_state": before},
                     after={"state": RetryState.WITHDRAWN,
                            "recovery_state": run.recovery_state}, created_at=run.db_now)
    return retry


def effect_mark_unknown(*, actor, tenant: Tenant, effect_id: uuid.UUID, reason: str,
                        bulk_id: uuid.UUID | None = None) -> Effect:
    """A reviewer declares that nobody can tell whether the effect happened.

    Allowed from ``submitted`` and ``unresolved`` only (422 otherwise), and only once the
    run's owner is gone (``OwnerLive``, 409, like reconciliation). The run becomes
    ``unknown_outcome`` until a retry is approved or the run is closed. ``bulk_id``: the
    bulk action this is part of, written into the audit event's ``after``.
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        effect = Effect.objects.for_tenant(tenant).filter(uuid=effect_id).select_related(
            "run").first()
        if effect is None:
            raise NotFound("no such effect")
        run = _get_run(tenant, effect.run.uuid)
        if run.closed_at is not None:
            raise InvalidTransition("run: the run is closed; a new write reopens it")
        effect.refresh_from_db()
        if effect.state not in EffectState.IN_DOUBT:
            # Settled (or marked unknown) since the caller looked: say by whom and when.
            last = (EffectRevision.objects.for_tenant(effect.tenant_id)
                    .filter(effect=effect).order_by("-revision").first())
            by = last.actor_name if last is not None and last.actor_name != "system" else ""
            what = ("marked unknown" if effect.state == EffectState.UNKNOWN
                    else f"settled: {EffectState(effect.state).label.lower()}")
            raise AlreadyDone("state", what=what, by=by,
                              at=effect.state_changed_at, run_id=run.uuid)
        require_owner_gone(run, run_facts(run), "mark an outcome unknown")
        before = {"state": effect.state, "revision": effect.revision}
        moved = _effect_transition(effect, expected_revision=effect.revision, to_state=EffectState.UNKNOWN,
                                   receipt=KEEP_RECEIPT, by=EffectSource.REVIEWER, actor=actor,
                                   now=run.db_now)
        if moved is None:  # cannot happen under the run lock; kept as a guard
            raise StaleRevision(Effect.objects.for_tenant(effect.tenant_id)
                                .get(pk=effect.pk).revision)
        run_refresh_state(run)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.EFFECT_MARK_UNKNOWN,
                     target_type=TargetType.EFFECT, target_id=effect.uuid, run_id=run.uuid,
                     reason=reason, before=before,
                     after=_with_bulk({"state": EffectState.UNKNOWN,
                                       "revision": moved.revision}, bulk_id), created_at=run.db_now)
    return moved


def close_locked(run: Run, now, *, closed_by, reason: str) -> tuple[int, int]:
    """Mark ``run`` closed (the caller holds its lock and audits): its open retry
    request expired (``expired_at``; a requested one's ``decided_at`` too, an approved
    one's kept) and its open reconcile requests cancelled, so nothing acts on a
    closed run, then its recovery state recomputed. ``now`` is the database time read
    with the run; ``closed_by`` a user or ``None`` (closed by the system, e.g. a
    LangGraph thread deletion, issue 10). Returns ``(expired, cancelled)``. The one
    rule of closing: ``run_close`` and ``interop.langgraph`` call it."""
    # An approved request keeps its decision's time (the report counts approvals by it;
    # the stop-37 helper's finding: closing moved april's approval to the close's time).
    expired = RetryRequest.objects.for_tenant(run.tenant_id).filter(
        run=run, state__in=RetryState.OPEN).update(
        state=RetryState.EXPIRED, expired_at=now,
        decided_at=Coalesce("decided_at", Value(now, output_field=DateTimeField())))
    cancelled = ReconcileRequest.objects.for_tenant(run.tenant_id).filter(
        run=run, state__in=ReconcileState.OPEN).update(
        state=ReconcileState.CANCELLED, finished_at=now, last_error="the run was closed")
    Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(
        closed_at=now, closed_by=closed_by, closed_reason=reason)
    run.closed_at, run.closed_by, run.closed_reason = now, closed_by, reason
    run_refresh_state(run, now)
    return expired, cancelled


def awaits_review(run: Run) -> str:
    """Why ``run`` must stay before its reviewers whatever its runtime does ("" when
    nothing does): an effect in doubt (``submitted``/``unresolved``: it may have
    happened), an effect of unknown outcome no approved retry covers (a reviewer's
    declaration awaiting their decision), an open retry request or an open reconcile
    request. Only a reviewer's ``run_close`` closes such a run; a writer's LangGraph
    thread deletion leaves it open (issue 10, docs/langgraph.md "Deleting")."""
    effects = Effect.objects.for_tenant(run.tenant_id).filter(run=run)
    if effects.filter(state__in=EffectState.IN_DOUBT).exists():
        return "an effect is in doubt"
    if effects.filter(state=EffectState.UNKNOWN, retry_authorized_by__isnull=True).exists():
        return "an effect's outcome is unknown"
    if RetryRequest.objects.for_tenant(run.tenant_id).filter(
            run=run, state__in=RetryState.OPEN).exists():
        return "a retry request is open"
    if ReconcileRequest.objects.for_tenant(run.tenant_id).filter(
            run=run, state__in=ReconcileState.OPEN).exists():
        return "a reconcile request is open"
    return ""


def run_close(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str,
              bulk_id: uuid.UUID | None = None) -> Run:
    """A reviewer closes a run that was handled outside the system (DESIGN.md 4).

    The run shows as ``closed`` (its own tab) until the runtime's next write reopens it;
    an open retry request is expired and open reconcile requests are cancelled, so
    nothing acts on a closed run. Raises ``InvalidTransition`` (422) if it is already
    closed, ``ReasonRequired`` (400), ``NotFound``/``Forbidden``. Audited (with
    ``bulk_id`` in ``after`` when part of a bulk action).
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        if run.closed_at is not None:
            raise AlreadyDone("run", what="closed", by=_username(run.closed_by),
                              at=run.closed_at, run_id=run.uuid)
        if run.recovery_state == RecoveryState.COMPLETED:
            raise InvalidTransition("run: it completed; there is nothing to close")
        now = run.db_now
        before = run.recovery_state
        expired, cancelled = close_locked(run, now, closed_by=actor, reason=reason)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RUN_CLOSE, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid, reason=reason,
                     before={"recovery_state": before},
                     after=_with_bulk({"recovery_state": run.recovery_state,
                                       "retry_requests_expired": expired,
                                       "reconcile_requests_cancelled": cancelled}, bulk_id),
                     created_at=run.db_now)
    return run


def conflicts_acknowledge(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str,
                          only_open: bool = False,
                          bulk_id: uuid.UUID | None = None) -> int:
    """Acknowledge every open conflict of the run; returns how many. Audited (with
    ``bulk_id`` in ``after`` when part of a bulk action).

    Idempotent by default (the API: none open acknowledges 0). ``only_open=True`` (the
    dashboard's button, pressed on a page that showed open conflicts) refuses instead
    when none is open: ``AlreadyDone`` (422) naming who acknowledged the newest one and
    when, and nothing is written."""
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        now = run.db_now
        conflicts = Conflict.objects.for_tenant(run.tenant_id).filter(run=run)
        if only_open and not conflicts.filter(acknowledged_at__isnull=True).exists():
            last = (conflicts.filter(acknowledged_at__isnull=False)
                    .select_related("acknowledged_by").order_by("-acknowledged_at").first())
            raise AlreadyDone(
                "conflicts", what="acknowledged",
                by=_username(last.acknowledged_by) if last is not None else "",
                at=last.acknowledged_at if last is not None else None, run_id=run.uuid)
        n = conflicts.filter(acknowledged_at__isnull=True).update(
            acknowledged_at=now, acknowledged_by=actor)
        Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(unacknowledged_conflicts=0)
        run.unacknowledged_conflicts = 0
        before = run.recovery_state
        run_refresh_state(run, now)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.CONFLICTS_ACKNOWLEDGE,
                     target_type=TargetType.RUN, target_id=run.uuid, run_id=run.uuid, reason=reason,
                     before={"recovery_state": before, "open_conflicts": n},
                     after=_with_bulk({"recovery_state": run.recovery_state,
                                       "open_conflicts": 0}, bulk_id), created_at=run.db_now)
    return n


