"""The run page: what the run is and what to do next (``_run_context``, shared with
the actions that answer the refreshed page), its audit panel, the history pages of a
checkpoint or an effect, and the audited reveals (a payload, a diff of two revisions, a
reconcile look-up's evidence, an effect's receipt)."""

from __future__ import annotations

import difflib
import json
from datetime import UTC

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django_htmx.http import reswap, retarget, trigger_client_event

from .. import heartbeat, kinds, policy, roles, selectors, services
from ..exceptions import InvalidPayload
from ..models import Tenant
from ..templatetags.dashboard import ago
from ..vocab import (
    EffectState,
    PhaseClass,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    RetryOutcome,
    RetryState,
)
from .common import (
    AUDIT_CHANGED,
    _base_context,
    _reason,
    _require_valid,
    dashboard,
    require_GET,
    require_POST,
    tenant_page,
)
from .forms import DiffForm, HistoryForm, LiveRunForm, NoQuery, RevealForm
from .live import live_context

#: What a look-up answered, in words (``ReconcileAttempt.answer``).
ANSWER_WORDS = {
    ReconcileAnswer.FOUND: "the service has it: it happened",
    ReconcileAnswer.FAILED: "the service refused it",
    ReconcileAnswer.NOT_EXECUTED: "the service never saw the key",
    ReconcileAnswer.CANNOT_TELL: "could not tell (error, timeout or a bad answer)",
    ReconcileAnswer.NO_LOOKUP: "the service offers no look-up",
    ReconcileAnswer.OWNER_LIVE: "not asked: the owner was live",
    ReconcileAnswer.SETTLING: "the service had not seen the key yet: waiting for the settle "
                              "delay",
    ReconcileAnswer.MOVED_ON: "the effect had settled by other means",
}



def _service_names(effects) -> str:
    return ", ".join(sorted({e.service for e in effects}))


def _owner_live_words(owner: dict) -> str:
    """The sentence for a live owner: *The owner X is live until T (in 4 min); reconcile
    after it is gone.* ``owner`` is ``{"owner": lease owner or "", "until": when it counts
    as gone, or None}``."""
    who = (f"The owner {owner['owner']}" if owner["owner"]
           else "The run's owner (no lease; it wrote recently)")
    until = owner["until"]
    when = (f" until {until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({ago(until)})"
            if until else "")
    return f"{who} is live{when}; reconcile after it is gone."


def _reconcile_rows(requests) -> list[dict]:
    """The run's reconcile requests (newest first) as the Reconciliation section shows
    them: the attempt log in words, whether a queued request waits for the task queue to
    come back (``broker_down``), and whether a request that gave up leaves its effect
    waiting for a human (the newest request of that effect, and the effect still in
    doubt)."""
    broker = heartbeat.broker_configured()
    seen: set[int] = set()
    rows = []
    for r in requests:
        latest = r.effect_id not in seen
        seen.add(r.effect_id)
        queued = r.state == ReconcileState.QUEUED
        rows.append({
            "req": r,
            "effect": r.effect,
            "attempts": [{"a": a, "words": ANSWER_WORDS.get(a.answer, "")}
                         for a in r.attempt_log.all()],
            "broker_down": queued and (services.BROKER_DOWN in r.last_error
                                       or (broker and r.dispatched_at is None)),
            "waits_for_human": (r.state == ReconcileState.GAVE_UP and latest
                                and r.effect.state in EffectState.IN_DOUBT),
        })
    return rows


def _reconcile_step(in_doubt, rows: list[dict], owner: dict | None) -> str:
    """The next step while an effect is in doubt: wait for a reconciliation under way,
    wait for a live owner, decide after one gave up, or reconcile."""
    doubtful = [r for r in rows if r["effect"].state in EffectState.IN_DOUBT]
    open_rows = [r for r in doubtful if r["req"].state in ReconcileState.OPEN]
    if any(r["broker_down"] for r in open_rows):
        return ("Reconciliation is queued and will run when the worker is back (nothing is "
                "lost); nothing to do meanwhile")
    waiting = [r["req"].waiting_for_worker_since for r in open_rows
               if r["req"].waiting_for_worker_since]
    if waiting:
        return (f"Reconcile job waiting for a worker since {min(waiting):%Y-%m-%d %H:%M:%S} "
                f"UTC; the next stale-run sweep sends it again (nothing is lost)")
    running = [r["effect"] for r in open_rows if r["req"].state == ReconcileState.RUNNING]
    if running:
        return f"Reconciliation is asking {_service_names(running)} now; reload in a moment"
    if open_rows:
        req = open_rows[0]["req"]
        when = ago(req.next_attempt_at)
        when = f"due {when}" if when.startswith("in ") else "due now"
        return (f"Reconciliation is queued; its next look-up is {when}: "
                f"wait for the answer")
    if owner is not None:
        words = _owner_live_words(owner).rstrip(".")
        return f"Wait: {words[0].lower()}{words[1:]}"
    gave_up = [r["effect"] for r in rows if r["waits_for_human"]]
    if gave_up:
        e = gave_up[0]
        return (f"Reconciliation gave up on {e.service} {e.operation_key}: reconcile again, "
                f"or mark the outcome unknown")
    return f"Reconcile first: ask {_service_names(in_doubt)} by operation key"


