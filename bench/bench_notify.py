#!/usr/bin/env python
"""Notification benchmark (issue 21, "Done when": delivery latency from state change to
receiver, p50/p99, and the outbox's throughput), on its own PostgreSQL database
(``--db``, dropped and created; the name must contain "bench"), posting to a loopback
receiver in another process (a ``http.server`` that answers 204 and notes when each
message arrived).

1. Latency: ``--runs`` runs go ``ambiguous`` at a steady ``--rate`` (each change one
   committed ``UPDATE`` of the run's state: the outbox trigger writes its row in that
   transaction, as in the sweep's per-run transaction), while a thread runs
   ``jobs.notify.notify_round`` in a loop every ``--intervals`` seconds, as the
   in-process worker does (``stop.wait(interval)`` between rounds). The endpoint has
   ``group_window_s=0`` (no grouping wait): one message per run. Latency = the
   receiver's clock when the message arrived minus the producer's clock right after the
   commit (one machine, one clock); p50, p99, max per interval.
2. Throughput: ``--events`` runs go ``ambiguous`` in one statement (that many outbox
   rows), then ``dispatch_round`` is timed until the outbox is empty (rows/s: events
   classified, routed and rendered into messages) and ``send_due`` until every message
   is delivered (messages/s: claimed, signed, posted by ``THREADS`` threads, recorded).
   Reference, same run, same receiver: bare ``httpx`` POSTs of a message's body, a new
   client per request with one TLS context as ``safehttp`` does, in as many threads;
   and ``safehttp.post`` alone (the sender's POST without the database).
3. Nothing configured: another tenant with no endpoint gets ``--events`` outbox rows;
   one notification round's time and queries, beside an empty round's.

Prints the rows and ratios; with ``--json PATH`` writes them too. Asserts only
correctness (every message arrived once, the outbox drained); timings are not judged.

    .venv/bin/python bench/bench_notify.py [--runs 500] [--rate 20] [--intervals 1,5] \\
        [--events 5000] [--pg-url postgres://postgres@127.0.0.1:5432/recovery] \\
        [--db recovery_bench_notify] [--json var/bench/notify.json]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import free_port, on_own_database, percentile, wait_for_port  # noqa: E402

#: ``python -m bench --smoke`` passes these (every part once, numbers of no value).
SMOKE_ARGS = ["--runs", "20", "--rate", "40", "--intervals", "1", "--events", "200"]


# --- the receiver (its own process) ---------------------------------------------------------

def serve_receiver(port: int) -> None:
    """Answer every ``POST`` 204 and note (arrival time, ``webhook-id``, first run id);
    ``GET /seen`` returns them as JSON, ``POST /reset`` forgets them."""
    seen: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            arrived = time.time()
            if self.path == "/reset":
                with lock:
                    seen.clear()
                return self._answer(204)
            run = ""
            if self.path == "/hook":
                try:
                    runs = json.loads(body)["data"]["runs"]
                    run = runs[0]["id"] if runs else ""
                except (ValueError, KeyError, TypeError):
                    pass
            with lock:
                seen.append((arrived, self.headers.get("webhook-id", ""), run))
            return self._answer(204)

        def do_GET(self):  # noqa: N802
            with lock:
                data = json.dumps(seen).encode()
            return self._answer(200, data)

    ThreadingHTTPServer.request_queue_size = 256
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


class ReceiverProcess:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--receiver", str(self.port)])
        wait_for_port(self.port, self.proc, 30)

    def seen(self) -> list:
        import httpx

        return httpx.get(self.url + "/seen", timeout=30).json()

    def reset(self) -> None:
        import httpx

        httpx.post(self.url + "/reset", timeout=30)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


# --- the parts (Django is set up only in run(): its imports are inside the functions) ----

def _runs(tenant, n: int, tag: str) -> list:
    """``n`` healthy in-flight runs of ``tenant`` (rows written directly: the bench times
    what follows their state change, not their creation). Returns their primary keys."""
    from checkpoints.models import Run
    from checkpoints.vocab import PhaseClass, RecoveryState

    rows = [Run(tenant=tenant, uuid=uuid.uuid4(), kind="acme.order", workflow="acme.order",
                phase_class=PhaseClass.IN_FLIGHT, phase_label=f"charging {tag}-{i}",
                recovery_state=RecoveryState.HEALTHY) for i in range(n)]
    Run.objects.for_tenant(tenant).bulk_create(rows, batch_size=1000)
    return list(Run.objects.for_tenant(tenant).filter(uuid__in=[r.uuid for r in rows])
                .values_list("pk", "uuid"))


def _go_ambiguous(tenant, pks) -> None:
    from checkpoints.dbclock import NOW
    from checkpoints.models import Run
    from checkpoints.vocab import RecoveryState

    Run.objects.for_tenant(tenant).filter(pk__in=pks).update(
        recovery_state=RecoveryState.AMBIGUOUS, state_changed_at=NOW,
        recovery_reason="checkpoint in flight, owner gone")


def latency(tenant, receiver: ReceiverProcess, *, runs: int, rate: float,
            interval: float) -> dict:
    """Part 1 at one interval: p50/p99/max seconds from commit to arrival."""
    from django.db import connections

    from checkpoints.jobs import notify

    made = _runs(tenant, runs, f"L{interval:g}")
    receiver.reset()
    stop = threading.Event()
    rounds: list[float] = []

    def loop() -> None:  # jobs.inprocess._loop's shape
        try:
            while not stop.wait(interval):
                started = time.perf_counter()
                notify.notify_round()
                rounds.append(time.perf_counter() - started)
        finally:
            connections.close_all()

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    committed: dict[str, float] = {}
    started = time.monotonic()
    for i, (pk, run_uuid) in enumerate(made):
        pause = started + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        _go_ambiguous(tenant, [pk])  # autocommit: committed when it returns
        committed[str(run_uuid)] = time.time()
    deadline = time.monotonic() + 3 * interval + 60
    while time.monotonic() < deadline:
        seen = receiver.seen()
        if len(seen) >= runs:
            break
        time.sleep(0.2)
    stop.set()
    worker.join(timeout=120)
    arrived = {run: at for at, _, run in seen}
    assert len(seen) == runs and set(arrived) == set(committed), (
        f"latency: {len(seen)} messages for {runs} runs")
    lat = [arrived[run] - committed[run] for run in committed]
    return {"interval_s": interval, "runs": runs, "rate_per_s": rate,
            "p50_s": round(percentile(lat, 0.5), 3), "p99_s": round(percentile(lat, 0.99), 3),
            "max_s": round(max(lat), 3), "min_s": round(min(lat), 3),
            "round_p50_ms": round(1000 * percentile(rounds, 0.5), 1) if rounds else None}


def throughput(tenant, receiver: ReceiverProcess, *, events: int) -> dict:
    """Part 2: dispatch rows/s, send messages/s, and the bare POST reference."""
    import httpx

    from checkpoints import safehttp
    from checkpoints.jobs import notify
    from checkpoints.models import NotificationMessage, NotificationOutbox
    from checkpoints.services import notify_dispatch
    from checkpoints.vocab import DeliveryState

    made = _runs(tenant, events, "T")
    receiver.reset()
    _go_ambiguous(tenant, [pk for pk, _ in made])
    assert NotificationOutbox.objects.for_tenant(tenant).count() == events
    started = time.perf_counter()
    rows = 0
    while NotificationOutbox.objects.for_tenant(tenant).exists():
        rows += notify_dispatch.dispatch_round()["dispatched"]
    dispatch_s = time.perf_counter() - started
    messages = NotificationMessage.objects.for_tenant(tenant).filter(
        state=DeliveryState.PENDING)
    assert rows == events and messages.count() == events, (rows, messages.count())
    body = json.dumps(messages.first().payload, separators=(",", ":")).encode()  # body_of's

    started = time.perf_counter()
    sent = 0
    while sent < events:
        done = notify.send_due(budget_s=3600)["delivered"]
        if not done:
            break
        sent += done
    send_s = time.perf_counter() - started
    seen = receiver.seen()
    assert sent == events and len({msg_id for _, msg_id, _ in seen}) == events, (
        f"send: {sent} delivered, {len(seen)} received of {events}")

    tls = ssl.create_default_context()  # one per process, as safehttp keeps one

    def bare(_i: int) -> int:
        with httpx.Client(follow_redirects=False, trust_env=False, timeout=10,
                          verify=tls) as client:
            return client.post(receiver.url + "/bare", content=body,
                               headers={"Content-Type": "application/json"}).status_code

    def guarded(_i: int) -> int:
        return safehttp.post(receiver.url + "/bare", body=body,
                             headers={"Content-Type": "application/json"},
                             allow_private=True).status

    timed = {}
    for name, fn in (("reference", bare), ("safehttp", guarded)):
        started = time.perf_counter()
        with ThreadPoolExecutor(notify.THREADS) as pool:
            statuses = list(pool.map(fn, range(events)))
        timed[name] = time.perf_counter() - started
        assert statuses == [204] * events, name
    bare_s = timed["reference"]
    return {"events": events, "body_bytes": len(body),
            "dispatch_s": round(dispatch_s, 2), "dispatch_rows_per_s": round(events / dispatch_s),
            "send_s": round(send_s, 2), "send_per_s": round(events / send_s),
            "reference_s": round(bare_s, 2), "reference_per_s": round(events / bare_s),
            "safehttp_per_s": round(events / timed["safehttp"]),
            "threads": notify.THREADS}


def unconfigured(tenant, *, events: int) -> dict:
    """Part 3: one round with ``events`` outbox rows of a tenant with no endpoint."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from checkpoints.jobs import notify
    from checkpoints.models import NotificationOutbox

    def timed() -> tuple[float, int, dict]:
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            counts = notify.notify_round()
            took = time.perf_counter() - started
        return took, len(queries), counts

    notify.notify_round()
    empty_s, empty_q, _ = timed()
    made = _runs(tenant, events, "U")
    _go_ambiguous(tenant, [pk for pk, _ in made])
    took, queries, counts = timed()
    assert counts["dispatch"]["dropped"] == events
    assert not NotificationOutbox.objects.for_tenant(tenant).exists()
    return {"events": events, "round_ms": round(1000 * took, 1), "queries": queries,
            "empty_round_ms": round(1000 * empty_s, 1), "empty_round_queries": empty_q}


