"""Erasure requests and legal holds on the dashboard (issue 20, items 2 and 4): the run
page's forms (a reviewer or admin files an erasure request for the run, an admin places a
legal hold on it), the approval queue of erasure requests (an approver who did not file a
request approves it, which erases at once, or rejects it) and the list of legal holds (an
admin places one on runs, a subject or the whole tenant, or releases one). Each action is one service call; what the page hides the API hides
(``services.erasure``, ``services.holds``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import ngettext

from .. import roles, selectors, services
from ..exceptions import DomainError, InvalidPayload
from ..models import Tenant
from ..templatetags.dashboard import erasure_counts_words
from ..vocab import ErasureOutcome, HoldScope
from .common import (
    _base_context,
    _reason,
    dashboard,
    form_refusal,
    require_POST,
    require_safe,
    see_other,
    tenant_page,
)
from .forms import NoQuery
from .typed import LINE_BREAK, posted, textarea_value


@require_safe
@dashboard
@tenant_page()
def erasure_requests(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/erasure-requests/``: the approval queue (requests waiting for a
    decision first) and the decided ones with their counts. Any role reads it; an approver
    sees Approve / Reject on the requests someone else filed. Takes no parameter."""
    NoQuery.from_request(request)
    rows = selectors.erasure_request_list(user=request.user, tenant=tenant)
    for row in rows:  # the approver sees what approving would erase and what would block
        row.preview = services.erasure_preview(user=request.user, tenant=tenant, request=row)
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
    return see_other("run_detail", slug=tenant.slug, run_id=str(run.uuid))


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
def erasure_approve(request: HttpRequest, tenant: Tenant, request_id: str) -> HttpResponse:
    """Approve someone else's erasure request (approver): it is executed at once."""
    row = selectors.erasure_request_get(user=request.user, tenant=tenant,
                                        request_id=request_id)
    done = services.erasure_approve(actor=request.user, tenant=tenant, request_id=row.uuid,
                                    reason=request.POST.get("reason", ""))
    words = erasure_counts_words(done.counts)
    if done.outcome == ErasureOutcome.NOTHING_ERASED:  # "executed" alone read as done
        messages.warning(request, f"Erasure approved, but {words}.")
    else:
        messages.success(request, f"Erasure approved and executed: {words}.")
    return see_other("erasure_requests", slug=tenant.slug)


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
    return see_other("erasure_requests", slug=tenant.slug)


#: Where the place-a-hold form shows a refusal of ``services.legal_hold_place``: the
#: field its message names (``runs``, ``subject.field``, ``subject.value``, ``tenant``,
#: ``reason``) -> the form's field (``common.form_refusal``).
HOLD_FORM_FIELDS = {"runs": "runs", "subject": "subject_field",
                    "subject.field": "subject_field", "subject.value": "subject_value",
                    "tenant": "scope", "reason": "reason", "scope": "scope",
                    "subject_field": "subject_field", "subject_value": "subject_value"}


def _holds_page(request: HttpRequest, tenant: Tenant, *, form: dict | None = None,
                error: tuple[str, str] | None = None, status: int = 200) -> HttpResponse:
    """The legal holds page; for the tenant's admin the place-a-hold form, showing
    ``form`` (what was typed, after a refusal) with ``error`` (``(field, message)``)
    beside its field, and the subject fields the data policy declares."""
    context = _base_context(request, tenant, "inbox") | {
        "holds": selectors.legal_hold_list(user=request.user, tenant=tenant),
        "form": form or {"scope": HoldScope.RUNS}, "error": error, "subject_names": []}
    if context["can_manage"]:
        policy = selectors.data_policy_get(user=request.user, tenant=tenant)
        context["subject_names"] = sorted(policy.subject_fields or {})
    return render(request, "checkpoints/legal_holds.html", context, status=status)


_BREAKS = frozenset("\r\n")