#: What a reconciliation that settled an in-flight run's effect leads to, best news first.
_RECONCILED_STEP = {
    EffectState.CONFIRMED: ("Reconciliation confirmed {e}: request a retry (it replays the confirmed "
                  "receipt; not called again) or close the run"),
    EffectState.NOT_EXECUTED: ("Reconciliation found that {e} never ran: request a retry (it is "
                     "submitted again with the same key) or close the run"),
    EffectState.FAILED: ("Reconciliation found that the service refused {e}: request a retry (the run "
               "follows its failure path) or close the run"),
}


def _reconciled(rows: list[dict]) -> str:
    """The hint for a run whose effect reconciliation settled, if one did and it still
    stands (the newest such request; ``confirmed`` before the others)."""
    for outcome, words in _RECONCILED_STEP.items():
        for r in rows:
            req, effect = r["req"], r["effect"]
            if (req.state == ReconcileState.DONE and req.outcome == outcome
                    and effect.state == outcome):
                return words.format(e=f"{effect.service} {effect.operation_key}")
    return ""


def _next_step(detail: selectors.RunDetail, open_retry, *, reconcile_rows=(),
               owner: dict | None = None, may_decide: bool = False,
               may_withdraw: bool = False, tenant: str = "") -> str:
    """One short hint at the top of the run page, from the run's state (presentation only:
    the services decide what is allowed). It leads a reviewer to an end state: the run
    retried (and finished by its runtime) or closed."""
    run, effects = detail.run, detail.effects
    state = run.recovery_state
    in_doubt = [e for e in effects if e.state in EffectState.IN_DOUBT]
    unknown = [e for e in effects if e.state == EffectState.UNKNOWN]
    if run.closed_at is not None:
        who = run.closed_by.get_username() if run.closed_by else "a reviewer"
        return (f"Closed by {who}: nothing to do here; a new write by the runtime reopens "
                f"it")
    if state == RecoveryState.SCHEMA_MISMATCH:
        return f"Schema mismatch: {run.recovery_reason or 'unsupported kind or schema version'}"
    if state == RecoveryState.AWAITING_APPROVAL and open_retry is not None:
        requester = open_retry.requested_by.get_username()
        if may_decide:
            return f"Your decision: {requester} asked for this retry; read the preview, then " \
                   f"approve or reject it"
        if may_withdraw:
            return (f"Waiting for an approver other than {requester} (you); you may "
                    f"withdraw your request below")
        return f"Waiting for an approver other than {requester}"
    if state == RecoveryState.RETRY_APPROVED:
        if kinds.migration_required(run.kind, run.schema_version):
            # What the runtime's resume answers (reject / migration_required) until then.
            return "Approved, but waiting for a migration: " + policy.migration_required_detail(
                run.kind, run.schema_version, tenant=tenant, run_id=str(run.uuid))
        return "Approved: the runtime's next resume call will retry"
    if in_doubt and state in RecoveryState.RETRYABLE:
        return _reconcile_step(in_doubt, list(reconcile_rows), owner)
    if unknown and open_retry is None:
        e = unknown[0]
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        return (f"Nobody can tell whether {e.service} ran {e.operation_key}{more}: request a "
                f"retry (accepts a possible duplicate) or close the run")
    if (state == RecoveryState.AMBIGUOUS and run.phase_class == PhaseClass.IN_FLIGHT
            and open_retry is None and all(e.state in EffectState.SETTLED for e in effects)):
        if not effects:
            return "No side effect was recorded; a retry re-runs the step, or close the run"
        return _reconciled(list(reconcile_rows)) or (
            "Every recorded effect is settled; a retry re-runs the step and replays "
            "confirmed receipts (not called again), or close the run")
    if state == RecoveryState.CONFLICTED:
        return "Refused writes to acknowledge"
    return ""


