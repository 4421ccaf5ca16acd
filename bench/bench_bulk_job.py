#!/usr/bin/env python
"""Bulk job benchmark (issue 22, item 6): one bulk close of ``--runs`` runs (default
5,000) run as a stored job (``jobs.bulk.execute``), against the same close of 500 runs
inline (``services.bulk_submit``), in the same process and database: milliseconds per
run of each and their ratio (the job's per-run cost over the inline one's: the job adds
one conditional UPDATE of its row per run). Also the result page's selector on the
finished job (at most 500 rows listed).

On its own PostgreSQL database (``--db``, dropped and created; the name must contain
"bench"). Runs are inserted as rows (the bench times the bulk, not the writes). Prints;
asserts nothing (a benchmark, not a test).

    .venv/bin/python bench/bench_bulk_job.py [--runs 5000] \\
        [--pg-url postgres://postgres@127.0.0.1:5432/recovery] [--db recovery_bench_bulkjob]
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
    standalone(__doc__, run, runs=5000, db="recovery_bench_bulkjob")


def _runs(tenant, n: int) -> list[str]:
    """``n`` healthy runs of ``tenant``, inserted as rows."""
    from checkpoints.models import Run
    from checkpoints.vocab import PhaseClass, RecoveryState

    rows = [Run(tenant=tenant, uuid=uuid.uuid4(), kind="acme.order", workflow="acme.order",
                phase_class=PhaseClass.STABLE, phase_label=f"ready {i}",
                recovery_state=RecoveryState.HEALTHY) for i in range(n)]
    Run.objects.for_tenant(tenant).bulk_create(rows, batch_size=1000)
    return [str(r.uuid) for r in rows]


def run(n: int) -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from checkpoints import selectors, services
    from checkpoints.jobs import bulk as bulk_job
    from checkpoints.models import BULK_MAX_RUNS

    tenant = services.tenant_create(slug="bench", name="bench")
    reviewer = services.account_create(username="bench-reviewer", password=None)
    services.role_grant(actor=None, tenant=tenant, user=reviewer, role="reviewer")

    inline_runs = _runs(tenant, BULK_MAX_RUNS)
    started = time.perf_counter()
    services.bulk_submit(actor=reviewer, tenant=tenant, action="close", reason="bench",
                         run_ids=inline_runs, client_token=uuid.uuid4())
    inline_ms = 1000 * (time.perf_counter() - started) / BULK_MAX_RUNS
    print(f"inline close, {BULK_MAX_RUNS} runs: {inline_ms:.2f} ms/run")

    job_runs = _runs(tenant, n)
    job, _ = services.bulk_submit(actor=reviewer, tenant=tenant, action="close",
                                  reason="bench", run_ids=job_runs, client_token=uuid.uuid4())
    started = time.perf_counter()
    result = bulk_job.execute(job.pk)
    took = time.perf_counter() - started
    job_ms = 1000 * took / n
    print(f"job close, {n} runs: {took:.1f} s, {job_ms:.2f} ms/run ({result['result']}, "
          f"{result.get('counts')})")
    print(f"job / inline per run: {job_ms / inline_ms:.2f}x")
    started = time.perf_counter()
    selectors.bulk_get(user=reviewer, tenant=tenant, bulk_id=job.uuid)
    print(f"result page selector (job, {n} results): "
          f"{1000 * (time.perf_counter() - started):.1f} ms")


if __name__ == "__main__":
    main()
