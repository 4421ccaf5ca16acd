"""Reading a report range from rollups (issue 22, item 5): the whole UTC days of the
range from day rows, the whole hours left from hour rows, and only the partial hours at
its ends (at most two, each under an hour) from the rows themselves, so a range costs
about the same whatever the tenant's size (``spans``).

The rollups (migration 0036) are kept by database triggers in the same transaction as
the rows they count: ``CheckpointSizeRollup`` (``sizes.checkpoint_sizes``) and
``ReportCount`` (``rolled_series``: runs entering each state, refused writes per reason).
They count what happened, like metrics: a row deleted later (a run's history going with
the run, a purge of payloads) stays counted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils.dateparse import parse_datetime

from ..models import ReportCount, Tenant
from .ranges import HOUR, ReportRange, _truncate

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_HOUR, _DAY = timedelta(hours=1), timedelta(days=1)


def _floor(at: datetime, step: timedelta) -> datetime:
    return _EPOCH + ((at.astimezone(UTC) - _EPOCH) // step) * step


def _ceil(at: datetime, step: timedelta) -> datetime:
    low = _floor(at, step)
    return low if low == at else low + step


def spans(start: datetime, end: datetime, *, days: bool = True, open_end: bool = False):
    """How ``[start, end)`` is read: ``(days, hours, exact)``, lists of ``(lo, hi)``:
    whole UTC days from the day rollups (none when ``days`` is false: a range drawn in
    hours needs hour rows), whole hours from the hour rollups (at most 47 with days),
    and the partial hours at the ends (at most two, each under an hour) from the rows.

    ``open_end``: ``end`` is the database's now (a named range), so nothing lies between
    it and the end of its hour yet: that hour is read whole from its rollup (a row
    committed while the report is read may be counted, as if read a moment later)."""
    if open_end:
        end = _ceil(end, _HOUR)
    h_lo, h_hi = _ceil(start, _HOUR), _floor(end, _HOUR)
    if h_lo >= h_hi:
        return [], [], [(start, end)]
    d_lo, d_hi = _ceil(h_lo, _DAY), _floor(h_hi, _DAY)
    if days and d_lo < d_hi:
        whole, hours = [(d_lo, d_hi)], [(h_lo, d_lo), (d_hi, h_hi)]
    else:
        whole, hours = [], [(h_lo, h_hi)]
    exact = [(start, h_lo), (h_hi, end)]
    return whole, [s for s in hours if s[0] < s[1]], [s for s in exact if s[0] < s[1]]


def between(column: str, pairs) -> tuple[str, list]:
    """``(column >= lo AND column < hi) OR ...`` for ``pairs`` (``1 = 0`` for none), and
    its parameters."""
    adapt = connection.ops.adapt_datetimefield_value
    sql = " OR ".join(f"({column} >= %s AND {column} < %s)" for _ in pairs) or "1 = 0"
    return sql, [adapt(x) for pair in pairs for x in pair]


def rolled_series(tenant: Tenant, series: str, model, at: str, key: str, w: ReportRange,
                  names=()) -> dict[str, list[int]]:
    """``{key value: [count per bucket]}`` of ``model``'s rows of the tenant with ``at``
    in the window, as ``aggregates._series`` answers it, read from ``ReportCount``
    (``series``) and, for the partial hours at the ends, from ``model`` itself: one
    query. ``names`` are always present (zeros), in that order, then the others found,
    sorted."""
    whole, hours, exact = spans(w.start, w.end, days=w.bucket != HOUR,
                                open_end=w.end >= w.as_of)
    q = connection.ops.quote_name
    day_sql, day_params = between(q("start"), whole)
    hour_sql, hour_params = between(q("start"), hours)
    table, counts = model._meta.db_table, ReportCount._meta.db_table
    at_col, key_col = q(model._meta.get_field(at).column), q(model._meta.get_field(key).column)
    # One range scan per partial hour, counted per key: each lies in one bucket.
    edges = "".join(f" UNION ALL SELECT NULL, {key_col}, COUNT(*), {i} FROM {table} "
                    f"WHERE tenant_id = %s AND {at_col} >= %s AND {at_col} < %s "
                    f"GROUP BY {key_col}" for i in range(len(exact)))
    sql = (f"SELECT {q('start')}, {q('key')}, SUM(n), -1 FROM {counts} WHERE tenant_id = %s "
           f"AND series = %s AND ((hours = 24 AND ({day_sql})) OR (hours = 1 AND ({hour_sql}))) "
           f"GROUP BY {q('start')}, {q('key')}{edges}")
    adapt = connection.ops.adapt_datetimefield_value
    params = [tenant.pk, series, *day_params, *hour_params,
              *(x for lo, hi in exact for x in (tenant.pk, adapt(lo), adapt(hi)))]
    index = {b: i for i, b in enumerate(w.buckets())}
    out = {name: [0] * len(index) for name in names}
    found: dict[str, list[int]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for when, name, n, edge in rows:
        if edge >= 0:
            when = exact[edge][0]
        elif not isinstance(when, datetime):  # SQLite: text
            when = parse_datetime(when)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        i = index.get(_truncate(when, w.bucket))
        if i is None:
            continue
        series_of = out.get(name) if name in out else found.setdefault(name, [0] * len(index))
        series_of[i] += int(n)
    return out | {k: found[k] for k in sorted(found)}
