"""Read scenarios on ``generate_load`` data, and a web worker's memory.

Reads go through Django's test ``Client`` in this process (the whole middleware stack,
views, templates and serializers; no HTTP socket), logged in (``force_login``) as the
first tenant's reviewer, or as its writer for the resume decision. Each endpoint is
requested twice unmeasured, then ``samples`` times measured; one more request counts its
queries (``CaptureQueriesContext``). The tenant measured is ``load-00``, which holds
``--big-tenant-share`` (default half) of all generated runs.

Memory: a forked process sends API ``GET``\\ s with the writer's bearer token (a run
list, a resume preview, the report, in turn) and reads its own resident set size after 1,000
requests (after half of them in a run of fewer than 2,000: ``memory_marks``) and at the end.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
import uuid

from bench.common import percentile, rss_kib

LONG_RUN = uuid.UUID("0193a4f2-0000-7000-8000-000000002000")
TENANT = "load-00"


def grow(*, total_runs: int, existing_runs: int, tenants: int, revisions_per_run: int,
         long_run_revisions: int, seed: int) -> None:
    """Add runs with ``generate_load`` until the data set holds ``total_runs``; the first
    call also adds the long run."""
    from django.core.management import call_command

    add = total_runs - existing_runs
    if add <= 0:
        return
    kwargs = {}
    if existing_runs == 0:
        kwargs = {"long_run": LONG_RUN, "long_run_revisions": long_run_revisions}
    call_command("generate_load", tenants=tenants, runs=add,
                 revisions=add * revisions_per_run, force=True, seed=seed, **kwargs)


def _timed_round_robin(endpoints: list[tuple]) -> list[dict]:
    """Time every endpoint, one request of each in turn (so that a burst of load from
    elsewhere on the machine spreads over all of them instead of spoiling one), after two
    unmeasured requests each; then count one request's queries (``count`` if given)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _, fn, _, _ in endpoints:
        for _ in range(2):
            fn()
    lat: list[list[float]] = [[] for _ in endpoints]
    for i in range(max(n for _, _, n, _ in endpoints)):
        for j, (_, fn, n, _) in enumerate(endpoints):
            if i < n:
                a = time.perf_counter()
                fn()
                lat[j].append((time.perf_counter() - a) * 1000)
    rows = []
    for (name, fn, n, count), times in zip(endpoints, lat, strict=True):
        with CaptureQueriesContext(connection) as q:
            size = (count or fn)()
        rows.append({"endpoint": name, "p50_ms": round(percentile(times, 0.5), 2),
                     "p95_ms": round(percentile(times, 0.95), 2), "queries": len(q),
                     "bytes": size, "samples": n})
    return rows


def _get(client, url: str):
    def fn() -> int:
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"bench: GET {url} answered {response.status_code}")
        return len(response.content)

    return fn


#: The reference of the search rows: the inbox as a viewer opens it, no search.
SEARCH_REFERENCE = "search reference: inbox, no search"
#: ``(endpoint, what it is measured against)``: each search row's reference.
SEARCH_ROWS = ("search inbox ?q=- (one character)", "search inbox ?q=refund (broad word)",
               "search API runs?q=-", "search API runs?q=refund")


def search_endpoints(api: str) -> list[tuple[str, str]]:
    """``(endpoint name, URL)`` of the search scenario, the reference first."""
    urls = [f"/t/{TENANT}/", f"/t/{TENANT}/?q=-", f"/t/{TENANT}/?q=refund",
            f"{api}/runs?q=-", f"{api}/runs?q=refund"]
    return list(zip((SEARCH_REFERENCE, *SEARCH_ROWS), urls, strict=True))


