"""The report's rollups (issue 22, item 5; migration 0036): ``CheckpointSizeRollup`` and
``ReportCount`` always equal an aggregate of the rows they count, after writes of every
kind (created, updated through the ORM and, on PostgreSQL, the SQL write path; refused
ones), on both databases; the migration's backfill writes the same rows as the
triggers; the report's percentiles read from them are within the stated bound of the
exact ones (12.5 %), and its counts are exact.
"""

from __future__ import annotations

import importlib
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from checkpoints import reports
from checkpoints.exceptions import StaleRevision
from checkpoints.models import (
    ROLLUP_SHARDS,
    CheckpointRevision,
    CheckpointSizeRollup,
    Conflict,
    ReportCount,
    RunTransition,
)
from checkpoints.reports.aggregates import percentile
from checkpoints.reports.rollups import spans
from checkpoints.reports.sizes import BOUNDS, Histogram, bucket_of, bucket_sql
from tests.helpers import ambiguous_run, envelope, put_checkpoint

MIGRATION = importlib.import_module("checkpoints.migrations.0036_checkpoint_size_rollups")


def _start(at: datetime, hours: int) -> datetime:
    at = at.astimezone(UTC)
    return at.replace(minute=0, second=0, microsecond=0) if hours == 1 else \
        at.replace(hour=0, minute=0, second=0, microsecond=0)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def rolled_sizes(tenant) -> dict:
    """``{(hours, start, kind, bucket): [n, smallest, largest]}`` over the shards."""
    out: dict = {}
    for hours, start, kind, bucket, n, lo, hi in (
            CheckpointSizeRollup.objects.for_tenant(tenant).values_list(
                "hours", "start", "kind", "bucket", "n", "smallest", "largest")):
        cell = out.setdefault((hours, _aware(start), kind, bucket), [0, lo, hi])
        cell[0] += n
        cell[1], cell[2] = min(cell[1], lo), max(cell[2], hi)
    return out


def exact_sizes(tenant) -> dict:
    out: dict = {}
    for at, kind, size in CheckpointRevision.objects.for_tenant(tenant).values_list(
            "received_at", "kind", "payload_size"):
        for hours in (1, 24):
            cell = out.setdefault((hours, _start(at, hours), kind, bucket_of(size)),
                                  [0, size, size])
            cell[0] += 1
            cell[1], cell[2] = min(cell[1], size), max(cell[2], size)
    return out


def rolled_counts(tenant) -> dict:
    out: dict = defaultdict(int)
    for series, hours, start, key, n in ReportCount.objects.for_tenant(tenant).values_list(
            "series", "hours", "start", "key", "n"):
        out[(series, hours, _aware(start), key)] += n
    return dict(out)


def exact_counts(tenant) -> dict:
    out: dict = defaultdict(int)
    for series, model, at, key in (("runs_entering", RunTransition, "at", "to_state"),
                                   ("conflicts", Conflict, "created_at", "reason")):
        for when, value in model.objects.for_tenant(tenant).values_list(at, key):
            for hours in (1, 24):
                out[(series, hours, _start(when, hours), value)] += 1
    return dict(out)


def assert_rollups_true(*tenants):
    for tenant in tenants:
        assert rolled_sizes(tenant) == exact_sizes(tenant), tenant.slug
        assert rolled_counts(tenant) == exact_counts(tenant), tenant.slug


def _writes(writer, tenant, rng: random.Random, runs: int = 6) -> int:
    """Created and updated checkpoints of varied sizes and two kinds, and refused writes
    (stale revisions); returns how many writes were refused."""
    refused = 0
    for i in range(runs):
        body = envelope(kind="acme.order" if i % 2 else "acme.other",
                        payload={"phase": "ready", "pad": "x" * rng.randint(0, 3000)})
        put_checkpoint(writer, tenant, body)
        for revision in range(1, 1 + rng.randint(1, 3)):
            put_checkpoint(writer, tenant, dict(
                body, revision=revision,
                payload={"phase": "ready", "pad": "y" * rng.randint(0, 40_000)}),
                expected=revision - 1)
        # A stale write: refused, kept as a conflict, no revision.
        with pytest.raises(StaleRevision):
            put_checkpoint(writer, tenant, dict(body, revision=1, payload={
                "phase": "ready", "pad": "z" * 50}), expected=0)
        refused += 1
    return refused


