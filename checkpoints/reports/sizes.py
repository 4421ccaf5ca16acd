"""The report's checkpoint sizes from rollups (issue 22, item 5): a log-linear histogram of
payload sizes with fixed bucket bounds, and the percentiles read from it.

``CheckpointSizeRollup`` rows (migration 0036, kept by a trigger on the revision table)
count the revisions of a tenant received in a UTC hour or day, per kind and per size
bucket, with the smallest and largest size of each row. The report reads whole days and
hours from them and only the revisions of the (at most two) partial hours at the range's
ends from the revision table, so a range costs about the same whatever the tenant's size.

Buckets (``BOUNDS``): ``[0, 1)``, then each power of two ``[2^e, 2^(e+1))`` cut into 8
equal parts (fewer below 8 bytes, where parts would be narrower than one byte), up to
``2^31`` (``payload_size`` is a PostgreSQL ``integer``). A bucket starting at ``lo`` is at
most ``lo / 8`` wide.

Error bound (``percentile_of``): ``n`` and ``max`` are exact; a percentile is
``PERCENTILE_CONT``'s linear interpolation between the two nearest ranks, each rank's
value estimated inside its bucket between the bucket's smallest and largest size seen,
so each estimate is within ``largest - smallest < lo / 8 <= value / 8`` of the true
value, and so is their interpolation: **the estimate is within 12.5 % of the exact
percentile** (below it for sizes under 8 bytes, where buckets are one byte wide, and when
a bucket holds one or two sizes: exact).
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import datetime

from django.db import connection

from ..models import CheckpointRevision, CheckpointSizeRollup, Tenant
from .rollups import between, spans

#: Parts of each power of two.
PARTS = 8
#: Sizes at or above this are counted in the last bucket (``integer``'s limit).
TOP = 2 ** 31


def _bounds() -> tuple[int, ...]:
    lows = {0}
    for e in range(31):
        for j in range(PARTS):
            lows.add(2 ** e + (j * 2 ** e) // PARTS)
    return tuple(sorted(lows))


#: The lower bound of every bucket, ascending; bucket ``i`` holds ``[BOUNDS[i], BOUNDS[i+1])``
#: (the last one up to ``TOP``). Frozen in migration 0036 (its trigger's ``CASE``):
#: ``tests/services/test_size_rollups.py`` checks the two are the same.
BOUNDS = _bounds()


def bucket_of(size: int) -> int:
    """The bucket index of a payload of ``size`` bytes (``BOUNDS``)."""
    return max(0, bisect_right(BOUNDS, size) - 1)


def bucket_sql(expr: str, bounds: tuple[int, ...] = BOUNDS) -> str:
    """A SQL ``CASE`` giving ``bucket_of(expr)``: a binary search over ``bounds`` (about
    eight comparisons), the same text on PostgreSQL and SQLite."""
    def tree(lo: int, hi: int) -> str:
        if hi - lo == 1:
            return str(lo)
        mid = (lo + hi) // 2
        return f"CASE WHEN {expr} < {bounds[mid]} THEN {tree(lo, mid)} ELSE {tree(mid, hi)} END"
    return tree(0, len(bounds))


class Histogram:
    """One kind's sizes as ``{bucket: [count, smallest, largest]}``, merged from rollup
    rows (``add_row``) and single revisions (``add``)."""

    def __init__(self):
        self.buckets: dict[int, list[int]] = {}

    def add_row(self, bucket: int, n: int, smallest: int, largest: int) -> None:
        """Merge a rollup row (``n`` sizes of ``bucket``, from ``smallest`` to ``largest``)."""
        cell = self.buckets.get(bucket)
        if cell is None:
            self.buckets[bucket] = [n, smallest, largest]
        else:
            cell[0] += n
            cell[1] = min(cell[1], smallest)
            cell[2] = max(cell[2], largest)

    @property
    def n(self) -> int:
        return sum(c[0] for c in self.buckets.values())

    def value_at(self, rank: int) -> float:
        """The estimated size of the ``rank``-th smallest (0-based) value: spread evenly
        between its bucket's smallest and largest (both exact at the ends)."""
        for b in sorted(self.buckets):
            n, smallest, largest = self.buckets[b]
            if rank < n:
                if n == 1:
                    return float(largest)
                return smallest + (largest - smallest) * rank / (n - 1)
            rank -= n
        raise IndexError(rank)

    def percentile(self, fraction: float) -> float | None:
        """``PERCENTILE_CONT(fraction)`` estimated (module docstring: within 12.5 %), or
        ``None`` for no values."""
        total = self.n
        if not total:
            return None
        pos = fraction * (total - 1)
        low = int(pos)
        high = min(low + 1, total - 1)
        a, b = self.value_at(low), self.value_at(high)
        return float(a + (b - a) * (pos - low))

    def stats(self) -> dict:
        """``{n, p50, p95, max}`` (``n`` and ``max`` exact)."""
        top = max((c[2] for c in self.buckets.values()), default=None)
        return {"n": self.n, "p50": self.percentile(0.5), "p95": self.percentile(0.95),
                "max": float(top) if top is not None else None}


def checkpoint_sizes(tenant: Tenant, start: datetime, end: datetime, *,
                     open_end: bool = False) -> dict[str, dict]:
    """``{kind: {n, p50, p95, max}}`` of the payload sizes of the tenant's revisions
    received in ``[start, end)``, kinds sorted: one query reading the day and hour
    rollups of the whole days and hours of the range (``spans``) and the revisions of its
    partial hours at the ends (``rollups.spans``; ``open_end``: ``end`` is the database's
    now). ``n`` and ``max`` exact, percentiles within 12.5 % (module docstring). Issue
    22, item 5."""
    days, hours, exact = spans(start, end, open_end=open_end)
    r, h = CheckpointSizeRollup._meta.db_table, CheckpointRevision._meta.db_table
    q = connection.ops.quote_name
    day_sql, day_params = between(q("start"), days)
    hour_sql, hour_params = between(q("start"), hours)
    # One range scan of the revisions per partial hour (an OR of two ranges would make
    # PostgreSQL read every revision of the tenant and filter), counted per size
    # (bucketed here: a CASE per row costs more than a hash on the size).
    edges = "".join(f" UNION ALL SELECT kind, NULL, COUNT(*), payload_size, NULL FROM {h} "
                    f"WHERE tenant_id = %s AND received_at >= %s AND received_at < %s "
                    f"GROUP BY kind, payload_size"
                    for _ in exact)
    sql = (f"SELECT kind, bucket, SUM(n), MIN(smallest), MAX(largest) FROM {r} "
           f"WHERE tenant_id = %s AND ((hours = 24 AND ({day_sql})) "
           f"OR (hours = 1 AND ({hour_sql}))) GROUP BY kind, bucket{edges}")
    adapt = connection.ops.adapt_datetimefield_value
    params = [tenant.pk, *day_params, *hour_params,
              *(x for lo, hi in exact for x in (tenant.pk, adapt(lo), adapt(hi)))]
    kinds: dict[str, Histogram] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for kind, bucket, n, smallest, largest in cursor.fetchall():
            histogram = kinds.setdefault(kind, Histogram())
            if bucket is None:  # n revisions of one size (``smallest``), at an end
                histogram.add_row(bucket_of(smallest), int(n), smallest, smallest)
            else:
                histogram.add_row(bucket, int(n), smallest, largest)
    return {kind: kinds[kind].stats() for kind in sorted(kinds)}
