"""The bench's table and the issue's targets (issue 8, "Targets"), judged on one run."""

from __future__ import annotations

from bench.reads import SEARCH_REFERENCE, SEARCH_ROWS

HOLDS, NOT_YET, NO_DATA = "holds", "not yet", "no data"


def _base(writes: list[dict], row: dict) -> dict | None:
    """The raw reference of a write row: raw with the same writers (contended: raw
    contended)."""
    for r in writes:
        if (r.get("variant") == "raw" and r.get("contended") == row.get("contended")
                and r.get("writers") == row.get("writers") and "ops_per_s" in r):
            return r
    return None


def _find(writes: list[dict], variant: str, writers: int, *, tenants: int = 1,
          contended: bool = False) -> dict | None:
    for r in writes:
        if (r.get("variant") == variant and r.get("writers") == writers
                and r.get("tenants", 1) == tenants and r.get("contended", False) == contended
                and "ops_per_s" in r and not r.get("errors")):
            return r
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def targets(result: dict) -> list[dict]:
    """Each target of the issue with its measured value and "holds" / "not yet"."""
    out: list[dict] = []
    w = result.get("writes") or []

    def add(target: str, value, verdict: bool | None, measured: str) -> None:
        out.append({"target": target, "value": value, "measured": measured,
                    "verdict": NO_DATA if verdict is None else HOLDS if verdict else NOT_YET})

    for n in (1, 4):
        svc, raw, lg = _find(w, "services", n), _find(w, "raw", n), _find(w, "langgraph", n)
        r = _ratio(svc and svc["ops_per_s"], raw and raw["ops_per_s"])
        add(f"store write >= 0.5x raw CAS+history, {n} writer(s)", r,
            None if r is None else r >= 0.5, f"{r}x" if r is not None else "-")
        r = _ratio(svc and svc["ops_per_s"], lg and lg["ops_per_s"])
        add(f"store write >= LangGraph PostgresSaver.put, {n} writer(s)", r,
            None if r is None else r >= 1.0, f"{r}x LangGraph" if r is not None else "-")
    one, four = _find(w, "services", 4), _find(w, "services", 4, tenants=4)
    r = _ratio(one and one["ops_per_s"], four and four["ops_per_s"])
    add("chain head does not bind: 4w in 1 tenant >= 0.9x 4w in 4 tenants (bench's bar)", r,
        None if r is None else r >= 0.9, f"{r}x" if r is not None else "-")
    http4, raw4 = _find(w, "http", 4), _find(w, "raw", 4)
    r = _ratio(http4 and http4["ops_per_s"], raw4 and raw4["ops_per_s"])
    add("HTTP PUT (keep-alive) >= 0.2x raw, 4 connections", r,
        None if r is None else r >= 0.2, f"{r}x" if r is not None else "-")
    p99 = http4["p99_ms"] if http4 else None
    add("HTTP PUT p99 < 25 ms, 4 connections (issue: on an idle machine)", p99,
        None if p99 is None else p99 < 25, f"{p99} ms" if p99 is not None else "-")
    svc_c, raw_c = _find(w, "services", 16, contended=True), _find(w, "raw", 16, contended=True)
    if svc_c:
        ok = svc_c["check"]["ok"]
        add("contended: no lost update, every refusal recorded (services)", ok, ok,
            svc_c["check"]["detail"])
    else:
        add("contended: no lost update, every refusal recorded (services)", None, None, "-")
    r = _ratio(svc_c and svc_c["ops_per_s"], raw_c and raw_c["ops_per_s"])
    add("contended >= 0.5x raw contended (attempts/s, 16w on 10)", r,
        None if r is None else r >= 0.5, f"{r}x" if r is not None else "-")

    reads = result.get("reads") or {}
    sizes = sorted(reads, key=int)
    if sizes:
        small, large = reads[sizes[0]], reads[sizes[-1]]
        lists = [r for r in large if _is_list(r["endpoint"])]
        worst = max(lists, key=lambda r: r["p95_ms"])
        add(f"lists p95 < 50 ms at {int(sizes[-1]):,} runs (issue: 100,000)", worst["p95_ms"],
            worst["p95_ms"] < 50, f"worst {worst['endpoint']}: {worst['p95_ms']} ms")
        if len(sizes) > 1:
            by_name = {r["endpoint"]: r for r in small}
            growth = [(r["p95_ms"] / by_name[r["endpoint"]]["p95_ms"], r["endpoint"])
                      for r in lists if by_name.get(r["endpoint"], {}).get("p95_ms")]
            g, name = max(growth)
            add(f"lists flat from {int(sizes[0]):,} to {int(sizes[-1]):,} runs: p95 grows "
                f"<= 1.5x (bench's bar)", round(g, 2), g <= 1.5, f"worst {name}: x{g:.2f}")
            changed = [r["endpoint"] for r in large
                       if r["endpoint"] in by_name
                       and r["queries"] != by_name[r["endpoint"]]["queries"]]
            add("query counts constant across sizes", not changed, not changed,
                ", ".join(changed) or "every endpoint the same")
        page = next((r for r in large if r["endpoint"].startswith("run page")), None)
        if page:
            add(f"{page['endpoint']} < 100 ms (p95)", page["p95_ms"], page["p95_ms"] < 100,
                f"{page['p95_ms']} ms, {page['bytes']:,} B")
        resume = next((r for r in large if r["endpoint"].startswith("resume decision")), None)
        if resume:
            add("resume decision p50 < 5 ms", resume["p50_ms"], resume["p50_ms"] < 5,
                f"{resume['p50_ms']} ms, {resume['queries']} queries")
        # Search (issue 17, item 7): each search row's p95 against the unfiltered inbox
        # of the same run. Bench's bars: a one-character q costs no more than 1.5x the
        # plain page (it reads ids only), a broad word at most 3x (capped counts).
        by_name = {r["endpoint"]: r for r in large}
        ref = by_name.get(SEARCH_REFERENCE)
        for name in SEARCH_ROWS:
            row = by_name.get(name)
            if not (row and ref and ref["p95_ms"]):
                continue
            bar = 1.5 if "?q=-" in name else 3.0
            r = round(row["p95_ms"] / ref["p95_ms"], 2)
            add(f"{name} p95 <= {bar:g}x the unfiltered inbox (bench's bar)", r, r <= bar,
                f"x{r:.2f} ({row['p95_ms']} ms vs {ref['p95_ms']} ms, {row['queries']} queries)")
    mem = result.get("memory")
    if mem:
        first = min(1000, mem["requests"])
        add(f"worker RSS after {mem['requests']:,} requests within 20% of after {first:,}",
            mem["ratio"], mem["ratio"] <= 1.2, f"x{mem['ratio']:.2f}")
    lag = (result.get("audit") or {}).get("lag")
    if lag:  # issue 22, item 1 (bench/bench_audit.py)
        add("audit event integrated: lag p99 < 2 s, sequencer every 1 s, under writes",
            lag["p99_s"], lag["holds"], f"{lag['p99_s']} s ({lag['events_per_s']:,} events/s, "
            f"{lag['not_integrated']} not integrated)")
    return out


