"""Reconciliation as durable jobs (issue 5; CONTRACT.md 3 "reconcile"; DESIGN.md 4).

A reviewer's reconcile writes one ``ReconcileRequest`` per in-doubt effect in the same
transaction as its audit event, and hands them to a worker (``services.reconcile_requests``:
``run_reconcile``, ``dispatch``, ``redrive``, below this module). A worker then runs
``execute`` for each request id:

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
for a human with the error on the run page. ``reconcile_requests.redrive`` (run by the
sweep: beat with a broker, the in-process worker without one) sends again what a lost
message, a dead worker or a broker outage left behind. Every time here is the
database's (``dbclock``).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Prefetch, Q

from .. import audit, crypto, reconcile, services
from ..dbclock import NOW
from ..exceptions import InvalidPayload, NotFound
from ..heartbeat import broker_configured
from ..jsonparse import dumps, loads_any, loads_object, shown
from ..models import (
    Effect,
    ReconcileAttempt,
    ReconcileRequest,
    ReconcileState,
    Run,
    Tenant,
)
from ..services import notify_dispatch, reconcile_requests
from ..vocab import (
    AuditAction,
    EffectSource,
    EffectState,
    NotificationEventType,
    ReconcileAnswer,
    TargetType,
)

log = logging.getLogger(__name__)

# How long a claim lasts beyond the look-up's own timeout before the sweep re-drives it.
CLAIM_MARGIN_S = 60


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
    # Committed on its own, before the look-up calls the service (never call this inside
    # a caller's transaction: it would hold the row over a network call).
    with transaction.atomic():
        won = requests.filter(due | vanished, pk=request_pk).update(
            state=ReconcileState.RUNNING, attempts=F("attempts") + 1,
            claimed_until=NOW + hold, updated_at=NOW)
        if won != 1:  # not due, or another worker holds the claim
            return None
        req = requests.annotate(db_now=NOW).get(pk=request_pk)
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
            f"{configured.name}: {type(exc).__name__}: {shown(str(exc), 300)}")
    answer = box.get("answer")
    try:
        return _checked(answer, configured.name)
    except Exception as exc:  # noqa: BLE001 - e.g. an unhashable kind, a detail that
        # cannot be printed: garbage is "cannot tell", never a crash left "running"
        return reconcile.Answer.cannot_tell(
            f"{configured.name}: unusable answer ({type(exc).__name__})")


def _strict(value: Any, what: str) -> Any:
    """``value`` as the API would accept it (CONTRACT.md 6), or ``InvalidPayload``."""
    try:
        text = json.dumps({"v": value}, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"{what}: not JSON ({type(exc).__name__})") from None
    return loads_object(text, what=what)["v"]


def _too_large(value: Any) -> bool:
    """Whether ``value`` (already strict JSON) is over ``reconcile.MAX_ANSWER_BYTES`` as
    stored: its ``dumps`` text in UTF-8, before encryption."""
    return len(dumps(value).encode("utf-8")) > reconcile.MAX_ANSWER_BYTES


def _checked(answer: Any, name: str) -> reconcile.Answer:
    """A plugin's ``answer`` as it may be stored, or ``cannot_tell`` naming what is wrong
    (CONTRACT.md 6; docs/reconciliation.md "Plugins"): not an ``Answer``, an unknown kind,
    evidence or a receipt that breaks the API's JSON rules or is larger than
    ``reconcile.MAX_ANSWER_BYTES`` (the cap on a service's answer; ``evidence larger than
    N bytes``, and nothing of it kept), a found/refused answer without a receipt object."""
    if not isinstance(answer, reconcile.Answer):
        return reconcile.Answer.cannot_tell(f"{name}: returned {type(answer).__name__}, "
                                            f"not an Answer")
    if answer.kind not in ReconcileAnswer.SERVICE:
        return reconcile.Answer.cannot_tell(f"{name}: unknown answer {shown(answer.kind, 40)!r}")
    try:
        evidence = _strict(answer.evidence, "answer") if answer.evidence is not None else None
    except InvalidPayload as exc:
        return reconcile.Answer.cannot_tell(f"{name}: {exc.detail}")
    # Evidence is stored (encrypted) with the attempt, so it has the receipt's cap. A
    # found/refused answer's evidence defaults to its receipt: a receipt over the cap
    # is refused here, as evidence.
    if evidence is not None and _too_large(evidence):
        return reconcile.Answer.cannot_tell(f"{name}: evidence larger than "
                                            f"{reconcile.MAX_ANSWER_BYTES} bytes")
    receipt = answer.receipt
    if answer.kind in ReconcileAnswer.WITH_RECEIPT:
        if not isinstance(receipt, dict):
            return reconcile.Answer.cannot_tell(f"{name}: a {answer.kind} answer needs a "
                                                f"receipt object", evidence=evidence)
        try:
            receipt = _strict(receipt, "receipt")
        except InvalidPayload as exc:
            return reconcile.Answer.cannot_tell(f"{name}: {exc.detail}")
        if _too_large(receipt):
            return reconcile.Answer.cannot_tell(f"{name}: receipt larger than "
                                                f"{reconcile.MAX_ANSWER_BYTES} bytes")
    return reconcile.Answer(answer.kind, receipt, shown(answer.detail, 1000), evidence)


def _effect_ref(effect: Effect, tenant_slug: str) -> reconcile.EffectRef:
    request = None
    if effect.request_ciphertext:
        try:
            request = loads_any(crypto.decrypt_text(effect.request_ciphertext,
                                                    tenant=effect.tenant_id))
        except crypto.DataKeyGone:  # a crypto-shredded tenant: the request is erased
            request = None
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
    # The answer's events (by the system) carry the request's incident, as the
    # reviewer's ``run.reconcile`` did (the newcomer's finding: they carried none).
    with audit.working_on(req.incident_ref or "", system=True):
        return _execute_request(req, started)


def _execute_request(req: ReconcileRequest, started: datetime) -> dict:
    svc = services
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
    # Long on purpose: one transaction over one attempt; each branch (moved on, waiting,
    # cannot tell, settled) ends the same request row with its one audit event, read as
    # one decision table.
    svc = services
    after_commit: list[tuple[int, float]] = []
    with transaction.atomic():  # one attempt's result, committed on its own
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
                attempt.evidence_ciphertext = crypto.encrypt_text(dumps(answer.evidence),
                                                                  tenant=current.tenant_id)
        elif answer is not None:
            attempt.answer = answer.kind
            attempt.detail = answer.detail
            if answer.evidence is not None:
                attempt.evidence_ciphertext = crypto.encrypt_text(dumps(answer.evidence),
                                                                  tenant=current.tenant_id)
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
                             after={"request": current.pk, "state": effect.state},
                             created_at=now)
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
                           "failures": current.failures}, created_at=now)
                # Told (issue 21: ``reconcile.gave_up``) in this transaction: a person
                # decides now. The service's name and the counts, never its answer.
                notify_dispatch.notify_emit(
                    tenant=run.tenant, event_type=NotificationEventType.RECONCILE_GAVE_UP,
                    run=run, detail={"effect": str(effect.uuid), "service": effect.service[:200],
                                     "attempts": current.attempts,
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
                    receipt=svc.KEEP_RECEIPT, by=EffectSource.RECONCILIATION, actor=None,
                    now=now)
            receipt = (answer.receipt if to_state in EffectState.WITH_RECEIPT
                       else svc.KEEP_RECEIPT)
            if to_state == EffectState.FAILED and receipt is None:
                receipt = svc.KEEP_RECEIPT
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
                       "reconciler": reconciler_name[:64]}, created_at=now)
        attempt.save()
        svc.run_refresh_state(run, now)
    if broker_configured():
        for pk, delay in after_commit:
            reconcile_requests.dispatch([pk], countdown=max(1.0, delay))
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
