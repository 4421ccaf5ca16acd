"""Reconcile requests (issue 5; CONTRACT.md 3 "reconcile"; DESIGN.md 4), the services'
side: a reviewer's request (``run_reconcile``), handing stored requests to a worker
(``dispatch``) and sending again what a lost message, a dead worker or a broker outage
left behind (``redrive``, run by the sweep), and the audited reveal of a look-up's
evidence (``evidence_reveal``).

The job itself (claim, look-up, apply) is ``checkpoints.jobs.reconciliation``, a layer above:
these services hand it work by name only, Celery's task name with a broker and
``EXECUTE``'s dotted path without one, so nothing here imports it (docs/architecture.md).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils.module_loading import import_string

from .. import crypto, locks, roles
from ..audit import audit_record, incident_now
from ..dbclock import NOW
from ..exceptions import InvalidTransition, NotFound
from ..heartbeat import broker_configured
from ..jsonparse import loads_any
from ..models import Effect, ReconcileAttempt, ReconcileRequest, ReconcileState, Tenant
from ..permissions import require
from ..vocab import AuditAction, EffectState, TargetType
from .common import _actor_name, _require_reason, _with_bulk
from .review import _get_run
from .runs import require_owner_gone, run_facts
from .stored_send import send_stored

log = logging.getLogger(__name__)

#: The job that runs one request, by dotted path: ``dispatch`` runs it in this process
#: when there is no broker (the embedded default's in-process worker).
EXECUTE = "checkpoints.jobs.reconciliation.execute"
#: Celery's name of the task that runs one request (``checkpoints.jobs.tasks``).
TASK = "checkpoints.tasks.reconcile_effect"

#: Where ``dispatch`` handed requests (``Sent.dispatch``, the reconcile answer's
#: ``dispatch``): ``in_process``: run in this process before the answer (no broker, the
#: embedded default), each request's own ``state`` says how it ended; ``worker``:
#: published to the task queue for a Celery worker, which may still be running them;
#: ``waiting``: not all handed over yet (the task queue was unavailable, from the first
#: message or part-way, or a delayed send without a broker): those are stored ``queued``,
#: the sweep sends them when something can run them.
IN_PROCESS, WORKER, WAITING = "in_process", "worker", "waiting"
DISPATCH_WHERE = (IN_PROCESS, WORKER, WAITING)

#: What ``dispatch`` writes into a request it could not hand to the broker (the run page
#: says "queued, will run when the worker is back" for it).
_DISPATCH = ("dispatch marks, by primary key, the requests it was handed (read scoped by "
             "the reviewer's action, or by the sweep's re-drive)")


@dataclass
class ReconcileQueued:
    """What ``run_reconcile`` did: the ``task_id`` given to the reviewer, the requests
    (one per in-doubt effect), whether they were handed to a worker (``dispatched``) or
    wait for one, where (``dispatch``: one of ``DISPATCH_WHERE``, or "" while the
    caller's transaction has not committed, as nothing is handed over before), and
    ``detail``, the same in words for people."""

    task_id: str
    requests: list[ReconcileRequest]
    dispatched: bool = True
    detail: str = ""
    results: list[dict] = field(default_factory=list)
    dispatch: str = ""

def run_reconcile(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str,
                  bulk_id: uuid.UUID | None = None) -> ReconcileQueued:
    """A reviewer asks to reconcile the run's in-doubt effects (CONTRACT.md 3).

    Under the run's lock, on the database clock, the owner must be gone (the sweep's
    rule); then one request per ``submitted``/``unresolved`` effect is stored (an effect
    that already has an open request keeps it, made due now) with one audit event, and
    the requests go to a worker after commit (``dispatch``). A broker outage loses
    nothing: the answer says they wait, and the sweep sends them when it is back.

    Raises ``OwnerLive`` (409) while the owner is alive, ``InvalidTransition`` (422) when
    nothing is in doubt or the run is closed, ``ReasonRequired``, ``NotFound``,
    ``Forbidden``. ``bulk_id``: the bulk action this is part of (``services.bulk``),
    written into the audit event's ``after``.
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    task_id = uuid.uuid4()
    outcome = ReconcileQueued(task_id=str(task_id), requests=[])
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        now = run.db_now
        if run.closed_at is not None:
            raise InvalidTransition("run: the run is closed; a new write reopens it")
        facts = run_facts(run, now)
        in_doubt = list(Effect.objects.for_tenant(run.tenant_id)
                        .filter(run=run, state__in=EffectState.IN_DOUBT)
                        .order_by("id"))
        if not in_doubt:
            raise InvalidTransition("run: no effect is submitted or unresolved")
        require_owner_gone(run, facts, "reconcile")
        open_by_effect = {r.effect_id: r for r in locks.lock_rows(
            ReconcileRequest.objects.for_tenant(tenant)
            .filter(effect__in=in_doubt, state__in=ReconcileState.OPEN))}
        for effect in in_doubt:
            existing = open_by_effect.get(effect.pk)
            if existing is not None:
                if existing.state == ReconcileState.QUEUED:
                    ReconcileRequest.objects.for_tenant(tenant).filter(pk=existing.pk).update(
                        next_attempt_at=now)
                outcome.requests.append(existing)
                continue
            outcome.requests.append(ReconcileRequest.objects.create(
                tenant=tenant, run=run, effect=effect, task_uuid=task_id, requested_by=actor,
                requested_by_name=_actor_name(actor), reason=reason, next_attempt_at=now,
                # The answer's events (by the system) carry the request's incident, as
                # the request's own does (jobs.reconciliation.execute).
                incident_ref=incident_now() or None))
        audit_record(
            tenant=tenant, actor=actor, action=AuditAction.RUN_RECONCILE, target_type=TargetType.RUN,
            target_id=run.uuid, run_id=run.uuid, reason=reason,
            after=_with_bulk({"task_id": str(task_id),
                                  "requests": [r.pk for r in outcome.requests],
                                  "effects": [str(e.uuid) for e in in_doubt]}, bulk_id),
            created_at=now)
        pks = [r.pk for r in outcome.requests]

        def send():
            sent = dispatch(pks)
            outcome.dispatched = sent.ok
            outcome.detail = sent.detail
            outcome.results = sent.results
            outcome.dispatch = sent.dispatch

        transaction.on_commit(send)
    return outcome

