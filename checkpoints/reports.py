"""The report's figures over time (issue 9, item 6): what happened to a tenant's runs in
a chosen range, read in a fixed number of aggregate queries whatever the number of rows.

Range (``ReportRangeForm``, ``window``): ``24h``, ``7d`` (the default), ``30d`` ending at
the database clock's now (``as_of``), or ``custom`` with ``from``/``to`` (ISO 8601 date
or date-time, UTC when no offset is given; ``to`` after ``from``, at most
``MAX_CUSTOM_DAYS`` days apart, from the year 2000 on and before the year 9000: see
``_when``). Buckets are hours for a range of
up to ``HOURLY_UP_TO`` and days beyond, aligned on UTC; a bucket holds
``[start, start + size)``; the first bucket holds the range's start.

Figures (``figures``), each from one aggregate query unless said otherwise:

- ``runs_entering``: runs entering each recovery state, per bucket (``RunTransition``,
  written by database triggers, migration 0013; a run's creation counts as entering its
  first state);
- ``schema_mismatches``: the ``schema_mismatch`` row of ``runs_entering`` (no query);
- ``conflicts``: refused writes per bucket and reason (``Conflict.created_at``);
- ``reconcile_outcomes``: reconcile requests finished per bucket, by outcome (the effect
  state reconciliation settled, ``moved_on``, or the request's state when it gave up or
  was cancelled);
- ``reconcile_answers``: look-ups made per bucket, by what the service answered
  (``ReconcileAttempt.answer``);
- ``time_to_resolve_s``: seconds from a run entering ``ambiguous``/``unknown_outcome``
  (the first such entry since its previous resolution) to its next move to ``healthy``,
  ``completed`` or ``closed``, for the resolutions in the range: ``{n, p50, p95, max}``;
- ``resume_age_ms``: per resume action, the age of the latest checkpoint when a runtime
  claimed a resume decision (``ResumeDecision``): ``{action: {n, p50, p95, max}}``;
- ``checkpoint_size_bytes``: per kind, the payload size of the revisions accepted in the
  range (``CheckpointRevision``): ``{kind: {n, p50, p95, max}}``;
- ``approvals``: retry requests decided in the range per approver:
  ``{username: {approved, rejected}}`` (an approved request later consumed or expired
  still counts as approved).

Percentiles are ``PERCENTILE_CONT`` (linear interpolation) on PostgreSQL; on SQLite the
values are read in the same one query and interpolated the same way in Python.
Series are ``{name: [count per bucket]}`` in ``buckets`` order.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from django import forms
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
from django.utils.dateparse import parse_date, parse_datetime

from . import roles
from .dbclock import db_now
from .exceptions import InvalidPayload
from .models import (
    CheckpointRevision,
    Conflict,
    ReconcileAttempt,
    ReconcileRequest,
    ResumeDecision,
    RetryRequest,
    RunTransition,
    Tenant,
)
from .permissions import require
from .querystring import single_values
from .vocab import (
    BADGE_CLASSES,
    ConflictReason,
    EffectState,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    RetryState,
    words,
)

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
CUSTOM = "custom"
DEFAULT_RANGE = "7d"
MAX_CUSTOM_DAYS = 366
MIN_CUSTOM = timedelta(hours=1)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
#: A custom range ends at the latest at this instant (``to=8999-12-31`` is the last day),
#: far from the end of Python's calendar (9999-12-31): no range, bucket or zone change
#: can overflow ``datetime``.
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
#: Ranges up to this long are drawn in hours, longer ones in days.
HOURLY_UP_TO = timedelta(days=3)
HOUR, DAY = "hour", "day"
BUCKET_SIZE = {HOUR: timedelta(hours=1), DAY: timedelta(days=1)}

#: A run in doubt: where the time to resolve starts.
IN_DOUBT = (RecoveryState.AMBIGUOUS, RecoveryState.UNKNOWN_OUTCOME)
#: Where it ends.
RESOLVED = (RecoveryState.HEALTHY, RecoveryState.COMPLETED, RecoveryState.CLOSED)

#: Every figure a CSV can be asked for (``?figure=``), in the page's order.
FIGURES = ("runs_entering", "schema_mismatches", "conflicts", "reconcile_outcomes",
           "reconcile_answers", "time_to_resolve_s", "resume_age_ms",
           "checkpoint_size_bytes", "approvals")
#: The columns of a percentile summary.
STATS = ("n", "p50", "p95", "max")


# --------------------------------------------------------------------------------------
# The range
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReportRange:
    """A report's range: ``name`` (``RANGES`` key or ``custom``), ``[start, end)`` as
    aware UTC datetimes, the bucket size (``hour``/``day``) and ``as_of``, the database
    time the report was read at."""

    name: str
    start: datetime
    end: datetime
    bucket: str
    as_of: datetime

    def buckets(self) -> list[datetime]:
        """The start of every bucket, first one holding ``start``, in order."""
        step = BUCKET_SIZE[self.bucket]
        first = _truncate(self.start, self.bucket)
        out = []
        while first < self.end:
            out.append(first)
            first += step
        return out


def _truncate(value: datetime, bucket: str) -> datetime:
    value = value.astimezone(UTC)
    if bucket == HOUR:
        return value.replace(minute=0, second=0, microsecond=0)
    return value.replace(hour=0, minute=0, second=0, microsecond=0)


def _when(text: str, field: str, *, end: bool) -> datetime:
    """``text`` (ISO 8601 date or date-time) as an aware UTC datetime; a date alone is
    its midnight (the day after for ``to``, so ``to=2026-11-30`` includes that day).
    Raises ``InvalidPayload`` naming ``field``: not a date, or outside
    ``[EARLIEST, LATEST]`` once in UTC.

    The year is checked as written, before any arithmetic or change of zone: Python's
    ``datetime`` ends at the years 1 and 9999, and ``9999-12-31`` as a ``to`` (the
    midnight after it) or ``0001-01-01T00:00+01:00`` in UTC would raise ``OverflowError``
    (a 500) instead of this 400."""
    try:  # a date alone first: Python's ``fromisoformat`` would read it as a midnight
        day = parse_date(text)
        moment = None if day else parse_datetime(text)
    except (ValueError, OverflowError):
        moment = day = None
    if moment is None and day is None:
        raise InvalidPayload(f"{field}: not an ISO 8601 date or date-time "
                             f"(2026-11-30 or 2026-11-30T12:00Z)")
    year = (moment or day).year
    if year < EARLIEST.year:
        raise InvalidPayload(f"{field}: must be in the year {EARLIEST.year} or later")
    if year >= LATEST.year:
        raise InvalidPayload(f"{field}: must be before the year {LATEST.year}")
    if moment is None:
        moment = datetime.combine(day + timedelta(days=1) if end else day, time(),
                                  tzinfo=UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)   # within a day of years 2000..8999: no overflow
    if moment < EARLIEST:
        raise InvalidPayload(f"{field}: must be in the year {EARLIEST.year} or later")
    if moment > LATEST:
        raise InvalidPayload(f"{field}: must be before the year {LATEST.year}")
    return moment


def window(range_name: str | None, start: str | None, end: str | None,
           as_of: datetime) -> ReportRange:
    """The ``ReportRange`` of the query parameters ``range``/``from``/``to`` (already checked
    for type and length by ``ReportRangeForm`` or the API's ``ReportParams``), ending at
    ``as_of`` (the database's now) for a named range. ``from``/``to`` alone mean
    ``range=custom``. Raises ``InvalidPayload`` naming the field: an unknown range,
    ``from``/``to`` with a named range, a custom range without both, a bad date or one
    before the year 2000 or from the year 9000 on (``_when``), ``to``
    not after ``from``, shorter than an hour or longer than ``MAX_CUSTOM_DAYS`` days."""
    name = range_name or (CUSTOM if (start or end) else DEFAULT_RANGE)
    if name in RANGES:
        if start or end:
            raise InvalidPayload(f"{'from' if start else 'to'}: only with range=custom")
        lo, hi = as_of - RANGES[name], as_of
    elif name == CUSTOM:
        if not start:
            raise InvalidPayload("from: required with range=custom")
        if not end:
            raise InvalidPayload("to: required with range=custom")
        lo, hi = _when(start, "from", end=False), _when(end, "to", end=True)
        if hi <= lo:
            raise InvalidPayload("to: must be after from")
        if hi - lo < MIN_CUSTOM:
            raise InvalidPayload("to: the range must be at least one hour long")
        if hi - lo > timedelta(days=MAX_CUSTOM_DAYS):
            raise InvalidPayload(f"to: the range must be at most {MAX_CUSTOM_DAYS} days long")
    else:
        raise InvalidPayload(f"range: must be one of {', '.join([*RANGES, CUSTOM])}")
    bucket = HOUR if hi - lo <= HOURLY_UP_TO else DAY
    return ReportRange(name=name, start=lo, end=hi, bucket=bucket, as_of=as_of)


class ReportRangeForm(forms.Form):
    """The report page's query string: ``range`` (``24h``/``7d``/``30d``/``custom``),
    ``from``/``to`` (ISO 8601, at most 32 characters), ``format`` (``html``/``csv``) and
    ``figure`` (one of ``FIGURES``, required with ``format=csv``). Cross-field rules are
    ``window``'s. A repeated parameter is refused (400 naming it)."""

    range = forms.ChoiceField(required=False, choices=[(k, k) for k in [*RANGES, CUSTOM]])
    start = forms.CharField(required=False, max_length=32, strip=True)
    end = forms.CharField(required=False, max_length=32, strip=True)
    format = forms.ChoiceField(required=False, choices=[("html", "html"), ("csv", "csv")])
    figure = forms.ChoiceField(required=False, choices=[(f, f) for f in FIGURES])

    #: query parameter -> form field (``from`` is a Python keyword)
    NAMES = {"range": "range", "from": "start", "to": "end", "format": "format",
             "figure": "figure"}

    @classmethod
    def parse(cls, query, query_string: str = "") -> dict:
        """``query`` (a ``QueryDict``) of the raw ``query_string`` checked: ``{range, start,
        end, format, figure}``. Raises ``InvalidPayload`` naming the parameter (not UTF-8,
        unknown, repeated or invalid; ``querystring.single_values``, as every dashboard
        page and the API)."""
        values = single_values(query_string, query, known=cls.NAMES)
        form = cls({cls.NAMES[k]: v for k, v in values.items()})
        if not form.is_valid():
            field, errors = next(iter(form.errors.items()))
            name = {v: k for k, v in cls.NAMES.items()}.get(field, field)
            raise InvalidPayload(f"{name}: {errors[0]}")
        data = form.cleaned_data
        if data["format"] == "csv" and not data["figure"]:
            raise InvalidPayload(f"figure: required with format=csv (one of "
                                 f"{', '.join(FIGURES)})")
        return data


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------

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


def figures(*, user, tenant: Tenant, range_name: str | None = None,
            start: str | None = None, end: str | None = None) -> dict:
    """Every figure of the report for the tenant over the range (module docstring):
    ``{as_of, range: {name, from, to, bucket}, buckets, runs_entering,
    schema_mismatches, conflicts, reconcile_outcomes, reconcile_answers,
    time_to_resolve_s, resume_age_ms, checkpoint_size_bytes, approvals}``.

    Nine queries whatever the tenant's size (plus the role check's, when the caller's
    rights are not cached yet): the database clock, one per figure
    (``schema_mismatches`` is read from ``runs_entering``). Raises
    ``NotFound``/``Forbidden`` without a viewer role, ``InvalidPayload`` for a bad range
    (``window``)."""
    require(user, tenant, roles.VIEW)
    as_of = db_now()
    w = window(range_name, start, end, as_of)
    entering = _series(RunTransition.objects.for_tenant(tenant), "at", "to_state", w,
                       names=RecoveryState.INBOX_TABS)
    in_range = {"gte": w.start, "lt": w.end}
    return {
        "as_of": as_of,
        "range": {"name": w.name, "from": w.start, "to": w.end, "bucket": w.bucket},
        "buckets": w.buckets(),
        "runs_entering": entering,
        "schema_mismatches": entering[RecoveryState.SCHEMA_MISMATCH],
        "conflicts": _series(Conflict.objects.for_tenant(tenant), "created_at", "reason", w),
        "reconcile_outcomes": _reconcile_outcomes(tenant, w),
        "reconcile_answers": _series(ReconcileAttempt.objects.for_tenant(tenant),
                                     "finished_at", "answer", w),
        "time_to_resolve_s": _resolution_seconds(tenant, w),
        "resume_age_ms": _grouped_stats(
            ResumeDecision.objects.for_tenant(tenant).filter(
                at__gte=in_range["gte"], at__lt=in_range["lt"],
                checkpoint_age_ms__isnull=False), "action", "checkpoint_age_ms"),
        "checkpoint_size_bytes": _grouped_stats(
            CheckpointRevision.objects.for_tenant(tenant).filter(
                received_at__gte=in_range["gte"], received_at__lt=in_range["lt"]),
            "kind", "payload_size"),
        "approvals": _approvals(tenant, w),
    }


# --------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------

#: A cell starting with one of these is read as a formula by spreadsheets (OWASP, "CSV
#: injection"): such a cell is written with a leading ``'``.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    """``value`` as a CSV cell safe to open in a spreadsheet: ``None`` is empty, a
    datetime ISO 8601 UTC, a float with at most 3 decimals, text starting with a
    ``FORMULA_STARTS`` character prefixed with ``'`` (OWASP "CSV injection")."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    text = str(value)
    if text.startswith(FORMULA_STARTS):
        return "'" + text
    return text


#: The columns every row of a CSV ends with: the range and the database time the figures
#: were read at (a plain table, one header row: spreadsheets and ``pandas.read_csv`` read
#: it as it is).
CSV_CONTEXT = ("from", "to", "as_of")


def csv_rows(data: dict, figure: str) -> list[list]:
    """The rows (header first, every row as long as the header) of one figure of
    ``figures``' answer: a series as ``bucket, <one column per name>``; a percentile
    summary as ``<key>, n, p50, p95, max``; approvals as ``approver, approved,
    rejected``; ``time_to_resolve_s`` as one row of ``n, p50, p95, max``. Every row ends
    with the ``CSV_CONTEXT`` columns: the range's ``from``/``to`` and ``as_of``."""
    value = data[figure]
    if figure == "schema_mismatches":
        value = {"schema_mismatch": value}
    if figure in ("runs_entering", "schema_mismatches", "conflicts", "reconcile_outcomes",
                  "reconcile_answers"):
        names = list(value)
        rows = [["bucket", *names]]
        rows += [[b, *(value[n][i] for n in names)] for i, b in enumerate(data["buckets"])]
    elif figure == "time_to_resolve_s":
        rows = [list(STATS), [value[s] for s in STATS]]
    elif figure == "approvals":
        rows = [["approver", "approved", "rejected"]]
        rows += [[who, v["approved"], v["rejected"]] for who, v in value.items()]
    else:
        key = "action" if figure == "resume_age_ms" else "kind"
        rows = [[key, *STATS]] + [[k, *(v[s] for s in STATS)] for k, v in value.items()]
    context = [data["range"]["from"], data["range"]["to"], data["as_of"]]
    return [[*rows[0], *CSV_CONTEXT]] + [[*row, *context] for row in rows[1:]]


def csv_filename(data: dict, tenant_slug: str, figure: str) -> str:
    """The download's file name: ``<tenant>-<figure>-<range>-as-of-<UTC time>.csv``, e.g.
    ``acme-approvals-7d-as-of-20261201T003000Z.csv`` (the time ``figures`` read at)."""
    as_of = data["as_of"].astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{tenant_slug}-{figure}-{data['range']['name']}-as-of-{as_of}.csv"


def to_csv(data: dict, figure: str) -> str:
    """One figure as CSV text (``csv_rows``, every cell through ``csv_cell``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    for row in csv_rows(data, figure):
        writer.writerow([csv_cell(c) for c in row])
    return out.getvalue()


# --------------------------------------------------------------------------------------
# Charts: geometry for server-drawn inline SVG (no script, no style attribute: the
# Content-Security-Policy forbids both; colours are SVG ``fill`` attributes)
# --------------------------------------------------------------------------------------

#: The dashboard's colours per badge family (``BADGE_CLASSES``), as ``static/css/app.css``
#: writes them: the family's colour (``--amber``, the state bars of the page's top), its
#: ink (``--amber-ink``, the badge's text) and its badge border. A chart's fill must be a
#: colour the page already uses for that word's badge (``tests/services/test_reports.py``
#: reads app.css to hold the two together).
SHADES = {
    "amber": ("#e0a100", "#8a5a00", "#f5d88a"),
    "orange": ("#ea6a12", "#9a3d00", "#f7bf98"),
    "purple": ("#8649e0", "#5b2aa8", "#d3bdf7"),
    "red": ("#d93636", "#a31d1d", "#f4b9b9"),
    "blue": ("#2f6fe0", "#1e4fb3", "#bcd3fb"),
    "teal": ("#18a595", "#0d6b60", "#a5e0d7"),
    "green": ("#2f9e55", "#1d6b34", "#b9e4c4"),
    "grey": ("#9aa2b1", "#4b5567", "#d7dbe3"),
}
#: Families of the charted words no badge colours: a refused write is a conflict (orange).
FAMILY_OF = {ConflictReason.STALE_REVISION: "orange", ConflictReason.ID_EXISTS: "orange",
             ConflictReason.FENCED: "orange"}
#: The shade (index into ``SHADES``) of the words whose family meets itself in one chart;
#: every other word takes its family's colour (0). Runs: completed/closed; outcomes:
#: submitted/unresolved/running, failed/gave_up/unknown, moved_on/cancelled/planned,
#: confirmed/done; answers: owner_live/settling, failed/no_lookup; conflicts: all three.
SHADE_OF = {
    RecoveryState.CLOSED: 1,
    EffectState.UNRESOLVED: 1, ReconcileState.RUNNING: 2,
    ReconcileState.GAVE_UP: 1, EffectState.UNKNOWN: 2,
    ReconcileState.CANCELLED: 1, EffectState.PLANNED: 2,
    ReconcileState.DONE: 1,
    ReconcileAnswer.SETTLING: 1, ReconcileAnswer.NO_LOOKUP: 1,
    ConflictReason.ID_EXISTS: 1, ConflictReason.FENCED: 2,
}
#: Every word a series chart can draw: what runs enter, what reconcile requests ended
#: with (an effect state, ``moved_on`` or the request's state), what look-ups answered,
#: why writes were refused.
CHARTED = (*RecoveryState.values, *EffectState.values, *ReconcileState.values,
           *ReconcileAnswer.values, *ConflictReason.values)
#: THE colour of each charted word, the same in every chart and the same family as its
#: badge (``not_executed`` is teal in "Reconciliation outcomes" and "Look-up answers"
#: alike). ``bar_chart`` takes no other colours.
FILL: dict[str, str] = {
    word: SHADES[FAMILY_OF.get(word) or BADGE_CLASSES[word]][SHADE_OF.get(word, 0)]
    for word in CHARTED}
#: A word outside the vocabulary (a value written before an enum changed): neutral.
OTHER_FILL = "#6b7385"
#: A percentile summary's bars: ``max`` lightest, ``p95``, ``p50`` darkest (blue family).
STAT_FILL = (("max", "#cbd5e1"), ("p95", "#60a5fa"), ("p50", "#1d4ed8"))
CHART_W, CHART_H, LEFT, BOTTOM, TOP = 720, 200, 44, 22, 8


def _label(moment: datetime, bucket: str) -> str:
    return moment.strftime("%H:00" if bucket == HOUR else "%m-%d")


def bar_chart(series: dict[str, list[int]], buckets: list[datetime], bucket: str) -> dict:
    """Stacked bars, one per bucket: ``{width, height, bars: [{x, y, w, h, fill, title}],
    ticks: [{x, label}], grid: [{y, label}], legend: [{name, fill, total}], total}``
    in the SVG's user units (``viewBox 0 0 width height``). Each series is drawn in its
    word's ``FILL`` (``OTHER_FILL`` for a word outside it), whatever the chart. Series
    with no count are left out of the bars but kept in the legend with 0."""
    names = list(series)
    colour = {n: FILL.get(n, OTHER_FILL) for n in names}
    totals = [sum(series[n][i] for n in names) for i in range(len(buckets))]
    top = max(totals, default=0) or 1
    plot_w, plot_h = CHART_W - LEFT - 4, CHART_H - BOTTOM - TOP
    step = plot_w / max(1, len(buckets))
    width = max(1.0, step * 0.8)
    bars = []
    for i, moment in enumerate(buckets):
        y = TOP + plot_h
        for n in names:
            count = series[n][i]
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            bars.append({"x": round(LEFT + i * step + (step - width) / 2, 2), "y": round(y, 2),
                         "w": round(width, 2), "h": round(h, 2), "fill": colour[n],
                         "title": f"{_label(moment, bucket)} {moment:%Y-%m-%d}: "
                                  f"{words(n)} {count}"})
    every = max(1, len(buckets) // 8)
    ticks = [{"x": round(LEFT + i * step + step / 2, 2), "label": _label(m, bucket)}
             for i, m in enumerate(buckets) if i % every == 0]
    grid = [{"y": round(TOP + plot_h - plot_h * f, 2), "label": _tick(top * f)}
            for f in (0, 0.5, 1)]
    return {"width": CHART_W, "height": CHART_H, "bars": bars, "ticks": ticks, "grid": grid,
            "left": LEFT, "right": CHART_W - 4, "baseline": TOP + plot_h,
            "legend": [{"name": n, "fill": colour[n], "total": sum(series[n])} for n in names],
            "total": sum(totals)}


def _tick(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def stat_chart(stats: dict[str, dict], unit: str) -> dict:
    """Horizontal bars, one row per key, its ``max``, ``p95`` and ``p50`` drawn over each
    other (lightest to darkest): ``{width, height, rows: [{y, label, bars: [{w, fill,
    title}]}]}``; ``unit`` is added to the titles."""
    top = max((s["max"] or 0 for s in stats.values()), default=0) or 1
    label_w, row_h = 180, 22
    plot_w = CHART_W - label_w - 8
    rows = []
    for i, (key, s) in enumerate(stats.items()):
        bars = []
        for name, fill in STAT_FILL:
            value = s[name] or 0
            bars.append({"x": label_w, "w": round(max(1.0, plot_w * value / top), 2),
                         "fill": fill, "title": f"{key} {name} {_tick(value)} {unit}"})
        rows.append({"y": i * row_h + 4, "label": key if len(key) <= 28 else key[:27] + "…",
                     "bars": bars, "text_y": i * row_h + 16})
    return {"width": CHART_W, "height": max(row_h, len(rows) * row_h + 8), "rows": rows,
            "label_w": label_w - 6}
