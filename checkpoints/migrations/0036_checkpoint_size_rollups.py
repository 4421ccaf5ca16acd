"""Reports that stay flat (issue 22, item 5). Checkpoint size rollups: ``CheckpointSizeRollup``, a log-linear
histogram of payload sizes per tenant, UTC hour and day, kind and size bucket, kept by a
trigger on the revision table in the same transaction as every revision inserted (the
ORM path, the SQL write path, ``generate_load``, imports), on PostgreSQL and SQLite; then
filled from the revisions already there.

No per-tenant hot row: on PostgreSQL the trigger is per statement (its rows aggregated
and upserted in key order, so two bulk inserts never wait on each other's rows in
opposite orders) and writes to shard ``pg_backend_pid() % 8``, so concurrent writers of
one tenant (one connection each) mostly touch different rows; SQLite has one writer
(shard 0). The bucket is a ``CASE`` over the frozen bounds below
(``checkpoints.reports.sizes.BOUNDS`` when this migration was written; a test compares).

``ReportCount``: the same for the report's two series that grew with the tenant, runs
entering each state (one per ``RunTransition``) and refused writes per reason (one per
``Conflict``), per tenant, hour and day, kept by per-statement triggers on those tables
(SQLite: per row) and filled from their rows.

Also partial indexes: for the report's flagged counts (``selectors.flagged_counts``, which
read every checkpoint and effect of the tenant before) and for its time to resolve (the
resolutions of a range, not every transition).
"""

import django.db.models.deletion
from django.db import migrations, models


SHARDS = 8  # checkpoints.models.ROLLUP_SHARDS when this migration was written
TABLE, ROLLUP = "checkpoints_checkpointrevision", "checkpoints_checkpointsizerollup"
KEY = "tenant_id, hours, start, kind, bucket, shard"
COLS = f"{KEY}, n, smallest, largest"


