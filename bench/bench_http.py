#!/usr/bin/env python
"""HTTP checkpoint writes through gunicorn, beside raw SQL CAS, on PostgreSQL (issue 8).

Not run by the test suite. Creates its own database (``--db``, dropped and recreated),
migrates it, makes a tenant, a writer account and a token with the management commands,
starts gunicorn (``gunicorn.conf.py`` of ``--server-tree``) and measures:

1. **round trips per PUT**: 50 checkpoint updates by one client with ``log_statement=all``
   on the database; every statement PostgreSQL logs is counted (BEGIN, COMMIT and the
   connection health check included), and the backends (connections) that logged them;
2. **throughput and latency**: ``--writers`` client processes (``recovery_client.client``, one
   kept-alive connection each, or a new one per request with ``--no-keepalive``), each
   updating its own checkpoint (1 KB payload) for ``--seconds``;
3. with ``--head``: the same clients sending ``HEAD`` of their checkpoint (the HTTP layer,
   authentication and tenant rights and one read, without the write path);
4. **raw reference**: as many processes, each with one psycopg connection, doing the CAS
   ``UPDATE ... WHERE revision = N`` and the history row in one statement, same payload.

    .venv/bin/python bench/bench_http.py [--writers 4] [--seconds 10]
        [--server-tree /work/main] [--client-tree .] [--no-keepalive]

``--server-tree`` is the checkout gunicorn runs (to measure a branch against main);
``--client-tree`` the one whose ``clients/python/recovery_client/client.py`` (with the
``core.py`` beside it, as a runtime vendors them; or, in an older tree, the single file
``client.py`` of either place) the clients load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PG_LOG = Path("/var/log/postgresql/postgresql-15-main.log")
PAYLOAD = {"phase": "charging", "order_id": "A-1042",
           "items": [{"sku": f"SKU-{i:04d}", "qty": i % 3 + 1, "price_cents": 1999 + i,
                      "note": "gift wrap, leave at the door"} for i in range(9)],
           "customer": {"id": "c-77", "tier": "gold", "country": "DE"}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def psql(url: str, sql: str) -> str:
    return subprocess.run(["psql", url, "-Atqc", sql], check=True, capture_output=True,
                          text=True).stdout.strip()


#: Where a tree keeps the runtime client: the SDK's place, then the one before it (a
#: ``--client-tree`` of an older checkout).
CLIENT_PATHS = ("clients/python/recovery_client/client.py", "checkpoints/client.py")


def load_client(tree: Path):
    """The tree's client module, loaded from its path (not the installed package): with
    the ``core.py`` it imports beside it, their folder as a package of its own name."""
    path = next((tree / p for p in CLIENT_PATHS if (tree / p).is_file()), tree / CLIENT_PATHS[0])
    if not (path.parent / "core.py").is_file():  # one standalone file (an older tree)
        spec = importlib.util.spec_from_file_location("bench_client", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    spec = importlib.util.spec_from_file_location(
        "bench_sdk", path.parent / "__init__.py", submodule_search_locations=[str(path.parent)])
    package = sys.modules["bench_sdk"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    return importlib.import_module("bench_sdk.client")


def make_store(client_mod, base_url, token, keepalive: bool):
    try:
        return client_mod.HttpCheckpointStore(base_url, "bench", token, keep_alive=keepalive)
    except TypeError:  # a client without keep-alive (before issue 8)
        if keepalive:
            print("note: this client has no keep-alive; measuring it without", flush=True)
        return client_mod.HttpCheckpointStore(base_url, "bench", token)


def http_writer(client_tree, base_url, token, keepalive, cp_id, run_id, revision, op,
                barrier, seconds, out):
    client_mod = load_client(Path(client_tree))
    store = make_store(client_mod, base_url, token, keepalive)
    env = {"id": cp_id, "run_id": run_id, "revision": revision, "kind": "bench.order",
           "schema_version": 1, "payload": PAYLOAD, "updated_at_ms": 0}
    lat = []
    barrier.wait()
    cpu0 = time.process_time()
    end = time.perf_counter() + seconds
    while op == "head" and (t0 := time.perf_counter()) < end:
        store.request("HEAD", f"checkpoints/{cp_id}")
        lat.append(time.perf_counter() - t0)
    while op == "put" and (t0 := time.perf_counter()) < end:
        nxt = dict(env, revision=env["revision"] + 1, updated_at_ms=int(time.time() * 1000))
        store.compare_and_swap(nxt, env["revision"])
        lat.append(time.perf_counter() - t0)
        env = nxt
    out.put((lat, time.process_time() - cpu0))


def raw_writer(db_url, cp_id, barrier, seconds, out):
    import psycopg

    payload = json.dumps(PAYLOAD)
    with psycopg.connect(db_url, autocommit=True) as conn:
        revision = 0
        lat = []
        sql = ("WITH u AS (UPDATE bench_raw_cp SET revision = revision + 1, payload = %s, "
               "updated_at = now() WHERE id = %s AND revision = %s RETURNING id, revision, "
               "payload) INSERT INTO bench_raw_hist SELECT id, revision, payload, now() FROM u "
               "RETURNING revision")
        barrier.wait()
        end = time.perf_counter() + seconds
        while (t0 := time.perf_counter()) < end:
            row = conn.execute(sql, (payload, cp_id, revision)).fetchone()
            assert row is not None, "lost update"
            revision = row[0]
            lat.append(time.perf_counter() - t0)
        out.put((lat, 0.0))


def run_parallel(target, argsets, seconds, server=None):
    """Run one process per argument set for ``seconds``; throughput, latency and, with a
    ``server``, the CPU time gunicorn (all its processes) and the clients spent per
    request: a figure the other tenants of a shared machine disturb far less than
    throughput."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(len(argsets)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, seconds, out)) for a in argsets]
    for p in procs:
        p.start()
    server_cpu = server.cpu() if server else 0.0
    results = [out.get(timeout=seconds + 120) for _ in procs]
    server_cpu = (server.cpu() - server_cpu) if server else 0.0
    for p in procs:
        p.join()
    lat = [x for r, _ in results for x in r]
    client_cpu = sum(c for _, c in results)
    return {"writes": len(lat), "per_s": len(lat) / seconds,
            "p50_ms": statistics.median(lat) * 1000, "p99_ms": percentile(lat, 0.99) * 1000,
            "server_cpu_ms": server_cpu / len(lat) * 1000 if server else None,
            "client_cpu_ms": client_cpu / len(lat) * 1000}


