"""The report's figures (``figures``), each from one aggregate query: runs entering each
state, conflicts, reconcile outcomes and answers, time to resolve, resume ages,
checkpoint sizes, approvals.
"""

from __future__ import annotations

from datetime import UTC

from django.db import connection
from django.db.models import (
    Aggregate,
    Case,
    Count,
    F,
    FloatField,
    IntegerField,
    Max,
    Q,
    Sum,
    Value,
    When,
    Window,
)
from django.db.models.functions import TruncDay, TruncHour

from .. import roles
from ..dbclock import db_now
from ..models import (
    RESOLVED_STATES,
    Conflict,
    ReconcileAttempt,
    ReconcileRequest,
    ResumeDecision,
    RetryRequest,
    RunTransition,
    Tenant,
)
from ..permissions import require
from ..vocab import (
    ReconcileState,
    RecoveryState,
    RetryState,
)
from .ranges import HOUR, ReportRange, _truncate, window
from .rollups import rolled_series
from .sizes import checkpoint_sizes

#: A run in doubt: where the time to resolve starts.
IN_DOUBT = (RecoveryState.AMBIGUOUS, RecoveryState.UNKNOWN_OUTCOME)
#: Where it ends (the partial index ``run_transition_resolved_idx`` has this condition).
RESOLVED = RESOLVED_STATES




