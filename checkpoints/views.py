"""The reviewer dashboard: server-rendered pages with htmx fragments (no SPA).

One function view per page or action. Each page view resolves the tenant from the URL
through ``permissions.access_tenant`` (no role there -> 404, role lacks the right -> 403),
reads through ``selectors`` and writes only through ``services`` (which check the right
again and write the audit event in the same transaction). Fragments are
``{% partialdef %}`` blocks of the page template, rendered as ``"page.html#name"`` when the
request comes from htmx; every link and form also works without JavaScript.

Errors: a ``DomainError`` becomes its own status with a readable message. For htmx the
message fragment is retargeted into the error slot of the form that sent the request
(``#<form id>-error``), otherwise a full error page is rendered. ``templates/base.html``
tells htmx 2 to swap 400/403/404/409/412/422 responses (it swaps only 2xx by default).
One refusal is not an error page: reconcile while the run's owner is live (``OwnerLive``)
answers 409 with the run page itself, the reason shown where the button was.

Caching: every dashboard response carries ``Vary: HX-Request`` (``vary_on_htmx``; the
405s of ``require_GET``/``require_POST`` and CSRF failures too), since the same URL
answers a whole page or a fragment (or an error page or an error fragment) depending on
that header; every answer is ``no-store`` (``security.PrivateNoStoreMiddleware``). An htmx
history restore gets the whole page (``whole_page_for_history``).

Pages that stay true (issue 9): a CSRF failure (``csrf_failure``) or an ended session
(``htmx_login_redirect``) inside an htmx action is a short message in place; an action
refused because someone acted first (``AlreadyDone``) answers the refreshed run body with
a sentence naming who and when (``refreshes_when_acted_first``).

GETs never write: pages read through ``selectors`` (and the read-only
``services.retry_preview``); only the POST actions call services that write.
"""

from __future__ import annotations

import difflib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import content_disposition_header, url_has_allowed_host_and_scheme, urlencode
from django.views.decorators import http
from django.views.decorators.cache import never_cache
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget, trigger_client_event
from django_htmx.middleware import HtmxDetails

from . import kinds, reconciliation, reports, roles, selectors, services, vocab
from .exceptions import AlreadyDone, DomainError, InvalidPayload, OwnerLive, ReasonRequired
from .forms import (
    ALL_TAB,
    BULK_MATCHING,
    DEFAULT_TAB,
    AuditFilterForm,
    BulkForm,
    CloseForm,
    DiffForm,
    HistoryForm,
    InboxFilterForm,
    MarkUnknownForm,
    NoQuery,
    ReasonForm,
    RevealForm,
    first_error,
)
from .models import BULK_MAX_RUNS, Tenant
from .permissions import access_tenant, role_names, tenant_perms
from .templatetags.dashboard import ago, label
from .vocab import (
    AuditAction,
    BulkActionKind,
    EffectState,
    PhaseClass,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    RetryOutcome,
    RetryState,
)

AUDIT_CHANGED = "audit-changed"
_SAFE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,80}\Z")
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


# --------------------------------------------------------------------------------------
# Decorators and helpers
# --------------------------------------------------------------------------------------

#: What an htmx action says in place when the session it was loaded in is gone.
SESSION_ENDED = "Your session has ended (logged out, or it expired): nothing was done. " \
                "Log in again, then repeat the action."