class Server:
    def __init__(self, tree: Path, env: dict, port: int):
        self.tree, self.env, self.port = tree, env, port
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "recovery.wsgi",
             "-b", f"127.0.0.1:{self.port}"], cwd=self.tree, env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/", timeout=2)
            except urllib.error.HTTPError:
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("gunicorn did not start: " + self.proc.stderr.read(4000).decode())

    def cpu(self) -> float:
        """Seconds of CPU (user + system) used so far by gunicorn's processes (its
        process group: the master and its workers)."""
        total, tick = 0.0, os.sysconf("SC_CLK_TCK")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # pgrp
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def __exit__(self, *exc):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


def manage(tree: Path, env: dict, *args) -> str:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=tree, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def count_round_trips(server_env, tree, port, token, client_mod, keepalive, db, admin_url,
                      cp_id, run_id, revision, n=50):
    psql(admin_url, f"ALTER DATABASE {db} SET log_statement = 'all'")
    try:
        with Server(tree, server_env, port):
            store = make_store(client_mod, f"http://127.0.0.1:{port}", token, keepalive)
            env = {"id": cp_id, "run_id": run_id, "revision": revision, "kind": "bench.order",
                   "schema_version": 1, "payload": PAYLOAD, "updated_at_ms": 0}
            for _ in range(5):  # warm: the first requests of each worker thread connect
                nxt = dict(env, revision=env["revision"] + 1)
                store.compare_and_swap(nxt, env["revision"])
                env = nxt
            time.sleep(0.5)
            start = PG_LOG.stat().st_size
            for _ in range(n):
                nxt = dict(env, revision=env["revision"] + 1)
                store.compare_and_swap(nxt, env["revision"])
                env = nxt
            time.sleep(0.5)
            with PG_LOG.open("rb") as f:
                f.seek(start)
                text = f.read().decode("utf-8", "replace")
    finally:
        psql(admin_url, f"ALTER DATABASE {db} RESET log_statement")
    lines = re.findall(r"^\S+ \S+ \S+ \[(\d+)\] \S* ?LOG:  (statement|execute [^:]*): (.*)$",
                       text, re.M)
    pids = {pid for pid, _, _ in lines}
    return {"statements_per_put": len(lines) / n, "connections_per_put": len(pids) / n,
            "revision": env["revision"],
            "sample": [s[:90] for _, _, s in lines[: len(lines) // n + 2]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--db", default="recovery_http_bench")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--server-tree", type=Path, default=HERE)
    parser.add_argument("--client-tree", type=Path, default=HERE)
    parser.add_argument("--no-keepalive", action="store_true")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument("--head", action="store_true",
                        help="also HEAD of a checkpoint by --writers clients (the HTTP layer "
                             "without a service: token, tenant and rights, one read)")
    args = parser.parse_args()
    keepalive = not args.no_keepalive
    admin_url, db_url = f"{args.pg}/postgres", f"{args.pg}/{args.db}"
    psql(admin_url, f"DROP DATABASE IF EXISTS {args.db} WITH (FORCE)")
    psql(admin_url, f"CREATE DATABASE {args.db}")
    env = dict(os.environ, DATABASE_URL=db_url, SECRET_KEY="bench-" + uuid.uuid4().hex,
               DEBUG="0", ALLOWED_HOSTS="127.0.0.1,localhost", SECURE_SSL_REDIRECT="0",
               SESSION_COOKIE_SECURE="0", CSRF_COOKIE_SECURE="0", SECURE_HSTS_SECONDS="0",
               RECOVERY_INPROCESS_WORKER="0", RECOVERY_FAST_HASHER="1", LOG_LEVEL="ERROR",
               RECOVERY_ENCRYPTION_KEYS="ZGV2LW9ubHkta2V5LXJlY292ZXJ5LTMyYnl0ZXMhISE=",
               RECOVERY_AUDIT_KEYS="bench-audit-key-0123456789abcdef0123456789")
    env.pop("CELERY_BROKER_URL", None)
    tree = args.server_tree.resolve()
    manage(tree, env, "migrate", "-v0")
    manage(tree, env, "create_tenant", "bench")
    manage(tree, env, "create_account", "bench-runtime", "--service")
    manage(tree, env, "grant", "bench-runtime", "writer", "bench")
    token = manage(tree, env, "issue_token", "bench-runtime").split()[-1]
    client_mod = load_client(args.client_tree.resolve())
    base = f"http://127.0.0.1:{args.port}"
    rounds = sorted({1, args.writers})
    # One fresh checkpoint per writer and round, and one for counting round trips.
    cps = {w: [(str(uuid.uuid4()), str(uuid.uuid4())) for _ in range(w)] for w in rounds}
    counted_cp = (str(uuid.uuid4()), str(uuid.uuid4()))
    with Server(tree, env, args.port):
        store = make_store(client_mod, base, token, keepalive)
        for cp_id, run_id in [counted_cp, *(c for w in rounds for c in cps[w])]:
            store.compare_and_swap({"id": cp_id, "run_id": run_id, "revision": 0,
                                    "kind": "bench.order", "schema_version": 1,
                                    "payload": PAYLOAD, "updated_at_ms": 0}, None)
    counted = count_round_trips(env, tree, args.port, token, client_mod, keepalive, args.db,
                                admin_url, *counted_cp, 0)
    results = {"round_trips": counted}
    with Server(tree, env, args.port) as server:
        for writers in rounds:
            results[f"http_{writers}"] = run_parallel(
                http_writer, [(str(args.client_tree.resolve()), base, token, keepalive,
                               cp, run, 0, "put") for cp, run in cps[writers]], args.seconds,
                server)
        if args.head:  # the HTTP layer alone: three reads, no service
            results[f"head_{args.writers}"] = run_parallel(
                http_writer, [(str(args.client_tree.resolve()), base, token, keepalive,
                               cp, run, 0, "head") for cp, run in cps[args.writers]],
                args.seconds, server)
    if not args.skip_raw:
        psql(db_url, "CREATE TABLE bench_raw_cp (id uuid PRIMARY KEY, revision bigint NOT NULL,"
                     " payload jsonb NOT NULL, updated_at timestamptz NOT NULL);"
                     "CREATE TABLE bench_raw_hist (cp_id uuid NOT NULL, revision bigint NOT NULL,"
                     " payload jsonb NOT NULL, at timestamptz NOT NULL,"
                     " PRIMARY KEY (cp_id, revision))")
        for writers in rounds:
            ids = [str(uuid.uuid4()) for _ in range(writers)]
            for i in ids:
                psql(db_url, f"INSERT INTO bench_raw_cp VALUES ('{i}', 0, '{{}}', now())")
            results[f"raw_{writers}"] = run_parallel(raw_writer, [(db_url, i) for i in ids],
                                                     args.seconds)
    print(json.dumps(results, indent=1))
    print(f"\n{'scenario':<14}{'writes/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'vs raw':>8}"
          f"{'server CPU ms':>15}{'client CPU ms':>15}")
    for writers in rounds:
        raw = results.get(f"raw_{writers}")
        for kind in ("raw", "http", "head"):
            r = results.get(f"{kind}_{writers}")
            if r:
                ratio = f"{r['per_s'] / raw['per_s']:.3f}" if raw else "-"
                server_ms = r.get("server_cpu_ms")
                print(f"{kind} x{writers:<9}{r['per_s']:>10.1f}{r['p50_ms']:>9.2f}"
                      f"{r['p99_ms']:>9.2f}{ratio:>8}"
                      f"{f'{server_ms:.2f}' if server_ms is not None else '-':>15}"
                      f"{r['client_cpu_ms']:>15.2f}")
    print(f"round trips per PUT: {counted['statements_per_put']:.1f}; "
          f"connections per PUT: {counted['connections_per_put']:.2f}")


if __name__ == "__main__":
    main()
