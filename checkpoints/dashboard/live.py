"""Pages that move by themselves (issue 21, item 8): the polls of the run page and of
the inbox, with htmx (``hx-trigger="every 3s"``; no server-sent events: a poll is a
short GET any proxy and worker set-up serves, and it costs what its one read costs).

- The run page (``run.run_live``) polls ``runs/<id>/live/?seen=<marker>`` while something is pending
  (a retry awaiting approval or approved, a reconciliation under way, a migration of its
  kind): nothing changed -> 204 (htmx swaps nothing, the poll goes on); something did ->
  the run body (``run.html#run-body``) swapped over the page's, which polls again only
  while something is still pending, and says "completed 2 s ago" (database clock) when
  the run has ended. ``static/js/app.js`` keeps a reason being typed: the page then says
  "changed: reload" instead of swapping under the typist.
- The inbox polls ``new-runs/?<its filters>&since=<db time>`` every 10 s: "2 new runs ·
  show", the runs that entered the tab since the page was read; "show" reloads the tab,
  whose counts and list come from one read (``selectors.consistent_read``).

Every answer says ``Vary: HX-Request`` (``@dashboard``); a poll writes nothing.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import replica, selectors
from ..models import Tenant
from .common import dashboard, require_safe, tenant_page
from .forms import ALL_TAB, NewRunsForm
from .inbox import INBOX_POLL_S, _run_filters, check_cursor

#: How often a run page with something pending asks again (the template's ``every``).
RUN_POLL_S = 3


def duration_words(seconds: int) -> str:
    """``"2 s"``, ``"4 min 47 s"``, ``"3 h 5 min"``, ``"2 d 4 h"``: a duration for people."""
    seconds = max(0, int(seconds))
    parts = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def live_context(live: selectors.RunLive) -> dict:
    """What ``_live.html#run-live`` shows of a ``RunLive``: the poll (``live``), the
    pending things in words, and "completed 2 s ago" once the run has ended."""
    ended = live.ended_s
    return {"live": live, "poll_s": RUN_POLL_S,
            "live_waiting": "; ".join(live.waiting),
            "live_ended": "" if ended is None else f"completed {duration_words(ended)} ago"}


def new_runs_context(tenant: Tenant, query: dict, state: str, since: int, n: int) -> dict:
    """What ``_live.html#inbox-new`` shows: the poll's URL parts and ``n`` new runs
    (``capped``: more than ``selectors.NEW_RUNS_CAP``)."""
    capped = n > selectors.NEW_RUNS_CAP
    return {"tenant": tenant, "filter_query": query, "state": state, "since": since,
            "new_runs": min(n, selectors.NEW_RUNS_CAP), "new_capped": capped,
            "inbox_poll_s": INBOX_POLL_S}


@require_safe
@dashboard
@tenant_page()
@replica.replica_reads
def run_new(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/new-runs/?<inbox filters>&since=<µs>``: the inbox's poll, "2 new runs ·
    show": how many runs passing the page's filters entered its tab after ``since`` (the
    database time the page was read at; ``selectors.new_runs``: one query). The
    filters are checked as the inbox's, ``cursor`` included (``inbox.check_cursor``; 400
    naming the parameter), ``since`` is required."""
    data = NewRunsForm.from_request(request).cleaned_data
    state = data["state"]
    check_cursor(data, state)
    filters = _run_filters(data, state)
    since = data["since"]
    n = selectors.new_runs(user=request.user, tenant=tenant, filters=filters,
                           since=selectors.from_micros(since))
    query = {k: v for k, v in (("q", data["q"]), ("kind", data["kind"]),
                               ("subject", data["subject"]),
                               ("age", request.GET.get("age", "")),
                               ("sort", request.GET.get("sort", ""))) if v}
    context = new_runs_context(tenant, query, state if state else ALL_TAB, since, n)
    return render(request, "checkpoints/_live.html#inbox-new", context)
