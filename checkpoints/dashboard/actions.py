"""The POST actions on a run (each asks for a reason and calls one service function):
request, approve, reject or withdraw a retry, mark an effect's outcome unknown,
reconcile, close, end a lease, acknowledge conflicts. Each answers the refreshed run page
(``_action_done``); one refused because someone acted first answers it with a sentence
saying so (``refreshes_when_acted_first``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import wraps

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import ngettext
from django_htmx.http import trigger_client_event

from .. import intranges, roles, selectors, services
from ..exceptions import AlreadyDone, DomainError, OwnerLive
from ..models import Tenant
from ..templatetags.dashboard import ago
from .common import (
    AUDIT_CHANGED,
    _reason,
    _require_valid,
    dashboard,
    require_POST,
    see_other,
    tenant_page,
)
from .forms import CloseForm, LeaseRevokeForm, MarkUnknownForm
from .run import _owner_live_words, _run_context
from .typed import posted


def refreshes_when_acted_first(view: Callable) -> Callable:
    """For an action refused because someone acted first (``AlreadyDone``): the run page
    as it is now, with one sentence saying what happened ("Not done: already approved by
    april 2 min ago."), status 422 like any refused move. htmx: the refreshed run body
    (the action's ``#run-body`` target) plus ``audit-changed`` (the audit panel shows the
    other person's event); otherwise the whole page. Nothing was written (the service
    refused inside its transaction). Wear it under ``@tenant_page``."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, tenant: Tenant, **kwargs):
        try:
            return view(request, *args, tenant=tenant, **kwargs)
        except AlreadyDone as exc:
            context = _run_context(request, tenant, exc.run_id, refusal=acted_first_words(exc))
            if request.htmx:
                response = render(request, "checkpoints/run.html#run-body", context,
                                  status=exc.status)
                return trigger_client_event(response, AUDIT_CHANGED)
            return render(request, "checkpoints/run.html", context, status=exc.status)

    return wrapper


def acted_first_words(exc: AlreadyDone,
                      shown: str = "The page below shows the run as it is now.") -> str:
    """The sentence for ``AlreadyDone``: *Not done: already approved by april 2 min ago.*
    (who and when as the refusing service read them; either may be unknown), then
    ``shown``, what the page under it shows (the run page's words by default)."""
    who = f" by {exc.by}" if exc.by else ""
    when = f" {ago(exc.at)}" if exc.at is not None else ""
    return f"Not done: already {exc.what}{who}{when}. {shown}"


def _run_url(tenant: Tenant, run_id) -> str:
    return reverse("run_detail", args=[tenant.slug, str(run_id)])


def _action_done(request: HttpRequest, tenant: Tenant, run_id, notice: str) -> HttpResponse:
    """After a successful action: htmx gets the refreshed run body plus ``audit-changed``;
    a plain form post is redirected back to the run page (post/redirect/get)."""
    if request.htmx:
        context = _run_context(request, tenant, run_id, notice=notice)
        response = render(request, "checkpoints/run.html#run-body", context)
        return trigger_client_event(response, AUDIT_CHANGED)
    messages.success(request, notice)
    return see_other(_run_url(tenant, run_id))


# --------------------------------------------------------------------------------------
# Actions (POST only; each asks for a reason and calls one service function)
# --------------------------------------------------------------------------------------

@require_POST
@dashboard
@tenant_page(roles.REVIEW)
@refreshes_when_acted_first
def run_retry_request(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """Request a retry of the run (reviewer); ``services.retry_request``."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    services.retry_request(actor=request.user, tenant=tenant, run_id=run.uuid,
                           reason=_reason(request))
    return _action_done(request, tenant, run.uuid, "Retry requested; an approver must decide.")


def _retry_act(request: HttpRequest, tenant: Tenant, retry_id: int, act: Callable,
               notice: str) -> HttpResponse:
    """The body of the three actions on a retry request: the request ``retry_id`` of
    ``tenant`` (``NotFound`` elsewhere), ``act`` (``services.retry_approve``,
    ``retry_reject`` or ``retry_withdraw``) called on it with the POSTed reason
    (``ReasonRequired`` without one), then ``_action_done`` on its run saying ``notice``
    (``{pk}`` in it: the request's number)."""
    retry = selectors.retry_get(user=request.user, tenant=tenant, retry_id=retry_id)
    act(actor=request.user, tenant=tenant, retry_id=retry.pk, reason=_reason(request))
    return _action_done(request, tenant, retry.run.uuid, notice.format(pk=retry.pk))


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
@refreshes_when_acted_first
def retry_approve(request: HttpRequest, tenant: Tenant, retry_id: int) -> HttpResponse:
    """Approve someone else's retry request (approver); ``services.retry_approve``."""
    return _retry_act(request, tenant, retry_id, services.retry_approve,
                      "Retry request approved; the runtime's next resume call will retry.")


@require_POST
@dashboard
@tenant_page(roles.APPROVE)
@refreshes_when_acted_first
def retry_reject(request: HttpRequest, tenant: Tenant, retry_id: int) -> HttpResponse:
    """Reject someone else's retry request (approver); ``services.retry_reject``."""
    return _retry_act(request, tenant, retry_id, services.retry_reject,
                      "Retry request rejected.")


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
@refreshes_when_acted_first
def retry_withdraw(request: HttpRequest, tenant: Tenant, retry_id: int) -> HttpResponse:
    """Withdraw your own retry request while no approver has decided it (reviewer);
    ``services.retry_withdraw``. The run leaves "awaiting approval"."""
    return _retry_act(request, tenant, retry_id, services.retry_withdraw,
                      "Retry request #{pk} withdrawn; no approver will see it.")


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
@refreshes_when_acted_first
def effect_mark_unknown(request: HttpRequest, tenant: Tenant, effect_id: str) -> HttpResponse:
    """Declare a submitted/unresolved effect's outcome unknown (reviewer; a reason and a
    ticked confirmation, ``MarkUnknownForm``: 400 naming ``confirm`` without it)."""
    effect = selectors.effect_get(user=request.user, tenant=tenant, effect_id=effect_id)
    form = MarkUnknownForm(request.POST)
    _require_valid(form)
    services.effect_mark_unknown(actor=request.user, tenant=tenant, effect_id=effect.uuid,
                                 reason=form.cleaned_data["reason"])
    return _action_done(request, tenant, effect.run.uuid,
                        f"Effect {effect.operation_key} marked outcome unknown.")


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
def run_reconcile(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """Reconcile the run's in-doubt effects (reviewer): stored requests, one per effect.
    In the embedded default they have run when the page is rendered; with a broker a
    worker may still be asking the services; with the broker down they wait, stored, and
    the notice says so. A live owner is refused (409 ``owner_live``) with its expiry."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    try:
        queued = services.run_reconcile(actor=request.user, tenant=tenant, run_id=run.uuid,
                                        reason=_reason(request))
    except OwnerLive as exc:
        return _owner_live_refusal(request, tenant, run, exc)
    return _action_done(request, tenant, run.uuid, reconcile_notice(queued))


def reconcile_notice(queued) -> str:
    """The run page's notice after a reconcile, from ``services.run_reconcile``'s answer:
    chosen by where the requests went (``dispatch``, the API answer's field of the same
    name), so the page and the API say the same: ran in this process (the section below
    shows the answers), handed to a worker (reload to see them), or waiting for the
    worker (the service's ``detail``)."""
    n = len(queued.requests)
    what = f"Reconciliation of {n} effect{'s' if n != 1 else ''} requested " \
           f"(task {queued.task_id[:8]})"
    where = services.reconcile_requests
    if not queued.dispatched or queued.dispatch == where.WAITING:
        return f"{what}: {queued.detail}."
    if queued.dispatch == where.IN_PROCESS:
        return (f"{what} and run in this process; the section below shows what the services "
                f"answered.")
    return (f"{what}; a worker is asking the services, so reload in a moment to see their "
            f"answers.")


def _owner_live_refusal(request: HttpRequest, tenant: Tenant, run, exc: OwnerLive):
    """Reconcile refused because the run's owner is alive: not an error page but the run
    page (htmx: its body) with the reason where the Reconcile button was, 409. Nothing
    was written (the service refused inside its transaction)."""
    until = exc.extra.get("lease_expires_at")
    try:
        until = datetime.fromisoformat(until) if until else None
    except ValueError:
        until = None
    words = _owner_live_words({"owner": run.lease_owner, "until": until})
    context = _run_context(request, tenant, run.uuid, reconcile_blocked=words,
                           reconcile_refused=True)
    template = "checkpoints/run.html" + ("#run-body" if request.htmx else "")
    return render(request, template, context, status=exc.status)


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
@refreshes_when_acted_first
def run_close(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """Close a run that was handled outside the system (reviewer; a reason and a ticked
    confirmation); ``services.run_close``. It leaves the inbox for the ``closed`` tab until
    the runtime's next write reopens it."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    form = CloseForm(request.POST)
    _require_valid(form)
    services.run_close(actor=request.user, tenant=tenant, run_id=run.uuid,
                       reason=form.cleaned_data["reason"])
    return _action_done(request, tenant, run.uuid,
                        "Run closed. A new write by the runtime reopens it.")


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
def run_lease_revoke(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """End the run's live lease because the reviewer knows its owner is gone (reviewer; a
    reason, a ticked confirmation and the owner and token the page showed,
    ``LeaseRevokeForm``);
    ``services.lease_revoke``. Its writes are refused from now on and reconcile is no
    longer refused for the lease.

    A refusal re-shows the run page as it is now (htmx: its body) with the service's
    words beside the form (``lease_revoke_error``; the typed reason kept), at the
    refusal's status: 400 for the form's fields, 409 ``no_live_lease`` (the lease ended
    or expired meanwhile: the page then shows no form) or ``lease_held`` (another owner
    took it since: the form shows the new owner). Other refusals (403, 404) are
    ``@dashboard``'s."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    form = LeaseRevokeForm(request.POST)
    try:
        # The lease the page showed, by its token (the same owner may have taken it again
        # since: the second attack's stale form fenced a live runtime), read as the API's
        # integer: ASCII digits in FENCING_TOKEN's range, once, in its words (the third
        # attack: "1.0", a full-width 1 and a repeated field passed Django's IntegerField).
        # The owner and the reason once too (the stop-38 attack: a repeated owner, the
        # last one winning, ended the lease of the owner the page did not show).
        token = posted(request.POST, ("fencing_token", "owner", "reason", "confirm")
                       ).get("fencing_token", "")
        expected_token = intranges.FENCING_TOKEN.parse(token, "fencing_token") \
            if token != "" else None
        _require_valid(form)
        ended = services.lease_revoke(actor=request.user, tenant=tenant, run_id=run.uuid,
                                      reason=form.cleaned_data["reason"],
                                      expected_owner=form.cleaned_data["owner"],
                                      expected_token=expected_token)
    except DomainError as exc:
        if exc.status not in (400, 409):
            raise
        context = _run_context(request, tenant, run.uuid, lease_revoke_error=exc.detail or exc.error,
                               lease_revoke_reason=request.POST.get("reason", "")[:4000])
        template = "checkpoints/run.html" + ("#run-body" if request.htmx else "")
        return render(request, template, context, status=exc.status)
    return _action_done(request, tenant, run.uuid,
                        f"Lease of {ended.lease_owner} ended: its writes are refused from now on "
                        f"(fencing token {ended.fencing_token}). Reconcile the run next.")


@require_POST
@dashboard
@tenant_page(roles.REVIEW)
@refreshes_when_acted_first
def conflicts_acknowledge(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """Acknowledge every open conflict of the run (reviewer)."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    # only_open: pressed on a page that showed open conflicts; none left means someone
    # acknowledged them first (AlreadyDone), not "0 acknowledged".
    n = services.conflicts_acknowledge(actor=request.user, tenant=tenant, run_id=run.uuid,
                                       reason=_reason(request), only_open=True)
    return _action_done(request, tenant, run.uuid, ngettext("%d conflict acknowledged.", "%d conflicts acknowledged.", n) % n)
