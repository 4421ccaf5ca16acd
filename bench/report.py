"""The bench's table and the issue's targets (issue 8, "Targets"), judged on one run."""

from __future__ import annotations

from bench.reads import SEARCH_REFERENCE, SEARCH_ROWS

HOLDS, NOT_YET, NO_DATA = "holds", "not yet", "no data"

#: A smoke run (``python -m bench --smoke``, ``meta["smoke"]``) runs every part once at
#: the smallest sizes: its table says so first, and each printed verdict carries the mark
#: (the JSON's verdicts stay as judged; ``meta["smoke"]`` says what they are worth).
SMOKE_HEADER = ("SMOKE RUN (--smoke): every part once at the smallest sizes. Its numbers are of "
                "no value and its",
                "verdicts are not the targets' verdicts: those come from `make bench` (--full: "
                "the issues' sizes).")
SMOKE_MARK = " (smoke)"


def _base(writes: list[dict], row: dict) -> dict | None:
    """The raw reference of a write row: raw with the same writers (contended: raw
    contended)."""
    for r in writes:
        if (r.get("variant") == "raw" and r.get("contended") == row.get("contended")
                and r.get("writers") == row.get("writers") and "ops_per_s" in r):
            return r
    return None


#: The raw reference's p50 (ms, 1 writer) under which a round counts as a "fast flush"
#: round: this machine's commit flush alternates between about 0.3 ms and 4 ms (issue 22).
FAST_FLUSH_MS = 1.5


def _row(writes: list[dict], variant: str, writers: int, *, tenants: int = 1,
         contended: bool = False) -> dict | None:
    for r in writes:
        if (r.get("variant") == variant and r.get("writers") == writers
                and r.get("tenants", 1) == tenants and r.get("contended", False) == contended
                and "rounds" in r):
            return r
    return None


def regimes(writes: list[dict]) -> dict[int, tuple[str, float]]:
    """Round number -> ("fast" | "slow", the raw 1-writer reference's p50 in ms): the
    commit-flush regime each round ran in."""
    raw = _row(writes, "raw", 1)
    out = {}
    for x in (raw or {}).get("rounds", []):
        out[x["round"]] = ("fast" if x["p50_ms"] < FAST_FLUSH_MS else "slow", x["p50_ms"])
    return out


def round_ratios(product: dict | None, reference: dict | None,
                 flush: dict[int, tuple[str, float]]) -> list[dict]:
    """Per round: the product's ops/s over the reference's in the same round (never a
    row's best round against another's), with the round's flush regime. Rounds where
    either side failed its check or wrote nothing are left out."""
    if not product or not reference:
        return []
    ref = {x["round"]: x for x in reference.get("rounds", [])}
    out = []
    for x in product.get("rounds", []):
        y = ref.get(x["round"])
        if (y and x.get("ops_per_s") and y.get("ops_per_s") and not x.get("errors")
                and not y.get("errors")):
            out.append({"round": x["round"], "ratio": round(x["ops_per_s"] / y["ops_per_s"], 3),
                        "regime": flush.get(x["round"], ("?", None))[0]})
    return out


def judged(ratios: list[dict]) -> tuple[float | None, str]:
    """The ratio a target is judged on: the median over the fast-flush rounds (the
    issue's figures are fast-flush figures), or over every round when none was fast;
    and which rounds those were."""
    fast = [r["ratio"] for r in ratios if r["regime"] == "fast"]
    pool, which = (fast, "fast-flush rounds") if fast else (
        [r["ratio"] for r in ratios], "all rounds (none fast)")
    if not pool:
        return None, ""
    pool = sorted(pool)
    mid = len(pool) // 2
    median = pool[mid] if len(pool) % 2 else (pool[mid - 1] + pool[mid]) / 2
    return round(median, 3), which


def _ratios_text(ratios: list[dict]) -> str:
    return ", ".join(f"r{r['round']} {r['ratio']:.3f} ({r['regime']})" for r in ratios)


