#!/usr/bin/env python
"""LangGraph checkpointers side by side (issue 10): ``RecoverySaver`` through gunicorn
against LangGraph's own ``PostgresSaver`` on the same PostgreSQL server.

    .venv/bin/python -m bench.bench_langgraph [--seconds 3] [--writers 1,4] [--rounds 2]
        [--pg-url postgres://postgres@127.0.0.1:5432/x] [--db recovery_lgbench]

Not run by the test suite; asserts no timing. It drops and creates its own database
(``--db``, whose name must contain "bench"), migrates it, makes a tenant with a writer and
a token, starts gunicorn (``gunicorn.conf.py``) on it, creates LangGraph's tables in the
same database (``PostgresSaver.setup``), and measures, for each saver and each number of
client processes (each on its own thread, one chain of checkpoints):

- ``put``: one checkpoint per operation, parent = the previous one, a ~1.2 KB channel
  value (the bench's ``runifold.agent`` payloads, as ``bench/writes.py``) and a counter;
  RecoverySaver: HTTP POST, compare-and-swap on the thread's head, an envelope revision,
  audit event, encryption; PostgresSaver: its upserts, append-only, no CAS;
- ``get_tuple``: the head of the thread (channel values decoded), after 20 puts
  (``--history``);
  RecoverySaver's read is one audited ``payload.read`` (a write on the server).

A third row per operation is the service's own path for the same payload, as the
reference for what HTTP, authentication, CAS, encryption and audit cost before LangGraph's
mapping adds its part: a checkpoint ``PUT`` (and ``GET``) with ``recovery_client.client``.

Then checks that every accepted put is a stored row, and prints a table (ops/s, p50 and
p99 latency in ms, ratio to PostgresSaver). Numbers depend on the machine and what else
runs on it: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # python bench/bench_langgraph.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_url, drop_database, environ, reset_database  # noqa: E402

PRIME = 20  # puts before a get_tuple scenario measures
ENVELOPE = "checkpoint PUT/GET (client)"


def say(text: str) -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------------------
# Operations: each ``make_*`` runs in a client process and returns ``op() -> bool``
# --------------------------------------------------------------------------------------


class Chain:
    """One thread's chain of checkpoints written through ``saver.put``."""

    def __init__(self, saver, thread: str, payloads: list[dict]):
        self.saver, self.thread, self.payloads = saver, thread, payloads
        self.step, self.parent, self.version = 0, None, None

    def put(self) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        step = self.step + 1
        version = self.saver.get_next_version(self.version, None)
        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=step))
        cp["channel_values"] = {"state": self.payloads[step % len(self.payloads)],
                                "counter": step}
        cp["channel_versions"] = {"state": version, "counter": version}
        config = {"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}}
        if self.parent:
            config["configurable"]["checkpoint_id"] = self.parent
        self.saver.put(config, cp, {"source": "loop", "step": step, "parents": {}},
                       {"state": version, "counter": version})
        self.step, self.parent, self.version = step, cp["id"], version

    def get(self) -> bool:
        tup = self.saver.get_tuple({"configurable": {"thread_id": self.thread,
                                                     "checkpoint_ns": ""}})
        return tup is not None and tup.checkpoint["channel_values"]["counter"] == self.step


def _recovery_saver(spec: dict):
    from recovery_client.langgraph import RecoverySaver

    return RecoverySaver(spec["base_url"], spec["tenant"], spec["token"], timeout_s=30)


def _postgres_saver(spec: dict):
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    conn = psycopg.connect(spec["dsn"], autocommit=True, prepare_threshold=0,
                           row_factory=dict_row)
    return PostgresSaver(conn)


def _make(saver_factory, what: str):
    def make(spec: dict):
        chain = Chain(saver_factory(spec), spec["thread_id"], spec["payloads"])
        if what == "put":
            def op() -> bool:
                chain.put()
                return True
            return op
        for _ in range(spec.get("history", PRIME)):
            chain.put()
        return chain.get

    return make


def make_envelope_put(spec: dict):
    """The reference: the same payload as a plain checkpoint ``PUT`` (CAS, revision,
    audit event) with the runtime client ``recovery_client.client``, kept-alive."""
    from recovery_client.client import HttpCheckpointStore, next_revision

    store = HttpCheckpointStore(spec["base_url"], spec["tenant"], spec["token"], timeout_s=30)
    body = {"id": str(uuid.uuid4()), "run_id": str(uuid.uuid4()), "revision": 0,
            "kind": "runifold.agent", "schema_version": 1, "payload": spec["payloads"][0],
            "updated_at_ms": int(time.time() * 1000)}
    store.compare_and_swap(body, None)
    state = {"body": body}

    def op() -> bool:
        current = state["body"]
        nxt = next_revision(current, spec["payloads"][(current["revision"] + 1)
                                                      % len(spec["payloads"])])
        store.compare_and_swap(nxt, current["revision"])
        state["body"] = nxt
        if spec.get("read"):
            return store.load(nxt["id"])["revision"] == nxt["revision"]
        return True

    if not spec.get("read"):
        return op
    for _ in range(spec.get("history", PRIME)):
        op()
    return lambda: store.load(state["body"]["id"])["revision"] == state["body"]["revision"]


def make_envelope_get(spec: dict):
    return make_envelope_put(dict(spec, read=True))


make_recovery_put = _make(_recovery_saver, "put")
make_recovery_get = _make(_recovery_saver, "get")
make_postgres_put = _make(_postgres_saver, "put")
make_postgres_get = _make(_postgres_saver, "get")


# --------------------------------------------------------------------------------------
# Checks (in the parent, after the clients exited)
# --------------------------------------------------------------------------------------


def check_recovery(threads: list[str], accepted: int, tenant) -> dict:
    from checkpoints.models import GraphCheckpoint

    rows = GraphCheckpoint.objects.for_tenant(tenant).filter(thread_id__in=threads).count()
    return {"ok": rows == accepted, "detail": f"{rows:,} checkpoint rows for {accepted:,} puts"}


def check_postgres(dsn: str, threads: list[str], accepted: int) -> dict:
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ANY(%s)",
                            [threads]).fetchone()[0]
    return {"ok": rows == accepted, "detail": f"{rows:,} checkpoint rows for {accepted:,} puts"}