#: What an htmx action says in place when its CSRF token is no longer the session's.
SESSION_CHANGED = "Your session changed (you logged out or in, maybe in another tab): " \
                  "nothing was done. Reload the page and try again."


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


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``settings.CSRF_FAILURE_VIEW``: a POST whose CSRF token is not the session's (the
    page was loaded before a logout/login, perhaps in another tab, rotated the token).

    403 always, and ``Vary: HX-Request`` (the answer depends on it): htmx gets
    ``SESSION_CHANGED`` in place (``_in_place``: the form's error slot, never Django's
    error page swapped into the run page); a plain form post a readable page; a path
    under ``/api/`` the API's JSON error (``{"error": "forbidden", "detail"}``; DRF's
    views are CSRF-exempt and check it themselves, so this is a fallback). ``reason``
    (Django's words) is not shown: it would only confuse a reviewer.
    """
    if request.path.startswith("/api/"):
        response = JsonResponse({"error": "forbidden",
                                 "detail": "csrf: the CSRF token is missing or stale"},
                                status=403)
    elif getattr(request, "htmx", None):  # set by HtmxMiddleware, unless it never ran
        here = request.htmx.current_url_abs_path or request.get_full_path()
        response = _in_place(request, SESSION_CHANGED, 403, link=(here, "Reload the page"))
    else:
        back = _referer(request)
        response = render(request, "checkpoints/error.html",
                          {"status": 403, "message": SESSION_CHANGED, "back": back,
                           "link": (back, "Reload the page") if back else None},
                          status=403)
    patch_vary_headers(response, ("HX-Request",))
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


def require_GET(view: Callable) -> Callable:  # noqa: N802 (Django's name)
    """Django's ``require_GET`` whose 405 also says ``Vary: HX-Request``: it sits
    outside ``@dashboard``, and every dashboard answer, errors included, says it."""
    return vary_on_htmx(http.require_GET(view))


def require_POST(view: Callable) -> Callable:  # noqa: N802 (Django's name)
    """Django's ``require_POST`` whose 405 also says ``Vary: HX-Request`` (as
    ``require_GET``)."""
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
    a miss (``refreshOnHistoryMiss``), so this is the second line (issue 9, item 4)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if request.htmx and request.htmx.history_restore_request:
            request.htmx = _WholePage(request)
        return view(request, *args, **kwargs)

    return wrapper


def dashboard(view: Callable) -> Callable:
    """The stack every dashboard view wears: ``Vary: HX-Request``, whole pages for htmx
    history restores, htmx-aware login, then domain error mapping."""
    return vary_on_htmx(whole_page_for_history(
        htmx_login_redirect(login_required(domain_errors(view)))))


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


def acted_first_words(exc: AlreadyDone) -> str:
    """The sentence for ``AlreadyDone``: *Not done: already approved by april 2 min ago.*
    (who and when as the refusing service read them; either may be unknown)."""
    who = f" by {exc.by}" if exc.by else ""
    when = f" {ago(exc.at)}" if exc.at is not None else ""
    return f"Not done: already {exc.what}{who}{when}. The page below shows the run as it is now."


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
        # The vocabulary for templates ({% if r.state == vocab.ReconcileState.QUEUED %}):
        # a template compares against the enums, never a literal state.
        "vocab": vocab,
    }


def _run_url(tenant: Tenant, run_id) -> str:
    return reverse("run_detail", args=[tenant.slug, str(run_id)])


# --------------------------------------------------------------------------------------
# Home and inbox
# --------------------------------------------------------------------------------------

@require_GET
@dashboard
def home(request: HttpRequest) -> HttpResponse:
    """``/``: the first tenant's inbox, or a page saying the account has no role anywhere.
    Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    tenant = selectors.tenants_for_user(request.user).first()
    if tenant is not None:
        return redirect("run_list", slug=tenant.slug)
    return render(request, "checkpoints/no_tenant.html", _base_context(request, None, "home"))


#: Runs per inbox page.
INBOX_PAGE = 50

#: The states each role acts on, in the tabs' order: the inbox lands on the first of them
#: holding a run (issue 9). A reviewer resolves what is in doubt or refused
#: (ambiguous, unknown outcome, conflicted, schema mismatch); an approver decides the
#: retries awaiting approval first, then looks where a reviewer does; a viewer (who acts
#: on nothing) follows what waits for a person, in the same order as a reviewer, then
#: the approvals. Nothing there: ``DEFAULT_TAB`` ("ambiguous", which says so).
_IN_DOUBT = (RecoveryState.AMBIGUOUS, RecoveryState.UNKNOWN_OUTCOME,
             RecoveryState.CONFLICTED, RecoveryState.SCHEMA_MISMATCH)
ROLE_TABS = {
    "review": _IN_DOUBT,
    "approve": (RecoveryState.AWAITING_APPROVAL, *_IN_DOUBT),
    "view": (*_IN_DOUBT, RecoveryState.AWAITING_APPROVAL),
}


