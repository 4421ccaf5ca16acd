"""Reconciliation as durable jobs (issue 5; CONTRACT.md 3 "reconcile"; DESIGN.md 4).

A reviewer's reconcile writes one ``ReconcileRequest`` per in-doubt effect in the same
transaction as its audit event (``run_reconcile``). A worker then runs ``execute`` for
each request id:

1. **claim** (one short transaction): a ``queued`` request that is due, or a ``running``
   one whose worker vanished (``claimed_until`` passed), becomes ``running`` with
   ``attempts + 1``. A second delivery of the same message finds it running and does
   nothing: one look-up, one transition, one audit event.
2. **look up** (no transaction, under a timeout): the owner must be gone (the sweep's
   rule, ``RunFacts.owner_gone``, on the database clock) and, for "never saw the key",
   the settle delay must have passed since ``submitted``; otherwise the request simply
   waits. The reconciler's answer passes the API's strict JSON rules; a bad answer, an
   exception or a timeout is ``cannot_tell`` with the reason, and only this request
   retries: one effect's failure never skips its siblings.
3. **apply** (one transaction, run lock first): the effect moves by compare-and-swap
   (``services._effect_transition`` with ``by=reconciliation``), the attempt and its
   evidence are stored, and one audit event is written; a result whose claim was lost
   meanwhile is dropped.

``cannot_tell`` retries with capped exponential back-off; after
``RECOVERY_RECONCILE_MAX_FAILURES`` in a row the request ``gave_up`` and the effect waits
for a human with the error on the run page. ``redrive`` (run by the sweep: beat with a
broker, the in-process worker without one) sends again what a lost message, a dead
worker or a broker outage left behind. Every time here is the database's (``dbclock``).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, Prefetch, Q

from . import crypto, locks, reconcile, roles
from .dbclock import NOW
from .exceptions import InvalidPayload, InvalidTransition, NotFound
from .heartbeat import broker_configured
from .jsonparse import dumps, loads_any, loads_object
from .models import (
    Effect,
    ReconcileAttempt,
    ReconcileRequest,
    ReconcileState,
    Run,
    Tenant,
)
from .permissions import require
from .vocab import (
    AuditAction,
    EffectSource,
    EffectState,
    ReconcileAnswer,
    TargetType,
)

log = logging.getLogger(__name__)

#: What ``dispatch`` writes into a request it could not hand to the broker (the run page
#: says "queued, will run when the worker is back" for it).
BROKER_DOWN = "broker unavailable"
_DISPATCH = ("dispatch marks, by primary key, the requests it was handed (read scoped by "
             "the reviewer's action, or by the sweep's re-drive)")
# How long a claim lasts beyond the look-up's own timeout before the sweep re-drives it.
CLAIM_MARGIN_S = 60


@dataclass
class ReconcileQueued:
    """What ``run_reconcile`` did: the ``task_id`` given to the reviewer, the requests
    (one per in-doubt effect), and whether they reached a worker (``dispatched``) or
    wait for one (``detail`` says so in words for people)."""

    task_id: str
    requests: list[ReconcileRequest]
    dispatched: bool = True
    detail: str = ""
    results: list[dict] = field(default_factory=list)


def _services():
    # Imported late: the services import this module (``run_reconcile``, ``redrive``);
    # the cycle is the knot docs/architecture.md names, to be cut next.
    from . import services

    return services


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
    svc = _services()
    require(actor, tenant, roles.REVIEW)
    reason = svc._require_reason(reason)
    task_id = uuid.uuid4()
    outcome = ReconcileQueued(task_id=str(task_id), requests=[])
    with transaction.atomic():
        run = svc._get_run(tenant, run_id)
        now = run.db_now
        if run.closed_at is not None:
            raise InvalidTransition("run: the run is closed; a new write reopens it")
        facts = svc.run_facts(run, now)
        in_doubt = list(Effect.objects.for_tenant(run.tenant_id)
                        .filter(run=run, state__in=EffectState.IN_DOUBT)
                        .order_by("id"))
        if not in_doubt:
            raise InvalidTransition("run: no effect is submitted or unresolved")
        svc.require_owner_gone(run, facts, "reconcile")
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
                requested_by_name=svc._actor_name(actor), reason=reason, next_attempt_at=now))
        svc.audit_record(
            tenant=tenant, actor=actor, action=AuditAction.RUN_RECONCILE, target_type=TargetType.RUN,
            target_id=run.uuid, run_id=run.uuid, reason=reason,
            after=svc._with_bulk({"task_id": str(task_id),
                                  "requests": [r.pk for r in outcome.requests],
                                  "effects": [str(e.uuid) for e in in_doubt]}, bulk_id))
        pks = [r.pk for r in outcome.requests]

        def send():
            sent = dispatch(pks)
            outcome.dispatched = sent.ok
            outcome.detail = sent.detail
            outcome.results = sent.results

        transaction.on_commit(send)
    return outcome


# --------------------------------------------------------------------------------------
# Dispatch: to Celery with a broker, in this process without one
# --------------------------------------------------------------------------------------

@dataclass
class Sent:
    ok: bool
    detail: str
    results: list[dict] = field(default_factory=list)


def dispatch(request_pks: list[int], *, countdown: float | None = None) -> Sent:
    """Hand requests to a worker. With a broker: one ``reconcile_effect`` message each
    (by task name, so services never import tasks); a publish error leaves them stored
    and ``queued`` (the sweep sends them later) and says so. Without a broker: run each
    now, in this process (the embedded default's in-process worker)."""
    if not request_pks:
        return Sent(True, "nothing to reconcile")
    if not broker_configured():
        if countdown:
            return Sent(True, "queued for the in-process worker")
        results = []
        for pk in request_pks:
            try:
                results.append(execute(pk))
            except Exception:  # noqa: BLE001 - stored and claimed: the sweep re-drives it
                log.exception("reconcile request %s failed in this process; the sweep will "
                              "run it again", pk)
                results.append({"request": pk, "result": "error"})
        return Sent(True, "reconciled in this process", results)
    try:
        for pk in request_pks:
            current_app.send_task("checkpoints.tasks.reconcile_effect", args=[pk],
                                  countdown=countdown)
    except Exception as exc:  # noqa: BLE001 - any broker failure: keep the job, say so
        log.warning("reconcile dispatch failed, requests %s stay queued: %s", request_pks, exc)
        why = f"{BROKER_DOWN} ({type(exc).__name__}); queued, will run when the " \
              f"worker is back"
        (ReconcileRequest.objects.for_all_tenants(reason=_DISPATCH)
         .filter(pk__in=request_pks, state=ReconcileState.QUEUED).update(last_error=why[:500]))
        return Sent(False, "queued; the task queue is unavailable, so it will run when the "
                           "worker is back (nothing is lost)")
    (ReconcileRequest.objects.for_all_tenants(reason=_DISPATCH).filter(pk__in=request_pks)
     .update(dispatched_at=NOW))
    return Sent(True, "queued for a worker")


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


# --------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------

def _backoff_s(failures: int) -> int:
    base = settings.RECOVERY_RECONCILE_BACKOFF_S
    return min(settings.RECOVERY_RECONCILE_BACKOFF_MAX_S, base * 2 ** max(0, failures - 1))


def _claim(request_pk: int) -> tuple[ReconcileRequest, datetime] | None:
    """Claim request ``request_pk`` for this worker: one conditional ``UPDATE`` (the
    healthchecks pattern), whose row count says who won. A ``queued`` request that is due
    (within a second), or a ``running`` one whose worker vanished (``claimed_until``
    passed), becomes ``running`` with ``attempts + 1`` and a claim that lasts the
    reconciler's timeout plus ``CLAIM_MARGIN_S``, all on the database clock. Returns the
    claimed request and the database time it was read at, or None: not due, claimed by
    another worker, or gone. Outside the lock order (``locks``): the ``UPDATE`` holds this
    one row and waits for nothing else."""
    requests = ReconcileRequest.objects.for_all_tenants(
        reason="a worker claims the request it was handed, by primary key")
    found = requests.filter(pk=request_pk).values_list("tenant_id", "effect__service").first()
    if found is None:
        return None
    configured = reconcile.reconciler_for(*found)
    hold = timedelta(seconds=configured.timeout_s + CLAIM_MARGIN_S)
    due = Q(state=ReconcileState.QUEUED, next_attempt_at__lte=NOW + timedelta(seconds=1))
    vanished = Q(state=ReconcileState.RUNNING, claimed_until__lt=NOW)
    with transaction.atomic():
        won = requests.filter(due | vanished, pk=request_pk).update(
            state=ReconcileState.RUNNING, attempts=F("attempts") + 1,
            claimed_until=NOW + hold, updated_at=NOW)
        if won != 1:  # not due, or another worker holds the claim
            return None
        req = requests.annotate(db_now=NOW).select_related("effect").get(pk=request_pk)
    return req, req.db_now


def lookup_with_timeout(configured: reconcile.Configured, ref: reconcile.EffectRef
                        ) -> reconcile.Answer:
    """Call the plugin under its timeout; whatever it raises or returns that is not an
    ``Answer`` of a known kind becomes ``cannot_tell`` with the reason."""
    # A daemon thread, so that a plugin that never returns cannot hold the worker process
    # open at exit (a ThreadPoolExecutor's threads are joined then).
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["answer"] = configured.reconciler.lookup(ref)
        except BaseException as exc:  # noqa: BLE001 - a plugin's failure is data
            box["error"] = exc

    thread = threading.Thread(target=call, name="reconciler", daemon=True)
    thread.start()
    thread.join(configured.timeout_s + 1)
    if thread.is_alive():
        return reconcile.Answer.cannot_tell(
            f"{configured.name}: no answer within {configured.timeout_s} s")
    if "error" in box:
        exc = box["error"]
        return reconcile.Answer.cannot_tell(
            f"{configured.name}: {type(exc).__name__}: {_safe_text(str(exc), 300)}")
    answer = box.get("answer")
    try:
        return _checked(answer, configured.name)
    except Exception as exc:  # noqa: BLE001 - e.g. an unhashable kind, a detail that
        # cannot be printed: garbage is "cannot tell", never a crash left "running"
        return reconcile.Answer.cannot_tell(
            f"{configured.name}: unusable answer ({type(exc).__name__})")


def _safe_text(text: Any, limit: int) -> str:
    """One storable line: no NUL, no lone surrogate, at most ``limit`` characters."""
    text = str(text)[:limit]
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\0")


def _strict(value: Any, what: str) -> Any:
    """``value`` as the API would accept it (CONTRACT.md 6), or ``InvalidPayload``."""
    try:
        text = json.dumps({"v": value}, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"{what}: not JSON ({type(exc).__name__})") from None
    return loads_object(text, what=what)["v"]


def _checked(answer: Any, name: str) -> reconcile.Answer:
    if not isinstance(answer, reconcile.Answer):
        return reconcile.Answer.cannot_tell(f"{name}: returned {type(answer).__name__}, "
                                            f"not an Answer")
    if answer.kind not in ReconcileAnswer.SERVICE:
        return reconcile.Answer.cannot_tell(f"{name}: unknown answer {_safe_text(answer.kind, 40)!r}")
    try:
        evidence = _strict(answer.evidence, "answer") if answer.evidence is not None else None
    except InvalidPayload as exc:
        return reconcile.Answer.cannot_tell(f"{name}: {exc.detail}")
    receipt = answer.receipt
    if answer.kind in ReconcileAnswer.WITH_RECEIPT:
        if not isinstance(receipt, dict):
            return reconcile.Answer.cannot_tell(f"{name}: a {answer.kind} answer needs a "
                                                f"receipt object", evidence=evidence)
        try:
            receipt = _strict(receipt, "receipt")
        except InvalidPayload as exc:
            return reconcile.Answer.cannot_tell(f"{name}: {exc.detail}")
        if len(dumps(receipt).encode("utf-8")) > reconcile.MAX_ANSWER_BYTES:
            return reconcile.Answer.cannot_tell(f"{name}: receipt larger than "
                                                f"{reconcile.MAX_ANSWER_BYTES} bytes")
    return reconcile.Answer(answer.kind, receipt, _safe_text(answer.detail, 1000), evidence)


def _effect_ref(effect: Effect, tenant_slug: str) -> reconcile.EffectRef:
    request = None
    if effect.request_ciphertext:
        request = loads_any(crypto.decrypt_text(effect.request_ciphertext))
    return reconcile.EffectRef(
        tenant=tenant_slug, effect_id=effect.uuid, service=effect.service,
        operation_key=effect.operation_key, effect_class=effect.effect_class,
        request_fingerprint=effect.request_fingerprint, attempt=effect.attempt,
        request=request)


def execute(request_pk: int) -> dict:
    """Run one reconcile request (the body of the Celery task; safe to run twice, at once
    or later). Returns ``{"request": pk, "result": ...}`` where result is ``skipped`` (not
    due, or claimed elsewhere), ``waiting`` (owner live or settling), ``retry``,
    ``gave_up``, ``moved_on``, ``lost_claim`` or the effect state it settled."""
    claimed = _claim(request_pk)
    if claimed is None:
        return {"request": request_pk, "result": "skipped"}
    req, started = claimed
    svc = _services()
    effect = (Effect.objects.for_tenant(req.tenant_id).select_related("run", "tenant")
              .get(pk=req.effect_id))
    run = (Run.objects.for_tenant(req.tenant_id).annotate(db_now=NOW).select_related("tenant")
           .get(pk=req.run_id))
    facts = svc.run_facts(run)
    configured = reconcile.reconciler_for(req.tenant_id, effect.service)
    seen_attempt = effect.attempt

    answer: reconcile.Answer | None = None
    wait_until: datetime | None = None
    note = ""
    if effect.state not in EffectState.IN_DOUBT:
        pass  # settled by other means: recorded as moved on below
    elif not facts.owner_gone:
        wait_until = facts.owner_gone_at
        note = policy_words(ReconcileAnswer.OWNER_LIVE, wait_until)
    else:
        try:
            ref = _effect_ref(effect, run.tenant.slug)
        except Exception as exc:  # noqa: BLE001 - e.g. a key no longer configured
            answer = reconcile.Answer.cannot_tell(f"stored request unreadable: "
                                                  f"{type(exc).__name__}")
        else:
            answer = lookup_with_timeout(configured, ref)
        if answer.kind == ReconcileAnswer.NOT_EXECUTED:
            submitted_at = effect.submitted_at or effect.state_changed_at or effect.created_at
            settle_at = submitted_at + timedelta(seconds=configured.settle_delay_s)
            if settle_at > run.db_now:
                wait_until = settle_at
                note = policy_words(ReconcileAnswer.SETTLING, settle_at)
    return _apply(req, effect, seen_attempt, answer, wait_until, note, configured.name,
                  started)


def policy_words(why: str, until: datetime | None) -> str:
    when = until.isoformat() if until else "now"
    if why == ReconcileAnswer.OWNER_LIVE:
        return f"not asked: the run's owner is live until {when}"
    return f"the service has not seen the key; waiting for the settle delay until {when}"


def _apply(req: ReconcileRequest, effect: Effect, seen_attempt: int,
           answer: reconcile.Answer | None, wait_until: datetime | None, note: str,
           reconciler_name: str, started: datetime) -> dict:
    svc = _services()
    after_commit: list[tuple[int, float]] = []
    with transaction.atomic():
        run = svc._lock_run(effect.tenant, effect.run.uuid, create=False)
        now = run.db_now
        # The claim still holds: one conditional UPDATE (it locks the row, after the run:
        # the order of ``locks``) whose row count decides. Another worker's claim since
        # ours (a vanished-worker re-claim) moved ``attempts`` on; a cancel moved the state.
        requests = ReconcileRequest.objects.for_tenant(req.tenant_id)
        held = requests.filter(pk=req.pk, state=ReconcileState.RUNNING,
                               attempts=req.attempts).update(updated_at=NOW)
        if held != 1:
            return {"request": req.pk, "result": "lost_claim"}
        current = requests.get(pk=req.pk)
        effect.refresh_from_db()
        facts = svc.run_facts(run, now)
        attempt = ReconcileAttempt(
            tenant_id=req.tenant_id, request=current, number=current.attempts,
            reconciler=reconciler_name[:64], started_at=started, finished_at=now)
        # Moved on: settled by other means, or sent again under a retry. A move that left
        # it in doubt (the sweep's submitted -> unresolved meanwhile) does not count: the
        # answer is about the same operation key and still settles it.
        moved_on = effect.state not in EffectState.IN_DOUBT or effect.attempt != seen_attempt
        if not moved_on and answer is not None and not facts.owner_gone:
            # The owner came back while we asked: leave its effect alone.
            answer, wait_until = None, facts.owner_gone_at
            note = policy_words(ReconcileAnswer.OWNER_LIVE, wait_until)
        if answer is not None and wait_until is not None:
            # "Never saw the key" within the settle delay: the call may still be on its way.
            attempt.answer = ReconcileAnswer.SETTLING
            attempt.detail = f"{note}; {answer.detail}"
            if answer.evidence is not None:
                attempt.evidence_ciphertext = crypto.encrypt_text(dumps(answer.evidence))
        elif answer is not None:
            attempt.answer = answer.kind
            attempt.detail = answer.detail
            if answer.evidence is not None:
                attempt.evidence_ciphertext = crypto.encrypt_text(dumps(answer.evidence))
        elif moved_on:
            attempt.answer = ReconcileAnswer.MOVED_ON
        else:
            attempt.answer = (ReconcileAnswer.OWNER_LIVE if note.startswith("not asked")
                              else ReconcileAnswer.SETTLING)
            attempt.detail = note
        if moved_on:
            attempt.detail = (f"the effect moved on to {effect.state} (revision "
                              f"{effect.revision}) before the answer was applied")
            result = _finish(current, now, outcome=ReconcileAnswer.MOVED_ON,
                             state=ReconcileState.DONE)
            svc.audit_record(tenant=run.tenant, actor=None, action=AuditAction.RECONCILE_MOVED_ON,
                             target_type=TargetType.EFFECT, target_id=effect.uuid,
                             run_id=run.uuid, reason=attempt.detail,
                             after={"request": current.pk, "state": effect.state})
        elif wait_until is not None or answer is None:
            # Not asked, or "never saw the key" too early: wait, without counting a failure.
            current.state = ReconcileState.QUEUED
            current.next_attempt_at = max(now, wait_until or now) + timedelta(seconds=1)
            current.claimed_until = None
            current.last_error = note[:1000]
            current.save(update_fields=["state", "next_attempt_at", "claimed_until",
                                        "last_error", "updated_at"])
            after_commit.append((current.pk, (current.next_attempt_at - now).total_seconds()))
            result = "waiting"
        elif answer.kind == ReconcileAnswer.CANNOT_TELL:
            current.failures += 1
            current.last_error = answer.detail[:1000]
            current.claimed_until = None
            if current.failures >= settings.RECOVERY_RECONCILE_MAX_FAILURES:
                result = _finish(current, now, outcome="", state=ReconcileState.GAVE_UP)
                svc.audit_record(
                    tenant=run.tenant, actor=None, action=AuditAction.RECONCILE_GAVE_UP,
                    target_type=TargetType.EFFECT, target_id=effect.uuid, run_id=run.uuid,
                    reason=answer.detail[:4000],
                    after={"request": current.pk, "attempts": current.attempts,
                           "failures": current.failures})
            else:
                delay = _backoff_s(current.failures)
                current.state = ReconcileState.QUEUED
                current.next_attempt_at = now + timedelta(seconds=delay)
                current.save(update_fields=["state", "failures", "last_error",
                                            "next_attempt_at", "claimed_until", "updated_at"])
                after_commit.append((current.pk, delay))
                result = "retry"
        else:
            to_state = ReconcileAnswer.SETTLES[answer.kind]
            before = {"state": effect.state, "revision": effect.revision}
            if to_state == EffectState.NOT_EXECUTED and effect.state == EffectState.SUBMITTED:
                effect = svc._effect_transition(
                    effect, expected_revision=effect.revision, to_state=EffectState.UNRESOLVED,
                    receipt=effect.receipt, by=EffectSource.RECONCILIATION, actor=None, now=now)
            receipt = answer.receipt if to_state in EffectState.WITH_RECEIPT else effect.receipt
            if to_state == EffectState.FAILED and receipt is None:
                receipt = effect.receipt
            effect = svc._effect_transition(
                effect, expected_revision=effect.revision, to_state=to_state, receipt=receipt,
                by=EffectSource.RECONCILIATION, actor=None, now=now)
            attempt.applied = to_state
            current.failures = 0
            current.last_error = ""
            result = _finish(current, now, outcome=to_state, state=ReconcileState.DONE)
            svc.audit_record(
                tenant=run.tenant, actor=None, action=AuditAction.EFFECT_RECONCILE,
                target_type=TargetType.EFFECT, target_id=effect.uuid, run_id=run.uuid,
                reason=answer.detail[:4000], before=before,
                after={"state": effect.state, "revision": effect.revision,
                       "answer": answer.kind, "request": current.pk,
                       "reconciler": reconciler_name[:64]})
        attempt.save()
        svc.run_refresh_state(run, now)
    if broker_configured():
        for pk, delay in after_commit:
            dispatch([pk], countdown=max(1.0, delay))
    return {"request": req.pk, "result": result}


def _finish(req: ReconcileRequest, now: datetime, *, outcome: str, state: str) -> str:
    req.state = state
    req.outcome = outcome
    req.finished_at = now
    req.claimed_until = None
    req.save(update_fields=["state", "outcome", "finished_at", "claimed_until", "failures",
                            "last_error", "updated_at"])
    return outcome or state


def requests_for_run(run: Run) -> list[ReconcileRequest]:
    """The run's reconcile requests, newest first, each with ``attempt_log`` prefetched
    and its ``effect`` loaded (for the run page and the API)."""
    log = Prefetch("attempt_log", queryset=ReconcileAttempt.objects.for_tenant(run.tenant_id)
                   .defer("evidence_ciphertext"))
    return list(ReconcileRequest.objects.for_tenant(run.tenant_id)
                .filter(run=run).select_related("effect").annotate(db_now=NOW)
                .prefetch_related(log).order_by("-created_at", "-id")[:50])


def request_get(tenant: Tenant, pk: int) -> ReconcileRequest:
    """The tenant's reconcile request ``pk`` (as ``requests_get``), or ``NotFound``."""
    return requests_get(tenant, [pk])[0]


def requests_get(tenant: Tenant, pks: list[int]) -> list[ReconcileRequest]:
    """The tenant's reconcile requests ``pks``, in that order, each with its ``effect``
    loaded and ``attempt_log`` prefetched (evidence left in the database), in two queries
    whatever their number (the API's answers render both). Raises ``NotFound`` unless
    every one is the tenant's."""
    log = Prefetch("attempt_log", queryset=ReconcileAttempt.objects.for_tenant(tenant)
                   .defer("evidence_ciphertext"))
    found = ReconcileRequest.objects.for_tenant(tenant).filter(pk__in=pks) \
        .select_related("effect").annotate(db_now=NOW).prefetch_related(log).in_bulk()
    if any(pk not in found for pk in pks):
        raise NotFound("no such reconcile request")
    return [found[pk] for pk in pks]


def evidence_reveal(*, actor, tenant: Tenant, attempt_id: int, reason: str) -> Any:
    """Decrypt what a service answered to one look-up (``ReconcileAttempt`` evidence) for
    a role that may reveal payloads (receipts are treated like payloads, CONTRACT.md 4);
    one ``evidence.reveal`` audit event in the same transaction. Returns the JSON value
    (``None``, and nothing audited, when the look-up kept no evidence). Raises
    ``NotFound`` (not this tenant's attempt), ``Forbidden``, ``ReasonRequired``.
    """
    svc = _services()
    require(actor, tenant, roles.REVEAL)
    reason = svc._require_reason(reason)
    with transaction.atomic():
        attempt = (ReconcileAttempt.objects.for_tenant(tenant)
                   .select_related("request__effect", "request__run")
                   .filter(pk=attempt_id).first())
        if attempt is None:
            raise NotFound("no such reconcile attempt")
        if not attempt.evidence_ciphertext:
            return None
        value = loads_any(crypto.decrypt_text(attempt.evidence_ciphertext))
        svc.audit_record(tenant=tenant, actor=actor, action=AuditAction.EVIDENCE_REVEAL,
                         target_type=TargetType.EFFECT, target_id=attempt.request.effect.uuid,
                         run_id=attempt.request.run.uuid, reason=reason[:4000],
                         after={"request": attempt.request_id, "attempt": attempt.number})
    return value