def test_the_bucket_bounds_are_frozen_in_the_migration():
    assert MIGRATION.BOUNDS == BOUNDS
    assert MIGRATION.SHARDS == ROLLUP_SHARDS
    assert BOUNDS[0] == 0 and list(BOUNDS) == sorted(set(BOUNDS))
    for lo, hi in zip(BOUNDS[8:], BOUNDS[9:], strict=False):  # from 8 bytes on
        assert (hi - lo) * 8 <= lo, (lo, hi)                  # at most lo / 8 wide


@pytest.mark.django_db
def test_the_sql_bucket_is_the_python_bucket():
    sizes = sorted({*range(0, 300), *(2 ** e + d for e in range(31) for d in (-1, 0, 1)),
                    2 ** 31 - 1} - {-1})
    sizes = [s for s in sizes if 0 <= s < 2 ** 31]
    with connection.cursor() as cursor:
        for size in sizes:
            cursor.execute(f"SELECT {bucket_sql(str(size))}")
            assert cursor.fetchone()[0] == bucket_of(size), size


@pytest.mark.django_db
def test_the_rollups_count_every_stored_revision_and_no_refused_write(acme, globex, wendy,
                                                                       wes):
    rng = random.Random(22)
    assert_rollups_true(acme, globex)
    refused = _writes(wendy, acme, rng) + _writes(wes, globex, rng, runs=3)
    assert Conflict.objects.count() == refused == 9  # kept, counted as conflicts only
    ambiguous_run(wendy, acme)             # a state change by the sweep
    assert_rollups_true(acme, globex)
    day = sum(v[0] for k, v in rolled_sizes(acme).items() if k[0] == 24)
    assert day == CheckpointRevision.objects.for_tenant(acme).count()


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_sql_write_path_keeps_the_rollups(acme, wendy, settings):
    from checkpoints.services import writepath

    settings.RECOVERY_SQL_WRITE_PATH = True
    calls = []
    real = writepath.checkpoint_update

    def spy(**kwargs):
        calls.append(1)
        return real(**kwargs)

    writepath.checkpoint_update = spy
    try:
        _writes(wendy, acme, random.Random(7), runs=3)
    finally:
        writepath.checkpoint_update = real
    assert calls
    assert_rollups_true(acme)


@pytest.mark.django_db
def test_the_backfill_writes_what_the_triggers_wrote(acme, globex, wendy, wes):
    rng = random.Random(5)
    _writes(wendy, acme, rng)
    _writes(wes, globex, rng, runs=2)
    before = (rolled_sizes(acme), rolled_counts(acme), rolled_sizes(globex),
              rolled_counts(globex))
    CheckpointSizeRollup.objects.all().delete()
    ReportCount.objects.all().delete()
    pg = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute(MIGRATION._backfill(MIGRATION.PG_START if pg
                                           else MIGRATION.SQLITE_BACKFILL_START))
        for series, table, at, key, _name in MIGRATION.COUNTED:
            cursor.execute(MIGRATION._count_backfill(series, table, at, key, pg))
    after = (rolled_sizes(acme), rolled_counts(acme), rolled_sizes(globex),
             rolled_counts(globex))
    assert after == before
    assert before[0] and before[1]


def test_a_percentile_of_the_histogram_is_within_an_eighth_of_the_exact_one():
    rng = random.Random(1)
    for trial in range(200):
        n = rng.randint(1, 400)
        scale = rng.choice([10, 1000, 100_000, 10_000_000])
        values = [int(rng.lognormvariate(0, 1) * scale) for _ in range(n)]
        if trial % 7 == 0:
            values = [rng.choice([40, 41, 700, 1500]) for _ in range(n)]
        histogram = Histogram()
        for v in values:
            histogram.add_row(bucket_of(v), 1, v, v)
        ordered = sorted(values)
        for fraction in (0.0, 0.05, 0.5, 0.9, 0.95, 0.99, 1.0):
            exact = percentile(ordered, fraction)
            estimate = histogram.percentile(fraction)
            assert abs(estimate - exact) <= exact / 8, (trial, fraction, exact, estimate)
        stats = histogram.stats()
        assert stats["n"] == n and stats["max"] == max(values)
    assert Histogram().stats() == {"n": 0, "p50": None, "p95": None, "max": None}