def _inbox_filters(request: HttpRequest, tenant: Tenant) -> tuple[dict, dict]:
    """The inbox query string checked (``InboxFilterForm``: 400 naming the field) and the
    tabs: ``(cleaned data, tabs context)``. The tab counts follow the filters
    (``selectors.run_state_counts``: the tenant-wide counters without a narrowing
    filter, one GROUP BY with one); the tab is the one asked for, or the landing tab
    (``_default_tab``). ``filter_query`` is what every link of the page keeps: the
    filters, the search and the sort (never the cursor)."""
    form = InboxFilterForm.from_request(request)
    data = form.cleaned_data
    filters = _run_filters(data, ALL_TAB)
    counts = selectors.run_state_counts(user=request.user, tenant=tenant, filters=filters)
    state = data["state"]
    if not request.GET.get("state"):
        state = _default_tab(request, tenant, counts, filtered=filters.narrowing)
    sort = data["sort"] if data["sort"] != selectors.DEFAULT_RUN_SORT else ""
    query = {k: v for k, v in (("q", data["q"]), ("kind", data["kind"]),
                               ("subject", data["subject"]),
                               ("age", request.GET.get("age", "")), ("sort", sort)) if v}
    total = sum(counts.values())
    text = selectors.search_terms(data["q"])
    return data, {
        "state": state,
        "all_tab": ALL_TAB,
        "form": form,
        "filters": filters,
        "tabs": [(s.value, s.label, counts.get(s.value, 0)) for s in RecoveryState.INBOX_TABS],
        "total": total,
        "tab_total": total if state == ALL_TAB else counts.get(state, 0),
        "filtered": filters.narrowing,
        # Past SEARCH_COUNT_CAP matches the counts stop: each shown as "n+" (at least).
        "counts_capped": counts.capped,
        "count_cap": f"{selectors.inbox.SEARCH_COUNT_CAP:,}",
        # A search too short for the text columns reads the ids only (docs/search.md).
        "search_ids_only": bool(text) and not selectors.search_substring(text),
        "substring_min": selectors.SEARCH_SUBSTRING_MIN,
        "filter_query": query,
        "sort": data["sort"],
    }


def _run_filters(data: dict, state: str) -> selectors.RunFilters:
    """The ``selectors.RunFilters`` of a cleaned ``InboxFilterForm`` and the tab
    ``state`` (``ALL_TAB``: every state): the inbox's rows, its tab counts and a bulk
    action's "all matching" are the same runs."""
    return selectors.RunFilters(
        recovery_state=None if state == ALL_TAB else state,
        kind=data["kind"] or None, subject=data["subject"] or None, age_s_min=data["age"],
        q=data["q"] or None,
    )


def _inbox_context(request: HttpRequest, tenant: Tenant) -> dict:
    """The inbox page: its tabs (``_inbox_filters``), one keyset page of runs
    (``selectors.run_list``) and where the page sits: ``first``-``last`` of
    ``tab_total`` (``selectors.run_position`` for a page after the first: one count)."""
    data, tabs = _inbox_filters(request, tenant)
    state = tabs["state"]
    filters = replace(tabs["filters"], recovery_state=None if state == ALL_TAB else state)
    page = selectors.run_list(user=request.user, tenant=tenant, filters=filters,
                              sort=data["sort"], cursor=data["cursor"] or None,
                              limit=INBOX_PAGE)
    first = 1
    if page.previous_cursor and page.rows:
        before = selectors.run_position(user=request.user, tenant=tenant, filters=filters,
                                        sort=data["sort"], pk=page.rows[0]["id"])
        # None: more than SEARCH_COUNT_CAP matches before this page (not counted).
        first = None if before is None else first + before
    last = None if first is None else first + len(page.rows) - 1
    other = "created" if data["sort"] == "-created" else "-created"
    return tabs | {
        "rows": page.rows,
        "next_cursor": page.next_cursor,
        "previous_cursor": page.previous_cursor,
        "paged": bool(data["cursor"]),
        "first": first,
        "last": last,
        # Runs created since the first page can make a count a step behind the page.
        "of": max(tabs["tab_total"], last or 0),
        "sort_toggle": "" if other == selectors.DEFAULT_RUN_SORT else other,
        "known_kinds": list(kinds.registered()),
        "age_choices": tabs["form"].fields["age"].choices,
    }


