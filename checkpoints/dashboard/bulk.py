"""Bulk actions (issue 9, item 3): the inbox's bulk bar posts here (the bar itself is
``inbox._bulk_bar``), the result page shows each run's outcome, and the list finds
them again."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render

from .. import roles, selectors, services
from ..exceptions import AlreadyDone, InvalidPayload
from ..models import Tenant
from ..templatetags.dashboard import ago
from ..vocab import (
    BulkActionKind,
    BulkOutcome,
    BulkState,
    EffectState,
    ReconcileAnswer,
    ReconcileState,
)
from .common import (
    _base_context,
    _require_valid,
    dashboard,
    require_POST,
    require_safe,
    see_other,
    tenant_page,
)
from .forms import (
    BULK_MATCHING,
    BulkForm,
    BulkListForm,
    InboxFilterForm,
    NoQuery,
    ReasonForm,
)
from .inbox import _run_filters
from .typed import posted


def _bulk_filters(raw: str) -> selectors.RunFilters:
    """The bulk form's ``filters`` (the inbox's query string) as ``RunFilters``, checked
    by the inbox's own form (``QueryForm.from_string``: unknown, repeated, not UTF-8 or
    invalid): 400 naming ``filters`` and the filter. A ``cursor`` is refused too: the
    action takes every matching run, never one page, so it would be ignored; and so is
    an empty ``q=`` (``services.bulk_search``: not "every run"; the inbox never sends
    one, it leaves an empty search out)."""
    data = InboxFilterForm.from_string(raw, name="filters").cleaned_data
    if data["cursor"]:
        raise InvalidPayload("filters: cursor: not taken (the action takes every run "
                             "matching the filters, never one page)")
    given = QueryDict(raw)
    if "q" in given:  # an empty search is refused, not "every run" (the API alike)
        try:
            services.bulk_search(given["q"])
        except InvalidPayload as exc:
            raise InvalidPayload(f"filters: {exc.detail}") from None
    return _run_filters(data, data["state"])


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
def bulk_submit(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/bulk/``: one review action on the ticked runs or on every run the
    inbox's filters match (``BulkForm``; at most ``BULK_MAX_RUNS``), through
    ``services.bulk_submit``; then the result page (post/redirect/get). The same form
    submitted twice (same ``client_token``) acts once and shows the first's results.
    Bad input is a 400 naming the field, with nothing written."""
    # Each of the form's single fields once (the ticked runs are many): a repeated owner,
    # the last one winning, ended another owner's leases (the stop-38 attack).
    posted(request.POST, BulkForm.SINGLE)
    form = BulkForm(request.POST)
    _require_valid(form)
    data = form.cleaned_data
    matching = data["scope"] == BULK_MATCHING
    bulk, created = services.bulk_submit(
        actor=request.user, tenant=tenant, action=data["action"], reason=data["reason"],
        client_token=data["client_token"], run_ids=None if matching else data["run"],
        filters=_bulk_filters(data["filters"]) if matching else None,
        lease_owner=data["lease_owner"])
    if not created:
        messages.info(request, "This bulk action was already submitted: these are its "
                               "results (nothing was done again).")
    return see_other("bulk_detail", slug=tenant.slug, bulk_id=str(bulk.uuid))


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
def bulk_abort(request: HttpRequest, tenant: Tenant, bulk_id: str) -> HttpResponse:
    """``POST /t/<slug>/bulk/<uuid>/abort/``: stop a bulk action running as a stored job
    (reviewer; a reason: ``ReasonForm``), through ``services.bulk_abort`` (audited
    ``bulk.abort``); the runs done stay done. Then the result page (post/redirect/get);
    htmx gets the page's live part. Already ended: the page says by whom and when (422);
    an inline one: 422 in words. Bad input is a 400 naming the field, nothing written."""
    form = ReasonForm(request.POST)
    _require_valid(form)
    notice = "Aborted: the worker stops before its next run; the runs done stay done."
    status = 200
    try:
        services.bulk_abort(actor=request.user, tenant=tenant, bulk_id=bulk_id,
                            reason=form.cleaned_data["reason"])
    except AlreadyDone as exc:
        who = f" by {exc.by}" if exc.by else ""
        when = f" {ago(exc.at)}" if exc.at is not None else ""
        notice, status = f"Not done: already {exc.what}{who}{when}.", exc.status
    if not request.htmx:
        (messages.success if status == 200 else messages.warning)(request, notice)
        return see_other("bulk_detail", slug=tenant.slug, bulk_id=str(bulk_id))
    context = _detail_context(request, tenant, bulk_id) | {"notice": notice}
    return render(request, "checkpoints/bulk.html#bulk-live", context, status=status)