# --------------------------------------------------------------------------------------
# Dispatch: to Celery with a broker, in this process without one
# --------------------------------------------------------------------------------------

@dataclass
class Sent:
    """What ``dispatch`` did: ``ok`` (false only when the task queue refused), ``detail`` (in
    words for people), ``results`` (the in-process runs' results) and ``dispatch``, where
    the requests went (``DISPATCH_WHERE``)."""

    ok: bool
    detail: str
    results: list[dict] = field(default_factory=list)
    dispatch: str = WORKER


def dispatch(request_pks: list[int], *, countdown: float | None = None) -> Sent:
    """Hand requests to a worker. With a broker: one ``TASK`` message each (by task
    name, so services never import tasks), through ``stored_send.send_stored``: each
    request the broker took is marked ``dispatched_at``; a publish error leaves the ones
    not sent yet stored and ``queued`` with ``last_error`` saying so (the sweep sends
    them later). ``dispatch`` is ``worker`` when every request was sent; else ``waiting``
    with ``ok`` false, also when the broker failed part-way: some requests still wait for
    it, and ``ok``/``waiting`` are what tells the reviewer to look again (the detail
    says how many of how many went to a worker; each request's ``last_error`` and
    ``dispatched_at`` tell which). Without a broker: run each now, in this process (the
    embedded default's in-process worker; ``dispatch`` ``in_process``, the requests' own
    states tell how each ended), or with a ``countdown`` leave them for the sweep
    (``waiting``)."""
    if not request_pks:
        return Sent(True, "nothing to reconcile")
    if not broker_configured():
        if countdown:
            return Sent(True, "queued for the in-process worker", dispatch=WAITING)
        results = []
        for pk in request_pks:
            try:
                results.append(import_string(EXECUTE)(pk))
            except Exception:  # noqa: BLE001 - stored and claimed: the sweep re-drives it
                log.exception("reconcile request %s failed in this process; the sweep will "
                              "run it again", pk)
                results.append({"request": pk, "result": "error"})
        return Sent(True, "ran in this process before this answer; each request's state "
                          "says how it ended", results, IN_PROCESS)
    published = send_stored(ReconcileRequest.objects.for_all_tenants(reason=_DISPATCH),
                            request_pks, task=TASK, queued=ReconcileState.QUEUED,
                            countdown=countdown)
    return Sent(published.ok, published.detail,
                dispatch=WORKER if published.ok else WAITING)


