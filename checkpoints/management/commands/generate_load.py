"""``manage.py generate_load``: a large, realistic data set for benchmarks (issue 8).

    python manage.py generate_load --tenants 20 --runs 100000 --revisions 1000000 \\
        --long-run 0193a4f2-0000-7000-8000-000000002000 --long-run-revisions 2000

Adds ``--runs`` runs spread over ``--tenants`` generated tenants (``load-00``,
``load-01``, ...; the first holds ``--big-tenant-share`` of the runs, the others share the
rest evenly), with ``--revisions`` checkpoint revisions in all (at least one per run),
effects in every state, conflicts, retry requests, and runs in every recovery state.
Running it again adds more runs to the same tenants (the benchmark grows its data set this
way from one size to the next). ``--long-run UUID`` also puts one run with
``--long-run-revisions`` revisions in the first tenant (the run page benchmark).

**Bulk load data, not service writes.** Tenants and their accounts (``load-NN-reviewer``,
``-approver``, ``-approver2``, ``-viewer``, ``-writer``; no passwords) are made through
``services`` (so each tenant's audit chain exists and verifies), but runs, checkpoints,
revisions, effects, conflicts and retry requests are inserted directly, in batches
(PostgreSQL ``COPY``, else multi-row INSERTs), bypassing ``services``. The rows are kept
consistent with what ``services`` would have written:

- phase class, phase label and identity come from ``kinds.classify`` of the stored
  payload, as in ``checkpoint_put``; the checkpoint row equals its last revision row;
- a run's ``recovery_state``/``recovery_reason`` are ``policy.recovery_state`` of the
  facts generated for it (effect states and labels, open retry, unacknowledged conflicts,
  lease, last write, closed), the function ``services.run_refresh_state`` applies; the
  command checks that each run lands in the state it was generated for;
- effects walk the effect table (``policy.EFFECT_TRANSITIONS``) with one revision row per
  step; ``confirmed``/``failed`` carry an encrypted receipt;
- ``unacknowledged_conflicts`` equals the run's unacknowledged ``Conflict`` rows; retry
  requests keep four eyes and at most one open request per run; an approved one carries
  the preview ``services.retry_preview`` would have stored.

What it leaves out: audit events for the bulk rows (the tenants' chains hold only their
set-up events, so ``verify_audit_chain`` still passes), reconcile requests, leases'
audit. Payload ciphertexts are encrypted once per template and reused (each is a real
Fernet token of a ~1 KB payload under the configured key, so reveals work).

**Never on real data.** It refuses to run when the database holds any tenant it did not
make (slug not starting with ``load-``), unless ``--force``.
"""

from __future__ import annotations

import random
import time
import uuid

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection

from checkpoints import services
from checkpoints.management.loaddata import (
    MAX_RUN_REVISIONS,
    MAX_RUNS,
    NAME_PREFIX,
    ROLES,
    SLUG_PREFIX,
    User,
    _Tenant,
)
from checkpoints.management.loadgen import _Generator, _Progress
from checkpoints.models import (
    Run,
    Tenant,
)
from checkpoints.vocab import (
    Role,
)