# --------------------------------------------------------------------------------------


def _args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.bench_langgraph",
                                description=__doc__.splitlines()[0])
    p.add_argument("--pg-url", default=(os.environ.get("PG_URL") or os.environ.get(
        "DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/recovery"),
        help="any database URL on the PostgreSQL server (its name is replaced by --db)")
    p.add_argument("--db", default="recovery_lgbench", help="the bench database (dropped!)")
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per row")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2, help="each row this many times, in turn; "
                                                         "the best is shown")
    p.add_argument("--writers", default="1,4", help="client processes per row, comma-separated")
    p.add_argument("--history", type=int, default=PRIME,
                   help="puts on a thread before its get_tuple row measures")
    p.add_argument("--only", default="put,get_tuple", help="operations, comma-separated")
    p.add_argument("--out", default=str(ROOT / "var" / "bench" / "langgraph.json"))
    args = p.parse_args(argv)
    args.writer_counts = [int(x) for x in args.writers.split(",") if x.strip()]
    return args


def main(argv=None) -> None:
    args = _args(argv)
    url = bench_url(args.pg_url, args.db)
    env = environ(url)
    os.environ.update(env)
    os.environ.pop("CELERY_BROKER_URL", None)
    log_dir = ROOT / "var" / "bench"
    (log_dir / "var").mkdir(parents=True, exist_ok=True)
    say(f"bench_langgraph: database {args.db} on {url.rsplit('/', 1)[0]} (dropped and created)")
    reset_database(args.pg_url, args.db)

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from bench.common import payloads as make_payloads
    from bench.writes import Fixture, run_writers, start_gunicorn, stop, summarise

    call_command("migrate", verbosity=0)
    with connection.cursor() as cur:
        cur.execute("SHOW server_version")
        pg_version = cur.fetchone()[0]
    fx = Fixture()
    tenant = fx.tenant("bench-lg")
    token = fx.tokens["bench-lg"]
    payloads = make_payloads()
    size = len(json.dumps(payloads[0]))

    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as pg_saver:
        pg_saver.setup()
    connections.close_all()

    server, base_url = start_gunicorn(env, log_dir / "gunicorn-langgraph.log")
    rows: list[dict] = []
    try:
        from recovery_client.langgraph import RecoverySaver

        with RecoverySaver(base_url, "bench-lg", token) as warm:  # imports, connections
            for _ in range(8):
                warm.get_tuple({"configurable": {"thread_id": "warm-up", "checkpoint_ns": ""}})

        scenarios = []
        for n in args.writer_counts:
            for what in [w.strip() for w in args.only.split(",") if w.strip()]:
                scenarios.append(("RecoverySaver (HTTP, gunicorn)", what, n,
                                  make_recovery_put if what == "put" else make_recovery_get))
                scenarios.append(("PostgresSaver (LangGraph)", what, n,
                                  make_postgres_put if what == "put" else make_postgres_get))
                scenarios.append((ENVELOPE, what, n,
                                  make_envelope_put if what == "put" else make_envelope_get))
        best: dict = {}
        oks: dict = {}
        for r in range(1, args.rounds + 1):
            say(f"  round {r} of {args.rounds}")
            for name, what, n, make_op in scenarios:
                threads = [f"bench-lg-{uuid.uuid4()}" for _ in range(n)]
                specs = [{"base_url": base_url, "tenant": "bench-lg", "token": token,
                          "dsn": url, "thread_id": t, "payloads": payloads,
                          "history": args.history} for t in threads]
                outcomes = run_writers(make_op, specs, warmup=args.warmup,
                                       seconds=args.seconds)
                row = summarise(outcomes)
                connections.close_all()
                if row["errors"]:
                    check = {"ok": False, "detail": "client failed: "
                             + row["errors"][0].strip().splitlines()[-1]}
                elif name == ENVELOPE:
                    check = {"ok": row["refused"] == 0,
                             "detail": f"{row['accepted']:,} accepted, {row['refused']:,} "
                                       f"wrong"}
                elif what == "put":
                    check = (check_recovery(threads, row["accepted"], tenant)
                             if name.startswith("Recovery")
                             else check_postgres(url, threads, row["accepted"]))
                else:
                    puts = args.history * n
                    check = {"ok": row["refused"] == 0,
                             "detail": f"{row['accepted']:,} heads read, {row['refused']:,} "
                                       f"wrong (after {puts} puts)"}
                row["check"] = check
                say(f"    {name:<31} {what:<9} {n}w {row['ops_per_s']:>8,.0f} ops/s  p50 "
                    f"{row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                    f"{'ok' if check['ok'] else 'FAILED'}: {check['detail']}")
                key = (name, what, n)
                oks[key] = oks.get(key, True) and check["ok"]
                if key not in best or row["ops_per_s"] > best[key]["ops_per_s"]:
                    best[key] = dict(row, saver=name, operation=what, writers=n)
        for key, row in best.items():
            row["all_ok"] = oks[key]
        rows = list(best.values())
    finally:
        stop(server)
        connections.close_all()
        if not args.keep_db:
            drop_database(args.pg_url, args.db)

    say("")
    say(f"LangGraph savers, best of {args.rounds} round(s) of {args.seconds:g} s, "
        f"~{size:,} B channel value, PostgreSQL {pg_version}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}")
    say(f"  {'saver':<31} {'operation':<10}{'clients':>7} {'ops/s':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'vs PG saver':>12}")
    for row in rows:
        ref = best.get(("PostgresSaver (LangGraph)", row["operation"], row["writers"]))
        ratio = (f"{row['ops_per_s'] / ref['ops_per_s']:.2f}x"
                 if ref and ref["ops_per_s"] else "-")
        say(f"  {row['saver']:<31} {row['operation']:<10}{row['writers']:>7} "
            f"{row['ops_per_s']:>9,.0f} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
            f"{ratio:>12}{'' if row['all_ok'] else '  CHECK FAILED'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "postgresql": pg_version, "cpus": os.cpu_count(),
                               "seconds": args.seconds, "rounds": args.rounds,
                               "rows": [{k: v for k, v in r.items() if k != "errors"}
                                        for r in rows]}, indent=2))
    say(f"\nwritten to {out}")
    if not all(r["all_ok"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
