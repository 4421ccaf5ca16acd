#!/usr/bin/env python
"""Audit sequencer benchmark (issue 22, item 1: "an event not yet integrated is at most a
bounded time old, p99 under 2 s with the sequencer running"), on its own PostgreSQL
database (``--db``, dropped and created; the name must contain "bench").

1. Integration throughput, per tenant, in batches: ``--events`` events are built
   (``audit.new_event``: HMAC each) and appended in one multi-row ``INSERT``
   (``sql.insert_rows``: the seq and queue triggers fire, as for every append), timed:
   **the reference**, the append alone. Then ``audittree.audit_integrate`` runs in
   batches of ``--batch`` until the tenant's queue is empty, timed: leaves, stored nodes,
   one Ed25519-signed head per batch, the queue rows deleted. Events/s of each and their
   ratio, ``--rounds`` times, interleaved (each round its own tenant).
2. Lag under load: ``--writers`` threads, spread over ``--tenants`` tenants, each append
   one event per transaction (``audit_record``, as a write does) at ``--rate`` events/s
   (0: as fast as they can) for ``--seconds``; a thread runs
   ``audittree.audit_integrate_all`` once a second (fixed ticks), as beat or the
   in-process worker does. Each event's lag = when the sequencer's round that integrated
   it had committed (``clock_timestamp()`` read right after the round) minus when the
   event's transaction had committed (``clock_timestamp()`` read by its writer right
   after ``COMMIT``), both on the database clock. p50, p99, max; the target is p99 < 2 s.

Prints the rows and whether the target holds; with ``--json PATH`` writes them too.
Asserts only correctness (every event integrated once, the trail verifies); timings are
not judged by a test.

    .venv/bin/python bench/bench_audit.py [--events 20000] [--batch 5000] [--rounds 2] \\
        [--writers 4] [--tenants 2] [--rate 250] [--seconds 10] \\
        [--pg-url postgres://postgres@127.0.0.1:5432/recovery] [--db recovery_bench_audit] \\
        [--json var/bench/audit.json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import on_own_database, percentile  # noqa: E402

#: ``python -m bench --smoke`` passes these (every part once, numbers of no value).
SMOKE_ARGS = ["--events", "500", "--batch", "200", "--rounds", "1", "--writers", "2",
              "--seconds", "3", "--rate", "50"]
#: The target of issue 22, item 1.
LAG_P99_TARGET_S = 2.0


def say(text: str) -> None:
    print(text, flush=True)


def db_clock():
    """The database's clock now (``clock_timestamp()``, not the transaction's start)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


# --- 1. throughput --------------------------------------------------------------------------

def throughput(tenant, *, events: int, batch: int) -> dict:
    """Append ``events`` events to ``tenant`` in one INSERT (timed: the reference), then
    integrate them in batches (timed). Returns the row."""
    from django.db import transaction
    from django.utils import timezone

    from checkpoints import audittree, sql
    from checkpoints.audit import new_event
    from checkpoints.models import AuditEvent, AuditPending

    now = timezone.now()
    rows = [new_event(tenant=tenant, created_at=now, actor=None, action="bench.note",
                      target_type="tenant", target_id=i) for i in range(events)]
    fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
    values = [{f.attname: getattr(e, f.attname) for f in fields} for e in rows]
    started = time.perf_counter()
    with transaction.atomic():
        sql.insert_rows(AuditEvent, values)
    insert_s = time.perf_counter() - started
    started = time.perf_counter()
    batches = 0
    while audittree.audit_integrate(tenant, limit=batch):
        batches += 1
    integrate_s = time.perf_counter() - started
    assert not AuditPending.objects.filter(tenant=tenant).exists(), "queue not drained"
    return {"events": events, "batch": batch, "batches": batches,
            "insert_s": round(insert_s, 3), "integrate_s": round(integrate_s, 3),
            "insert_per_s": round(events / insert_s), "integrate_per_s":
            round(events / integrate_s), "ratio": round(insert_s / integrate_s, 3)}


# --- 2. lag under a write load --------------------------------------------------------------