class PercentileCont(Aggregate):
    """PostgreSQL's ``PERCENTILE_CONT(fraction) WITHIN GROUP (ORDER BY expression)``."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """``PERCENTILE_CONT`` of ascending ``sorted_values`` (linear interpolation between
    the two nearest ranks), or ``None`` for no values."""
    if not sorted_values:
        return None
    pos = fraction * (len(sorted_values) - 1)
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low))


def _stats(values: list[float]) -> dict:
    values = sorted(values)
    return {"n": len(values), "p50": percentile(values, 0.5), "p95": percentile(values, 0.95),
            "max": float(values[-1]) if values else None}


def _pg() -> bool:
    return connection.vendor == "postgresql"


def _grouped_stats(qs, key: str, value: str) -> dict[str, dict]:
    """``{key: {n, p50, p95, max}}`` of ``value`` over ``qs``: one query (aggregated on
    PostgreSQL, the values read and interpolated in Python elsewhere)."""
    if _pg():
        rows = (qs.order_by().values(key)
                .annotate(n=Count("*"), p50=PercentileCont(value, 0.5),
                          p95=PercentileCont(value, 0.95), top=Max(value)))
        return {r[key]: {"n": r["n"], "p50": r["p50"], "p95": r["p95"],
                         "max": float(r["top"]) if r["top"] is not None else None}
                for r in sorted(rows, key=lambda r: r[key])}
    grouped: dict[str, list] = {}
    for k, v in qs.order_by().values_list(key, value):
        grouped.setdefault(k, []).append(v)
    return {k: _stats(grouped[k]) for k in sorted(grouped)}


def _series(qs, at: str, key: str, w: ReportRange, names=()) -> dict[str, list[int]]:
    """``{key value: [count per bucket]}`` of the rows of ``qs`` with ``at`` in the
    window: one GROUP BY. ``names`` are always present (zeros), in that order, then the
    others found, sorted."""
    trunc = (TruncHour if w.bucket == HOUR else TruncDay)(at, tzinfo=UTC)
    rows = (qs.filter(**{f"{at}__gte": w.start, f"{at}__lt": w.end}).order_by()
            .annotate(bucket=trunc).values("bucket", key).annotate(n=Count("*"))
            .values_list("bucket", key, "n"))
    index = {b: i for i, b in enumerate(w.buckets())}
    out = {name: [0] * len(index) for name in names}
    found: dict[str, list[int]] = {}
    for bucket, name, n in rows:
        i = index.get(_truncate(bucket, w.bucket))
        if i is None:
            continue
        series = out.get(name) if name in out else found.setdefault(name, [0] * len(index))
        series[i] += n
    return out | {k: found[k] for k in sorted(found)}


def _resolution_seconds(tenant: Tenant, w: ReportRange) -> dict:
    """``{n, p50, p95, max}`` of the seconds from doubt to resolution (module docstring)
    of the resolutions in the window: one query.

    The runs resolved in the window are found with ``run_transition_at_idx``; their
    transitions up to the window's end are numbered by episode with a window function
    (``ep``: resolutions so far, including the row itself); a resolution of episode
    ``ep`` is paired with the first entry into doubt of episode ``ep - 1``."""
    resolved = (RunTransition.objects.for_tenant(tenant)
                .filter(at__gte=w.start, at__lt=w.end, to_state__in=RESOLVED)
                .exclude(from_state__in=["", *RESOLVED]).values("run_id"))
    flag = Case(When(to_state__in=RESOLVED, then=Value(1)), default=Value(0),
                output_field=IntegerField())
    history = (RunTransition.objects.for_tenant(tenant)
               .filter(run_id__in=resolved, at__lt=w.end).order_by()
               .annotate(ep=Window(Sum(flag), partition_by=[F("run_id")],
                                   order_by=[F("at").asc(), F("id").asc()]))
               .values_list("run_id", "to_state", "at", "ep"))
    inner, params = history.query.sql_with_params()
    q = connection.ops.quote_name
    doubt = ", ".join(["%s"] * len(IN_DOUBT))
    done = ", ".join(["%s"] * len(RESOLVED))
    if _pg():
        seconds = f"EXTRACT(EPOCH FROM e.{q('at')} - s.started)"
    else:
        seconds = f"(JULIANDAY(e.{q('at')}) - JULIANDAY(s.started)) * 86400.0"
    pairs = (
        f"WITH t(run_id, to_state, {q('at')}, ep) AS ({inner}) "
        f"SELECT {seconds} AS d FROM t e JOIN ("
        f"SELECT run_id, ep, MIN({q('at')}) AS started FROM t WHERE to_state IN ({doubt}) "
        f"GROUP BY run_id, ep) s ON s.run_id = e.run_id AND s.ep = e.ep - 1 "
        f"WHERE e.to_state IN ({done}) AND e.{q('at')} >= %s"
    )
    params = (*params, *IN_DOUBT, *RESOLVED, connection.ops.adapt_datetimefield_value(w.start))
    with connection.cursor() as cursor:
        if _pg():
            cursor.execute(f"SELECT COUNT(*), PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY d), "
                           f"PERCENTILE_CONT(0.95) WITHIN GROUP (ORDER BY d), MAX(d) "
                           f"FROM ({pairs}) x", params)
            n, p50, p95, top = cursor.fetchone()
            return {"n": n, "p50": _float(p50), "p95": _float(p95), "max": _float(top)}
        cursor.execute(pairs, params)
        # JULIANDAY is a double: round to the millisecond the times are stored in.
        return _stats([max(0.0, round(float(d), 3)) for (d,) in cursor.fetchall()])


def _float(value) -> float | None:
    return None if value is None else float(value)


def _reconcile_outcomes(tenant: Tenant, w: ReportRange) -> dict[str, list[int]]:
    label = Case(When(state__in=[ReconcileState.GAVE_UP, ReconcileState.CANCELLED],
                      then=F("state")),
                 When(outcome="", then=F("state")), default=F("outcome"))
    qs = (ReconcileRequest.objects.for_tenant(tenant).filter(finished_at__isnull=False)
          .annotate(label=label))
    return _series(qs, "finished_at", "label", w)


def _approvals(tenant: Tenant, w: ReportRange) -> dict[str, dict[str, int]]:
    rows = (RetryRequest.objects.for_tenant(tenant)
            .filter(decided_at__gte=w.start, decided_at__lt=w.end, decided_by__isnull=False)
            .order_by().values("decided_by__username")
            .annotate(approved=Count("pk", filter=~Q(state=RetryState.REJECTED)),
                      rejected=Count("pk", filter=Q(state=RetryState.REJECTED))))
    return {r["decided_by__username"]: {"approved": r["approved"], "rejected": r["rejected"]}
            for r in sorted(rows, key=lambda r: r["decided_by__username"])}


def _recovery_cost(tenant: Tenant, w: ReportRange) -> dict[str, dict[str, int]]:
    """What recovery cost per kind: the ``usage_burnt`` of the retries consumed in the
    range, summed per counter (``{kind: {counter: total}}``, kinds and counters sorted;
    a retry claimed without usage costs nothing known). One query, summed in Python
    (JSON sums differ between PostgreSQL and SQLite; consumed retries are few)."""
    rows = (RetryRequest.objects.for_tenant(tenant)
            .filter(consumed_at__gte=w.start, consumed_at__lt=w.end)
            .exclude(usage_burnt={}).order_by().values_list("run__kind", "usage_burnt"))
    totals: dict[str, dict[str, int]] = {}
    for kind, burnt in rows:
        into = totals.setdefault(kind, {})
        for counter, spent in (burnt or {}).items():
            into[counter] = into.get(counter, 0) + spent
    return {kind: dict(sorted(v.items())) for kind, v in sorted(totals.items())}


def figures(*, user, tenant: Tenant, range_name: str | None = None,
            start: str | None = None, end: str | None = None) -> dict:
    """Every figure of the report for the tenant over the range (module docstring):
    ``{as_of, range: {name, from, to, bucket}, buckets, runs_entering,
    schema_mismatches, conflicts, reconcile_outcomes, reconcile_answers,
    time_to_resolve_s, resume_age_ms, checkpoint_size_bytes, approvals, recovery_cost}``.

    Ten queries whatever the tenant's size (plus the role check's, when the caller's
    rights are not cached yet): the database clock, one per figure
    (``schema_mismatches`` is read from ``runs_entering``). Raises
    ``NotFound``/``Forbidden`` without a viewer role, ``InvalidPayload`` for a bad range
    (``window``)."""
    require(user, tenant, roles.VIEW)
    as_of = db_now()
    w = window(range_name, start, end, as_of)
    entering = rolled_series(tenant, "runs_entering", RunTransition, "at", "to_state", w,
                             names=RecoveryState.INBOX_TABS)
    in_range = {"gte": w.start, "lt": w.end}
    return {
        "as_of": as_of,
        "range": {"name": w.name, "from": w.start, "to": w.end, "bucket": w.bucket},
        "buckets": w.buckets(),
        "runs_entering": entering,
        "schema_mismatches": entering[RecoveryState.SCHEMA_MISMATCH],
        "conflicts": rolled_series(tenant, "conflicts", Conflict, "created_at", "reason", w),
        "reconcile_outcomes": _reconcile_outcomes(tenant, w),
        "reconcile_answers": _series(ReconcileAttempt.objects.for_tenant(tenant),
                                     "finished_at", "answer", w),
        "time_to_resolve_s": _resolution_seconds(tenant, w),
        "resume_age_ms": _grouped_stats(
            ResumeDecision.objects.for_tenant(tenant).filter(
                at__gte=in_range["gte"], at__lt=in_range["lt"],
                checkpoint_age_ms__isnull=False), "action", "checkpoint_age_ms"),
        "checkpoint_size_bytes": checkpoint_sizes(tenant, w.start, w.end,
                                                  open_end=w.end >= as_of),
        "approvals": _approvals(tenant, w),
        "recovery_cost": _recovery_cost(tenant, w),
    }
