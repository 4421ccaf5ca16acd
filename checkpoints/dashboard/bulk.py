"""Bulk actions (issue 9, item 3): the inbox's bulk bar posts here (the bar itself is
``inbox._bulk_bar``), and the result page shows each run's outcome."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from .. import roles, selectors, services
from ..exceptions import InvalidPayload
from ..models import Tenant
from .common import _base_context, _require_valid, dashboard, require_GET, require_POST, tenant_page
from .forms import BULK_MATCHING, BulkForm, InboxFilterForm, NoQuery
from .inbox import _run_filters


def _bulk_filters(raw: str) -> selectors.RunFilters:
    """The bulk form's ``filters`` (the inbox's query string) as ``RunFilters``, checked
    by the inbox's own form (``QueryForm.from_string``: unknown, repeated, not UTF-8 or
    invalid): 400 naming ``filters`` and the filter. A ``cursor`` is refused too: the
    action takes every matching run, never one page, so it would be ignored."""
    data = InboxFilterForm.from_string(raw, name="filters").cleaned_data
    if data["cursor"]:
        raise InvalidPayload("filters: cursor: not taken (the action takes every run "
                             "matching the filters, never one page)")
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
    form = BulkForm(request.POST)
    _require_valid(form)
    data = form.cleaned_data
    matching = data["scope"] == BULK_MATCHING
    bulk, created = services.bulk_submit(
        actor=request.user, tenant=tenant, action=data["action"], reason=data["reason"],
        client_token=data["client_token"], run_ids=None if matching else data["run"],
        filters=_bulk_filters(data["filters"]) if matching else None)
    if not created:
        messages.info(request, "This bulk action was already submitted: these are its "
                               "results (nothing was done again).")
    return redirect("bulk_detail", slug=tenant.slug, bulk_id=str(bulk.uuid))


@require_GET
@dashboard
@tenant_page()
def bulk_detail(request: HttpRequest, tenant: Tenant, bulk_id: str) -> HttpResponse:
    """``/t/<slug>/bulk/<uuid>/``: a bulk action's per-run result table (run, action,
    outcome, the refusal's plain words). Reads only; a fixed number of queries whatever
    the number of runs (``selectors.bulk_get``). Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    result = selectors.bulk_get(user=request.user, tenant=tenant, bulk_id=bulk_id)
    context = _base_context(request, tenant, "inbox") | {"b": result.bulk, "result": result}
    return render(request, "checkpoints/bulk.html", context)