def test_small_sizes_and_lone_values_are_exact():
    histogram = Histogram()
    for v in (0, 1, 2, 3, 5, 7, 1000, 5000):
        histogram.add_row(bucket_of(v), 1, v, v)
    values = [0, 1, 2, 3, 5, 7, 1000, 5000]
    for fraction in (0.1, 0.3, 0.5, 0.95):
        assert histogram.percentile(fraction) == percentile(values, fraction)


@pytest.mark.parametrize("open_end", [False, True])
@pytest.mark.parametrize("days", [False, True])
def test_the_spans_cover_the_range_once(days, open_end):
    rng = random.Random(3)
    base = datetime(2026, 11, 1, tzinfo=UTC)
    for _ in range(300):
        start = base + timedelta(minutes=rng.randint(0, 60 * 24 * 40))
        end = start + timedelta(minutes=rng.randint(1, 60 * 24 * 35))
        whole, hours, exact = spans(start, end, days=days, open_end=open_end)
        pieces = sorted(whole + hours + exact)
        assert pieces[0][0] == start
        last = pieces[-1][1]
        assert last == end or (open_end and end < last <= end + timedelta(hours=1)
                               and last.minute == 0)
        for (_, a_hi), (b_lo, _) in zip(pieces, pieces[1:], strict=False):
            assert a_hi == b_lo                           # no gap, no overlap
        assert len(exact) <= 2 and all(hi - lo < timedelta(hours=1) for lo, hi in exact)
        assert all(lo.minute == 0 and (hi - lo) % timedelta(hours=1) == timedelta(0)
                   for lo, hi in hours)
        assert days or not whole
        assert all(lo.hour == 0 and hi.hour == 0 for lo, hi in whole)


@pytest.mark.django_db
def test_the_report_reads_the_rollups_within_the_bound(acme, wendy, vic):
    rng = random.Random(11)
    _writes(wendy, acme, rng, runs=10)
    data = reports.figures(user=vic, tenant=acme, range_name="24h")
    exact: dict[str, list[int]] = defaultdict(list)
    for kind, size in CheckpointRevision.objects.for_tenant(acme).values_list(
            "kind", "payload_size"):
        exact[kind].append(size)
    sizes = data["checkpoint_size_bytes"]
    assert set(sizes) == set(exact)
    for kind, values in exact.items():
        values.sort()
        assert sizes[kind]["n"] == len(values) and sizes[kind]["max"] == values[-1]
        for name, fraction in (("p50", 0.5), ("p95", 0.95)):
            assert abs(sizes[kind][name] - percentile(values, fraction)) <= \
                percentile(values, fraction) / 8
    assert sum(sum(v) for v in data["conflicts"].values()) == \
        Conflict.objects.for_tenant(acme).count()
    assert sum(sum(v) for v in data["runs_entering"].values()) == \
        RunTransition.objects.for_tenant(acme).count()


@pytest.mark.django_db
def test_a_custom_range_counts_its_partial_hours_from_the_rows(acme, wendy, vic):
    """A custom range ending in the past, mid-hour: the rows after its end are not
    counted, those before are (the partial hours are read from the rows)."""
    rng = random.Random(2)
    _writes(wendy, acme, rng, runs=4)
    times = sorted(CheckpointRevision.objects.for_tenant(acme).values_list(
        "received_at", flat=True))
    cut = times[len(times) // 2]
    start = (cut - timedelta(hours=30)).isoformat()
    data = reports.figures(user=vic, tenant=acme, range_name="custom", start=start,
                           end=cut.isoformat())
    want = CheckpointRevision.objects.for_tenant(acme).filter(received_at__lt=cut).count()
    assert sum(v["n"] for v in data["checkpoint_size_bytes"].values()) == want
