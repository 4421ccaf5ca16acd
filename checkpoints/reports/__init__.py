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
  written by database triggers, migration 0013, counted per hour and day in
  ``ReportCount`` by triggers, migration 0036, ``rollups``; a run's creation counts as
  entering its first state);
- ``schema_mismatches``: the ``schema_mismatch`` row of ``runs_entering`` (no query);
- ``conflicts``: refused writes per bucket and reason (``Conflict.created_at``, counted
  in ``ReportCount``);
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
  range (``CheckpointSizeRollup``, a histogram kept from ``CheckpointRevision``: ``n`` and
  ``max`` exact, percentiles within 12.5 %, ``sizes``): ``{kind: {n, p50, p95, max}}``;
- ``recovery_cost``: per kind, the usage the interrupted attempts spent beyond their
  checkpoints, summed over the retries consumed in the range
  (``RetryRequest.usage_burnt``): ``{kind: {counter: total}}``;
- ``approvals``: retry requests decided in the range per approver:
  ``{username: {approved, rejected}}`` (an approved request later consumed or expired
  still counts as approved).

Percentiles are ``PERCENTILE_CONT`` (linear interpolation) on PostgreSQL; on SQLite the
values are read in the same one query and interpolated the same way in Python; checkpoint
sizes interpolate a histogram (``sizes``, docs/reports.md "Rollups").
Series are ``{name: [count per bucket]}`` in ``buckets`` order.
"""

# ruff: noqa: F401 - the package's interface: callers write ``reports.figures(...)``

from .aggregates import (
    IN_DOUBT,
    RESOLVED,
    PercentileCont,
    _approvals,
    _float,
    _grouped_stats,
    _pg,
    _reconcile_outcomes,
    _resolution_seconds,
    _series,
    _stats,
    figures,
    percentile,
)
from .charts import (
    BOTTOM,
    CHART_H,
    CHART_W,
    CHARTED,
    FAMILY_OF,
    FILL,
    LEFT,
    OTHER_FILL,
    SHADE_OF,
    SHADES,
    STAT_FILL,
    TOP,
    _label,
    _tick,
    bar_chart,
    stat_chart,
)
from .export import (
    CSV_CONTEXT,
    FORMULA_STARTS,
    csv_cell,
    csv_filename,
    csv_rows,
    to_csv,
)
from .ranges import (
    BUCKET_SIZE,
    CUSTOM,
    DAY,
    DEFAULT_RANGE,
    EARLIEST,
    FIGURES,
    HOUR,
    HOURLY_UP_TO,
    LATEST,
    MAX_CUSTOM_DAYS,
    MIN_CUSTOM,
    RANGES,
    STATS,
    ReportRange,
    ReportRangeForm,
    _truncate,
    _when,
    window,
)