def targets(result: dict) -> list[dict]:
    """Each target of the issues with its measured value and "holds" / "not yet"; the
    write targets are judged per round (``round_ratios``, ``judged``); then the targets
    of every plugged-in part (``bench.run.PLUGINS``: its module's ``targets``)."""
    out: list[dict] = []
    w = result.get("writes") or []

    def add(target: str, value, verdict: bool | None, measured: str) -> None:
        out.append({"target": target, "value": value, "measured": measured,
                    "verdict": NO_DATA if verdict is None else HOLDS if verdict else NOT_YET})

    out += write_targets(w)
    for name, module in _plugins().items():
        if result.get(name) is not None:
            out += module.targets(result[name])


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
        # ``first`` since the newcomer's finding (a smoke run compared 200 with 200);
        # older JSONs read 1,000 or all of them.
        first = mem.get("first", min(1000, mem["requests"]))
        add(f"worker RSS after {mem['requests']:,} requests within 20% of after {first:,}",
            mem["ratio"], mem["ratio"] <= 1.2, f"x{mem['ratio']:.2f}")
    lag = (result.get("audit") or {}).get("lag")
    if lag:  # issue 22, item 1 (bench/bench_audit.py)
        add("audit event integrated: lag p99 < 2 s, sequencer every 1 s, under writes",
            lag["p99_s"], lag["holds"], f"{lag['p99_s']} s ({lag['events_per_s']:,} events/s, "
            f"{lag['not_integrated']} not integrated)")
    return out


#: The write targets of issue 22 ("Targets"): (label, product row, reference row, bar).
#: A row is (variant, writers, tenants, contended), found by ``_row``.
WRITE_TARGETS = [
    ("16 writers in one tenant >= 0.9x 16 writers over 16 tenants",
     ("services-tenant", 16, 1, False), ("services-tenant", 16, 16, False), 0.9),
    ("services.checkpoint_put >= 0.5x raw CAS+history, 1 writer",
     ("services", 1, 1, False), ("raw", 1, 1, False), 0.5),
    ("services.checkpoint_put >= 0.35x raw CAS+history, 4 writers",
     ("services", 4, 1, False), ("raw", 4, 1, False), 0.35),
    ("contended (16w on 10) >= 0.15x raw contended, every refusal recorded",
     ("services", 16, 1, True), ("raw", 16, 1, True), 0.15),
    ("HTTP PUT >= 0.5x the floor (bare WSGI, same gunicorn), 4 keep-alive writers",
     ("http", 4, 1, False), ("floor", 4, 1, False), 0.5),
    ("RecoverySaver.put >= 0.15x PostgresSaver.put, 1 client",
     ("recoverysaver", 1, 1, False), ("langgraph", 1, 1, False), 0.15),
    # issue 8's, kept
    ("(issue 8) 4 writers in one tenant >= 0.9x 4 writers over 4 tenants",
     ("services-tenant", 4, 1, False), ("services-tenant", 4, 4, False), 0.9),
    ("(issue 8) HTTP PUT (keep-alive) >= 0.2x raw, 4 connections",
     ("http", 4, 1, False), ("raw", 4, 1, False), 0.2),
]


