"""What every dashboard view shares: the decorator stack (``dashboard``, ``tenant_page``,
``require_safe``/``require_POST``), the mapping of domain errors to pages or fragments,
the message in place for htmx, the POSTed reason, the redirect after a POST
(``see_other``) and the context every page starts from (``_base_context``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators import http
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from .. import audit, roles, selectors, vocab
from ..exceptions import DomainError, InvalidPayload, ReasonRequired
from ..models import Tenant
from ..permissions import access_tenant, role_names, tenant_perms
from .forms import ReasonForm, first_error

AUDIT_CHANGED = "audit-changed"
_SAFE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,80}\Z")


#: What an htmx action says in place when the session it was loaded in is gone.
SESSION_ENDED = "Your session has ended (logged out, or it expired): nothing was done. " \
                "Log in again, then repeat the action."


def _in_place(request: HttpRequest, message: str, status: int, *,
              link: tuple[str, str] | None = None) -> HttpResponse:
    """The short message fragment (``error.html#message``) swapped into the error slot of
    the form that sent the htmx request (``#<form id>-error``; else the page's
    ``#flash``), never a whole page into a section. ``link`` is ``(href, words)``."""
    context = {"status": status, "message": message, "link": link}
    response = render(request, "checkpoints/error.html#message", context, status=status)
    trigger = request.htmx.trigger or ""
    target = f"#{trigger}-error" if _SAFE_ID.match(trigger) else "#flash"
    return reswap(retarget(response, target), "innerHTML")


def htmx_login_redirect(view: Callable) -> Callable:
    """An htmx request from an expired (or logged-out) session never gets the login page
    swapped into a fragment (Django's ``login_required`` answers 302, which htmx would
    follow):

    - an action (POST): 403 with a short message in place (``SESSION_ENDED``) and a link
      to log in and come back to the page; the reason typed into the form stays there
      (issue 9: "a short message in place", not a redirect that loses it);
    - a read (tabs polling, "load older"): ``HX-Redirect`` to the login page, which
      reloads the whole page (nothing typed is lost).
    """

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if request.htmx and not request.user.is_authenticated:
            here = request.htmx.current_url_abs_path or request.get_full_path()
            login = redirect_to_login(here, settings.LOGIN_URL).url
            if request.method == "POST":
                return _in_place(request, SESSION_ENDED, 403, link=(login, "Log in again"))
            return HttpResponseClientRedirect(login)
        return view(request, *args, **kwargs)

    return wrapper



def see_other(to, *args, **kwargs) -> HttpResponse:
    """The answer to every dashboard POST that succeeds without htmx: 303 See Other to
    ``to`` (a URL, or a URL name with ``args``/``kwargs``, as Django's ``redirect``),
    which the browser reads with a GET (post/redirect/get; RFC 9110 15.4.4). The one
    rule: no dashboard POST answers 302 (Django's default, which some answered while
    others answered 303)."""
    response = redirect(to, *args, **kwargs)
    response.status_code = 303
    return response


def _referer(request: HttpRequest) -> str | None:
    """The ``Referer`` as a "back" link, only when it points at this site (same host,
    and https when the request is): a forged cross-site post carries the attacker's page,
    or ``javascript:``, which an error page must never link to."""
    url = request.META.get("HTTP_REFERER") or ""
    if url and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                               require_https=request.is_secure()):
        return url
    return None


def domain_errors(view: Callable) -> Callable:
    """Turn a ``DomainError`` into its status code with a readable message.

    htmx: the ``checkpoints/error.html#message`` fragment, retargeted into the sending
    form's error slot (``#<form id>-error``) or the page's ``#flash`` area. Otherwise the
    full error page.
    """

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except DomainError as exc:
            if request.htmx:
                return _in_place(request, _message(exc), exc.status)
            context = {"status": exc.status, "error": exc.error,
                       "message": _message(exc), "back": _referer(request)}
            return render(request, "checkpoints/error.html", context, status=exc.status)

    return wrapper


def _message(exc: DomainError) -> str:
    """One human sentence for an error; the detail names the field where there is one.

    A 404 says the same for "no such object" and "not yours to know about" (CONTRACT.md 3).
    """
    if exc.status == 404:
        return ("We could not find that. It may not exist, or it belongs to a tenant "
                "where you have no role.")
    if exc.detail:
        return exc.detail
    readable = {
        "not_found": "Not found.",
        "forbidden": "Your role does not allow this.",
        "conflict": "Someone else changed this first; reload and try again.",
    }
    extra = ", ".join(f"{k}: {v}" for k, v in exc.extra.items())
    return readable.get(exc.error, exc.error.replace("_", " ")) + (f" ({extra})" if extra else "")


def vary_on_htmx(view: Callable) -> Callable:
    """Add ``Vary: HX-Request``: the same URL answers a page or a fragment (an error page
    or an error fragment, a redirect or a client redirect) depending on that header, so
    a cache must not hand one to the other (django-htmx docs, "middleware")."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        response = view(request, *args, **kwargs)
        patch_vary_headers(response, ("HX-Request",))
        return response

    return wrapper


def require_safe(view: Callable) -> Callable:
    """Django's ``require_safe`` (GET and HEAD; any other method is a 405) whose 405 also
    says ``Vary: HX-Request``: it sits outside ``@dashboard``, and every dashboard
    answer, errors included, says it. HEAD runs the GET view (same status and headers;
    the server drops the body: gunicorn, runserver and the test client do), so every
    page that answers GET answers HEAD as the API does, and writes nothing either."""
    return vary_on_htmx(http.require_safe(view))


def require_POST(view: Callable) -> Callable:  # noqa: N802 (Django's name)
    """Django's ``require_POST`` whose 405 also says ``Vary: HX-Request`` (as
    ``require_safe``)."""
    return vary_on_htmx(http.require_POST(view))


class _WholePage(HtmxDetails):
    """``request.htmx`` of a history-restore request: false, so every view answers the
    whole page (see ``whole_page_for_history``)."""

    def __bool__(self) -> bool:
        return False


def whole_page_for_history(view: Callable) -> Callable:
    """htmx 2 restores Back/Forward from its localStorage snapshot and, on a miss, asks
    the URL again with ``HX-Request`` and ``HX-History-Restore-Request``, then puts the
    answer in place of the whole ``<body>``: a fragment there would leave a bare fragment
    without header or navigation. Such a request is answered as a plain one (the whole
    page). ``base.html`` turns the snapshots off (``historyCacheSize: 0``) and reloads on
    a miss (``refreshOnHistoryMiss``), so this is the second line (issue 9, item 4).

    Every answer then depends on that header too, so each says
    ``Vary: HX-History-Restore-Request`` (with or without it: a cache must not hand the
    fragment to a restore, nor the whole page to a swap)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if request.htmx and request.htmx.history_restore_request:
            request.htmx = _WholePage(request)
        response = view(request, *args, **kwargs)
        patch_vary_headers(response, ("HX-History-Restore-Request",))
        return response

    return wrapper


