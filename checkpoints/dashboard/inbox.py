"""The inbox: ``/`` (the first tenant's inbox), the run list with its tabs, search,
filters, sort and keyset pages, its live tab counts, and the bulk bar it shows
reviewers (the bulk action itself is ``bulk``)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import urlencode

from .. import dbclock, declared, kinds, replica, roles, selectors
from ..models import BULK_JOB_MAX_RUNS, BULK_MAX_RUNS, Run, Tenant
from ..permissions import tenant_perms
from ..vocab import BulkActionKind, RecoveryState
from .common import _base_context, dashboard, require_safe, tenant_page
from .forms import ALL_TAB, BACK_MAX, DEFAULT_TAB, InboxFilterForm, NoQuery


@require_safe
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
#: How often the inbox asks whether runs entered its tab (``live.run_new``), seconds.
INBOX_POLL_S = 10

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
    """The inbox query string checked (``InboxFilterForm``, and its ``cursor`` by
    ``check_cursor``: 400 naming the field) and the tabs: ``(cleaned data, tabs
    context)``. The tab counts follow the filters
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
    check_cursor(data, state)
    sort = data["sort"] if data["sort"] != selectors.DEFAULT_RUN_SORT else ""
    query = {k: v for k, v in (("q", data["q"]), ("kind", data["kind"]),
                               ("subject", data["subject"]),
                               ("age", request.GET.get("age", "")), ("sort", sort)) if v}
    total = sum(counts.values())
    text = selectors.search_terms(data["q"])
    tenant_counts = counts if not filters.narrowing else None
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
        "role_work": _role_work(request, tenant, tenant_counts),
    }


#: The states that wait for each role, as the header line counts them (issue 21, item 7):
#: a reviewer resolves what is in doubt or refused, an approver decides retries.
ROLE_WORK = (("a reviewer", _IN_DOUBT), ("an approver", (RecoveryState.AWAITING_APPROVAL,)))


def _role_work(request: HttpRequest, tenant: Tenant, counts: dict | None) -> list[dict]:
    """The inbox's header line, "3 runs need a reviewer · 10 need an approver": per role of
    ``ROLE_WORK``, how many of the tenant's runs wait for it, summed from the tenant-wide
    state counters (``selectors.state_counts``: what the unfiltered tabs show, so the two
    agree). ``counts``: those counters when the page already read them (no narrowing
    filter); else one more query of them. Each item: ``who`` ("a reviewer"), ``n`` and
    ``state`` (the tab holding them: the first of its states with a run)."""
    if counts is None:
        counts = selectors.run_state_counts(user=request.user, tenant=tenant,
                                            filters=selectors.RunFilters())
    work = []
    for who, states in ROLE_WORK:
        n = sum(counts.get(s, 0) for s in states)
        tab = next((s for s in states if counts.get(s, 0)), states[0])
        work.append({"who": who, "n": n, "state": tab})
    return work


def _run_filters(data: dict, state: str) -> selectors.RunFilters:
    """The ``selectors.RunFilters`` of a cleaned ``InboxFilterForm`` and the tab
    ``state`` (``ALL_TAB``: every state): the inbox's rows, its tab counts and a bulk
    action's "all matching" are the same runs."""
    return selectors.RunFilters(
        recovery_state=None if state == ALL_TAB else state,
        kind=data["kind"] or None, subject=data["subject"] or None, age_s_min=data["age"],
        q=data["q"] or None,
    )


def check_cursor(data: dict, state: str) -> None:
    """Refuse the ``cursor`` of a cleaned ``InboxFilterForm`` as the inbox's list does
    (``selectors.decode_cursor`` for the tab ``state``, the filters and the sort): raises
    ``InvalidPayload`` (400) naming ``cursor`` when it is not a cursor the inbox made, or
    one made for another sort or other filters. No cursor: nothing to check. The tab
    counts and the "n new runs" poll page nothing, yet take the inbox's query string and
    check it the same way (the team's rule: query parameters are validated like bodies),
    so no malformed ``cursor`` is a 200 anywhere."""
    if data["cursor"]:
        selectors.decode_cursor(data["cursor"], sort=data["sort"],
                                filters=_run_filters(data, state))


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
    # The reason column is the run page's next step, short (selectors.nextstep: the same
    # rule, in a fixed number of queries for the whole page).
    steps = selectors.page_steps(user=request.user, tenant=tenant, rows=page.rows)
    for row in page.rows:
        row["next_step"] = steps[row["id"]].short
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
        # Where a run page's back link returns: this page (tab, filters, cursor), checked
        # again by the run page (forms.back_target).
        "back": _here(request),
        "known_kinds": sorted(set(kinds.registered()) | declared.declared_kind_names(tenant)),
        "age_choices": tabs["form"].fields["age"].choices,
    }