class Command(BaseCommand):
    help = ("Bulk-load a large, realistic data set (runs in every recovery state, checkpoint "
            "history, effects, conflicts, retry requests) into generated tenants load-NN. "
            "Refuses a database with other tenants unless --force.")

    def add_arguments(self, parser):
        parser.add_argument("--tenants", type=int, default=20, help="generated tenants (1..100)")
        parser.add_argument("--runs", type=int, default=1000, help="runs to add")
        parser.add_argument("--revisions", type=int, default=None,
                            help="checkpoint revisions to add in all, at least one per run "
                                 "(default: 10 per run)")
        parser.add_argument("--big-tenant-share", type=float, default=0.5,
                            help="share of the runs in the first tenant (0..1; each other run "
                                 "goes to one of the others at random)")
        parser.add_argument("--long-run", type=uuid.UUID, default=None,
                            help="also add this run (a UUID) to the first tenant with "
                                 "--long-run-revisions revisions")
        parser.add_argument("--long-run-revisions", type=int, default=2000)
        parser.add_argument("--seed", type=int, default=None, help="random seed")
        parser.add_argument("--batch", type=int, default=2000, help="runs per transaction")
        parser.add_argument("--force", action="store_true",
                            help="run even though the database has tenants this command "
                                 "did not make (a slug without load- or a name it does not give)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args, **o):
        tenants_n, runs_n = o["tenants"], o["runs"]
        revisions_n = o["revisions"] if o["revisions"] is not None else 10 * runs_n
        if not 1 <= tenants_n <= 100:
            raise CommandError("--tenants: 1..100")
        if runs_n < 0 or (runs_n and revisions_n < runs_n):
            raise CommandError("--runs must be >= 0 and --revisions >= --runs")
        if not 0 <= o["big_tenant_share"] <= 1:
            raise CommandError("--big-tenant-share: 0..1")
        if not 1 <= o["long_run_revisions"] <= MAX_RUN_REVISIONS:
            raise CommandError(f"--long-run-revisions: 1..{MAX_RUN_REVISIONS:,}")
        if runs_n > MAX_RUNS or (runs_n and revisions_n > MAX_RUN_REVISIONS * runs_n):
            raise CommandError(f"--runs: at most {MAX_RUNS:,}; --revisions: at most "
                               f"{MAX_RUN_REVISIONS:,} per run")
        if not 1 <= o["batch"] <= 100_000:
            raise CommandError("--batch: 1..100,000 runs per transaction")
        try:
            # Made by this command: a load-NN slug and the name it gives (a hand-made
            # tenant called load-00 is somebody's data).
            others = list(Tenant.objects.exclude(slug__startswith=SLUG_PREFIX,
                                                  name__startswith=NAME_PREFIX)
                          .values_list("slug", flat=True)[:5])
        except DatabaseError:
            raise CommandError("generate_load: the database has no tables yet: run "
                               "`python manage.py migrate` first") from None
        if others and not o["force"]:
            raise CommandError(
                f"generate_load: this database has tenants it did not make ({', '.join(others)}"
                f"{', ...' if len(others) == 5 else ''}); it only loads throwaway databases. "
                f"Use --force to load it anyway.")
        if o["long_run"] is not None and (
                Run.objects.for_tenant(Tenant.objects.filter(slug__startswith=SLUG_PREFIX))
                .filter(uuid=o["long_run"]).exists()):
            raise CommandError(f"--long-run: run {o['long_run']} exists already")
        rng = random.Random(o["seed"])
        started = time.monotonic()
        gen = _Generator(rng, self._tenants(tenants_n), o["big_tenant_share"])
        progress = _Progress(runs_n + (1 if o["long_run"] else 0), "generate_load",
                             not o["no_progress"])
        try:
            if o["long_run"] is not None:
                gen.long_run(o["long_run"], o["long_run_revisions"])
                progress.update(1)
            left_runs, left_revs = runs_n, revisions_n
            while left_runs:
                n = min(o["batch"], left_runs)
                revs = revisions_n * n // runs_n if left_runs > n else left_revs
                gen.batch(n, revs)
                left_runs -= n
                left_revs -= revs
                progress.update(n)
        finally:
            progress.close()
        if connection.vendor == "postgresql" and runs_n:
            # Fresh statistics: without them the planner takes a tenant for a handful of
            # rows and may re-run a search's subquery once per run listed (issue 17,
            # item 7: seconds for one inbox page until autovacuum analyzes the tables).
            with connection.cursor() as cur:
                cur.execute("ANALYZE")
        took = time.monotonic() - started
        stats = ", ".join(f"{n:,} {name}" for name, n in gen.counts.items())
        self.stdout.write(f"generate_load: added {stats} in {took:.1f} s")

    def _tenants(self, n: int) -> list[_Tenant]:
        out = []
        for i in range(n):
            slug = f"{SLUG_PREFIX}{i:02d}"
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                tenant = services.tenant_create(slug=slug, name=f"{NAME_PREFIX}{i:02d}")
            users = {}
            for suffix, role in ROLES:
                name = f"{slug}-{suffix}"
                user = User.objects.filter(username=name).first()
                if user is None:
                    user = services.account_create(username=name, service=role == Role.WRITER)
                    services.role_grant(actor=None, tenant=tenant, user=user, role=role)
                users[suffix] = user
            out.append(_Tenant(tenant, users))
        return out
