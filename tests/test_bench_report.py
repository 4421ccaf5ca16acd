"""``make bench``'s judgement of its write targets (issue 22, "Targets"): every ratio is
taken within one round (a product round against its reference's same round, never a row's
best round against another row's), each round is labelled with its commit-flush regime
(the raw 1-writer reference's p50), and a target is judged on its fast-flush rounds."""

from __future__ import annotations

import pytest

from bench import reads
from bench.report import (
    HOLDS,
    NO_DATA,
    NOT_YET,
    judged,
    regimes,
    round_ratios,
    targets,
    write_targets,
)
from bench.run import QUICK, SMOKE


def _row(variant, writers, per_round, *, p50=None, tenants=1, contended=False, name=None):
    rounds = [{"round": i + 1, "ops_per_s": ops, "p50_ms": (p50 or [1.0] * 9)[i],
               "p99_ms": 1.0, "errors": [], "check": {"ok": True, "detail": "ok"}}
              for i, ops in enumerate(per_round)]
    return {"scenario": name or f"{variant} {writers}w", "variant": variant,
            "writers": writers, "tenants": tenants, "contended": contended,
            "rounds": rounds, "p99_ms": 1.0, "check": {"ok": True, "detail": "ok"}}


def test_ratios_pair_rounds_and_name_their_flush_regime():
    raw = _row("raw", 1, [2000, 250, 1900], p50=[0.4, 4.1, 0.5])
    svc = _row("services", 1, [400, 200, 380])
    flush = regimes([raw, svc])
    assert flush == {1: ("fast", 0.4), 2: ("slow", 4.1), 3: ("fast", 0.5)}
    ratios = round_ratios(svc, raw, flush)
    assert [(r["round"], r["ratio"], r["regime"]) for r in ratios] == [
        (1, 0.2, "fast"), (2, 0.8, "slow"), (3, 0.2, "fast")]
    # best against best would say 400/2000 = 0.2 here, but the slow round alone 0.8:
    # judged on the fast-flush rounds only
    assert judged(ratios) == (0.2, "fast-flush rounds")
    assert judged([dict(r, regime="slow") for r in ratios])[0] == 0.2  # the median of all


def test_each_write_target_names_its_reference_and_verdict():
    raw1 = _row("raw", 1, [1000, 1000], p50=[0.3, 0.3], name="raw CAS+history, 1w")
    writes = [raw1, _row("services", 1, [600, 400]),
              _row("http", 4, [100, 160]), _row("floor", 4, [300, 300], name="HTTP floor, 4w")]
    by_label = {t["target"]: t for t in write_targets(writes)}
    one = by_label["services.checkpoint_put >= 0.5x raw CAS+history, 1 writer"]
    assert (one["verdict"], one["value"], one["reference"]) == (HOLDS, 0.5, "raw CAS+history, 1w")
    http = by_label["HTTP PUT >= 0.5x the floor (bare WSGI, same gunicorn), 4 keep-alive writers"]
    assert (http["verdict"], http["reference"]) == (NOT_YET, "HTTP floor, 4w")
    assert http["value"] == round((100 / 300 + 160 / 300) / 2, 3)
    assert by_label["RecoverySaver.put >= 0.15x PostgresSaver.put, 1 client"]["verdict"] == NO_DATA


def test_a_failed_check_never_holds():
    raw = _row("raw", 16, [1000], contended=True)
    svc = _row("services", 16, [900], contended=True)
    svc["check"] = {"ok": False, "detail": "3 refusals but 2 conflict rows"}
    target = next(t for t in write_targets([_row("raw", 1, [1]), raw, svc])
                  if t["target"].startswith("contended"))
    assert target["verdict"] == NOT_YET and "3 refusals" in target["measured"]


def test_a_smoke_runs_table_says_its_verdicts_are_not_the_targets():
    """``--smoke`` (``meta["smoke"]``) runs every part once at the smallest sizes: its table
    opens by saying so and every verdict it prints is marked, so "lists p95 < 50 ms at 200
    runs ... not yet" is not read as the target's verdict. The JSON's verdicts are
    unchanged; a run that is not a smoke run prints no mark."""
    from bench.report import SMOKE_HEADER, SMOKE_MARK, render

    rows = [{"target": "lists p95 < 50 ms at 200 runs (issue: 100,000)", "value": 61.0,
             "measured": "worst inbox tab all: 61.0 ms", "verdict": NOT_YET},
            {"target": "resume decision p50 < 5 ms", "value": 2.0, "measured": "2.0 ms",
             "verdict": HOLDS}]
    smoke = render({"meta": {"smoke": True}, "targets": rows}).splitlines()
    assert smoke[:2] == list(SMOKE_HEADER) and "not the targets' verdicts" in smoke[1]
    assert SMOKE_MARK == " (smoke)"
    assert "SMOKE-SIZED: not the targets' verdicts" in smoke[3]
    lines = {line.split()[0]: line for line in smoke if line.startswith(("lists", "resume"))}
    assert "not yet (smoke)" in lines["lists"] and "holds (smoke)" in lines["resume"]
    assert [r["verdict"] for r in rows] == [NOT_YET, HOLDS]

    plain = render({"meta": {"smoke": False}, "targets": rows})
    assert "(smoke)" not in plain and "SMOKE" not in plain
    assert plain.splitlines()[0].startswith("TARGETS")


def test_the_memory_row_compares_two_sizes_at_every_run_size():
    """``--smoke`` sends 200 requests: the memory row read its first RSS after
    ``min(1000, 200)`` = 200 requests, so it compared the end with itself (x1.00, a
    verdict that could not fail: the newcomer's finding). It now reads it after half of
    a short run; a long run still after 1,000."""
    first, marks = reads.memory_marks(SMOKE["memory_requests"])
    assert (first, marks) == (100, [100, 200])
    assert reads.memory_marks(QUICK["memory_requests"]) == (1000, [1000, 2000])
    assert reads.memory_marks(20_000) == (1000, [1000, 5000, 10000, 20000])
    assert reads.memory_marks(2) == (1, [1, 2])
    with pytest.raises(ValueError):
        reads.memory_marks(1)
    grew = {"requests": 200, "first": 100, "rss_kib": {"100": 80_000, "200": 104_000},
            "ratio": 1.3}
    row = next(t for t in targets({"memory": grew}) if "RSS" in t["target"])
    assert row["target"] == "worker RSS after 200 requests within 20% of after 100"
    assert (row["value"], row["verdict"]) == (1.3, NOT_YET)  # the ratio can fail
    flat = dict(grew, rss_kib={"100": 80_000, "200": 81_000}, ratio=1.01)
    assert next(t for t in targets({"memory": flat}) if "RSS" in t["target"])["verdict"] == HOLDS
