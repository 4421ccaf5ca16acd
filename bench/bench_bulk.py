#!/usr/bin/env python
"""Bulk action benchmark (issue 9, item 3): how long one bulk action of ``--runs`` runs
(default ``BULK_MAX_RUNS``, 500) takes inline, as the dashboard's POST runs it.

On its own PostgreSQL database (``--db``, dropped and created; the name must contain
"bench"), it builds ``--runs`` in-doubt runs (a checkpoint in flight and one submitted
effect each, the owners gone) and times ``services.bulk_submit`` for: reconcile (the
requests stored; the worker is not run: ``RECOVERY_INPROCESS_WORKER=0`` and no broker,
so they wait as with a broker), mark unknown, acknowledge conflicts, close; and the
result page's selector (``selectors.bulk_get``). Prints seconds and milliseconds per run;
asserts nothing (a benchmark, not a test).

    .venv/bin/python bench/bench_bulk.py [--runs 500] \\
        [--pg-url postgres://postgres@127.0.0.1:5432/recovery] [--db recovery_bench_bulk]
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
    standalone(__doc__, run, runs=500, db="recovery_bench_bulk",
               env={"CELERY_TASK_ALWAYS_EAGER": "1"})


def run(n: int) -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from checkpoints import selectors, services
    from checkpoints.jobs import reconciliation
    from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect

    # Reconcile without running the look-ups (a worker's job, not the request's).
    reconciliation.dispatch = lambda pks, **kw: reconciliation.Sent(False, "not dispatched")
    tenant = services.tenant_create(slug="bench", name="bench")
    writer = services.account_create(username="bench-writer", password=None, service=True)
    services.role_grant(actor=None, tenant=tenant, user=writer, role="writer")
    reviewer = services.account_create(username="bench-reviewer", password=None)
    services.role_grant(actor=None, tenant=tenant, user=reviewer, role="reviewer")

    def build() -> list[uuid.UUID]:
        runs = []
        for i in range(n):
            run_id = uuid.uuid4()
            put_checkpoint(writer, tenant, envelope(run_id=run_id, payload={
                "phase": "charging", "order_id": f"B-{i}"}))
            fx = effect_body(run_id=run_id, operation_key=f"charge:{run_id}")
            put_effect(writer, tenant, fx)
            put_effect(writer, tenant, dict(fx, revision=1, state="submitted"), expected=0)
            runs.append(run_id)
        age_world(3600)
        return runs

    started = time.perf_counter()
    runs = build()
    print(f"built {n} in-doubt runs in {time.perf_counter() - started:.1f} s")
    for action, fresh in (("reconcile", False), ("mark_unknown", True),
                          ("acknowledge_conflicts", False), ("close", False)):
        if fresh:
            runs = build()
        started = time.perf_counter()
        bulk, _ = services.bulk_submit(actor=reviewer, tenant=tenant, action=action,
                                       reason="bench", run_ids=runs,
                                       client_token=uuid.uuid4())
        took = time.perf_counter() - started
        print(f"{action:>22}: {n} runs in {took:6.2f} s  ({1000 * took / n:5.1f} ms/run; "
              f"done {bulk.done}, refused {bulk.refused}, failed {bulk.failed})")
        started = time.perf_counter()
        selectors.bulk_get(user=reviewer, tenant=tenant, bulk_id=bulk.uuid)
        print(f"{'result page selector':>22}: {1000 * (time.perf_counter() - started):.1f} ms")


if __name__ == "__main__":
    main()