def _here(request: HttpRequest) -> str:
    """This inbox page's path and query (an htmx swap's own URL, which it pushes), or ""
    when it is longer than ``forms.BACK_MAX`` (the run page would refuse it)."""
    here = request.get_full_path()
    return here if len(here) <= BACK_MAX else ""


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


@require_safe
@dashboard
@tenant_page()
@replica.replica_reads
def run_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/``: the inbox. One tab per recovery state (landing on
    ``_default_tab``), the search ``q``, filters ``kind``/``subject``/``age``, ``sort``,
    keyset pagination by ``cursor`` (next and previous), all in the URL.

    An htmx request (tab, filter, page) gets only the ``inbox-main`` fragment. Read from
    the replica when one is configured (``replica.replica_reads``; its access checked on
    the primary).
    """
    # One snapshot (issue 21, item 8): the tab counts agree with the list, and ``since``
    # (the database time of that snapshot, its first query) starts the "n new runs" poll.
    with selectors.consistent_read():
        read_at = replica.snapshot_now()
        dbclock.seed_page_now(read_at)  # the page's "3 min ago" is as of what it shows
        since = selectors.to_micros(read_at)
        context = _base_context(request, tenant, "inbox") | _inbox_context(request, tenant)
        rejected = selectors.rejected_retries(user=request.user, tenant=tenant,
                                              run_pks=[r["id"] for r in context["rows"]])
    for row in context["rows"]:  # issue 21, item 9: "retry rejected" on the row
        row["rejected"] = rejected.get(row["id"])
    context.update(since=since, new_runs=0, inbox_poll_s=INBOX_POLL_S)
    if context["can_review"] and context["tab_total"]:  # nothing listed: nothing to act on
        context["bulk"] = _bulk_bar(context)
    _migration_offers(request, tenant, context)
    template = "checkpoints/inbox.html"
    if request.htmx:
        template += "#inbox-main"
    return render(request, template, context)


def _migration_offers(request: HttpRequest, tenant: Tenant, context: dict) -> None:
    """On the ``schema_mismatch`` tab, for the tenant's admin only, and only when it
    lists runs: each listed run of a kind ``selectors.migration_offers`` offers a
    migration for gets ``migrate_to`` (the version; the row links to the preview). The
    offers need ``selectors.kind_usage`` (three grouped queries over the tenant's
    checkpoints), so no other tab, role or empty page pays for them."""
    if (context["state"] != RecoveryState.SCHEMA_MISMATCH or not context["can_manage"]
            or not context["rows"]):
        return
    offers = selectors.migration_offers(selectors.kind_usage(user=request.user, tenant=tenant))
    for row in context["rows"]:
        row["migrate_to"] = offers.get(row["kind"])


@require_safe
@dashboard
@tenant_page()
@replica.replica_reads
def run_counts(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/counts/``: the inbox tabs with live counts, polled by htmx every 10 s.
    Only the counts are read, following the page's filters (checked, ``cursor`` included,
    as the inbox checks them; no run is listed)."""
    context = _base_context(request, tenant, "inbox") | _inbox_filters(request, tenant)[1]
    return render(request, "checkpoints/inbox.html#tabs", context)


def _bulk_bar(context: dict) -> dict:
    """What ``checkpoints/_bulk_bar.html`` needs (reviewers only): a fresh client token
    (one per rendered inbox, so submitting this form twice acts once), the current
    filters as a query string (``state`` included) for "every run matching", the
    actions, the maximum (``BULK_JOB_MAX_RUNS``; above ``BULK_MAX_RUNS`` it runs as a
    stored job, issue 22, item 6) and how many runs match (the tab's count, which follows the
    filters: no extra query)."""
    query = dict(context["filter_query"], state=context["state"])
    # The tab counts follow every filter; past the count cap the number is unknown.
    matching = None if context["counts_capped"] else context["tab_total"]
    return {"token": uuid.uuid4(), "filters": urlencode(query),
            "confirm_actions": " ".join(sorted(BulkActionKind.CONFIRM)),
            "actions": BulkActionKind.choices, "max": BULK_JOB_MAX_RUNS,
            "owner_max": Run._meta.get_field("lease_owner").max_length,
            "inline_max": BULK_MAX_RUNS, "matching": matching}