#: The session keys: the incident reference, and the last reason given while on it,
#: each a ``{tenant slug: text}`` (an incident belongs to the tenant it was typed in).
INCIDENT_KEY = "recovery.incident_ref"
REASON_KEY = "recovery.incident_reason"


def session_get(request: HttpRequest, key: str, tenant_slug: str) -> str:
    """The session's ``key`` for the tenant ``tenant_slug`` ("" when none)."""
    session = getattr(request, "session", None)
    value = session.get(key) if session is not None else None
    if not (isinstance(value, dict) and tenant_slug):
        return ""
    return value.get(tenant_slug) or ""


def session_put(request: HttpRequest, key: str, tenant_slug: str, text: str) -> None:
    """Set (``text``) or forget (``""``) the session's ``key`` for the tenant
    ``tenant_slug``."""
    value = request.session.get(key)
    value = dict(value) if isinstance(value, dict) else {}
    if text:
        value[tenant_slug] = text
    else:
        value.pop(tenant_slug, None)
    if value:
        request.session[key] = value
    else:
        request.session.pop(key, None)


def incident_of(request: HttpRequest, tenant_slug: str) -> dict:
    """``{"ref": the reviewer's incident in the tenant ``tenant_slug`` or "", "reason":
    the last reason they gave while on it or ""}``, from their session (nothing is read
    from the database; another tenant's incident is not this one's)."""
    ref = session_get(request, INCIDENT_KEY, tenant_slug)
    return {"ref": ref,
            "reason": session_get(request, REASON_KEY, tenant_slug) if ref else ""}