def _retry_blocked(run, open_retry, in_doubt: bool) -> str:
    """Why "Request retry" is not offered (mirrors ``services.retry_request``'s refusals)."""
    if run.closed_at is not None:
        return "No retry: the run is closed; a new write by the runtime reopens it."
    if open_retry is not None:
        waits = ("an approver" if open_retry.state == RetryState.REQUESTED
                 else "the runtime's resume")
        return f"No new retry: request #{open_retry.pk} is open and awaits {waits}."
    if run.recovery_state not in RecoveryState.RETRYABLE:
        return (f"No retry: it is for ambiguous or unknown-outcome runs, and this one is "
                f"{run.recovery_state.replace('_', ' ')}.")
    if in_doubt:
        return "No retry yet: an effect is still in doubt (reconcile or mark it unknown first)."
    return ""


def _back_link(run) -> tuple[str, str]:
    """The run page's back link: the inbox tab of the run's current state."""
    if run.recovery_state in RecoveryState.INBOX_TABS:
        return f"?state={run.recovery_state}", f"{run.recovery_state.replace('_', ' ')} runs"
    return "", "inbox"


def _run_context(request: HttpRequest, tenant: Tenant, run_id, **extra) -> dict:
    """Everything the run page shows, with the action flags the viewer's role allows."""
    # Long on purpose: the run page's whole context in a fixed number of queries; each
    # part reads what the previous ones loaded.
    detail = selectors.run_detail(user=request.user, tenant=tenant, run_id=run_id)
    context = _base_context(request, tenant, "inbox")
    user = request.user
    run = detail.run
    closed = run.closed_at is not None
    open_retry = next((r for r in detail.retry_requests
                       if r.state in RetryState.OPEN), None)
    any_in_doubt = any(e.state in EffectState.IN_DOUBT for e in detail.effects)
    effects = [
        {"effect": e, "history": detail.effect_history.get(e.pk, []),
         "older": detail.effect_history_older.get(e.pk),
         "can_mark_unknown": (context["can_review"] and e.state in EffectState.IN_DOUBT
                              and not closed),
         "flags": services.flag_sentences(e.secret_paths)}
        for e in detail.effects
    ]
    # Screening's flags (docs/security/secrets.md): paths and types, never a value.
    checkpoints = [{"cp": cp, "revisions": detail.revisions.get(cp.pk, []),
                    "older": detail.revisions_older.get(cp.pk),
                    "flags": services.flag_sentences(cp.secret_paths, size=cp.payload_size,
                                            large_above=cp.large_above)}
                   for cp in detail.checkpoints]
    retries = [
        {"retry": r,
         "can_decide": (context["can_approve"] and r.state == RetryState.REQUESTED
                        and r.requested_by_id != user.pk),
         "can_withdraw": (context["can_review"] and r.state == RetryState.REQUESTED
                          and r.requested_by_id == user.pk),
         "own": r.requested_by_id == user.pk}
        for r in detail.retry_requests
    ]
    reconcile_rows = _reconcile_rows(
        selectors.reconcile_requests(user=user, tenant=tenant, run=run))
    # Reconcile is refused while the owner is live (``OwnerLive``): ask the database's
    # clock only when there is something to reconcile.
    owner = None
    if any_in_doubt and not closed:
        status = selectors.run_owner_status(user=user, tenant=tenant, run=run)
        if status.live:
            owner = {"owner": status.owner, "until": status.gone_at}
    can_reconcile = context["can_review"] and any_in_doubt and not closed and owner is None
    if owner is not None:  # mark unknown is refused over a live owner too (OwnerLive)
        for item in effects:
            item["can_mark_unknown"] = False
    reconcile_blocked = ""
    if context["can_review"] and any_in_doubt and not can_reconcile:
        reconcile_blocked = ("No reconcile: the run is closed; a new write by the runtime "
                             "reopens it." if closed else _owner_live_words(owner))
    open_conflicts = detail.open_conflicts
    retry_blocked = _retry_blocked(run, open_retry, any_in_doubt)
    can_request_retry = context["can_review"] and not retry_blocked
    deciding = any(r["can_decide"] for r in retries)
    # What an approved retry would do, shown before it is requested and before approval.
    preview = services.retry_preview(run) if can_request_retry or deciding else []
    duplicates = sum(1 for p in preview if p["outcome"] == RetryOutcome.POSSIBLE_DUPLICATE)
    back_query, back_label = _back_link(run)
    context.update(
        run=run,
        checkpoints=checkpoints,
        effects=effects,
        conflicts=detail.conflicts,
        open_conflicts=open_conflicts,
        more_conflicts=detail.more_conflicts,
        retries=retries,
        audit=detail.audit,
        reconcile_rows=reconcile_rows,
        sweep_interval_s=settings.RECOVERY_SWEEP_INTERVAL_S,
        show_reconciliation=bool(reconcile_rows) or any_in_doubt,
        next_step=_next_step(
            detail, open_retry, reconcile_rows=reconcile_rows, owner=owner,
            may_decide=(open_retry is not None and context["can_approve"]
                        and user.pk != open_retry.requested_by_id),
            may_withdraw=any(r["can_withdraw"] for r in retries), tenant=tenant.slug),
        can_request_retry=can_request_retry,
        retry_blocked=retry_blocked if context["can_review"] else "",
        can_reconcile=can_reconcile,
        reconcile_again=any(r["waits_for_human"] for r in reconcile_rows),
        reconcile_blocked=reconcile_blocked,
        reconcile_refused=False,
        can_acknowledge=context["can_review"] and open_conflicts > 0,
        can_close=context["can_review"] and not closed,
        has_open_retry=open_retry is not None,
        has_open_reconcile=any(r["req"].state in ReconcileState.OPEN for r in reconcile_rows),
        show_preview=can_request_retry or deciding,
        preview=preview,
        preview_duplicates=duplicates,
        back_query=back_query,
        back_label=back_label,
        revealed=None,
        revealed_evidence=None,
        revealed_receipt=None,
        notice="",
        refusal="",
        # Pages that move by themselves (issue 21, item 8): the poll while something is
        # pending, "completed 2 s ago" once it ended (``_live.html#run-live``).
        **live_context(selectors.run_live(user=user, tenant=tenant, run_id=run.uuid)),
        rejected=selectors.rejected_retries(user=user, tenant=tenant,
                                            run_pks=[run.pk]).get(run.pk),
    )
    if run.payloads_deleted_at is not None:
        # Retention or erasure deleted its payloads (docs/security/retention.md): the page
        # says when and why (its tombstone), and offers no reveal and no action; the
        # services refuse writes to it (409 run_deleted).
        context.update(tombstone=selectors.run_tombstone(user=user, tenant=tenant, run=run),
                       can_reveal=False, can_request_retry=False, can_reconcile=False,
                       can_acknowledge=False, can_close=False, show_preview=False,
                       next_step="")
        deciding = False
        for item in effects:
            item["can_mark_unknown"] = False
        for r in retries:
            r["can_decide"] = r["can_withdraw"] = False
    context["has_actions"] = (context["can_request_retry"] or context["can_reconcile"]
                              or context["can_acknowledge"] or context["can_close"]
                              or deciding or any(r["can_withdraw"] for r in retries)
                              or any(e["can_mark_unknown"] for e in effects))
    context.update(extra)
    return context