# --- the run -------------------------------------------------------------------------------

def run(args) -> dict:
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import override_settings

    call_command("migrate", verbosity=0)
    from checkpoints import services
    from checkpoints.vocab import NotificationEventType as E

    tenant = services.tenant_create(slug="bench", name="bench")
    quiet = services.tenant_create(slug="quiet", name="no endpoint")
    admin = services.account_create(username="bench-admin", password=None, service=True)
    services.role_grant(actor=None, tenant=tenant, user=admin, role="admin")
    receiver = ReceiverProcess()
    try:
        with override_settings(RECOVERY_NOTIFY_ALLOW_HTTP=True):
            services.endpoint_create(actor=admin, tenant=tenant, body={
                "channel": "webhook", "name": "bench", "url": receiver.url + "/hook",
                "event_types": [E.RUN_NEEDS_REVIEW], "group_window_s": 0})
        result = {"latency": [], "throughput": None, "unconfigured": None}
        for interval in args.interval_list:
            say(f"latency: {args.runs} runs going ambiguous at {args.rate:g}/s, a "
                f"notification round every {interval:g} s ...")
            row = latency(tenant, receiver, runs=args.runs, rate=args.rate, interval=interval)
            result["latency"].append(row)
            say(f"  commit -> receiver: p50 {row['p50_s']:.2f} s, p99 {row['p99_s']:.2f} s, "
                f"max {row['max_s']:.2f} s (a round: {row['round_p50_ms']} ms p50)")
        say(f"throughput: {args.events:,} events, one webhook endpoint (window 0) ...")
        row = throughput(tenant, receiver, events=args.events)
        result["throughput"] = row
        say(f"  dispatch: {row['events']:,} outbox rows in {row['dispatch_s']:.2f} s = "
            f"{row['dispatch_rows_per_s']:,} rows/s")
        say(f"  send:     {row['events']:,} messages in {row['send_s']:.2f} s = "
            f"{row['send_per_s']:,} messages/s ({row['threads']} threads, signed, recorded)")
        say(f"  reference bare httpx POST ({row['threads']} threads, a client per request, "
            f"{row['body_bytes']} B): {row['reference_per_s']:,}/s; send is "
            f"{row['send_per_s'] / row['reference_per_s']:.2f}x of it")
        say(f"  safehttp.post alone (the sender's POST: address checks, pinned IP, bounded "
            f"read; no database): {row['safehttp_per_s']:,}/s")
        row = unconfigured(quiet, events=args.events)
        result["unconfigured"] = row
        say(f"nothing configured: a round with {row['events']:,} outbox rows of a tenant "
            f"with no endpoint: {row['round_ms']} ms, {row['queries']} queries (an empty "
            f"round: {row['empty_round_ms']} ms, {row['empty_round_queries']} queries)")
        return result
    finally:
        receiver.stop()


def say(text: str) -> None:
    print(text, flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=500, help="runs per latency interval")
    p.add_argument("--rate", type=float, default=20.0, help="runs going ambiguous per second")
    p.add_argument("--intervals", default="1,5",
                   help="seconds between notification rounds, comma-separated")
    p.add_argument("--events", type=int, default=5000, help="outbox rows for throughput")
    p.add_argument("--pg-url", default=os.environ.get("PG_URL")
                   or "postgres://postgres@127.0.0.1:5432/recovery")
    p.add_argument("--db", default="recovery_bench_notify")
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--receiver", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.receiver is not None:
        serve_receiver(args.receiver)
        return
    if "bench" not in args.db:
        p.error("--db: the name must contain 'bench' (it is dropped)")
    args.interval_list = [float(x) for x in args.intervals.split(",") if x.strip()]
    result = on_own_database(args, lambda: run(args), drop_env=("CELERY_BROKER_URL",),
                             env={"RECOVERY_NOTIFY_ALLOW_PRIVATE": "true", "LOG_LEVEL": "ERROR"})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
