"""The run page: what the run is and what to do next (``_run_context``, shared with
the actions that answer the refreshed page), its audit panel, the history pages of a
checkpoint or an effect, and the audited reveals (a payload, a diff of two revisions, a
reconcile look-up's evidence, an effect's receipt)."""

from __future__ import annotations

import difflib
import json
import uuid
from urllib.parse import parse_qs, urlencode, urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django_htmx.http import reswap, retarget, trigger_client_event

from .. import policy, roles, selectors, services
from ..exceptions import InvalidPayload
from ..models import Tenant
from ..selectors import nextstep
from ..vocab import (
    EffectState,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    RetryOutcome,
    RetryState,
    words,
)
from .common import (
    AUDIT_CHANGED,
    _base_context,
    _reason,
    _require_valid,
    dashboard,
    require_POST,
    require_safe,
    tenant_page,
)
from .forms import DiffForm, HistoryForm, LiveRunForm, NoQuery, RevealForm, RunPageForm, back_target
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



#: The viewer-independent rule of the next step lives in ``selectors.nextstep`` (the
#: inbox and the API run list say the same, shorter); the run page adds who may decide.
_owner_live_words = nextstep.owner_live_words


def _reconcile_rows(requests) -> list[dict]:
    """The run's reconcile requests (newest first) as the Reconciliation section shows
    them: ``nextstep.reconcile_rows`` (``broker_down``, ``waits_for_human``) and each
    request's attempt log in words."""
    rows = nextstep.reconcile_rows(requests)
    for row in rows:
        row["attempts"] = [{"a": a, "words": ANSWER_WORDS.get(a.answer, "")}
                           for a in row["req"].attempt_log.all()]
    return rows


def _next_step(detail: selectors.RunDetail, open_retry, *, reconcile_rows=(),
               owner: dict | None = None, may_decide: bool = False,
               may_withdraw: bool = False, tenant: str = "") -> nextstep.Step:
    """The run page's next step (``nextstep.next_step``, the inbox's rule): the run's
    state, effects, open request and reconciliation, and the viewer's part in an open
    request."""
    run = detail.run
    return nextstep.next_step(nextstep.StepInput(
        state=run.recovery_state, phase_class=run.phase_class,
        closed=run.closed_at is not None,
        closed_by=run.closed_by.get_username() if run.closed_by else "",
        recovery_reason=run.recovery_reason, kind=run.kind,
        schema_version=run.schema_version, run_id=str(run.uuid),
        deleted=run.payloads_deleted_at is not None, effects=detail.effects,
        open_retry=open_retry,
        requester=open_retry.requested_by.get_username() if open_retry else "",
        reconcile_rows=list(reconcile_rows), owner=owner, may_decide=may_decide,
        may_withdraw=may_withdraw, tenant=tenant))


def _retry_blocked(run, open_retry, in_doubt: bool, owner: dict | None) -> str:
    """Why "Request retry" is not offered (mirrors ``services.retry_request``'s refusals,
    in its order: a live ``owner``, ``{"owner", "until"}`` as ``_owner_live_words``
    reads it, before the run's state; the stop-39 attack found the page still giving
    the state where the service answers 409 owner_live)."""
    if run.closed_at is not None:
        return "No retry: the run is closed; a new write by the runtime reopens it."
    if open_retry is not None:
        waits = ("an approver" if open_retry.state == RetryState.REQUESTED
                 else "the runtime's resume")
        if not policy.retry_applies(run.phase_class):
            waits = "nothing while the run stays completed (replayed, never retried)"
        return f"No new retry: request #{open_retry.pk} is open and awaits {waits}."
    if not policy.retry_applies(run.phase_class):
        return "No retry: the run completed; a completed run is replayed, never retried."
    if owner is not None:
        return "No retry yet: " + _owner_live_words(owner, "request a retry")
    if run.recovery_state not in RecoveryState.RETRYABLE:
        return (f"No retry: it is for ambiguous or unknown-outcome runs, and this one is "
                f"{run.recovery_state.replace('_', ' ')}.")
    if in_doubt:
        return "No retry yet: an effect is still in doubt (reconcile or mark it unknown first)."
    return ""