@require_GET
@dashboard
@tenant_page()
def run_live(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """``/t/<slug>/runs/<run_id>/live/?seen=<marker>``: the run page's poll. The same
    marker as the page's: 204, nothing to swap (one read: ``selectors.run_live``).
    Another: the refreshed run body, retargeted over ``#run-body``. Without htmx: the
    whole run page. ``seen`` is required (400 naming it)."""
    seen = LiveRunForm.from_request(request).cleaned_data["seen"]
    live = selectors.run_live(user=request.user, tenant=tenant, run_id=run_id)
    if not request.htmx:
        return render(request, "checkpoints/run.html", _run_context(request, tenant, run_id))
    if live.marker == seen:
        return HttpResponse(status=204)
    context = _run_context(request, tenant, run_id)
    response = render(request, "checkpoints/run.html#run-body", context)
    return reswap(retarget(response, "#run-body"), "outerHTML")


@require_GET
@dashboard
@tenant_page()
def run_detail(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """``/t/<slug>/runs/<run_id>/``: identity, lease, state, checkpoint timeline, effects,
    conflicts, retry requests, audit trail and the actions the viewer's role allows.
    Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    return render(request, "checkpoints/run.html", _run_context(request, tenant, run_id))


def _history_before(request: HttpRequest) -> int | None:
    """The history pages' ``?before=N`` (``HistoryForm``); 400 naming ``before`` for a
    value given twice, or other than ASCII digits (as the API's parameters), and naming
    any other parameter."""
    return HistoryForm.from_request(request).cleaned_data["before"]


def _history(request: HttpRequest, tenant: Tenant, partial: str, run, context: dict):
    """htmx ("Load older"): the page's list items (``run.html#<partial>``), which replace
    the link; otherwise the history page around them."""
    context = {"tenant": tenant} | context
    if request.htmx:
        return render(request, f"checkpoints/run.html#{partial}", context)
    context = _base_context(request, tenant, "inbox") | context | {"run": run}
    return render(request, "checkpoints/history.html", context)


@require_GET
@dashboard
@tenant_page()
def checkpoint_history(request: HttpRequest, tenant: Tenant, checkpoint_id: str) -> HttpResponse:
    """``/t/<slug>/checkpoints/<id>/revisions/?before=N``: the checkpoint's revisions
    below N (none: from the latest), newest first, ``selectors.HISTORY_PAGE`` at a time
    (metadata; payloads only through the audited reveal). The run page shows the newest
    page and links here for older ones."""
    before = _history_before(request)
    cp = selectors.checkpoint_get(user=request.user, tenant=tenant, checkpoint_id=checkpoint_id)
    page = selectors.checkpoint_history(user=request.user, tenant=tenant, checkpoint=cp,
                                        before=before)
    return _history(request, tenant, "cp-revisions", cp.run,
                    {"cp": cp, "revisions": page.rows, "older": page.older, "before": before})


@require_GET
@dashboard
@tenant_page()
def effect_history(request: HttpRequest, tenant: Tenant, effect_id: str) -> HttpResponse:
    """``/t/<slug>/effects/<id>/revisions/?before=N``: the effect's revisions below N,
    newest first, one page at a time; as ``checkpoint_history``."""
    before = _history_before(request)
    effect = selectors.effect_get(user=request.user, tenant=tenant, effect_id=effect_id)
    page = selectors.effect_history(user=request.user, tenant=tenant, effect=effect,
                                    before=before)
    return _history(request, tenant, "effect-revisions", effect.run,
                    {"e": effect, "history": page.rows, "older": page.older, "before": before})


@require_GET
@dashboard
@tenant_page()
def run_audit(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """The run's audit trail fragment; the page re-fetches it on ``audit-changed``.
    Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    audit = selectors.audit_list(user=request.user, tenant=tenant, run_id=run.uuid, limit=200)
    context = _base_context(request, tenant, "inbox") | {"run": run, "audit": audit}
    return render(request, "checkpoints/run.html#audit-panel", context)


# --------------------------------------------------------------------------------------
# Payloads: reveal and diff (reviewer, approver, admin; each reveal is audited)
# --------------------------------------------------------------------------------------

def _pretty(envelope: dict) -> str:
    return json.dumps(envelope["payload"], indent=2, sort_keys=True, ensure_ascii=False)


def _payload_done(request: HttpRequest, tenant: Tenant, checkpoint, revealed: dict):
    """htmx: the payload fragment plus ``audit-changed``; otherwise the run page with the
    revealed payload shown under its checkpoint."""
    if request.htmx:
        context = _base_context(request, tenant, "inbox") | {"revealed": revealed}
        response = render(request, "checkpoints/run.html#payload", context)
        return trigger_client_event(response, AUDIT_CHANGED)
    context = _run_context(request, tenant, checkpoint.run.uuid, revealed=revealed)
    return render(request, "checkpoints/run.html", context)


@require_POST
@never_cache  # a revealed payload or evidence must not be kept by any cache (issue 6)
@dashboard
@tenant_page(roles.REVEAL)
def checkpoint_reveal(request: HttpRequest, tenant: Tenant, checkpoint_id: str) -> HttpResponse:
    """Decrypt and show one revision's payload; ``services.payload_reveal`` audits it."""
    checkpoint = selectors.checkpoint_get(user=request.user, tenant=tenant,
                                          checkpoint_id=checkpoint_id)
    form = RevealForm(request.POST)
    _require_valid(form)
    envelope = services.payload_reveal(actor=request.user, tenant=tenant, checkpoint=checkpoint,
                                       revision=form.cleaned_data["revision"],
                                       reason=form.cleaned_data["reason"])
    revealed = {"checkpoint_pk": checkpoint.pk, "mode": "payload",
                "revision": envelope["revision"], "text": _pretty(envelope),
                "updated_at_ms": envelope.get("updated_at_ms")}
    return _payload_done(request, tenant, checkpoint, revealed)


@require_POST
@never_cache  # a revealed payload or evidence must not be kept by any cache (issue 6)
@dashboard
@tenant_page(roles.REVEAL)
def checkpoint_diff(request: HttpRequest, tenant: Tenant, checkpoint_id: str) -> HttpResponse:
    """Line diff of two revisions' pretty-printed payloads; both reveals are audited."""
    checkpoint = selectors.checkpoint_get(user=request.user, tenant=tenant,
                                          checkpoint_id=checkpoint_id)
    form = DiffForm(request.POST)
    _require_valid(form)
    data = form.cleaned_data
    for field in ("from_rev", "to_rev"):
        if data[field] > checkpoint.revision:
            raise InvalidPayload(f"{field}: revision {data[field]} does not exist "
                                 f"(latest is {checkpoint.revision})")
    reason = f"diff r{data['from_rev']}..r{data['to_rev']}: {data['reason']}"
    old = services.payload_reveal(actor=request.user, tenant=tenant, checkpoint=checkpoint,
                                  revision=data["from_rev"], reason=reason)
    new = services.payload_reveal(actor=request.user, tenant=tenant, checkpoint=checkpoint,
                                  revision=data["to_rev"], reason=reason)
    lines = list(difflib.unified_diff(
        _pretty(old).splitlines(), _pretty(new).splitlines(),
        fromfile=f"revision {data['from_rev']}", tofile=f"revision {data['to_rev']}",
        lineterm="", n=3))
    diff = [{"text": line, "cls": _diff_class(line)} for line in lines]
    revealed = {"checkpoint_pk": checkpoint.pk, "mode": "diff", "diff": diff,
                "from_rev": data["from_rev"], "to_rev": data["to_rev"]}
    return _payload_done(request, tenant, checkpoint, revealed)


@require_POST
@never_cache  # a revealed payload or evidence must not be kept by any cache (issue 6)
@dashboard
@tenant_page(roles.REVEAL)
def reconcile_evidence_reveal(request: HttpRequest, tenant: Tenant,
                              attempt_id: int) -> HttpResponse:
    """Show what a service answered to one reconcile look-up (roles that may reveal
    payloads; a reason is required); ``services.evidence_reveal`` audits it. htmx:
    the evidence fragment plus ``audit-changed``; otherwise the run page with it shown."""
    attempt = selectors.reconcile_attempt_get(user=request.user, tenant=tenant,
                                              attempt_id=attempt_id)
    reason = _reason(request)
    value = services.evidence_reveal(actor=request.user, tenant=tenant,
                                           attempt_id=attempt.pk, reason=reason)
    revealed = {"attempt_pk": attempt.pk, "number": attempt.number,
                "text": None if value is None else json.dumps(
                    value, indent=2, sort_keys=True, ensure_ascii=False)}
    if request.htmx:
        context = _base_context(request, tenant, "inbox") | {"revealed_evidence": revealed}
        response = render(request, "checkpoints/run.html#evidence", context)
        return trigger_client_event(response, AUDIT_CHANGED)
    context = _run_context(request, tenant, attempt.request.run.uuid,
                           revealed_evidence=revealed)
    return render(request, "checkpoints/run.html", context)


@require_POST
@dashboard
@tenant_page(roles.REVEAL)
def effect_receipt_reveal(request: HttpRequest, tenant: Tenant, effect_id: str) -> HttpResponse:
    """Show an effect's receipt (roles that may reveal payloads; a reason is required);
    ``services.receipt_reveal`` audits it. Receipts are treated like payloads
    (CONTRACT.md 4): the run page never shows one without this. htmx: the receipt
    fragment plus ``audit-changed``; otherwise the run page with it shown."""
    effect = selectors.effect_get(user=request.user, tenant=tenant, effect_id=effect_id)
    answer = services.receipt_reveal(actor=request.user, tenant=tenant,
                                     effect_id=effect.uuid, reason=_reason(request))
    revealed = {"effect_pk": effect.pk, "revision": answer["revision"],
                "text": None if answer["receipt"] is None else json.dumps(
                    answer["receipt"], indent=2, sort_keys=True, ensure_ascii=False)}
    if request.htmx:
        context = _base_context(request, tenant, "inbox") | {"revealed_receipt": revealed}
        response = render(request, "checkpoints/run.html#receipt", context)
        return trigger_client_event(response, AUDIT_CHANGED)
    context = _run_context(request, tenant, effect.run.uuid, revealed_receipt=revealed)
    return render(request, "checkpoints/run.html", context)


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "ctx")
