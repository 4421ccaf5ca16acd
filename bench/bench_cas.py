#!/usr/bin/env python
"""Checkpoint compare-and-swap benchmark: writes/second and p50/p99 latency.

Runs on whichever database is configured (``DATABASE_URL``, else embedded SQLite), in a
throwaway test database created and dropped by Django's test machinery, so it never
touches real data. Not run by the test suite.

    .venv/bin/python bench/bench_cas.py [--writes 500] [--writers 4]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/recovery .venv/bin/python bench/bench_cas.py

Three measurements, each through ``services.checkpoint_put`` (validation, CAS UPDATE,
history row, recovery state, audit event, one transaction per write):
1. sequential: one writer, N updates of one checkpoint;
2. concurrent: K writers, each updating its own checkpoint (N/K writes each);
3. contended: K writers racing on one checkpoint from the same revision (wins vs conflicts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
os.environ.setdefault("RECOVERY_FAST_HASHER", "1")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, latencies: list[float], elapsed: float, extra: str = "") -> None:
    ms = [v * 1000 for v in latencies]
    print(f"{name:<12} {len(ms):>6} writes  {len(ms) / elapsed:>8.1f} writes/s  "
          f"p50 {statistics.median(ms):6.2f} ms  p99 {percentile(ms, 0.99):6.2f} ms{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=500, help="writes per measurement")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writers")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection

    from checkpoints import services
    from checkpoints.exceptions import StaleRevision

    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        tenant = services.tenant_create(slug="bench", name="Benchmark")
        writer = services.account_create(username="bench-writer", service=True)
        services.role_grant(actor=None, tenant=tenant, user=writer, role="writer")

        def put(cid, run_id, revision, expected):
            body = {"id": str(cid), "run_id": str(run_id), "revision": revision,
                    "kind": "acme.order", "schema_version": 1,
                    "payload": {"phase": "charged" if revision % 2 else "ready",
                                "order_id": f"B-{revision}", "amount_cents": 2599},
                    "updated_at_ms": int(time.time() * 1000)}
            env = services.parse_envelope(body, url_id=cid)
            services.checkpoint_put(actor=writer, tenant=tenant, envelope=env,
                                    expected_revision=expected)

        def chain(n: int, out: list[float]) -> None:
            cid, run_id = uuid.uuid4(), uuid.uuid4()
            put(cid, run_id, 0, None)
            for rev in range(1, n + 1):
                t0 = time.perf_counter()
                put(cid, run_id, rev, rev - 1)
                out.append(time.perf_counter() - t0)

        print(f"database: {connection.vendor} ({connection.settings_dict['NAME']}), "
              f"{args.writes} writes, {args.writers} writers")

        lat: list[float] = []
        t0 = time.perf_counter()
        chain(args.writes, lat)
        report("sequential", lat, time.perf_counter() - t0)

        per_thread: list[list[float]] = [[] for _ in range(args.writers)]

        def run_thread(i: int) -> None:
            try:
                chain(max(1, args.writes // args.writers), per_thread[i])
            finally:
                connection.close()

        threads = [threading.Thread(target=run_thread, args=(i,)) for i in range(args.writers)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        report("concurrent", [v for lst in per_thread for v in lst], time.perf_counter() - t0)

        cid, run_id = uuid.uuid4(), uuid.uuid4()
        put(cid, run_id, 0, None)
        rounds = max(1, args.writes // args.writers)
        lat, wins, conflicts = [], [0], [0]
        lock = threading.Lock()

        def contend(barrier: threading.Barrier, rev: int) -> None:
            try:
                barrier.wait()
                t_start = time.perf_counter()
                try:
                    put(cid, run_id, rev + 1, rev)
                    won = True
                except StaleRevision:
                    won = False
                with lock:
                    lat.append(time.perf_counter() - t_start)
                    (wins if won else conflicts)[0] += 1
            finally:
                connection.close()

        t0 = time.perf_counter()
        for rev in range(rounds):
            barrier = threading.Barrier(args.writers)
            threads = [threading.Thread(target=contend, args=(barrier, rev))
                       for _ in range(args.writers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        report("contended", lat, time.perf_counter() - t0,
               f"  ({wins[0]} won, {conflicts[0]} conflicts over {rounds} rounds)")
    finally:
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