def _hold_scope(post: dict) -> dict:
    """The place-a-hold form's scope as ``services.legal_hold_place``'s arguments, the
    API's body: ``tenant`` -> ``whole_tenant=True``; ``subject`` -> ``subject={"field",
    "value"}``; ``runs`` -> ``runs``, the ids one a line (blank lines dropped, each as
    typed: the service judges them); a subject value beginning or ending with a line
    break is refused (``InvalidPayload`` naming ``subject.value``). Another scope gives none of
    the three, which the
    service refuses naming ``runs`` ("give exactly one of …"). ``post``: the form's
    fields, one value each (``typed.posted``)."""
    scope = post.get("scope", "")
    if scope == HoldScope.TENANT:
        return {"whole_tenant": True}
    if scope == HoldScope.SUBJECT:
        value = textarea_value(post.get("subject_value", ""))
        if value[:1] in _BREAKS or value[-1:] in _BREAKS:
            # A trailing Enter held "c-42\n", a subject no payload holds, and said nothing
            # (the stop-37 attack). Refused, not stripped: a value that really begins or
            # ends with a line break goes, exact, through the API.
            raise InvalidPayload(
                "subject.value: a line break before or after the value is not taken here "
                "(an Enter typed after it?); a value that really holds one: POST "
                "…/legal-holds")
        return {"subject": {"field": post.get("subject_field", ""), "value": value}}
    if scope == HoldScope.RUNS:
        # Blank lines dropped; every other line as typed, so the service judges it as the
        # API would (a stripped control character or Unicode space would pass; stop 35).
        return {"runs": [v for v in LINE_BREAK.split(post.get("runs", "")) if v.strip()]}
    return {}


@require_safe
@dashboard
@tenant_page()
def legal_holds(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/legal-holds/``: the tenant's legal holds, active first, with what each
    covers and why; an admin sees Release and the form that places a hold. Takes no
    parameter."""
    NoQuery.from_request(request)
    return _holds_page(request, tenant)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def legal_hold_place(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/legal-holds/place/`` (the legal holds page's form; the tenant's
    admin, as ``POST …/legal-holds``): ``scope`` (``runs``, ``subject`` or ``tenant``)
    with ``runs`` (ids, one a line) or ``subject_field`` and ``subject_value``, and
    ``reason``; ``services.legal_hold_place`` judges and writes the hold and its audit
    event. 303 back to the page. A refusal renders the page again (400) with the
    service's words beside the field they name and what was typed, but the subject
    value: the service keeps only its digest, and the page does not echo it either."""
    try:
        post = posted(request.POST, ("scope", "runs", "subject_field", "subject_value",
                                     "reason"))
        hold = services.legal_hold_place(actor=request.user, tenant=tenant,
                                         reason=post.get("reason", ""), **_hold_scope(post))
    except DomainError as exc:
        error = form_refusal(exc, request, HOLD_FORM_FIELDS)
        if error is None:
            raise
        typed = {name: request.POST.get(name, "")
                 for name in ("scope", "runs", "subject_field", "reason")}
        return _holds_page(request, tenant, form=typed, error=error, status=exc.status)
    covers = {HoldScope.TENANT: "every run of the tenant",
              HoldScope.SUBJECT: f"every run of this {hold.subject_field}"}.get(
        hold.scope, ngettext("%d run", "%d runs", len(hold.run_uuids)) % len(hold.run_uuids))
    messages.success(request, f"Legal hold placed on {covers} (audited): neither retention "
                              "nor erasure touches it until it is released.")
    return see_other("legal_holds", slug=tenant.slug)


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
    return see_other("run_detail", slug=tenant.slug, run_id=str(run.uuid))


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def legal_hold_release(request: HttpRequest, tenant: Tenant, hold_id: str) -> HttpResponse:
    """Release a legal hold (the tenant's admin, a reason required); the row is kept."""
    hold = selectors.legal_hold_get(user=request.user, tenant=tenant, hold_id=hold_id)
    services.legal_hold_release(actor=request.user, tenant=tenant, hold_id=hold.uuid,
                                reason=_reason(request))
    messages.success(request, "Legal hold released.")
    return see_other("legal_holds", slug=tenant.slug)
