"""Erasure requests and legal holds on the dashboard (issue 20, items 2 and 4): the run
page's forms (a reviewer or admin files an erasure request for the run, an admin places a
legal hold on it), the approval queue of erasure requests (an approver who did not file a
request approves it, which erases at once, or rejects it) and the list of legal holds (an
admin releases one). Each action is one service call; what the page hides the API hides
(``services.erasure``, ``services.holds``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import ngettext

from .. import roles, selectors, services
from ..models import Tenant
from .common import _base_context, _reason, dashboard, require_GET, require_POST, tenant_page
from .forms import NoQuery


def _counts_words(counts: dict) -> str:
    """``"2 runs erased; 1 not erased (1 under legal hold)"`` for a notice."""
    erased = counts.get("erased", 0)
    words = ngettext("%d run erased", "%d runs erased", erased) % erased
    stopped = [f"{counts[k]} {label}" for k, label in (
        ("legal_hold", "under legal hold"), ("not_ended", "not ended"),
        ("effect_in_doubt", "with an effect in doubt"), ("already_deleted", "already deleted"))
        if counts.get(k)]
    if counts.get("blocked"):
        words += f"; {counts['blocked']} not erased ({', '.join(stopped)}): a new request " \
                 "is needed once that changes"
    return words


@require_GET
@dashboard
@tenant_page()
def erasure_requests(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/erasure-requests/``: the approval queue (requests waiting for a
    decision first) and the decided ones with their counts. Any role reads it; an approver
    sees Approve / Reject on the requests someone else filed. Takes no parameter."""
    NoQuery.from_request(request)
    rows = selectors.erasure_request_list(user=request.user, tenant=tenant)
    context = _base_context(request, tenant, "inbox") | {"requests": rows}
    return render(request, "checkpoints/erasure_requests.html", context)


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
def erasure_request_file(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """File an erasure request for the run (reviewer or admin); an approver decides."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    services.erasure_request(actor=request.user, tenant=tenant, runs=[run.uuid],
                             reason=_reason(request))
    messages.success(request, "Erasure requested; an approver (not you) must decide it.")
    return redirect("run_detail", slug=tenant.slug, run_id=str(run.uuid))


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
def erasure_approve(request: HttpRequest, tenant: Tenant, request_id: str) -> HttpResponse:
    """Approve someone else's erasure request (approver): it is executed at once."""
    row = selectors.erasure_request_get(user=request.user, tenant=tenant,
                                        request_id=request_id)
    done = services.erasure_approve(actor=request.user, tenant=tenant, request_id=row.uuid,
                                    reason=request.POST.get("reason", ""))
    messages.success(request, f"Erasure approved and executed: {_counts_words(done.counts)}.")
    return redirect("erasure_requests", slug=tenant.slug)


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
def erasure_reject(request: HttpRequest, tenant: Tenant, request_id: str) -> HttpResponse:
    """Reject someone else's erasure request (approver, a reason required)."""
    row = selectors.erasure_request_get(user=request.user, tenant=tenant,
                                        request_id=request_id)
    services.erasure_reject(actor=request.user, tenant=tenant, request_id=row.uuid,
                            reason=_reason(request))
    messages.success(request, "Erasure request rejected; nothing was erased.")
    return redirect("erasure_requests", slug=tenant.slug)


@require_GET
@dashboard
@tenant_page()
def legal_holds(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/legal-holds/``: the tenant's legal holds, active first, with what each
    covers and why; an admin sees Release. Takes no parameter."""
    NoQuery.from_request(request)
    rows = selectors.legal_hold_list(user=request.user, tenant=tenant)
    context = _base_context(request, tenant, "inbox") | {"holds": rows}
    return render(request, "checkpoints/legal_holds.html", context)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def legal_hold_place_run(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """Place a legal hold on the run (the tenant's admin, a reason required)."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    services.legal_hold_place(actor=request.user, tenant=tenant, runs=[run.uuid],
                              reason=_reason(request))
    messages.success(request, "Legal hold placed: neither retention nor erasure touches "
                              "this run until it is released.")
    return redirect("run_detail", slug=tenant.slug, run_id=str(run.uuid))


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def legal_hold_release(request: HttpRequest, tenant: Tenant, hold_id: str) -> HttpResponse:
    """Release a legal hold (the tenant's admin, a reason required); the row is kept."""
    hold = selectors.legal_hold_get(user=request.user, tenant=tenant, hold_id=hold_id)
    services.legal_hold_release(actor=request.user, tenant=tenant, hold_id=hold.uuid,
                                reason=_reason(request))
    messages.success(request, "Legal hold released.")
    return redirect("legal_holds", slug=tenant.slug)