@require_safe
@dashboard
@tenant_page()
def bulk_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/bulk-actions/``: the tenant's bulk actions, newest first, each linking
    to its result page (a newcomer's finding: one submitted from a script, or from a tab
    since closed, could be found again by its id only). The rows and filters of
    ``GET …/bulk-actions`` (``selectors.bulk_list``, one query; ``BulkListForm``: a bad
    filter is 400 naming it), paged backwards with ``cursor``. Reads only; any role."""
    data = BulkListForm.from_request(request).cleaned_data
    page_size = selectors.BULK_LIST_PAGE
    rows = selectors.bulk_list(user=request.user, tenant=tenant, action=data["action"] or None,
                               state=data["state"] or None,
                               requested_by=data["requested_by"] or None,
                               before=data["cursor"], limit=page_size + 1)
    older = rows[page_size - 1].pk if len(rows) > page_size else None
    query = {k: data[k] for k in ("action", "state", "requested_by") if data[k]}
    context = _base_context(request, tenant, "inbox") | {
        "bulks": rows[:page_size], "older": older, "filter_query": query, "filters": data,
        "paged": data["cursor"] is not None, "actions": BulkActionKind.choices,
        "states": BulkState.values}
    return render(request, "checkpoints/bulk_list.html", context)  # Vary (``dashboard``)


#: How often a bulk result page with runs still under way asks again, seconds.
BULK_POLL_S = 3

#: A reconciled run's outcome in words (``selectors.RunOutcome.word``; issue 21, item
#: 8: "requested" until the look-up answers, never "done").
RECONCILE_WORDS = {
    ReconcileState.QUEUED: "requested",
    ReconcileState.RUNNING: "requested · asking the service now",
    EffectState.CONFIRMED: "confirmed",
    EffectState.NOT_EXECUTED: "not executed",
    EffectState.FAILED: "the service refused it",
    EffectState.UNKNOWN: "unknown",
    ReconcileAnswer.MOVED_ON: "settled meanwhile",
    ReconcileState.GAVE_UP: "gave up · waits for a human",
    ReconcileState.CANCELLED: "cancelled",
}


def _outcome_words(item, outcome: selectors.RunOutcome) -> str:
    """One run's outcome for people: a reconcile's as ``RECONCILE_WORDS`` (several
    effects: each distinct one, joined), else the bulk's own (done, refused, failed)."""
    if item.outcome == BulkOutcome.DONE and item.reconcile_requests is not None:
        found = outcome.words or (outcome.word,)
        return " + ".join(RECONCILE_WORDS.get(w, w.replace("_", " ")) for w in found)
    return item.outcome


#: What became of a bulk reconcile's look-up, by its settled word (``RunOutcome.words``);
#: an effect state (the look-up's answer) is ``LOOKUP_ANSWERED``.
LOOKUP_ENDS = {
    ReconcileState.GAVE_UP: "its look-up gave up: a person decides",
    ReconcileState.CANCELLED: "its look-up was cancelled",
    ReconcileAnswer.MOVED_ON: "the run settled before its look-up answered",
}
LOOKUP_ANSWERED = "then its look-up answered (see Outcome)"


def _what_happened(item, outcome: selectors.RunOutcome) -> str:
    """A result row's "What happened": the bulk's own words for the run (``detail``),
    and for a reconcile what became of the look-up it requested (``LOOKUP_ENDS``), so
    the row never reads "requested" beside an outcome the look-up already settled (a
    newcomer's finding), nor "answered" beside one it gave up on (the attack's)."""
    if item.outcome != BulkOutcome.DONE or item.reconcile_requests is None:
        return item.detail
    if outcome.pending:
        return f"{item.detail}; its look-up has not answered yet"
    ends = dict.fromkeys(LOOKUP_ENDS.get(w, LOOKUP_ANSWERED)
                         for w in (outcome.words or (outcome.word,)))
    return f"{item.detail}; " + "; ".join(ends)


@require_safe
@dashboard
@tenant_page()
def bulk_detail(request: HttpRequest, tenant: Tenant, bulk_id: str) -> HttpResponse:
    """``/t/<slug>/bulk/<uuid>/``: a bulk action's per-run result table (run, action,
    outcome, the refusal's plain words). Reads only; a fixed number of queries whatever
    the number of runs (``selectors.bulk_get``, ``selectors.bulk_outcomes``). Takes no
    parameter (``NoQuery``).

    Issue 21, item 8: a reconcile's runs are followed to their stored requests, so each
    says "requested" (queued, running) until its look-up settles it, then what it found
    (confirmed, not executed, unknown ...). While a run is still under way (or the bulk
    itself still runs) the table polls this URL every ``BULK_POLL_S`` seconds; htmx gets
    the table's fragment only (``bulk.html#bulk-live``)."""
    NoQuery.from_request(request)
    context = _detail_context(request, tenant, bulk_id)
    template = "checkpoints/bulk.html" + ("#bulk-live" if request.htmx else "")
    return render(request, template, context)  # Vary: HX-Request (``dashboard``)


def _detail_context(request: HttpRequest, tenant: Tenant, bulk_id: str) -> dict:
    """The result page's context (``bulk_detail``, and ``bulk_abort``'s htmx answer)."""
    result = selectors.bulk_get(user=request.user, tenant=tenant, bulk_id=bulk_id)
    outcomes = selectors.bulk_outcomes(user=request.user, tenant=tenant, items=result.items)
    rows = [{"i": i, "o": outcomes[i.pk], "words": _outcome_words(i, outcomes[i.pk]),
             "what": _what_happened(i, outcomes[i.pk])}
            for i in result.items]
    b = result.bulk
    if b.background:
        # A stored job: the row's counts (every result, listed or not).
        tally = {(o, o): n for o, n in ((BulkOutcome.DONE, result.done),
                                        (BulkOutcome.REFUSED, result.refused),
                                        (BulkOutcome.FAILED, result.failed)) if n}
    else:
        tally = {}
        for row in rows:
            key = (row["words"], row["o"].word)
            tally[key] = tally.get(key, 0) + 1
    open_job = b.background and b.state in BulkState.OPEN
    pending = open_job or bool(result.pending and not b.background) \
        or any(row["o"].pending for row in rows)
    return _base_context(request, tenant, "inbox") | {
        "b": b, "result": result, "rows": rows,
        "tally": [{"words": w, "word": c, "n": n} for (w, c), n in sorted(tally.items())],
        "reconcile": b.action == BulkActionKind.RECONCILE,
        "live_pending": pending, "poll_s": BULK_POLL_S,
        "may_abort": open_job,
        "resulted": b.total - result.pending,
        "percent": (100 * (b.total - result.pending) // b.total) if b.total else 100}