def _asked_back(request: HttpRequest) -> str:
    """The ``back`` the run page was asked with: a GET's own ``?back=``; an htmx action's,
    the ``back`` of the page it was sent from (``HX-Current-URL``), so the link still
    returns there after the action's swap."""
    if request.method in ("GET", "HEAD"):
        return request.GET.get("back", "")
    current = request.htmx.current_url_abs_path if request.htmx else None
    values = parse_qs(urlsplit(current or "").query).get("back", [])
    return values[0] if len(values) == 1 else ""


def _back_link(request: HttpRequest, tenant: Tenant, run) -> tuple[str, str]:
    """The run page's back link ``(href, words)``: the inbox page the reviewer came from
    (``back``, checked by ``RunPageForm`` and ``back_target``; ``run_detail`` refuses a
    bad one with a 400, an action's swap ignores it), else the inbox tab of the run's
    current state."""
    inbox = reverse("run_list", args=[tenant.slug])
    form = RunPageForm({"back": _asked_back(request)})
    target = None
    if form.is_valid():
        try:
            target = back_target(form.cleaned_data["back"], inbox)
        except InvalidPayload:
            target = None
    if target is not None:
        href, state = target
        return href, (f"{words(state)} runs" if state in RecoveryState.values else "inbox")
    if run.recovery_state in RecoveryState.INBOX_TABS:
        return (f"{inbox}?state={run.recovery_state}",
                f"{run.recovery_state.replace('_', ' ')} runs")
    return inbox, "inbox"


def _run_context(request: HttpRequest, tenant: Tenant, run_id, **extra) -> dict:
    """Everything the run page shows, with the action flags the viewer's role allows,
    read from one snapshot of the database (``selectors.consistent_read``): the run, its
    effects, the next step and its reconcile requests are of one moment. Read apart, a
    worker that finished a reconcile between the effects' query and the requests' showed
    "done · unknown" beside an effect still "unresolved" and "Reconcile first" (the recon
    newcomer's finding, on the reconcile action's answer with a real Celery worker)."""
    with selectors.consistent_read():
        return _run_context_read(request, tenant, run_id, **extra)


def _run_context_read(request: HttpRequest, tenant: Tenant, run_id, **extra) -> dict:
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
         # A run that completed since is replayed, never retried: reject, not approve.
         "approvable": policy.retry_applies(run.phase_class),
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
    # ... and so is a retry request (judged before the run's state, as the service does).
    if not closed and (any_in_doubt or (open_retry is None
                                        and policy.retry_applies(run.phase_class))):
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
    retry_blocked = _retry_blocked(run, open_retry, any_in_doubt, owner)
    can_request_retry = context["can_review"] and not retry_blocked
    deciding = any(r["can_decide"] for r in retries)
    # What an approved retry would do, shown before it is requested and before approval.
    preview = services.retry_preview(run) if can_request_retry or deciding else []
    duplicates = sum(1 for p in preview if p["outcome"] == RetryOutcome.POSSIBLE_DUPLICATE)
    back_href, back_label = _back_link(request, tenant, run)
    step = _next_step(
        detail, open_retry, reconcile_rows=reconcile_rows, owner=owner,
        may_decide=(open_retry is not None and context["can_approve"]
                    and user.pk != open_retry.requested_by_id),
        may_withdraw=any(r["can_withdraw"] for r in retries), tenant=tenant.slug)
    # The header's reason says what the next step says an approved retry waits for.
    state_reason = nextstep.state_reason(run.recovery_state, run.recovery_reason, run.kind,
                                         run.schema_version)
    context.update(
        run=run,
        state_reason=state_reason,
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
        thread_id=selectors.run_thread_id(user=user, tenant=tenant, run=run,
                                          checkpoints=detail.checkpoints),
        next_step=step.text,
        next_step_short=step.short,
        can_request_retry=can_request_retry,
        retry_blocked=retry_blocked if context["can_review"] else "",
        can_reconcile=can_reconcile,
        reconcile_again=any(r["waits_for_human"] for r in reconcile_rows),
        reconcile_blocked=reconcile_blocked,
        reconcile_refused=False,
        can_acknowledge=context["can_review"] and open_conflicts > 0,
        can_close=context["can_review"] and not closed,
        # "End the lease" (``services.lease_revoke``): a reviewer, while the lease is live
        # (``lease_live``: on the database clock, read with the run).
        can_revoke_lease=context["can_review"] and bool(getattr(run, "lease_live", False)),
        lease_revoke_error="",
        lease_revoke_reason="",
        has_open_retry=open_retry is not None,
        has_open_reconcile=any(r["req"].state in ReconcileState.OPEN for r in reconcile_rows),
        show_preview=can_request_retry or deciding,
        preview=preview,
        preview_duplicates=duplicates,
        back_href=back_href,
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
        legal_holds=selectors.run_legal_holds(user=user, tenant=tenant, run=run),
    )
    if run.payloads_deleted_at is not None:
        # Retention or erasure deleted its payloads (docs/security/retention.md): the page
        # says when and why (its tombstone), and offers no reveal and no action; the
        # services refuse writes to it (409 run_deleted).
        context.update(tombstone=selectors.run_tombstone(user=user, tenant=tenant, run=run),
                       can_reveal=False, can_request_retry=False, can_reconcile=False,
                       can_acknowledge=False, can_close=False, show_preview=False,
                       can_revoke_lease=False,
                       next_step=step.text)
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