def _default_tab(request: HttpRequest, tenant: Tenant, counts: dict[str, int], *,
                 filtered: bool = False) -> str:
    """The landing tab: the first state of ``ROLE_TABS`` for the caller's role (reviewer
    before approver before viewer when one holds several) that holds a run under the
    page's filters (``counts``). None does: ``all`` when a search or filter (``filtered``)
    matches runs in other states, so a search lands on what it found; else
    ``DEFAULT_TAB``."""
    perms = tenant_perms(request.user, tenant)
    role = ("review" if roles.REVIEW in perms else
            "approve" if roles.APPROVE in perms else "view")
    for state in ROLE_TABS[role]:
        if counts.get(state, 0):
            return state
    if filtered and any(counts.values()):
        return ALL_TAB
    return DEFAULT_TAB


@require_GET
@dashboard
@tenant_page()
def run_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/``: the inbox. One tab per recovery state (landing on
    ``_default_tab``), the search ``q``, filters ``kind``/``subject``/``age``, ``sort``,
    keyset pagination by ``cursor`` (next and previous), all in the URL.

    An htmx request (tab, filter, page) gets only the ``inbox-main`` fragment.
    """
    context = _base_context(request, tenant, "inbox") | _inbox_context(request, tenant)
    if context["can_review"] and context["tab_total"]:  # nothing listed: nothing to act on
        context["bulk"] = _bulk_bar(context)
    template = "checkpoints/inbox.html"
    if request.htmx:
        template += "#inbox-main"
    return render(request, template, context)


@require_GET
@dashboard
@tenant_page()
def run_counts(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/counts/``: the inbox tabs with live counts, polled by htmx every 10 s.
    Only the counts are read, following the page's filters (checked; no run is listed)."""
    context = _base_context(request, tenant, "inbox") | _inbox_filters(request, tenant)[1]
    return render(request, "checkpoints/inbox.html#tabs", context)


# --------------------------------------------------------------------------------------
# Run page
# --------------------------------------------------------------------------------------

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
    broker = reconciliation.broker_configured()
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
            "broker_down": queued and (reconciliation.BROKER_DOWN in r.last_error
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
               may_withdraw: bool = False) -> str:
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
                              and not closed)}
        for e in detail.effects
    ]
    checkpoints = [{"cp": cp, "revisions": detail.revisions.get(cp.pk, []),
                    "older": detail.revisions_older.get(cp.pk)}
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
            may_withdraw=any(r["can_withdraw"] for r in retries)),
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
    )
    context["has_actions"] = (context["can_request_retry"] or context["can_reconcile"]
                              or context["can_acknowledge"] or context["can_close"]
                              or deciding or any(r["can_withdraw"] for r in retries)
                              or any(e["can_mark_unknown"] for e in effects))
    context.update(extra)
    return context


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


def _action_done(request: HttpRequest, tenant: Tenant, run_id, notice: str) -> HttpResponse:
    """After a successful action: htmx gets the refreshed run body plus ``audit-changed``;
    a plain form post is redirected back to the run page (post/redirect/get)."""
    if request.htmx:
        context = _run_context(request, tenant, run_id, notice=notice)
        response = render(request, "checkpoints/run.html#run-body", context)
        return trigger_client_event(response, AUDIT_CHANGED)
    messages.success(request, notice)
    return redirect(_run_url(tenant, run_id))


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
    n = len(queued.requests)
    what = f"Reconciliation of {n} effect{'s' if n != 1 else ''} requested " \
           f"(task {queued.task_id[:8]})"
    if not queued.dispatched:
        notice = f"{what}: {queued.detail}."
    elif queued.results:
        notice = f"{what}; the section below shows what the services answered."
    else:
        notice = (f"{what}; a worker is asking the services, so reload in a moment to see "
                  f"their answers.")
    return _action_done(request, tenant, run.uuid, notice)


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
@refreshes_when_acted_first
def conflicts_acknowledge(request: HttpRequest, tenant: Tenant, run_id: str) -> HttpResponse:
    """Acknowledge every open conflict of the run (reviewer)."""
    run = selectors.run_get(user=request.user, tenant=tenant, run_id=run_id)
    # only_open: pressed on a page that showed open conflicts; none left means someone
    # acknowledged them first (AlreadyDone), not "0 acknowledged".
    n = services.conflicts_acknowledge(actor=request.user, tenant=tenant, run_id=run.uuid,
                                       reason=_reason(request), only_open=True)
    return _action_done(request, tenant, run.uuid, f"{n} conflict(s) acknowledged.")


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