def write_targets(w: list[dict]) -> list[dict]:
    """The write targets (``WRITE_TARGETS``), each judged on its per-round ratios, with
    its reference named and every round's ratio and flush regime in ``measured``."""
    flush = regimes(w)
    out = []
    for label, prod, ref, bar in WRITE_TARGETS:
        p_row = _row(w, prod[0], prod[1], tenants=prod[2], contended=prod[3])
        r_row = _row(w, ref[0], ref[1], tenants=ref[2], contended=ref[3])
        ratios = round_ratios(p_row, r_row, flush)
        value, which = judged(ratios)
        verdict = None if value is None else value >= bar
        checks_ok = all(x["check"]["ok"] for x in (p_row, r_row) if x)
        if verdict and not checks_ok:
            verdict = False
        if value is None:
            measured = "-" if not (p_row and r_row) else "no round with both"
        else:
            measured = (f"{value:.3f}x {r_row['scenario']} (median of {which}); "
                        f"{_ratios_text(ratios)}"
                        + ("" if checks_ok else "; CHECK FAILED"))
            if prod[3]:  # contended: every refusal recorded
                measured += f"; {p_row['check']['detail']}"
        out.append({"target": label, "value": value, "ratios": ratios,
                    "reference": r_row["scenario"] if r_row else None, "measured": measured,
                    "verdict": NO_DATA if verdict is None else HOLDS if verdict else NOT_YET})
    http4 = _row(w, "http", 4)
    if http4:
        p99 = http4["p99_ms"]
        out.append({"target": "(issue 8) HTTP PUT p99 < 25 ms, 4 connections (idle machine)",
                    "value": p99, "measured": f"{p99} ms (median round)",
                    "verdict": HOLDS if p99 < 25 else NOT_YET})
    return out


def _plugins() -> dict:
    """The plugged-in parts' modules (``bench.run.PLUGINS``), imported."""
    from importlib import import_module

    from bench.run import PLUGINS

    return {name: import_module(module) for name, module in PLUGINS.items()}


def _is_list(endpoint: str) -> bool:
    return endpoint.startswith(("inbox", "report", "API report", "API run list"))


def _f(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def render(result: dict) -> str:
    lines: list[str] = []
    meta = result["meta"]
    smoke = bool(meta.get("smoke"))
    if smoke:
        lines += [*SMOKE_HEADER, ""]
    w = result.get("writes") or []
    if w:
        pg = meta.get("postgresql_settings", {})
        lines.append(f"WRITES  PostgreSQL {meta['postgresql'].split()[0]} "
                     f"(synchronous_commit {pg.get('synchronous_commit', '?')}), "
                     f"{meta['cpus']} CPUs, {meta.get('rounds', 1)} interleaved rounds of "
                     f"{meta['seconds']:g} s after {meta['warmup']:g} s warm-up (each row: "
                     f"its median round); load average at start "
                     f"{meta['load_avg_start'][0]:.2f}")
        flush = regimes(w)
        if flush:
            lines.append("flush regime per round (raw CAS+history 1w p50; fast < "
                         f"{FAST_FLUSH_MS:g} ms): " + ", ".join(
                             f"r{k} {v[0]} ({v[1]:.2f} ms)" for k, v in sorted(flush.items())))
        head = (f"{'scenario':<44} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'vs raw, per round':>24}  check")
        lines += [head, "-" * len(head)]
        for r in w:
            if "skipped" in r:
                lines.append(f"{r['scenario']:<44} skipped: {r['skipped']}")
                continue
            base = _base(w, r)
            per_round = " ".join(f"{x['ratio']:.3f}" for x in round_ratios(r, base, flush))
            check = ("ok" if r["check"]["ok"] else "FAILED") + ": " + r["check"]["detail"]
            lines.append(f"{r['scenario']:<44} {r['ops_per_s']:>8,.0f} {r['p50_ms']:>8.2f} "
                         f"{r['p99_ms']:>8.2f} {per_round or '-':>24}  {check}")
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
    for name, module in _plugins().items():
        if result.get(name) is not None and hasattr(module, "render"):
            lines += [*module.render(result[name]), ""]
    t = result.get("targets") or []
    if t:
        lines.append("TARGETS (issues 8 and 22; ratios of products and references measured "
                     "in the same round)" + ("; SMOKE-SIZED: not the targets' verdicts"
                                             if smoke else ""))
        mark = SMOKE_MARK if smoke else ""
        width = max(len("verdict"), *(len(x["verdict"] + mark) for x in t))
        head = f"{'target':<78} {'verdict':<{width}} measured"
        lines += [head, "-" * len(head)]
        for x in t:
            lines.append(f"{x['target']:<78} {x['verdict'] + mark:<{width}} {x['measured']}")
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