def measure(*, samples: int, say) -> list[dict]:
    """Every read endpoint once, on the data set as it is now."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from checkpoints import services
    from checkpoints.models import CheckpointRevision, Run, Tenant
    from checkpoints.vocab import RecoveryState

    users = get_user_model().objects
    tenant = Tenant.objects.get(slug=TENANT)
    reviewer = Client()
    reviewer.force_login(users.get(username=f"{TENANT}-reviewer"))
    writer_user = users.get(username=f"{TENANT}-writer")
    writer = Client()
    writer.force_login(writer_user)
    tenant_runs = Run.objects.for_tenant(tenant).count()
    long_revs = CheckpointRevision.objects.for_tenant(tenant).filter(
        checkpoint__run__uuid=LONG_RUN).count()
    rng = random.Random(5)
    sample_runs = list(Run.objects.for_tenant(tenant).values_list("uuid", flat=True)
                       .order_by("-id")[:2000])
    sample_runs = rng.sample(sample_runs, min(50, len(sample_runs)))

    heavy = max(3, samples // 3)
    api = f"/api/v1/tenants/{TENANT}"
    endpoints = [(f"inbox tab {s}", _get(reviewer, f"/t/{TENANT}/?state={s}"), samples, None)
                 for s in (*RecoveryState.INBOX_TABS, "all")]
    endpoints += [
        ("inbox counts (10 s poll)", _get(reviewer, f"/t/{TENANT}/counts/"), samples, None),
        ("report page", _get(reviewer, f"/t/{TENANT}/report/"), samples, None),
        ("API report", _get(reviewer, f"{api}/report"), samples, None),
        # The report over time (issue 9, item 6): every figure of checkpoints.reports.
        ("report page, 24h", _get(reviewer, f"/t/{TENANT}/report/?range=24h"), samples, None),
        ("report page, 30d", _get(reviewer, f"/t/{TENANT}/report/?range=30d"), samples, None),
        ("API report, 30d", _get(reviewer, f"{api}/report?range=30d"), samples, None),
        ("report CSV, 30d checkpoint sizes",
         _get(reviewer, f"/t/{TENANT}/report/?range=30d&format=csv&figure="
                        f"checkpoint_size_bytes"), samples, None),
        ("API run list", _get(reviewer, f"{api}/runs"), samples, None),
        ("API run list, ambiguous", _get(reviewer, f"{api}/runs?recovery_state=ambiguous"),
         samples, None),
        (f"run page, {long_revs:,} revisions", _get(reviewer, f"/t/{TENANT}/runs/{LONG_RUN}/"),
         heavy, None),
        (f"API run detail, {long_revs:,} revisions", _get(reviewer, f"{api}/runs/{LONG_RUN}"),
         heavy, None),
        ("API resume preview (GET)", _get(writer, f"{api}/runs/{LONG_RUN}/resume"), samples,
         None),
    ]
    # Search (issue 17, item 7): what any viewer can type, a one-character ``q`` (every
    # run id holds "-") and a broad word (``generate_load``'s agent refund-assistant and
    # workflow refund-approval: a large share of the runs), on the inbox and the API;
    # each read against the unfiltered inbox of this run (``SEARCH_REFERENCE``).
    endpoints += [(name, _get(reviewer, url), samples, None)
                  for name, url in search_endpoints(api)]
    cycle = iter(range(10**9))

    def resume(run_id=None) -> int:
        run_id = run_id or sample_runs[next(cycle) % len(sample_runs)]
        services.resume_preview(actor=writer_user, tenant=tenant, run_id=run_id, asked={})
        return 0

    # Over 50 runs of the tenant in every state; queries counted on the long run (an
    # effect in doubt: the most a decision reads), so that counts compare across sizes.
    endpoints.append(("resume decision (services.resume_preview)", resume,
                      max(4 * samples, 2 * len(sample_runs)), lambda: resume(LONG_RUN)))
    rows = _timed_round_robin(endpoints)
    for row in rows:
        row["tenant_runs"] = tenant_runs
        say(f"    {row['endpoint']:<44} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  "
            f"{row['queries']:3d} queries  {row['bytes']:>9,} B")
    return rows


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------


def _memory_child(n: int, marks: list[int], queue) -> None:
    try:
        from django.contrib.auth import get_user_model
        from django.test import Client

        from checkpoints import services
        from checkpoints.models import Run, Tenant

        slug = "load-01" if Tenant.objects.filter(slug="load-01").exists() else TENANT
        tenant = Tenant.objects.get(slug=slug)
        token = services.token_issue(user=get_user_model().objects.get(
            username=f"{slug}-writer"))
        run = Run.objects.for_tenant(tenant).order_by("id").values_list("uuid", flat=True)[0]
        api = f"/api/v1/tenants/{slug}"
        urls = [f"{api}/runs?limit=20", f"{api}/runs/{run}/resume", f"{api}/report"]
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        out = {}
        started = time.monotonic()
        for i in range(1, n + 1):
            response = client.get(urls[i % len(urls)])
            if response.status_code != 200:
                raise RuntimeError(f"GET {urls[i % len(urls)]} answered {response.status_code}")
            if i in marks:
                out[i] = rss_kib()
        queue.put({"rss_kib": out, "seconds": round(time.monotonic() - started, 1),
                   "tenant": slug, "urls": urls})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


#: The first RSS reading, after the warm-up (imports, caches, the first queries' plans):
#: the memory row compares the end with it.
MEMORY_FIRST = 1000


def memory_marks(requests: int) -> tuple[int, list[int]]:
    """``(first, marks)``: after how many of ``requests`` (>= 2) API GETs the memory run
    reads its RSS first (``MEMORY_FIRST``, or half of them in a run of fewer than
    ``2 * MEMORY_FIRST``, so a short run such as ``--smoke``'s 200 still compares two
    different sizes and its ratio can fail) and every count it reads it at, ending with
    ``requests``. Raises ``ValueError`` for fewer than 2 requests (nothing to compare)."""
    if requests < 2:
        raise ValueError("the memory run needs at least 2 requests: it compares two sizes")
    first = MEMORY_FIRST if requests >= 2 * MEMORY_FIRST else requests // 2
    return first, sorted({first, *(m for m in (5000, 10000, 20000, 50000) if m < requests),
                          requests})


def memory(*, requests: int, say) -> dict:
    """RSS of one process serving ``requests`` API GETs: after ``first`` of them
    (``memory_marks``) and at the end; ``ratio`` is the end's over the first's. Returns
    ``{"rss_kib": {count: KiB}, "requests", "first", "after_first_kib",
    "after_last_kib", "ratio", "seconds", "tenant", "urls"}``."""
    from django.db import connections

    first, marks = memory_marks(requests)
    connections.close_all()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(requests, marks, queue))
    proc.start()
    result = queue.get()
    proc.join()
    if "error" in result:
        raise SystemExit(f"bench: the memory run failed: {result['error']}")
    rss = result["rss_kib"]
    result["requests"] = requests
    result["first"] = first
    result["after_first_kib"] = rss[first]
    result["after_last_kib"] = rss[requests]
    result["ratio"] = round(rss[requests] / rss[first], 3)
    say(f"    RSS after {first:,} requests {rss[first] / 1024:.1f} MiB, after {requests:,} "
        f"{rss[requests] / 1024:.1f} MiB (x{result['ratio']:.2f}); "
        f"{requests / max(0.1, result['seconds']):.0f} requests/s")
    return result
