#!/usr/bin/env python
"""runifold import/export benchmark (issue 10, item 4): how many lines per second
``import_runifold`` and ``export_runifold`` move, for ``--lines`` lines (default 100,000;
``tests/runifold_synth.py``: agent and workflow checkpoints in flight, completed and
started tool calls) on the configured database.

On PostgreSQL (``--pg-url``, the default) it uses its own database (``--db``, dropped and
created; the name must contain "bench"); with ``--sqlite`` the embedded default in a
temporary directory. It times the service calls the commands make
(``runifold.runifold_import`` over ``jsonl_lines`` of a file, ``runifold.runifold_export``
into a file), a second import of the same file (every line skipped), and prints lines
per second and the process's peak resident size; ``--tracemalloc`` adds the peak of
Python's own allocations per step (it makes the import about 3.5 times slower, so its
lines per second are not the speed). Asserts nothing (a benchmark, not a test).

    .venv/bin/python bench/bench_runifold.py [--lines 100000] [--batch-size 500] \\
        [--pg-url postgres://postgres@127.0.0.1:5432/recovery] [--db recovery_bench_runifold]
    .venv/bin/python bench/bench_runifold.py --sqlite
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BENCH_ENV, bench_url, drop_database, environ, reset_database  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--pg-url", default=os.environ.get("PG_URL")
                   or "postgres://postgres@127.0.0.1:5432/recovery")
    p.add_argument("--db", default="recovery_bench_runifold")
    p.add_argument("--sqlite", action="store_true", help="the embedded SQLite default instead")
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--tracemalloc", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runifold-") as tmp:
        if args.sqlite:
            os.environ.update(BENCH_ENV)
            os.environ.pop("DATABASE_URL", None)
            os.environ["RECOVERY_VAR_DIR"] = tmp
            run(args, Path(tmp), "SQLite (embedded default)")
            return
        url = bench_url(args.pg_url, args.db)
        reset_database(args.pg_url, args.db)
        os.environ.update(environ(url))
        try:
            run(args, Path(tmp), f"PostgreSQL ({args.db})")
        finally:
            from django.db import connections

            connections.close_all()
            if not args.keep_db:
                drop_database(args.pg_url, args.db)


def run(args, tmp: Path, where: str) -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from checkpoints import services
    from checkpoints.interop import runifold
    from tests import runifold_synth

    tenant = services.tenant_create(slug="bench", name="bench")
    source, exported = tmp / "in.jsonl", tmp / "out.jsonl"
    size = runifold_synth.write(source, args.lines)
    print(f"runifold import/export of {args.lines} lines ({size / 1e6:.1f} MB) on {where}, "
          f"batch size {args.batch_size}")

    def timed(label: str, fn) -> None:
        if args.tracemalloc:
            tracemalloc.start()
        start = time.perf_counter()
        count = fn()
        seconds = time.perf_counter() - start
        peak = ""
        if args.tracemalloc:
            peak = f", peak Python allocations {tracemalloc.get_traced_memory()[1] / 1e6:.1f} MB"
            tracemalloc.stop()
        print(f"  {label:<28} {count:>8} lines in {seconds:7.1f} s = "
              f"{count / seconds:8.0f} lines/s{peak}")

    def do_import() -> int:
        with open(source, "rb") as f:
            report = runifold.runifold_import(actor=None, tenant=tenant,
                                              lines=runifold.jsonl_lines(f),
                                              batch_size=args.batch_size)
        assert report.failed == 0, report
        return report.lines

    def do_export() -> int:
        with open(exported, "wb") as f:
            report = runifold.runifold_export(
                actor=None, tenant=tenant, write=lambda line: f.write(line.encode() + b"\n"))
        return report.checkpoint_lines + report.effect_lines

    timed("import", do_import)
    timed("import again (all skipped)", do_import)
    timed("export", do_export)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak resident size of this process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