def redrive(limit: int = 200) -> int:
    """Send again the requests a lost message, a dead worker or a broker outage left
    behind; run by the sweep. A ``running`` request whose claim expired goes back to
    ``queued`` first. Returns how many were sent (or, without a broker, executed)."""
    grace = settings.RECOVERY_RECONCILE_REDRIVE_GRACE_S if broker_configured() else 0
    stale = Q(state=ReconcileState.RUNNING, claimed_until__lt=NOW)
    with transaction.atomic():
        every = ReconcileRequest.objects.for_all_tenants(
            reason="the sweep re-drives every tenant's stale or due reconcile requests")
        # Outside the lock order (``locks``): it holds these rows only, in ascending id,
        # and skips those a worker or a reviewer holds (the next sweep looks again).
        reclaimed = list(locks.lock_rows(every.filter(stale), skip_locked=True)
                         .values_list("pk", flat=True)[:limit])
        if reclaimed:
            every.filter(pk__in=reclaimed).filter(stale).update(
                state=ReconcileState.QUEUED, next_attempt_at=NOW, claimed_until=None,
                last_error="the worker vanished during the look-up; trying again")
    due = Q(state=ReconcileState.QUEUED,
            next_attempt_at__lte=NOW - timedelta(seconds=grace) if grace else NOW)
    # A request whose worker vanished is sent now, not a grace period after this sweep.
    due |= Q(state=ReconcileState.QUEUED, pk__in=reclaimed)
    pks = list(every.filter(due).order_by("next_attempt_at", "pk")
               .values_list("pk", flat=True)[:limit])
    if pks:
        dispatch(pks)
    return len(pks)

def evidence_reveal(*, actor, tenant: Tenant, attempt_id: int, reason: str) -> Any:
    """Decrypt what a service answered to one look-up (``ReconcileAttempt`` evidence) for
    a role that may reveal payloads (receipts are treated like payloads, CONTRACT.md 4);
    one ``evidence.reveal`` audit event in the same transaction. Returns the JSON value
    (``None``, and nothing audited, when the look-up kept no evidence). Raises
    ``NotFound`` (not this tenant's attempt), ``Forbidden``, ``ReasonRequired``.
    """
    require(actor, tenant, roles.REVEAL)
    reason = _require_reason(reason)
    with transaction.atomic():
        attempt = (ReconcileAttempt.objects.for_tenant(tenant)
                   .select_related("request__effect", "request__run")
                   .filter(pk=attempt_id).first())
        if attempt is None:
            raise NotFound("no such reconcile attempt")
        if not attempt.evidence_ciphertext:
            return None
        value = loads_any(crypto.decrypt_text(attempt.evidence_ciphertext, tenant=tenant))
        audit_record(tenant=tenant, actor=actor, action=AuditAction.EVIDENCE_REVEAL,
                         target_type=TargetType.EFFECT, target_id=attempt.request.effect.uuid,
                         run_id=attempt.request.run.uuid, reason=reason[:4000],
                         after={"request": attempt.request_id, "attempt": attempt.number})
    return value