@require_safe
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


@require_safe
@dashboard
@tenant_page()
def run_detail(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """``/t/<slug>/runs/<run_id>/``: identity, lease, state, checkpoint timeline, effects,
    conflicts, retry requests, audit trail and the actions the viewer's role allows.
    Takes ``back`` only (``RunPageForm``, ``back_target``: the inbox page to return to;
    anything else is a 400 naming it)."""
    form = RunPageForm.from_request(request)
    back_target(form.cleaned_data["back"], reverse("run_list", args=[tenant.slug]))
    try:
        uuid.UUID(run_id)
    except ValueError:
        return _run_by_prefix(request, tenant, run_id)
    return render(request, "checkpoints/run.html", _run_context(request, tenant, run_id))


def _run_by_prefix(request: HttpRequest, tenant: Tenant, prefix: str) -> HttpResponse:
    """The run page's URL with a short id (``/t/<slug>/runs/b2418a1d/``, as the inbox
    shows ids): one run of ``tenant`` starts with it, 302 to its full URL (the query
    string kept; nothing written); several, 200 with a page listing them (at most
    ``selectors.RUN_PREFIX_SHOWN``, then a link to the search); none, or fewer than
    ``selectors.RUN_PREFIX_MIN`` hex digits, 404 in words with a link to the inbox's search
    for it. Not a UUID prefix at all: the usual 404 (``NotFound``). Another tenant's runs
    are never looked at (``selectors.run_prefix_matches``)."""
    digits = selectors.run_prefix_digits(prefix)
    if digits is None:
        return render(request, "checkpoints/error.html",
                      {"status": 404, "message": f"No run has the id “{prefix}”: a run id is "
                                                 "hex digits (a UUID, or its first "
                                                 f"{selectors.RUN_PREFIX_MIN} or more)."},
                      status=404)
    search = (reverse("run_list", args=[tenant.slug]) + "?"
              + urlencode({"state": "all", "q": prefix}))
    if digits < selectors.RUN_PREFIX_MIN:
        message = (f"“{prefix}” is too short to name a run: a short run id needs at least "
                   f"{selectors.RUN_PREFIX_MIN} hex digits (the inbox shows that many).")
        return render(request, "checkpoints/error.html",
                      {"status": 404, "message": message, "link": (search, "Search for it")},
                      status=404)
    runs = selectors.run_prefix_matches(user=request.user, tenant=tenant, prefix=prefix)
    if not runs:
        message = f"No run of {tenant.name} has an id starting with “{prefix}”."
        return render(request, "checkpoints/error.html",
                      {"status": 404, "message": message, "link": (search, "Search for it")},
                      status=404)
    if len(runs) == 1:
        target = reverse("run_detail", args=[tenant.slug, str(runs[0].uuid)])
        query = request.META.get("QUERY_STRING", "")
        return HttpResponseRedirect(f"{target}?{query}" if query else target)
    context = _base_context(request, tenant, "inbox") | {
        "prefix": prefix, "runs": runs[:selectors.RUN_PREFIX_SHOWN],
        "more": len(runs) > selectors.RUN_PREFIX_SHOWN, "search": search}
    return render(request, "checkpoints/run_prefix.html", context)


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


@require_safe
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


@require_safe
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


@require_safe
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