def _is_list(endpoint: str) -> bool:
    return endpoint.startswith(("inbox", "report", "API report", "API run list"))


def _f(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def render(result: dict) -> str:
    lines: list[str] = []
    meta = result["meta"]
    w = result.get("writes") or []
    if w:
        pg = meta.get("postgresql_settings", {})
        lines.append(f"WRITES  PostgreSQL {meta['postgresql'].split()[0]} "
                     f"(synchronous_commit {pg.get('synchronous_commit', '?')}), "
                     f"{meta['cpus']} CPUs, best of {meta.get('rounds', 1)} rounds of "
                     f"{meta['seconds']:g} s after {meta['warmup']:g} s warm-up; load average "
                     f"at start "
                     f"{meta['load_avg_start'][0]:.2f}")
        head = (f"{'scenario':<44} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'ops/s vs raw':>12} {'p50 vs raw':>10}  check")
        lines += [head, "-" * len(head)]
        for r in w:
            if "skipped" in r:
                lines.append(f"{r['scenario']:<44} skipped: {r['skipped']}")
                continue
            base = _base(w, r)
            tr = _ratio(r["ops_per_s"], base and base["ops_per_s"])
            pr = _ratio(r["p50_ms"], base and base["p50_ms"])
            check = ("ok" if r["check"]["ok"] else "FAILED") + ": " + r["check"]["detail"]
            lines.append(f"{r['scenario']:<44} {r['ops_per_s']:>8,.0f} {r['p50_ms']:>8.2f} "
                         f"{r['p99_ms']:>8.2f} {_f(tr, '{:.3f}'):>12} "
                         f"{_f(pr, '{:.1f}x'):>10}  {check}")
        lines.append("")
    reads = result.get("reads") or {}
    if reads:
        sizes = sorted(reads, key=int)
        tenant_runs = [reads[s][0]["tenant_runs"] for s in sizes]
        lines.append("READS  tenant load-00 (" + ", ".join(
            f"{t:,} of {int(s):,} runs" for t, s in zip(tenant_runs, sizes, strict=True))
            + f"); Django test client, {meta['samples']} requests each in turn; ms, queries; "
            + "load average " + ", ".join(f"{v:.1f}" for v in
                                          meta.get("load_avg_reads", {}).values()))
        head = f"{'endpoint':<44}" + "".join(
            f" {'p50@' + _k(s):>9} {'p95@' + _k(s):>9} {'q':>3}" for s in sizes) + (
            f" {'p95 growth':>10}" if len(sizes) > 1 else "")
        lines += [head, "-" * len(head)]
        first = {r["endpoint"]: r for r in reads[sizes[0]]}
        for i, r in enumerate(reads[sizes[-1]]):
            cells = ""
            for s in sizes:
                x = reads[s][i]
                cells += f" {x['p50_ms']:>9.1f} {x['p95_ms']:>9.1f} {x['queries']:>3}"
            growth = ""
            if len(sizes) > 1 and first.get(r["endpoint"], {}).get("p95_ms"):
                growth = f" {r['p95_ms'] / first[r['endpoint']]['p95_ms']:>9.2f}x"
            lines.append(f"{r['endpoint']:<44}{cells}{growth}")
        lines.append("")
    mem = result.get("memory")
    if mem:
        lines.append(f"MEMORY  one process, {mem['requests']:,} API GETs (bearer token; "
                     f"run list, resume preview, report of {mem['tenant']})")
        lines.append("  " + ", ".join(f"after {int(k):,}: {v / 1024:.1f} MiB"
                                      for k, v in sorted(mem["rss_kib"].items(),
                                                         key=lambda kv: int(kv[0]))))
        lines.append("")
    lines += _notify_lines(result.get("notify"))
    t = result.get("targets") or []
    if t:
        lines.append("TARGETS (issue 8; ratios from this run)")
        head = f"{'target':<78} {'verdict':<8} measured"
        lines += [head, "-" * len(head)]
        for x in t:
            lines.append(f"{x['target']:<78} {x['verdict']:<8} {x['measured']}")
    return "\n".join(lines)


def _notify_lines(n: dict | None) -> list[str]:
    """The NOTIFY section (bench/bench_notify.py's JSON), or nothing."""
    if not n:
        return []
    lines = ["NOTIFY  webhook endpoint, window 0, loopback receiver in another process"]
    for r in n.get("latency") or []:
        lines.append(f"  latency, a round every {r['interval_s']:g} s, {r['runs']} runs at "
                     f"{r['rate_per_s']:g}/s: commit -> receiver p50 {r['p50_s']:.2f} s, "
                     f"p99 {r['p99_s']:.2f} s, max {r['max_s']:.2f} s")
    t = n.get("throughput")
    if t:
        lines.append(f"  {t['events']:,} events: dispatch {t['dispatch_rows_per_s']:,} rows/s, "
                     f"send {t['send_per_s']:,} messages/s; bare POST reference "
                     f"{t['reference_per_s']:,}/s ({t['send_per_s'] / t['reference_per_s']:.2f}x), "
                     f"safehttp.post alone {t['safehttp_per_s']:,}/s")
    u = n.get("unconfigured")
    if u:
        lines.append(f"  a round with {u['events']:,} rows of a tenant with no endpoint: "
                     f"{u['round_ms']} ms, {u['queries']} queries (empty: "
                     f"{u['empty_round_ms']} ms, {u['empty_round_queries']} queries)")
    return [*lines, ""]


def _k(size: str) -> str:
    n = int(size)
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)
