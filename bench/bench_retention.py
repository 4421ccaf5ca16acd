#!/usr/bin/env python
"""Retention purge benchmark (issue 20, "Done when": purge speed): how fast the scheduled
purge deletes ``--runs`` eligible runs (default 10,000), in runs per second, against a
reference: the same rows deleted by plain bulk ``DELETE`` statements (no lock, no
tombstone, no audit event, no fencing: the floor any purge pays).

On its own PostgreSQL database (``--db``, dropped and created; the name must contain
"bench"), it builds ``--runs`` completed runs (two checkpoint revisions each, and one
confirmed effect every other run), sets a one-day payload retention, ages the world two
days and times ``services.retention_purge`` (phase 1: a tombstone and an audit event per
run, one transaction each). It then builds as many runs again and times the reference
delete of their checkpoints and revisions. Prints both, the ratio and the size of a
tombstone's row; asserts nothing (a benchmark, not a test).

    .venv/bin/python bench/bench_retention.py [--runs 10000] \\
        [--pg-url postgres://postgres@127.0.0.1:5432/recovery] [--db recovery_bench_retention]
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import standalone  # noqa: E402


def main() -> None:
    standalone(__doc__, run, runs=10_000, db="recovery_bench_retention")


def run(n: int) -> None:
    import django

    django.setup()
    # Django is set up only now (the database URL is the bench's): imports after it.
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from checkpoints import services
    from checkpoints.models import Checkpoint, CheckpointRevision, Run, Tombstone
    from tests.helpers import age_world, effect_body, envelope, put_checkpoint, walk_effect

    tenant = services.tenant_create(slug="bench", name="bench")
    writer = services.account_create(username="bench-writer", password=None, service=True)
    services.role_grant(actor=None, tenant=tenant, user=writer, role="writer")

    def build(tag: str) -> None:
        for i in range(n):
            body = envelope(payload={"phase": "ready", "order_id": f"{tag}-{i}"})
            put_checkpoint(writer, tenant, body)
            if i % 2 == 0:
                walk_effect(writer, tenant, effect_body(run_id=body["run_id"],
                                                        operation_key=f"c:{uuid.uuid4()}"),
                            "submitted", "confirmed")
            put_checkpoint(writer, tenant, {**body, "revision": 1, "payload": {
                "phase": "completed", "order_id": f"{tag}-{i}"}}, expected=0)

    started = time.perf_counter()
    build("P")
    print(f"built {n} completed runs in {time.perf_counter() - started:.1f} s")
    services.data_policy_set(actor=None, tenant=tenant, payload_retention_days=1)
    age_world(2 * 86_400)
    started = time.perf_counter()
    stats = services.retention_purge(tenant=tenant)
    purge = time.perf_counter() - started
    print(f"retention_purge: {stats['purged']} runs in {purge:.2f} s = "
          f"{stats['purged'] / purge:,.0f} runs/s ({1000 * purge / n:.2f} ms/run; "
          f"{stats['batches']} batch(es))")

    build("R")
    started = time.perf_counter()
    Run.objects.for_tenant(tenant).filter(payloads_deleted_at__isnull=True).update(
        latest_checkpoint=None)
    CheckpointRevision.objects.for_tenant(tenant).all().delete()
    Checkpoint.objects.for_tenant(tenant).all().delete()
    reference = time.perf_counter() - started
    print(f"reference bulk DELETE of the same rows: {n} runs in {reference:.2f} s = "
          f"{n / reference:,.0f} runs/s; the purge takes {purge / reference:.1f}x as long")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT AVG(pg_column_size(t.*)) FROM {Tombstone._meta.db_table} t")
        print(f"a tombstone's row: {cursor.fetchone()[0]:.0f} bytes on average")


if __name__ == "__main__":
    main()
