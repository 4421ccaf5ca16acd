#!/usr/bin/env python
"""List pages at scale: milliseconds and queries per page for the inbox tabs, the counts
poll, the report, the audit log, the API lists and a run page with a long history
(issue 8, "lists that do not grow with the tenant"). Not run by the test suite.

Two steps, against a scratch PostgreSQL database named by ``DATABASE_URL`` (migrated
first with ``manage.py migrate``); it writes rows straight into the tables with
``generate_series`` (no services, no audit chain: the chain of a loaded tenant does not
verify), so never point it at real data:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/recovery_lists \\
        .venv/bin/python bench/bench_lists.py load --runs 50000 --revisions 10
    DATABASE_URL=... .venv/bin/python bench/bench_lists.py measure [--repeat 30]

``load`` makes 20 tenants (``t00``..``t19``; ``t00`` holds ``--hot-share`` of the runs,
the rest are spread over the others), ``--revisions`` checkpoint revisions, two effects
(three revisions each) and three audit events per run, an open conflict per conflicted
run, retry requests for the runs awaiting approval or approved, and one run in ``t00``
with 2,000 checkpoint revisions and 10 effects of 10 revisions each (``big``). A second
``load`` adds to what is there (more runs), so one database can be measured at 10k and
again at 100k runs. ``measure`` requests each page ``--repeat`` times through Django's
test client (in process: no HTTP, no network) as ``bench`` (reviewer in every tenant)
and prints p50/p95 ms, the p50 of the time spent in the database (round trips
included), queries and bytes per page. ``--no-persistent`` opens a database connection per
request, as ``CONN_MAX_AGE=0`` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
os.environ.setdefault("RECOVERY_FAST_HASHER", "1")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")

TENANTS = 20
STATES = (  # recovery_state by run number modulo 20
    ["ambiguous", "unknown_outcome", "conflicted", "awaiting_approval", "retry_approved",
     "schema_mismatch", "healthy", "healthy", "closed"] + ["completed"] * 11)
EFFECT_STATES = ["confirmed", "confirmed", "confirmed", "planned", "submitted", "unresolved",
                 "failed", "unknown"]


def _array(values: list[str]) -> str:
    """A SQL ``ARRAY[...]`` literal of plain words (no quotes in them)."""
    return "ARRAY[" + ",".join(f"'{v}'" for v in values) + "]"


def _setup() -> None:
    import django

    django.setup()


def _people():
    from django.contrib.auth import get_user_model

    from checkpoints import services
    from checkpoints.models import Tenant

    User = get_user_model()
    for slug in (f"t{i:02d}" for i in range(TENANTS)):
        if not Tenant.objects.filter(slug=slug).exists():
            services.tenant_create(slug=slug, name=slug)
    for name in ("bench", "bench2"):
        if not User.objects.filter(username=name).exists():
            user = services.account_create(username=name, password=None, service=True)
            for tenant in Tenant.objects.filter(slug__startswith="t"):
                services.role_grant(actor=None, tenant=tenant, user=user, role="reviewer")
    return User.objects.get(username="bench"), User.objects.get(username="bench2")


def load(args) -> None:
    """Append ``args.runs`` runs (and their rows) to the scratch database."""
    from django.db import connection, transaction

    bench, bench2 = _people()
    states = "ARRAY[" + ",".join(f"'{s}'" for s in STATES) + "]"
    estates = "ARRAY[" + ",".join(f"'{s}'" for s in EFFECT_STATES) + "]"
    hot = int(round(args.hot_share * 100))
    # What a search reads (issue 9), varied like real runs: agent and workflow names,
    # phase labels as the kinds write them, lease owners, and operation keys holding an
    # order id (``charge:A-<n>``, ``ship:A-<n>``) that is unique per run.
    agents = _array(["refund-assistant", "billing-bot", "triage-agent", "support-copilot",
                     "fraud-screener", "invoice-reader", "kyc-checker"])
    workflows = _array(["refund-approval", "acme.order", "invoice-dunning",
                        "kyc-onboarding", "chargeback-dispute"])
    phases = _array(["ready next charge-card", "step_in_flight charge-card",
                     "step_in_flight ship-parcel", "turn_in_flight turn",
                     "waiting approve-refund on timer", "completed after turns"])
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT id FROM checkpoints_tenant WHERE slug = 't00'")
        t00 = cur.fetchone()[0]
        cur.execute("SELECT array_agg(id ORDER BY slug) FROM checkpoints_tenant "
                    "WHERE slug ~ '^t[0-9][0-9]$' AND slug <> 't00'")
        others = cur.fetchone()[0]
        cur.execute("SELECT coalesce(max(id), 0) FROM checkpoints_run")
        base = cur.fetchone()[0]
        cur.execute("CREATE TEMP TABLE new_run (id bigint, n int) ON COMMIT DROP")
        # Runs: t00 gets hot% of them; last writes spread over the past 30 days.
        cur.execute(f"""
            WITH ins AS (
              INSERT INTO checkpoints_run (created_at, updated_at, uuid, kind, schema_version,
                agent, model, workflow, definition_version, phase_class, phase_label,
                recovery_state, recovery_reason, state_changed_at, last_write_at,
                lease_owner, fencing_token, unacknowledged_conflicts, tenant_id,
                closed_reason)
              SELECT now() - make_interval(secs => g * 26), now() - make_interval(secs => g * 26),
                gen_random_uuid(), 'acme.order', 1,
                ({agents})[1 + g % 7] || '-' || (g % 97), 'openai/gpt-4o',
                ({workflows})[1 + g % 5], 'v1',
                CASE WHEN g % 20 BETWEEN 6 AND 7 THEN 'stable' WHEN g % 20 >= 9 THEN 'completed'
                     ELSE 'in_flight' END,
                ({phases})[1 + g % 6] || ' ' || (g % 40),
                ({states})[1 + g % 20], '', now() - make_interval(secs => (g * 25) % 2592000),
                now() - make_interval(secs => (g * 25) % 2592000 + (g % 13)),
                CASE WHEN g % 3 = 0 THEN 'worker-' || (g % 64) || '@node-' || (g % 11) ELSE ''
                END, 0, CASE WHEN g % 20 = 2 THEN 1 ELSE 0 END,
                CASE WHEN g % 100 < {hot} THEN {t00}
                     ELSE ('{{{",".join(map(str, others))}}}'::bigint[])[1 + g % {len(others)}] END,
                ''
              FROM generate_series({base} + 1, {base} + {int(args.runs)}) AS g
              RETURNING id)
            INSERT INTO new_run SELECT id, id::int FROM ins""")
        cur.execute("CREATE INDEX ON new_run (id)")
        payload = "x" * args.payload_chars
        cur.execute(f"""
            INSERT INTO checkpoints_checkpoint (uuid, revision, kind, schema_version,
              payload_ciphertext, payload_size, phase_class, phase_label, updated_at_ms,
              received_at, tenant_id, written_by_id, run_id)
            SELECT gen_random_uuid(), %s - 1, 'acme.order', 1, %s, 1000, r.phase_class,
                   'step', 0, r.last_write_at, r.tenant_id, {bench.pk}, r.id
            FROM checkpoints_run r JOIN new_run n ON n.id = r.id""",
                    [args.revisions, payload])
        cur.execute("""
            UPDATE checkpoints_run r SET latest_checkpoint_id = c.id
            FROM checkpoints_checkpoint c, new_run n
            WHERE c.run_id = r.id AND n.id = r.id""")
        cur.execute(f"""
            INSERT INTO checkpoints_checkpointrevision (revision, kind, schema_version,
              payload_ciphertext, payload_size, phase_class, phase_label, updated_at_ms,
              received_at, checkpoint_id, tenant_id, written_by_id)
            SELECT v, 'acme.order', 1, %s, 1000, c.phase_class, 'step ' || v, 0,
                   c.received_at - make_interval(secs => (c.revision - v) * 5),
                   c.id, c.tenant_id, {bench.pk}
            FROM checkpoints_checkpoint c JOIN new_run n ON n.id = c.run_id,
                 generate_series(0, c.revision) AS v""", [payload])
        cur.execute(f"""
            INSERT INTO checkpoints_effect (created_at, updated_at, uuid, revision,
              operation_key, service, effect_class, request_fingerprint, state, attempt,
              state_changed_at, tenant_id, run_id, request_ciphertext, receipt_ciphertext)
            SELECT r.created_at + make_interval(secs => k), r.last_write_at, gen_random_uuid(),
                   2, (ARRAY['charge:A-', 'ship:A-'])[k] || r.id, 'payments', 'irreversible',
                   repeat('a', 64),
                   ({estates})[1 + (r.id + k) % {len(EFFECT_STATES)}], 1, r.last_write_at,
                   r.tenant_id, r.id, '', ''
            FROM checkpoints_run r JOIN new_run n ON n.id = r.id, generate_series(1, 2) AS k""")
        cur.execute("""
            INSERT INTO checkpoints_effectrevision (revision, state, attempt, actor_name,
              source, created_at, effect_id, tenant_id, receipt_ciphertext)
            SELECT v, e.state, 1, 'bench', 'runtime', e.created_at + make_interval(secs => v),
                   e.id, e.tenant_id, ''
            FROM checkpoints_effect e JOIN new_run n ON n.id = e.run_id,
                 generate_series(0, e.revision) AS v""")
        cur.execute("""
            INSERT INTO checkpoints_conflict (target_type, target_uuid, reason,
              expected_revision, actual_revision, attempted_revision, writer_name,
              refused_ciphertext, created_at, acknowledged_at, tenant_id, run_id)
            SELECT 'checkpoint', gen_random_uuid(), 'stale_revision', 1, 2, 2, 'bench', '',
                   r.last_write_at, CASE WHEN k = 1 THEN NULL ELSE r.last_write_at END,
                   r.tenant_id, r.id
            FROM checkpoints_run r JOIN new_run n ON n.id = r.id, generate_series(1, 2) AS k
            WHERE r.recovery_state = 'conflicted'""")
        cur.execute(f"""
            INSERT INTO checkpoints_retryrequest (created_at, updated_at, state, reason,
              decision_reason, decided_at, decided_by_id, requested_by_id, tenant_id, run_id)
            SELECT r.last_write_at, r.last_write_at,
                   CASE r.recovery_state WHEN 'awaiting_approval' THEN 'requested'
                        ELSE 'approved' END, 'bench', '',
                   CASE r.recovery_state WHEN 'awaiting_approval' THEN NULL
                        ELSE r.last_write_at END,
                   CASE r.recovery_state WHEN 'awaiting_approval' THEN NULL
                        ELSE {bench2.pk} END, {bench.pk}, r.tenant_id, r.id
            FROM checkpoints_run r JOIN new_run n ON n.id = r.id
            WHERE r.recovery_state IN ('awaiting_approval', 'retry_approved')""")
        # Audit: three events per run, numbered after the tenant's head.
        cur.execute("""
            INSERT INTO checkpoints_auditevent (seq, created_at, actor_name, action,
              target_type, target_ref, run_uuid, reason, prev_hash, hash, hash_scheme,
              key_id, tenant_id, actor_id)
            SELECT h.seq + row_number() OVER (PARTITION BY r.tenant_id ORDER BY r.id, k),
                   r.last_write_at - make_interval(secs => 3 - k), 'bench',
                   (ARRAY['checkpoint.create', 'effect.create', 'checkpoint.update'])[k],
                   'checkpoint', r.uuid::text, r.uuid, '', repeat('0', 64), repeat('0', 64), 2,
                   '', r.tenant_id, NULL
            FROM checkpoints_run r JOIN new_run n ON n.id = r.id
                 JOIN checkpoints_auditchainhead h ON h.tenant_id = r.tenant_id,
                 generate_series(1, 3) AS k""")
        cur.execute("""
            UPDATE checkpoints_auditchainhead h SET seq = m.seq
            FROM (SELECT tenant_id, max(seq) AS seq FROM checkpoints_auditevent
                  GROUP BY tenant_id) m WHERE m.tenant_id = h.tenant_id""")
        cur.execute("SELECT count(*) FROM checkpoints_run WHERE kind = 'big'")
        if not cur.fetchone()[0]:
            _load_big(cur, t00, bench, payload)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
        cur.execute("SELECT count(*) FROM checkpoints_run")
        runs = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM checkpoints_checkpointrevision")
        revs = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM checkpoints_run r JOIN checkpoints_tenant t "
                    "ON t.id = r.tenant_id WHERE t.slug = 't00'")
        hot_runs = cur.fetchone()[0]
    print(f"loaded in {time.perf_counter() - started:.1f}s: {runs} runs ({hot_runs} in t00), "
          f"{revs} checkpoint revisions")


def _load_big(cur, t00: int, bench, payload: str) -> None:
    """One ambiguous run in t00 with 2,000 checkpoint revisions and 10 effects of 10
    revisions each, written now (top of the ambiguous tab)."""
    cur.execute(f"""
        INSERT INTO checkpoints_run (created_at, updated_at, uuid, kind, schema_version,
          agent, model, workflow, definition_version, phase_class, phase_label,
          recovery_state, recovery_reason, state_changed_at, last_write_at, lease_owner,
          fencing_token, unacknowledged_conflicts, tenant_id, closed_reason)
        VALUES (now(), now(), gen_random_uuid(), 'big', 1, 'agent-big', 'openai/gpt-4o', '',
                'v1', 'in_flight', 'step', 'ambiguous', 'big', now(), now(), '', 0, 0, {t00},
                '') RETURNING id""")
    run = cur.fetchone()[0]
    cur.execute(f"""
        INSERT INTO checkpoints_checkpoint (uuid, revision, kind, schema_version,
          payload_ciphertext, payload_size, phase_class, phase_label, updated_at_ms,
          received_at, tenant_id, written_by_id, run_id)
        VALUES (gen_random_uuid(), 1999, 'acme.order', 1, %s, 1000, 'in_flight', 'step', 0,
                now(), {t00}, {bench.pk}, {run}) RETURNING id""", [payload])
    cp = cur.fetchone()[0]
    cur.execute(f"UPDATE checkpoints_run SET latest_checkpoint_id = {cp} WHERE id = {run}")
    cur.execute(f"""
        INSERT INTO checkpoints_checkpointrevision (revision, kind, schema_version,
          payload_ciphertext, payload_size, phase_class, phase_label, updated_at_ms,
          received_at, checkpoint_id, tenant_id, written_by_id)
        SELECT v, 'acme.order', 1, %s, 1000, 'in_flight', 'step ' || v, 0,
               now() - make_interval(secs => 2000 - v), {cp}, {t00}, {bench.pk}
        FROM generate_series(0, 1999) AS v""", [payload])
    cur.execute(f"""
        INSERT INTO checkpoints_effect (created_at, updated_at, uuid, revision, operation_key,
          service, effect_class, request_fingerprint, state, attempt, state_changed_at,
          tenant_id, run_id, request_ciphertext, receipt_ciphertext)
        SELECT now(), now(), gen_random_uuid(), 9, 'big-' || k, 'payments', 'irreversible',
               repeat('a', 64), 'confirmed', 1, now(), {t00}, {run}, '', ''
        FROM generate_series(1, 10) AS k""")
    cur.execute(f"""
        INSERT INTO checkpoints_effectrevision (revision, state, attempt, actor_name, source,
          created_at, effect_id, tenant_id, receipt_ciphertext)
        SELECT v, 'confirmed', 1, 'bench', 'runtime', now(), e.id, {t00}, ''
        FROM checkpoints_effect e, generate_series(0, 9) AS v WHERE e.run_id = {run}""")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(args) -> None:
    """Request each page ``args.repeat`` times; print p50/p95 ms, queries and bytes."""
    from django.db import connection
    from django.test import Client

    from checkpoints import services
    from checkpoints.models import Run, Tenant

    if args.persistent:  # one connection for the whole run, as with CONN_MAX_AGE
        connection.settings_dict["CONN_MAX_AGE"] = None
    bench, _ = _people()
    t00 = Tenant.objects.get(slug="t00")
    big = Run.objects.for_tenant(t00).filter(kind="big").values_list("uuid", flat=True).first()
    any_run = (Run.objects.for_tenant(t00).exclude(kind="big").order_by("id")
               .values_list("uuid", flat=True).first())
    web = Client()
    web.force_login(bench)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {services.token_issue(user=bench)}")
    first = api.get("/api/v1/tenants/t00/runs?recovery_state=ambiguous&limit=50").json()
    cursor = first["next"].split("cursor=")[1].split("&")[0] if first.get("next") else ""
    pages = [("web", f"/t/t00/?state={s}") for s in
             ("ambiguous", "unknown_outcome", "conflicted", "awaiting_approval", "healthy",
              "completed", "closed", "all")]
    pages += [
        ("web", f"/t/t00/?state=ambiguous&cursor={cursor}"),
        ("web", "/t/t00/?state=ambiguous&kind=acme.order&age=3600"),
        ("web", "/t/t00/counts/?state=ambiguous"),
        ("web", "/t/t00/report/"),
        ("web", "/t/t00/audit/"),
        ("web", "/t/t00/audit/?action=effect.create"),
        ("web", f"/t/t00/audit/?run={any_run}"),
        ("web", f"/t/t00/runs/{any_run}/"),
        ("web", f"/t/t00/runs/{big}/"),
        ("api", "/api/v1/tenants/t00/runs"),
        ("api", "/api/v1/tenants/t00/runs?recovery_state=ambiguous"),
        ("api", f"/api/v1/tenants/t00/runs?recovery_state=ambiguous&cursor={cursor}"),
        ("api", "/api/v1/tenants/t00/report"),
        ("api", "/api/v1/tenants/t00/audit-events"),
        ("api", "/api/v1/tenants/t00/effects?service=payments"),
        ("api", f"/api/v1/tenants/t00/effects?run={big}"),
        ("api", f"/api/v1/tenants/t00/runs/{big}"),
    ]
    pages += _search_pages(t00, api)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM checkpoints_run WHERE tenant_id = %s", [t00.pk])
        hot = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM checkpoints_run")
        total = cur.fetchone()[0]
    print(f"{total} runs, {hot} in t00; {args.repeat} requests per page")
    print(f"{'page':<72} {'p50 ms':>7} {'p95 ms':>7} {'sql p50':>7} {'queries':>7} "
          f"{'KiB':>6}")
    for who, url in pages:
        client = web if who == "web" else api
        client.get(url)  # warm
        times, sql, queries, size = [], [], 0, 0
        for _ in range(args.repeat):
            spent = [0.0, 0]

            def timed(execute, sql_text, params, many, context, spent=spent):
                t = time.perf_counter()
                try:
                    return execute(sql_text, params, many, context)
                finally:
                    spent[0] += time.perf_counter() - t
                    spent[1] += 1

            with connection.execute_wrapper(timed):
                t0 = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - t0) * 1000)
            sql.append(spent[0] * 1000)
            queries = spent[1]
            assert response.status_code == 200, (url, response.status_code,
                                                 response.content[:300])
            size = len(response.content)
        shown = url if len(url) < 70 else url[:67] + "..."
        print(f"{who + ' ' + shown:<72} {statistics.median(times):7.1f} "
              f"{_pct(times, 0.95):7.1f} {statistics.median(sql):7.1f} {queries:7d} "
              f"{size / 1024:6.0f}")


def _search_pages(t00, api) -> list[tuple[str, str]]:
    """The search (issue 9) in t00, one page per kind of field: a run id prefix (8 hex
    digits), a checkpoint id prefix, an order id inside an operation key, phase text
    (narrow: one label; broad: a word in a sixth of the labels), an agent (narrow: one
    name; broad: a seventh of the runs), a lease owner; then the second page of a broad
    search, the same on the API and in the audit log."""
    from checkpoints.models import Checkpoint, Effect, Run

    run = (Run.objects.for_tenant(t00).exclude(kind="big").order_by("-id")[5000:5001]
           .values_list("id", "uuid").get())
    cp = Checkpoint.objects.for_tenant(t00).filter(run_id=run[0]).values_list(
        "uuid", flat=True).first()
    key = Effect.objects.for_tenant(t00).filter(run_id=run[0]).values_list(
        "operation_key", flat=True).first()
    order = key.split(":", 1)[1]
    broad = api.get("/api/v1/tenants/t00/runs?q=ship-parcel&limit=50").json()
    cursor = broad["next"].split("cursor=")[1].split("&")[0] if broad.get("next") else ""
    q = "/t/t00/?q="
    return [
        ("web", f"{q}{str(run[1])[:8]}"),
        ("web", f"{q}{str(cp)[:8]}"),
        ("web", f"{q}{order}"),
        ("web", f"{q}ship-parcel+18"),
        ("web", f"{q}ship-parcel"),
        ("web", f"{q}billing-bot-4"),
        ("web", f"{q}billing"),
        ("web", f"{q}worker-17@node-3"),
        ("web", f"{q}ship-parcel&state=all&cursor={cursor}"),
        ("api", f"/api/v1/tenants/t00/runs?q={order}"),
        ("api", "/api/v1/tenants/t00/runs?q=billing-bot-4"),
        ("web", f"/t/t00/audit/?q={order}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_load = sub.add_parser("load")
    p_load.add_argument("--runs", type=int, default=10000)
    p_load.add_argument("--revisions", type=int, default=10, help="per run")
    p_load.add_argument("--hot-share", type=float, default=0.5,
                        help="share of the runs in tenant t00")
    p_load.add_argument("--payload-chars", type=int, default=400)
    p_measure = sub.add_parser("measure")
    p_measure.add_argument("--repeat", type=int, default=30)
    p_measure.add_argument("--no-persistent", dest="persistent", action="store_false",
                           help="a new database connection per request (CONN_MAX_AGE=0)")
    args = parser.parse_args()
    _setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("bench_lists: needs DATABASE_URL pointing at a scratch PostgreSQL database")
    load(args) if args.cmd == "load" else measure(args)


if __name__ == "__main__":
    main()
