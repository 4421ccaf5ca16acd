"""``make bench`` / ``python -m bench``: the store's benchmarks in one run (issue 8).

    .venv/bin/python -m bench                      # default sizes, about 12 minutes
    .venv/bin/python -m bench --quick              # short rounds, the small read size
    .venv/bin/python -m bench --only writes --write-scenarios http,floor
    .venv/bin/python -m bench --full               # 10,000 and 100,000 runs, 100,000 requests
    .venv/bin/python -m bench --only writes --seconds 10
    .venv/bin/python -m bench --pg-url postgres://postgres@127.0.0.1:5432/x --db recovery_bench

    .venv/bin/python -m bench --smoke               # the smallest sizes, well under 2 minutes

1. Drops and creates its own PostgreSQL database (``--db``, default the ``--pg-url``
   database's name with ``_bench`` added: ``recovery_bench`` for ``.../recovery``; the name
   must contain "bench") and migrates it. It never touches another database, and drops
   its own at the end (``--keep-db`` keeps it). Static files are collected into the
   bench's own var folder (``--var-dir``, ``staticfiles/``): it runs with ``DEBUG=0``,
   whose pages need collectstatic's manifest. Logs print errors only (``LOG_LEVEL``,
   no access lines, gunicorn ``--log-level error``).
2. Writes (``bench/writes.py``): raw psycopg CAS+history (the reference), the Django ORM,
   ``services.checkpoint_put``, HTTP ``PUT`` through gunicorn, the HTTP floor (a bare WSGI
   app under the same gunicorn settings, ``bench/floor_wsgi.py``), LangGraph's
   ``PostgresSaver.put`` and ``RecoverySaver.put``; one writer and four (writer
   processes), 4 and 16 writers in one tenant against as many in as many tenants, and 16
   writers on 10 checkpoints (raw and services), in interleaved rounds (each round runs
   every scenario once). Each checks for lost updates. Ratios are taken within a round,
   with the round's flush regime (``bench.report.regimes``).
3. Reads (``bench/reads.py``): ``manage.py generate_load`` builds the data set at each of
   ``--sizes`` (runs in all; the first of 20 tenants holds half of them), then every inbox
   tab, the counts, the report, the API lists, a run page and API run detail of a run
   with ``--long-run-revisions`` revisions and the resume decision are timed (p50/p95)
   with their query counts.
4. Memory: a web worker's RSS after 1,000 API GETs (half of ``--memory-requests`` when
   fewer than 2,000, as ``--smoke``'s 200: ``reads.memory_marks``) and after
   ``--memory-requests``.
5. Notifications (``bench/bench_notify.py``, in its own process and database
   ``<db>_notify``): delivery latency from a state change's commit to a loopback
   receiver (p50/p99, a round every 1 s and 5 s), the outbox's dispatch and send rates
   against a bare POST reference, and a round's cost for a tenant with no endpoint.
6. The audit sequencer (``bench/bench_audit.py``, in its own process and database
   ``<db>_audit``): integration throughput against the append alone, and the lag of
   each event (commit to integration, database clock) under writes with the sequencer
   every second (target p99 < 2 s).
7. Prints one table with ratios to raw and the issue's targets ("holds" / "not yet"; a
   ``--smoke`` run's table says first that it is one and marks each verdict "(smoke)":
   they are not the targets' verdicts), and writes everything to ``var/bench/latest.json``
   (``meta.smoke``).

Numbers depend on the machine and on what else runs on it: compare rows of one run, not
runs of different days. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import (
    ROOT,
    bench_url,
    collect_static,
    default_db_name,
    drop_database,
    environ,
    reset_database,
)

#: Bench parts of other modules, plugged in by name (``--only NAME``): name -> module.
#: The module has ``run(args, *, url, env, out_dir, say) -> dict`` (called after the
#: writes and reads, on the bench database; its answer is kept in the JSON under the
#: name) and ``targets(result) -> list[dict]`` (rows ``{"target", "value", "measured",
#: "verdict"}``, verdict one of ``bench.report.HOLDS``, ``NOT_YET``, ``NO_DATA``),
#: printed with the other targets. Optional ``render(result) -> list[str]``: its lines
#: in the table.
PLUGINS: dict[str, str] = {}

#: ``--quick``: every write target's scenarios, short rounds, the small read size; a few
#: minutes, for a change's before and after (explicit options still override).
QUICK = {"seconds": 1.5, "rounds": 3, "warmup": 0.3, "sizes": "2000", "samples": 10,
         "memory_requests": 2000}

#: ``--smoke``: the smallest sizes that still run every part and scenario once (the
#: end-to-end test, tests/test_bench_smoke.py); numbers of no value.
SMOKE = {"seconds": 0.3, "rounds": 1, "warmup": 0.1, "sizes": "200", "tenants": 2,
         "revisions_per_run": 2, "long_run_revisions": 20, "samples": 2,
         "memory_requests": 200}


def _args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    default_url = (os.environ.get("PG_URL") or os.environ.get("DATABASE_URL")
                   or "postgres://postgres@127.0.0.1:5432/recovery")
    p.add_argument("--pg-url", default=default_url,
                   help="any database URL on the PostgreSQL server to use (its database "
                        "name is replaced by --db)")
    p.add_argument("--db", default=None,
                   help="the bench database (dropped!); default: the --pg-url database's "
                        "name with _bench added")
    p.add_argument("--var-dir", default=str(ROOT / "var" / "bench"),
                   help="the bench's own folder: logs, and var/ (RECOVERY_VAR_DIR, the "
                        "collected static files)")
    p.add_argument("--smoke", action="store_true",
                   help="the smallest sizes (every part once, numbers of no value; "
                        "explicit options still override): " + ", ".join(
                            f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    p.add_argument("--quick", action="store_true",
                   help="short interleaved rounds and the small read size: " + ", ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    p.add_argument("--keep-db", action="store_true", help="keep the database at the end")
    p.add_argument("--only", default=None,
                   help="comma-separated parts: writes, reads, memory, notify "
                        "(bench/bench_notify.py on its own database, <db>_notify), audit "
                        "(bench/bench_audit.py, <db>_audit)"
                        + "".join(f", {n}" for n in PLUGINS) + "; default: all")
    p.add_argument("--write-scenarios", default=None,
                   help="comma-separated groups of write scenarios (bench/writes.py GROUPS: "
                        "raw, orm, services, tenants, http, floor, langgraph, contended); "
                        "default: all")
    p.add_argument("--full", action="store_true",
                   help="the issue's sizes: 10,000 and 100,000 runs (1,000,000 revisions), "
                        "100,000 memory requests")
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per write "
                                                              "scenario and round")
    p.add_argument("--rounds", type=int, default=3,
                   help="every write scenario this many times, interleaved (each round runs "
                        "every scenario); targets are judged per round")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds first")
    p.add_argument("--sizes", default=None,
                   help="data set sizes in runs, comma-separated (default 10000,40000; "
                        "--full: 10000,100000)")
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--revisions-per-run", type=int, default=10)
    p.add_argument("--long-run-revisions", type=int, default=2000)
    p.add_argument("--samples", type=int, default=30, help="measured requests per endpoint "
                                                         "(a third of that for the run page)")
    p.add_argument("--memory-requests", type=int, default=None,
                   help="API GETs for the memory figure (default 20,000; --full: 100,000)")
    p.add_argument("--out", default=None, help="the JSON (default: latest.json in --var-dir)")
    args = p.parse_args(argv)
    if args.smoke or args.quick:  # their sizes as defaults: explicit options still win
        p.set_defaults(**(SMOKE if args.smoke else QUICK))
        args = p.parse_args(argv)
    if args.db is None:
        args.db = default_db_name(args.pg_url)
    known = {"writes", "reads", "memory", "notify", "audit", *PLUGINS}
    args.parts = ({x.strip() for x in args.only.split(",") if x.strip()} if args.only
                  else set(known))
    unknown = args.parts - known
    if unknown:
        p.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
    from bench.writes import GROUPS

    args.write_groups = ({x.strip() for x in args.write_scenarios.split(",") if x.strip()}
                         if args.write_scenarios else set(GROUPS))
    if args.write_groups - set(GROUPS):
        p.error(f"--write-scenarios: unknown group(s) "
                f"{', '.join(sorted(args.write_groups - set(GROUPS)))}")
    sizes = args.sizes or ("10000,100000" if args.full else "10000,40000")
    args.size_list = sorted(int(s) for s in sizes.split(",") if s.strip())
    if args.memory_requests is None:
        args.memory_requests = 100_000 if args.full else 20_000
    if args.memory_requests < 2:
        p.error("--memory-requests: at least 2 (the memory row compares two sizes)")
    return args


def say(text: str) -> None:
    print(text, flush=True)


def main(argv=None) -> None:
    args = _args(argv)
    url = bench_url(args.pg_url, args.db)
    out_dir = Path(args.var_dir).resolve()
    (out_dir / "var").mkdir(parents=True, exist_ok=True)
    env = environ(url, out_dir / "var")
    os.environ.update(env)
    os.environ.pop("CELERY_BROKER_URL", None)
    started = time.monotonic()
    say(f"bench: database {args.db} on {url.rsplit('/', 1)[0]} (dropped and created)")
    if args.smoke:
        say("bench: --smoke: every part once at the smallest sizes; every figure and verdict "
            "printed is of no value (not the targets' verdicts)")
    reset_database(args.pg_url, args.db)

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    call_command("migrate", verbosity=0)
    collect_static()
    pg = {}
    with connection.cursor() as cur:
        for name in ("server_version", "synchronous_commit", "fsync", "shared_buffers",
                     "max_connections"):
            cur.execute(f"SHOW {name}")
            pg[name] = cur.fetchone()[0]
    meta = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(), "postgresql": pg["server_version"],
        "postgresql_settings": pg,
        "cpus": os.cpu_count(), "load_avg_start": os.getloadavg(),
        "database": args.db, "seconds": args.seconds, "warmup": args.warmup,
        "rounds": args.rounds,
        "sizes": args.size_list, "tenants": args.tenants,
        "revisions_per_run": args.revisions_per_run,
        "long_run_revisions": args.long_run_revisions, "samples": args.samples,
        "memory_requests": args.memory_requests, "full": args.full, "smoke": args.smoke,
        "web_concurrency": env.get("WEB_CONCURRENCY") or os.cpu_count(),
        "gunicorn_threads": env.get("GUNICORN_THREADS") or 4,
    }
    result = {"meta": meta, "writes": [], "reads": {}, "memory": None}
    try:
        if "writes" in args.parts:
            from bench import writes

            say("writes (writer processes, ~1.2 KB runifold.agent payload):")
            result["writes"] = writes.run_all(dsn=url, env=env, warmup=args.warmup,
                                              seconds=args.seconds, rounds=args.rounds,
                                              log_dir=out_dir, say=say,
                                              groups=args.write_groups)
        if args.parts & {"reads", "memory"}:
            from bench import reads

            existing = 0
            sizes = args.size_list if "reads" in args.parts else args.size_list[:1]
            for size in sizes:
                say(f"data set: {size:,} runs, {size * args.revisions_per_run:,} revisions, "
                    f"{args.tenants} tenants (generate_load)")
                t0 = time.monotonic()
                reads.grow(total_runs=size, existing_runs=existing, tenants=args.tenants,
                           revisions_per_run=args.revisions_per_run,
                           long_run_revisions=args.long_run_revisions, seed=size)
                existing = size
                connections.close_all()
                say(f"  built in {time.monotonic() - t0:.0f} s; vacuum analyze ...")
                _vacuum(url)
                if "reads" in args.parts:
                    load = os.getloadavg()[0]
                    say(f"reads at {size:,} runs (load average {load:.2f}):")
                    result["reads"][str(size)] = reads.measure(samples=args.samples, say=say)
                    from bench import bench_reports  # issue 22: report and broad search targets
                    result.setdefault("report_targets", {})[str(size)] = bench_reports.measure(
                        samples=args.samples, say=say, smoke=args.smoke)
                    meta.setdefault("load_avg_reads", {})[str(size)] = load
            if "memory" in args.parts:
                say(f"memory: {args.memory_requests:,} API GETs in one process ...")
                result["memory"] = reads.memory(requests=args.memory_requests, say=say)
        for name, module in PLUGINS.items():
            if name in args.parts:
                from importlib import import_module

                connections.close_all()
                result[name] = import_module(module).run(args, url=url, env=env,
                                                         out_dir=out_dir, say=say)
        if "notify" in args.parts:
            result["notify"] = _notify(args, out_dir)
        if "audit" in args.parts:
            result["audit"] = _own_process(args, out_dir, "audit")
    finally:
        connections.close_all()
        if not args.keep_db:
            drop_database(args.pg_url, args.db)
    meta["load_avg_end"] = os.getloadavg()
    meta["took_s"] = round(time.monotonic() - started, 1)
    from bench.report import render, targets

    result["targets"] = targets(result)
    text = render(result)
    say("")
    say(text)
    out = Path(args.out or out_dir / "latest.json")
    out = out if out.is_absolute() else ROOT / out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    say(f"\nbench: wrote {os.path.relpath(out, ROOT)} ({meta['took_s']:.0f} s in all)")
    failed = [r["scenario"] for r in result["writes"] if r.get("check") and not r["check"]["ok"]]
    if failed:
        say(f"bench: CHECK FAILED (lost update or unrecorded refusal): {', '.join(failed)}")
        sys.exit(1)


def _notify(args, out_dir: Path) -> dict:
    """``bench/bench_notify.py`` in its own process and database (``<db>_notify``, dropped
    at its end): delivery latency and the outbox's throughput (``--smoke``: its
    ``SMOKE_ARGS``). Its lines are printed as it goes; returns its JSON."""
    from bench.bench_notify import SMOKE_ARGS

    out = out_dir / "notify.json"
    out.unlink(missing_ok=True)
    say("notifications (bench/bench_notify.py):")
    argv = [sys.executable, str(ROOT / "bench" / "bench_notify.py"), "--pg-url", args.pg_url,
            "--db", f"{args.db}_notify", "--json", str(out), *(SMOKE_ARGS if args.smoke else [])]
    subprocess.run(argv, cwd=ROOT, check=True)
    return json.loads(out.read_text())


def _own_process(args, out_dir: Path, part: str) -> dict:
    """``bench/bench_<part>.py`` in its own process and database (``<db>_<part>``, dropped
    at its end; ``--smoke``: its ``--smoke``). Its lines are printed as it goes; returns
    its JSON. ``audit``: the sequencer's throughput and lag (issue 22, item 1)."""
    out = out_dir / f"{part}.json"
    out.unlink(missing_ok=True)
    say(f"{part} (bench/bench_{part}.py):")
    argv = [sys.executable, str(ROOT / "bench" / f"bench_{part}.py"), "--pg-url", args.pg_url,
            "--db", f"{args.db}_{part}", "--json", str(out), *(["--smoke"] if args.smoke else [])]
    subprocess.run(argv, cwd=ROOT, check=True)
    return json.loads(out.read_text())


def _vacuum(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