def lag(tenants, *, writers: int, rate: float, seconds: float) -> dict:
    """Writers append events for ``seconds`` while the sequencer runs once a second;
    returns the lag row (database clock)."""
    from django.db import connections, transaction

    from checkpoints import audittree, services
    from checkpoints.models import AuditLeaf

    stop_writing, stop_sequencer = threading.Event(), threading.Event()
    committed: list[tuple[int, object]] = []  # (event id, database time after COMMIT)
    rounds: list[tuple[object, dict[int, int]]] = []  # (database time after, {tenant: size})
    round_s: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        tenant = tenants[n % len(tenants)]
        mine = []
        try:
            period = 1.0 / rate if rate else 0.0
            next_at = time.monotonic()
            while not stop_writing.is_set():
                with transaction.atomic():
                    event = services.audit_record(tenant=tenant, actor=None,
                                                  action="bench.note", target_type="tenant",
                                                  target_id=n)
                mine.append((event.pk, db_clock()))
                if period:
                    next_at += period
                    stop_writing.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)
        finally:
            connections.close_all()
            with lock:
                committed.extend(mine)

    def sequencer() -> None:
        try:
            tick = time.monotonic()
            while not stop_sequencer.is_set():
                tick += 1.0
                stop_sequencer.wait(max(0.0, tick - time.monotonic()))
                started = time.perf_counter()
                audittree.audit_integrate_all()
                round_s.append(time.perf_counter() - started)
                sizes = {t.pk: (audittree.newest_head(t.pk).tree_size
                                if audittree.newest_head(t.pk) else 0) for t in tenants}
                rounds.append((db_clock(), sizes))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    seq_thread = threading.Thread(target=sequencer, name="sequencer")
    threads = [threading.Thread(target=writer, args=(n,), name=f"writer-{n}")
               for n in range(writers)]
    seq_thread.start()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop_writing.set()
    for t in threads:
        t.join()
    time.sleep(2.5)  # two more rounds: everything committed gets integrated
    stop_sequencer.set()
    seq_thread.join()
    if errors:
        raise errors[0]
    leaf_of = dict(AuditLeaf.objects.for_all_tenants(reason="bench: the lag of every event")
                   .filter(event_id__in=[e for e, _ in committed])
                   .values_list("event_id", "index"))
    tenant_of = dict(AuditLeaf.objects.for_all_tenants(reason="bench: the lag of every event")
                     .filter(event_id__in=[e for e, _ in committed])
                     .values_list("event_id", "tenant_id"))
    lags, missing = [], 0
    for event_id, at in committed:
        index = leaf_of.get(event_id)
        if index is None:
            missing += 1
            continue
        done = next((when for when, sizes in rounds if sizes[tenant_of[event_id]] > index),
                    None)
        if done is None:
            missing += 1
            continue
        lags.append(max(0.0, (done - at).total_seconds()))
    p99 = percentile(lags, 0.99)
    return {"writers": writers, "tenants": len(tenants), "rate_per_writer": rate,
            "seconds": seconds, "events": len(committed),
            "events_per_s": round(len(committed) / seconds), "not_integrated": missing,
            "p50_s": round(percentile(lags, 0.50), 3), "p99_s": round(p99, 3),
            "max_s": round(max(lags, default=0.0), 3),
            "round_p50_ms": round(percentile(round_s, 0.5) * 1000, 1),
            "round_max_ms": round(max(round_s, default=0.0) * 1000, 1),
            "target_p99_s": LAG_P99_TARGET_S,
            "holds": bool(lags) and missing == 0 and p99 < LAG_P99_TARGET_S}


# --- the run --------------------------------------------------------------------------------

def run(args) -> dict:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from checkpoints import services

    result = {"throughput": [], "lag": None}
    for r in range(args.rounds):
        tenant = services.tenant_create(slug=f"bench-{r}", name=f"throughput {r}")
        services.audit_integrate(tenant)  # its creation event: the tree starts at 1
        say(f"throughput round {r + 1}: {args.events:,} events, batches of {args.batch:,} ...")
        row = throughput(tenant, events=args.events, batch=args.batch)
        result["throughput"].append(row)
        say(f"  reference, the append alone (one INSERT, triggers): {row['insert_per_s']:,} "
            f"events/s; integration ({row['batches']} batch(es), a signed head each): "
            f"{row['integrate_per_s']:,} events/s = {row['ratio']:.2f}x the append")
    tenants = [services.tenant_create(slug=f"load-{n}", name=f"load {n}")
               for n in range(args.tenants)]
    services.audit_integrate_all()
    rate = f"{args.rate:g} events/s each" if args.rate else "as fast as they can"
    say(f"lag: {args.writers} writer(s) over {args.tenants} tenant(s), {rate}, for "
        f"{args.seconds:g} s, the sequencer every 1 s ...")
    row = lag(tenants, writers=args.writers, rate=args.rate, seconds=args.seconds)
    result["lag"] = row
    verdict = ("holds" if row["holds"] else "FAILS") + (" (smoke)" if args.smoke else "")
    say(f"  {row['events']:,} events ({row['events_per_s']:,}/s), not integrated "
        f"{row['not_integrated']}; commit -> integrated (database clock): p50 "
        f"{row['p50_s']:.2f} s, p99 {row['p99_s']:.2f} s, max {row['max_s']:.2f} s "
        f"(a round: p50 {row['round_p50_ms']} ms, max {row['round_max_ms']} ms)")
    say(f"  target: p99 < {LAG_P99_TARGET_S:g} s: {verdict}")
    for tenant in tenants:
        intact, _, problem = services.audit_verify(tenant=tenant)
        assert intact, f"{tenant.slug}: {problem}"
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20000, help="events per throughput round")
    p.add_argument("--batch", type=int, default=5000, help="events per integration batch")
    p.add_argument("--rounds", type=int, default=2, help="throughput rounds")
    p.add_argument("--writers", type=int, default=4, help="writer threads for the lag")
    p.add_argument("--tenants", type=int, default=2, help="tenants the writers spread over")
    p.add_argument("--rate", type=float, default=250.0,
                   help="events per second per writer (0: unthrottled)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of write load")
    p.add_argument("--smoke", action="store_true", help="the smallest sizes: "
                   + " ".join(SMOKE_ARGS))
    p.add_argument("--pg-url", default=os.environ.get("PG_URL")
                   or "postgres://postgres@127.0.0.1:5432/recovery")
    p.add_argument("--db", default="recovery_bench_audit")
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.smoke:
        args = p.parse_args([*SMOKE_ARGS, *(argv if argv is not None else sys.argv[1:])])
    if "bench" not in args.db:
        p.error("--db: the name must contain 'bench' (it is dropped)")
    result = on_own_database(args, lambda: run(args), drop_env=("CELERY_BROKER_URL",),
                             env={"LOG_LEVEL": "ERROR", "RECOVERY_INPROCESS_WORKER": "false"})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
