"""The report page: the tenant's numbers now and its figures over a range, drawn as
inline SVG, each with a CSV download. The figures, charts and CSV are
``checkpoints.reports``; this module only reads the query string and renders them."""

from __future__ import annotations

from datetime import timedelta

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.http import content_disposition_header

from .. import replica, reports, selectors
from ..models import Tenant
from ..templatetags.dashboard import label
from ..vocab import RecoveryState
from .common import _base_context, dashboard, require_safe, tenant_page


@require_safe
@dashboard
@tenant_page()
@replica.replica_reads
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
            "approvals": data["approvals"], "recovery_cost": data["recovery_cost"]}