def _require_valid(form) -> None:
    """Raise the domain error for a bound form's first invalid field: ``ReasonRequired``
    when it is the reason, else ``InvalidPayload`` (both 400, naming the field)."""
    if not form.is_valid():
        error = first_error(form)
        raise (ReasonRequired if error.startswith("reason") else InvalidPayload)(error)


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
    payloads; a reason is required); ``reconciliation.evidence_reveal`` audits it. htmx:
    the evidence fragment plus ``audit-changed``; otherwise the run page with it shown."""
    attempt = selectors.reconcile_attempt_get(user=request.user, tenant=tenant,
                                              attempt_id=attempt_id)
    reason = _reason(request)
    value = reconciliation.evidence_reveal(actor=request.user, tenant=tenant,
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


# --------------------------------------------------------------------------------------
# Reports and the audit log
# --------------------------------------------------------------------------------------

@require_GET
@dashboard
@tenant_page()
def report(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/report/``: the tenant's numbers now (runs, effects and retries per
    state, open conflicts) and its figures over a range (``reports.figures``), each drawn
    as inline SVG with a CSV download and the database time it was read at.

    Query string (``reports.ReportRangeForm``: 400 naming the parameter): ``range``
    (``24h``/``7d``/``30d``/``custom``), ``from``/``to`` (custom), ``format=csv`` with
    ``figure=<name>`` answers that figure as a CSV attachment (one header row, the range
    and as-of time in every row, cells safe from formula injection: ``reports.csv_rows``,
    ``reports.csv_cell``; named by ``reports.csv_filename``). An htmx request (a range link or the custom form)
    gets only the ``report-range`` fragment."""
    q = reports.ReportRangeForm.parse(request.GET, request.META.get("QUERY_STRING", ""))
    data = reports.figures(user=request.user, tenant=tenant, range_name=q["range"] or None,
                           start=q["start"] or None, end=q["end"] or None)
    if q["format"] == "csv":
        response = HttpResponse(reports.to_csv(data, q["figure"]),
                                content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = content_disposition_header(
            True, reports.csv_filename(data, tenant.slug, q["figure"]))
        return response
    context = _base_context(request, tenant, "report") | _report_range_context(data)
    if request.htmx:
        return render(request, "checkpoints/report.html#report-range", context)
    now = selectors.report(user=request.user, tenant=tenant)
    runs_total = sum(now["runs"].values()) or 1
    # the state's one chart colour (``reports.FILL``), like the charts below
    run_rows = [(state, n, round(100 * n / runs_total), reports.FILL.get(state, reports.OTHER_FILL))
                for state, n in now["runs"].items()]
    context |= {
        "data": now, "run_rows": run_rows, "runs_total": sum(now["runs"].values()),
        "effect_rows": sorted(now["effects"].items()),
        "retry_rows": sorted(now["retry_requests"].items()),
    }
    return render(request, "checkpoints/report.html", context)


def _report_range_context(data: dict) -> dict:
    """The range part of the report page: the figures with their charts
    (``reports.bar_chart``/``stat_chart``), the query of this range (for the CSV links)
    and the range links."""
    rng = data["range"]
    query = {"range": rng["name"]}
    if rng["name"] == reports.CUSTOM:
        query |= {"from": rng["from"].isoformat().replace("+00:00", "Z"),
                  "to": rng["to"].isoformat().replace("+00:00", "Z")}
    buckets, bucket = data["buckets"], rng["bucket"]

    def series(name, title, caption, values=None):
        return {"name": name, "title": title, "words": caption, "kind": "series",
                "chart": reports.bar_chart(values or data[name], buckets, bucket)}

    def stats(name, title, caption, unit, rows=None):
        # Only the keys with values: no empty chart or row of dashes ("Nothing in this
        # range." instead, like the series).
        rows = {k: v for k, v in (rows or data[name]).items() if v["n"]}
        return {"name": name, "title": title, "words": caption, "kind": "stats", "unit": unit,
                "rows": rows, "chart": reports.stat_chart(rows, unit)}

    doubt = " or ".join(label(s) for s in reports.IN_DOUBT)
    resolved = ", ".join(label(s) for s in reports.RESOLVED).rsplit(", ", 1)
    charts = [
        series("runs_entering", "Runs entering each recovery state",
               "a run's creation counts as entering its first state"),
        series("conflicts", "Conflicts", "refused writes, by reason"),
        series("schema_mismatches", "Schema mismatches",
               f"runs entering {label(RecoveryState.SCHEMA_MISMATCH)}",
               {RecoveryState.SCHEMA_MISMATCH: data["schema_mismatches"]}),
        series("reconcile_outcomes", "Reconciliation outcomes",
               "reconcile requests finished, by what they settled"),
        series("reconcile_answers", "Look-up answers",
               "what the services answered each look-up"),
        stats("time_to_resolve_s", "Time from ambiguous to resolved",
              f"from entering {doubt} to {' or '.join(resolved)}", "s",
              {"resolved runs": data["time_to_resolve_s"]}),
        stats("resume_age_ms", "Resume age",
              "how old the latest checkpoint was when a runtime claimed a resume, by answer",
              "ms"),
        stats("checkpoint_size_bytes", "Checkpoint size", "accepted revisions, by kind",
              "bytes"),
    ]
    return {"figures": data, "charts": charts, "range_query": query,
            "ranges": [*reports.RANGES], "range_custom": reports.CUSTOM,
            # the custom form's last day (``to`` is the exclusive midnight after it)
            "range_to_day": (rng["to"] - timedelta(microseconds=1)).date().isoformat(),
            "approvals": data["approvals"]}


@require_GET
@dashboard
@tenant_page()
def audit_log(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/audit/``: the tenant's audit events, newest first, filtered by the
    search ``q`` (events of the runs the inbox search finds) and ``actor``/``action``/
    ``run``, paged backwards with ``before``."""
    form = AuditFilterForm.from_request(request)
    data = form.cleaned_data
    page_size = 100
    events = selectors.audit_list(user=request.user, tenant=tenant, run_id=data["run"],
                                  actor=data["actor"] or None, action=data["action"] or None,
                                  before_seq=data["before"], q=data["q"] or None,
                                  limit=page_size + 1)
    older = events[page_size - 1].seq if len(events) > page_size else None
    query = {k: v for k, v in (("q", data["q"]), ("actor", data["actor"]),
                               ("action", data["action"]),
                               ("run", str(data["run"]) if data["run"] else "")) if v}
    context = _base_context(request, tenant, "audit") | {
        "events": events[:page_size], "older": older, "form": form, "filter_query": query,
        "paged": data["before"] is not None, "known_actions": AuditAction.values,
    }
    return render(request, "checkpoints/audit.html", context)



# --------------------------------------------------------------------------------------
# Bulk actions (issue 9, item 3): the inbox's bulk bar and the result page
# --------------------------------------------------------------------------------------

def _bulk_bar(context: dict) -> dict:
    """What ``checkpoints/_bulk_bar.html`` needs (reviewers only): a fresh client token
    (one per rendered inbox, so submitting this form twice acts once), the current
    filters as a query string (``state`` included) for "every run matching", the
    actions, the maximum and how many runs match (the tab's count, which follows the
    filters: no extra query)."""
    query = dict(context["filter_query"], state=context["state"])
    # The tab counts follow every filter; past the count cap the number is unknown.
    matching = None if context["counts_capped"] else context["tab_total"]
    return {"token": uuid.uuid4(), "filters": urlencode(query),
            "confirm_actions": " ".join(sorted(BulkActionKind.CONFIRM)),
            "actions": BulkActionKind.choices, "max": BULK_MAX_RUNS, "matching": matching}


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
