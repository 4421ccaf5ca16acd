#!/usr/bin/env python
"""Checkpoint migration benchmark (issue 19, "Done when": migration speed in checkpoints
per second on PostgreSQL for 10,000 stranded runs): how fast
``services.checkpoints_migrate`` (what ``manage.py migrate_checkpoints`` calls) moves
``--runs`` stranded ``acme.order`` v1 runs to v2, against a reference measured in the
same run on the same server.

On its own PostgreSQL database (``--db``, dropped and created; the name must contain
"bench") it bulk-loads two tenants the way ``manage.py generate_load`` does
(``loadgen._Generator``: rows inserted with COPY, consistent with what the services
write), holding only ``acme.order`` v1 runs whose owners are gone (every recovery state
but ``schema_mismatch``, no live lease): ``bench-mig`` with ``--runs`` runs, ``bench-ref``
with ``--reference-runs``. Then it times, each once:

1. the dry run over ``bench-mig`` (reads, checks and upcasts; writes nothing);
2. the migration of ``bench-mig`` (one transaction per checkpoint: lock, checks, upcast,
   CAS revision, history, run, audit event), with the statements it sends per
   checkpoint;
3. the reference: one runtime write (``services.checkpoint_put``, a new revision with
   the run's fencing token) of each of ``bench-ref``'s checkpoints, one after another;
   the store's ordinary single-writer write path.

Prints seconds, checkpoints per second and the ratio of each to the reference; asserts
only that everything was migrated (a benchmark, not a test; compare rows of one run).

    .venv/bin/python bench/bench_migrate.py [--runs 10000] [--reference-runs 2000] \\
        [--pg-url postgres://postgres@127.0.0.1:5432/recovery] [--db recovery_bench_migrate]
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import standalone  # noqa: E402


def _options(p) -> None:
    p.add_argument("--reference-runs", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=100, help="migrate_checkpoints' --batch-size")


def main() -> None:
    standalone(__doc__, run, runs=10_000, db="recovery_bench_migrate",
               extra=_options, whole_args=True)


def stranded(slug: str, runs: int, seed: int):
    """A tenant ``slug`` with ``runs`` ``acme.order`` v1 runs whose owners are gone
    (bulk rows, ``loadgen._Generator``); returns the tenant."""
    from checkpoints import services
    from checkpoints.management import loadgen
    from checkpoints.management.loaddata import ROLES, _Tenant
    from checkpoints.vocab import PhaseClass, RecoveryState, Role

    tenant = services.tenant_create(slug=slug, name=slug)
    users = {}
    for suffix, role in ROLES:
        users[suffix] = services.account_create(username=f"{slug}-{suffix}",
                                                service=role == Role.WRITER)
        services.role_grant(actor=None, tenant=tenant, user=users[suffix], role=role)

    class Stranded(loadgen._Generator):
        def plan(self, state, tenant):
            while True:  # a healthy run with a live lease is not stranded: plan again
                plan, effects = super().plan(state, tenant)
                if plan.lease_expires_at is None or plan.lease_expires_at < self.now:
                    return plan, effects

    gen = Stranded(random.Random(seed), [_Tenant(tenant, users)], 1.0)
    gen.templates = {c: [t for t in ts if (t.kind, t.schema_version) == ("acme.order", 1)]
                     or ts for c, ts in gen.templates.items()}
    weights = {s: w for s, w in loadgen.STATE_WEIGHTS.items()
               if s != RecoveryState.SCHEMA_MISMATCH}
    saved, loadgen.STATE_WEIGHTS = loadgen.STATE_WEIGHTS, weights
    try:
        for start in range(0, runs, 2000):
            n = min(2000, runs - start)
            gen.batch(n, n + n // 2)  # one or two revisions each
    finally:
        loadgen.STATE_WEIGHTS = saved
    assert all(t.kind == "acme.order" for c, ts in gen.templates.items()
               if c != PhaseClass.UNSUPPORTED for t in ts)
    return tenant


def run(args) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from checkpoints import services
    from checkpoints.models import Checkpoint, Run
    from checkpoints.vocab import MigrationOutcome

    t0 = time.perf_counter()
    mig = stranded("bench-mig", args.runs, seed=1)
    ref = stranded("bench-ref", args.reference_runs, seed=2)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")  # fresh statistics, as generate_load leaves them
    print(f"built {args.runs:,} + {args.reference_runs:,} stranded acme.order v1 runs in "
          f"{time.perf_counter() - t0:.1f} s (PostgreSQL {connection.pg_version})")

    statements = 0

    def count(execute, sql, params, many, context):
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    rows = []

    def timed(name: str, n: int, fn):
        nonlocal statements
        statements = 0
        started = time.perf_counter()
        with connection.execute_wrapper(count):
            result = fn()
        took = time.perf_counter() - started
        rows.append((name, n, took, statements))
        return result

    def migrate(dry_run: bool):
        return services.checkpoints_migrate(actor=None, tenant=mig, kind="acme.order",
                                            to_version=2, dry_run=dry_run,
                                            batch_size=args.batch_size)

    preview = timed("dry run (preview)", args.runs, lambda: migrate(True))
    assert preview.counts[MigrationOutcome.MIGRATED] == args.runs, preview.counts
    report = timed("migration (real)", args.runs, lambda: migrate(False))
    assert report.counts[MigrationOutcome.MIGRATED] == args.runs, (report.counts,
                                                                   report.refusals)
    assert not Checkpoint.objects.filter(tenant=mig, schema_version=1).exists()

    from checkpoints.management.loaddata import order_payload
    from checkpoints.services.checkpoints import parse_envelope

    writer = services.account_create(username="bench-ref-runtime", service=True)
    services.role_grant(actor=None, tenant=ref, user=writer, role="writer")
    targets = list(Checkpoint.objects.filter(tenant=ref).select_related("run")
                   .values_list("uuid", "run__uuid", "revision", "run__fencing_token"))
    payload = order_payload("charged", seed=3)

    def reference():
        for cp, run_id, revision, token in targets:
            env = parse_envelope({"id": str(cp), "run_id": str(run_id),
                                  "revision": revision + 1, "kind": "acme.order",
                                  "schema_version": 1, "payload": payload,
                                  "updated_at_ms": int(time.time() * 1000)}, url_id=cp)
            services.checkpoint_put(actor=writer, tenant=ref, envelope=env,
                                    expected_revision=revision, fencing_token=token)

    timed("reference: runtime write (checkpoint_put)", len(targets), reference)
    written = Checkpoint.objects.filter(tenant=ref, revision__gt=0).count()
    assert Run.objects.filter(tenant=ref).count() == len(targets) and written

    ref_rate = rows[-1][1] / rows[-1][2]
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cpus)")
    print(f"\n{'':42} {'checkpoints':>11} {'seconds':>8} {'per s':>8} {'x ref':>6} "
          f"{'stmts/cp':>8}")
    for name, n, took, stmts in rows:
        rate = n / took
        print(f"{name:42} {n:>11,} {took:>8.1f} {rate:>8.0f} {rate / ref_rate:>6.2f} "
              f"{stmts / n:>8.1f}")


if __name__ == "__main__":
    main()
