"""The approver's queue (issue 21, item 9): ``/t/<slug>/approvals/``, one row per open
retry request with what an approved retry would do folded in (the run page's preview,
``selectors.retry_previews``), possible duplicates highlighted; approve or reject each
with a reason, or approve at once every ticked request without a possible duplicate.
Each decision goes through ``services.retry_approve``/``retry_reject`` (four eyes, the
audit event, the run's state, all there); after each, the queue shows the next request.

Plain forms (post/redirect/get): they work without JavaScript, and the answer is the
queue again with what was done and a link to the next request (``#retry-<pk>``).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from .. import roles, selectors, services
from ..exceptions import AlreadyDone, DomainError, PossibleDuplicate
from ..models import Tenant
from .actions import acted_first_words
from .common import (
    _base_context,
    _require_valid,
    dashboard,
    require_POST,
    require_safe,
    see_other,
    tenant_page,
)
from .forms import BulkApproveForm, DecideForm, NoQuery


@require_safe
@dashboard
@tenant_page(roles.APPROVE)
def approval_queue(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/approvals/``: the open retry requests, oldest first, each with its
    preview (``selectors.approval_queue``: fixed queries whatever their number). The
    reader's own requests are shown as not theirs to decide. Approvers and admins only
    (403 for other roles of the tenant, 404 without one). Takes no parameter."""
    NoQuery.from_request(request)
    return _queue_page(request, tenant)


def _queue_page(request: HttpRequest, tenant: Tenant, *, refusal: str = "",
                status: int = 200) -> HttpResponse:
    """The queue as it is now; ``refusal``: one sentence above it saying why the
    decision just posted was not made (someone decided first)."""
    queue = selectors.approval_queue(user=request.user, tenant=tenant)
    context = _base_context(request, tenant, "approvals") | {
        "queue": queue, "refusal": refusal,
        "decidable": [row for row in queue.rows if not row.own],
        "clean": [row for row in queue.rows if not row.own and not row.duplicates],
    }
    return render(request, "checkpoints/approvals.html", context, status=status)


def _next_url(tenant: Tenant, user, after: int | None = None) -> tuple[str, str]:
    """The queue's URL pointing at the next open request the user may decide (the oldest
    other than ``after``), and words naming it; no such request: the queue, and ""."""
    queue = selectors.approval_queue(user=user, tenant=tenant)
    url = reverse("approval_queue", args=[tenant.slug])
    for row in queue.rows:
        if not row.own and row.retry.pk != after:
            return f"{url}#retry-{row.retry.pk}", f"Next request: #{row.retry.pk}."
    return url, "No other request awaits your decision."


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
def approval_decide(request: HttpRequest, tenant: Tenant, retry_id: int) -> HttpResponse:
    """``POST /t/<slug>/approvals/<retry_id>/``: approve or reject one request
    (``DecideForm``: ``decision`` and a reason, 400 naming the field) through
    ``services.retry_approve``/``retry_reject``, then the queue at the next request.
    The service's refusals are its error page (your own request: 403), except a request
    decided meanwhile (``AlreadyDone``, 422): the queue as it is now, with the run page's
    sentence for it ("Not done: already approved by april 2 min ago", ``actions.
    acted_first_words``) instead of the raw refusal and its ISO time. Nothing written."""
    form = DecideForm(request.POST)
    _require_valid(form)
    retry = selectors.retry_get(user=request.user, tenant=tenant, retry_id=retry_id)
    data = form.cleaned_data
    act = services.retry_approve if data["decision"] == "approve" else services.retry_reject
    try:
        act(actor=request.user, tenant=tenant, retry_id=retry.pk, reason=data["reason"])
    except AlreadyDone as exc:
        return _queue_page(request, tenant, refusal=acted_first_words(
            exc, "The queue below is as it is now."), status=exc.status)
    url, next_words = _next_url(tenant, request.user, after=retry.pk)
    done = "approved" if data["decision"] == "approve" else "rejected"
    messages.success(request, f"Retry request #{retry.pk} {done}. {next_words}")
    return see_other(url)


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
def approval_bulk(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/approvals/approve/``: approve each ticked request
    (``BulkApproveForm``: ``retry`` numbers, one reason) through
    ``services.retry_approve(refuse_duplicate=True)``, each in its own transaction with
    its own audit event. A request whose retry would send again an effect that may have
    happened is skipped and named (a possible duplicate is approved one at a time, on
    its row), as are your own requests and those decided meanwhile (the service's words);
    the others are approved. Then the queue, saying which were approved and skipped."""
    form = BulkApproveForm(request.POST)
    _require_valid(form)
    approved, skipped = [], []
    for pk in form.cleaned_data["retry"]:
        try:
            services.retry_approve(actor=request.user, tenant=tenant, retry_id=pk,
                                   reason=form.cleaned_data["reason"], refuse_duplicate=True)
        except PossibleDuplicate:
            skipped.append(f"#{pk} (possible duplicate: approve it on its own row)")
        except DomainError as exc:
            why = "not found" if exc.status == 404 else (exc.detail or exc.error)
            skipped.append(f"#{pk} ({why})")
        else:
            approved.append(f"#{pk}")
    if approved:
        messages.success(request, f"Approved {len(approved)} request"
                                  f"{'s' if len(approved) != 1 else ''}: {', '.join(approved)}.")
    if skipped:
        messages.warning(request, f"Skipped {len(skipped)}: {'; '.join(skipped)}.")
    url, next_words = _next_url(tenant, request.user)
    if next_words.startswith("Next"):
        messages.info(request, next_words)
    return see_other(url)