def with_incident(view: Callable) -> Callable:
    """Every audit event the view records carries the reviewer's incident
    (``audit.working_on``); after an action that succeeded with a reason, that reason is
    remembered for the incident (the action forms offer it again). Only when an incident
    is set; a GET writes nothing."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        slug = str(kwargs.get("slug") or "")
        ref = incident_of(request, slug)["ref"]
        with audit.working_on(ref):
            response = view(request, *args, **kwargs)
        if ref and request.method == "POST" and response.status_code < 400:
            form = ReasonForm(request.POST)
            if form.is_valid() and form.cleaned_data["reason"] != \
                    session_get(request, REASON_KEY, slug):
                session_put(request, REASON_KEY, slug, form.cleaned_data["reason"])
        return response

    return wrapper


def dashboard(view: Callable) -> Callable:
    """The stack every dashboard view wears: ``Vary: HX-Request``, whole pages for htmx
    history restores (``Vary: HX-History-Restore-Request``), htmx-aware login, the
    reviewer's incident on the audit events (``with_incident``), then domain error
    mapping."""
    return vary_on_htmx(whole_page_for_history(
        htmx_login_redirect(login_required(with_incident(domain_errors(view))))))



def tenant_page(right: str = roles.VIEW) -> Callable:
    """The base of every tenant page and action: resolves the tenant from the URL's
    ``slug`` and the caller's grants once (``permissions.access_tenant``: no role -> 404,
    role lacks ``right`` -> 403) and hands the view the ``Tenant`` instead of the slug, so
    a view never sees an unresolved slug. Everything it reads then starts from that
    tenant (``selectors``/``services`` take it; ``Model.objects.for_tenant(tenant)``,
    docs/tenancy.md). Wear it under ``@dashboard`` (which maps the 404/403)."""

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args, slug: str, **kwargs):
            tenant = access_tenant(request.user, slug, right)
            return view(request, *args, tenant=tenant, **kwargs)

        return wrapper

    return decorate


def _reason(request: HttpRequest) -> str:
    """The POSTed ``reason``; raises ``ReasonRequired``/``InvalidPayload`` (400)."""
    form = ReasonForm(request.POST)
    if not form.is_valid():
        raise ReasonRequired(first_error(form))
    return form.cleaned_data["reason"]


def _base_context(request: HttpRequest, tenant: Tenant | None, section: str) -> dict:
    perms = tenant_perms(request.user, tenant) if tenant else set()
    return {
        "tenant": tenant,
        "tenants": list(selectors.tenants_for_user(request.user)),
        "section": section,
        "perms": perms,
        "roles": role_names(request.user, tenant) if tenant else [],
        "can_reveal": roles.REVEAL in perms,
        "can_review": roles.REVIEW in perms,
        "can_approve": roles.APPROVE in perms,
        "can_manage": roles.MANAGE in perms,  # the tenant's admin (migrations, issue 19)
        # The vocabulary for templates ({% if r.state == vocab.ReconcileState.QUEUED %}):
        # a template compares against the enums, never a literal state.
        "vocab": vocab,
        # The incident the reviewer works on and its last reason (the action forms' prefill).
        "incident": incident_of(request, tenant.slug if tenant else ""),
    }



def _require_valid(form) -> None:
    """Raise the domain error for a bound form's first invalid field: ``ReasonRequired``
    when it is the reason, else ``InvalidPayload`` (both 400, naming the field)."""
    if not form.is_valid():
        error = first_error(form)
        raise (ReasonRequired if error.startswith("reason") else InvalidPayload)(error)



#: The statuses of a service's refusal that a dashboard form shows beside its field
#: (bad input, a conflict with what is stored, too large, unprocessable); any other
#: (403, 404, 503) is ``@dashboard``'s to answer.
FORM_REFUSALS = (400, 409, 413, 422)


def form_refusal(exc: DomainError, request: HttpRequest,
                 fields: dict[str, str]) -> tuple[str, str] | None:
    """``(field, message)``: where a form shows a service's refusal ``exc`` and in which
    words (the service's own: ``exc.detail``). The field is the one the message names
    (``"url: must be …"``), or its nearest parent (``"subject_fields.c: …"`` beside
    ``subject_fields``), mapped through ``fields`` (the service's name -> the form's
    field); ``"form"`` when it names none of them. ``None`` when the refusal is not the
    form's: an htmx request, or a status outside ``FORM_REFUSALS`` (the view re-raises
    and ``@dashboard`` answers). The one rule of the dashboard's forms that let the
    service judge (notifications, the Data page, legal holds)."""
    if request.htmx or exc.status not in FORM_REFUSALS:
        return None
    head = (exc.detail or "").split(":", 1)[0]
    while head and head not in fields:
        head = head.rpartition(".")[0]
    return fields.get(head, "form"), exc.detail or exc.error