def _bounds() -> tuple[int, ...]:
    lows = {0}
    for e in range(31):
        for j in range(8):
            lows.add(2 ** e + (j * 2 ** e) // 8)
    return tuple(sorted(lows))


BOUNDS = _bounds()


def _bucket(expr: str) -> str:
    def tree(lo: int, hi: int) -> str:
        if hi - lo == 1:
            return str(lo)
        mid = (lo + hi) // 2
        return f"CASE WHEN {expr} < {BOUNDS[mid]} THEN {tree(lo, mid)} ELSE {tree(mid, hi)} END"
    return tree(0, len(BOUNDS))


def _merge(excluded_n: str) -> str:
    return (f"ON CONFLICT ({KEY}) DO UPDATE SET n = {ROLLUP}.n + {excluded_n}, "
            f"smallest = {{least}}({ROLLUP}.smallest, excluded.smallest), "
            f"largest = {{greatest}}({ROLLUP}.largest, excluded.largest)")


PG_START = "date_trunc(CASE WHEN h.hours = 1 THEN 'hour' ELSE 'day' END, received_at, 'UTC')"
PG_UP = f"""
CREATE OR REPLACE FUNCTION {ROLLUP}_keep() RETURNS trigger AS $$
BEGIN
    INSERT INTO {ROLLUP} ({COLS})
    SELECT tenant_id, h.hours, {PG_START}, kind, {_bucket("payload_size")},
           pg_backend_pid() % {SHARDS}, COUNT(*), MIN(payload_size), MAX(payload_size)
    FROM added CROSS JOIN (VALUES (1), (24)) AS h(hours)
    GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6
    {_merge("excluded.n").format(least="LEAST", greatest="GREATEST")};
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS {ROLLUP}_keep ON {TABLE};
CREATE TRIGGER {ROLLUP}_keep AFTER INSERT ON {TABLE} REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {ROLLUP}_keep();
"""

SQLITE_START = {1: "STRFTIME('%Y-%m-%d %H:00:00', {at})", 24: "STRFTIME('%Y-%m-%d 00:00:00', {at})"}


def _sqlite_upsert(hours: int) -> str:
    return (f"INSERT INTO {ROLLUP} ({COLS}) VALUES (NEW.tenant_id, {hours}, "
            f"{SQLITE_START[hours].format(at='NEW.received_at')}, NEW.kind, "
            f"{_bucket('NEW.payload_size')}, 0, 1, NEW.payload_size, NEW.payload_size) "
            f"{_merge('1').format(least='MIN', greatest='MAX')};")


SQLITE_UP = (f"CREATE TRIGGER {ROLLUP}_ins AFTER INSERT ON {TABLE} "
             f"BEGIN {_sqlite_upsert(24)} {_sqlite_upsert(1)} END;")


def _backfill(start: str) -> str:
    return (f"INSERT INTO {ROLLUP} ({COLS}) "
            f"SELECT tenant_id, h.hours, {start}, kind, {_bucket('payload_size')}, 0, "
            f"COUNT(*), MIN(payload_size), MAX(payload_size) "
            f"FROM {TABLE} CROSS JOIN (SELECT 1 AS hours UNION ALL SELECT 24) h "
            f"GROUP BY 1, 2, 3, 4, 5")


SQLITE_BACKFILL_START = (f"CASE WHEN h.hours = 1 THEN {SQLITE_START[1].format(at='received_at')} "
                         f"ELSE {SQLITE_START[24].format(at='received_at')} END")


#: ``ReportCount``: (series, source table, its time column, its key column).
COUNTED = [
    ("runs_entering", "checkpoints_runtransition", "at", "to_state", "transition"),
    ("conflicts", "checkpoints_conflict", "created_at", "reason", "conflict"),
]
COUNTS = "checkpoints_reportcount"
COUNT_KEY = "tenant_id, series, hours, start, key, shard"


def _pg_count(series: str, table: str, at: str, key: str, name: str) -> str:
    start = f"date_trunc(CASE WHEN h.hours = 1 THEN 'hour' ELSE 'day' END, {at}, 'UTC')"
    fn = f"{COUNTS}_{name}"
    return f"""
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger AS $$
BEGIN
    INSERT INTO {COUNTS} ({COUNT_KEY}, n)
    SELECT tenant_id, '{series}', h.hours, {start}, {key}, pg_backend_pid() % {SHARDS}, COUNT(*)
    FROM added CROSS JOIN (VALUES (1), (24)) AS h(hours)
    GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT ({COUNT_KEY}) DO UPDATE SET n = {COUNTS}.n + excluded.n;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS {fn} ON {table};
CREATE TRIGGER {fn} AFTER INSERT ON {table} REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {fn}();
"""


def _sqlite_count(series: str, table: str, at: str, key: str, name: str) -> str:
    upserts = " ".join(
        f"INSERT INTO {COUNTS} ({COUNT_KEY}, n) VALUES (NEW.tenant_id, '{series}', {hours}, "
        f"{SQLITE_START[hours].format(at=f'NEW.{at}')}, NEW.{key}, 0, 1) "
        f"ON CONFLICT ({COUNT_KEY}) DO UPDATE SET n = {COUNTS}.n + 1;" for hours in (24, 1))
    return f"CREATE TRIGGER {COUNTS}_{name}_ins AFTER INSERT ON {table} BEGIN {upserts} END;"


def _count_backfill(series: str, table: str, at: str, key: str, pg: bool) -> str:
    start = (f"date_trunc(CASE WHEN h.hours = 1 THEN 'hour' ELSE 'day' END, {at}, 'UTC')"
             if pg else f"CASE WHEN h.hours = 1 THEN {SQLITE_START[1].format(at=at)} "
                        f"ELSE {SQLITE_START[24].format(at=at)} END")
    return (f"INSERT INTO {COUNTS} ({COUNT_KEY}, n) "
            f"SELECT tenant_id, '{series}', h.hours, {start}, {key}, 0, COUNT(*) "
            f"FROM {table} CROSS JOIN (SELECT 1 AS hours UNION ALL SELECT 24) h "
            f"GROUP BY 1, 2, 3, 4, 5")


def up(apps, schema_editor):
    # The triggers first, then the backfills, in the migration's transaction: CREATE
    # TRIGGER locks its table against inserts until commit, so no row is counted twice
    # or missed.
    pg = schema_editor.connection.vendor == "postgresql"
    if pg:
        schema_editor.execute(PG_UP, params=None)
        schema_editor.execute(_backfill(PG_START), params=None)
    else:
        schema_editor.execute(SQLITE_UP, params=None)
        schema_editor.execute(_backfill(SQLITE_BACKFILL_START), params=None)
    for series, table, at, key, name in COUNTED:
        schema_editor.execute((_pg_count if pg else _sqlite_count)(series, table, at, key, name),
                              params=None)
        schema_editor.execute(_count_backfill(series, table, at, key, pg), params=None)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {ROLLUP}_keep ON {TABLE}; "
                              f"DROP FUNCTION IF EXISTS {ROLLUP}_keep();", params=None)
        for _series, table, _at, _key, name in COUNTED:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {COUNTS}_{name} ON {table}; "
                                  f"DROP FUNCTION IF EXISTS {COUNTS}_{name}();", params=None)
    else:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {ROLLUP}_ins;", params=None)
        for *_rest, name in COUNTED:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {COUNTS}_{name}_ins;", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0035_audit_merkle_tree'),
    ]

    operations = [
        migrations.CreateModel(
            name='CheckpointSizeRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hours', models.PositiveSmallIntegerField()),
                ('start', models.DateTimeField()),
                ('kind', models.CharField(max_length=200)),
                ('bucket', models.PositiveSmallIntegerField()),
                ('shard', models.PositiveSmallIntegerField()),
                ('n', models.BigIntegerField()),
                ('smallest', models.PositiveIntegerField()),
                ('largest', models.PositiveIntegerField()),
                ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant', 'hours', 'start', 'kind', 'bucket', 'shard'), name='checkpoint_size_rollup_unique')],
            },
        ),
        # The report's flagged counts (selectors.flagged_counts): partial indexes that
        # hold only what screening flagged.
        migrations.AddIndex(
            model_name='checkpoint',
            index=models.Index(condition=models.Q(('secret_paths', []), _negated=True), fields=['tenant', 'run'], name='checkpoint_secret_idx'),
        ),
        migrations.AddIndex(
            model_name='checkpoint',
            index=models.Index(condition=models.Q(('large_above__isnull', False)), fields=['tenant'], name='checkpoint_large_idx'),
        ),
        migrations.AddIndex(
            model_name='effect',
            index=models.Index(condition=models.Q(('secret_paths', []), _negated=True), fields=['tenant', 'run'], name='effect_secret_idx'),
        ),
        migrations.CreateModel(
            name='ReportCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('series', models.CharField(max_length=16)),
                ('hours', models.PositiveSmallIntegerField()),
                ('start', models.DateTimeField()),
                ('key', models.CharField(max_length=24)),
                ('shard', models.PositiveSmallIntegerField()),
                ('n', models.BigIntegerField()),
                ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='checkpoints.tenant')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant', 'series', 'hours', 'start', 'key', 'shard'), name='report_count_unique')],
            },
        ),
        # The report's time to resolve: only the resolutions of a range (partial).
        migrations.AddIndex(
            model_name='runtransition',
            index=models.Index(condition=models.Q(('to_state__in', ('healthy', 'completed', 'closed')), models.Q(('from_state__in', ['', 'healthy', 'completed', 'closed']), _negated=True)), fields=['tenant', 'at'], include=('run',), name='run_transition_resolved_idx'),
        ),
        migrations.RunPython(up, down),
    ]
