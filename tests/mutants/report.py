"""The survivors report of a mutmut run (``make mutants``): kill rate per module, and each
surviving mutant's location and diff.

Usage (from the repository root, after ``mutmut run``)::

    python -m tests.mutants.report --out var/mutants/report.md [--sampled FILE ...]

Reads mutmut's own records (``mutants/<file>.meta``: one exit code per mutant; mutmut
3.8.1's meanings, ``mutmut.stats.status_by_exit_code``). The kill rate is
``(killed + timeout) / (mutants that ran)``, the number mutmut's badge uses; mutants with
no covering test ("no tests") are listed and counted apart, never as killed. ``--sampled``
names the modules whose mutants were a random sample (``--sample-note`` says how it was
drawn): their rows say so.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

RAN = ("killed", "timeout", "survived", "suspicious", "segfault")

# Functions that only run while the module is imported, before mutmut activates a mutant
# (mutmut 3 switches mutants at call time, in a child forked after the import): their
# mutants can never run, so they "survive" whatever the tests do. Listed apart, not in
# the kill rate. ``kinds._workflow_validator`` builds the validators registered at import.
IMPORT_TIME = {("checkpoints/kinds/builtin.py", "_workflow_validator")}


def function_lines(path: Path) -> dict[str, int]:
    """``name`` and ``Class.name`` -> line of the ``def`` in the original source."""
    tree = ast.parse(path.read_text("utf-8"))
    lines: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines[f"{node.name}.{item.name}"] = item.lineno
    return lines


def function_of(key: str) -> str:
    """``checkpoints.services.x_retry_request__mutmut_12`` -> ``retry_request``;
    ``checkpoints.policy.xǁRunFactsǁcount__mutmut_1`` -> ``RunFacts.count``."""
    name = key.rsplit(".", 1)[-1]
    name = re.sub(r"__mutmut_\d+$", "", name)
    if name.startswith("xǁ"):
        _, cls, func = name.split("ǁ", 2)
        return f"{cls}.{func}"
    return name[2:] if name.startswith("x_") else name


def location(diff: str, def_line: int | None) -> str:
    """The source line of the first changed line: the function's ``def`` line plus the
    offset of the first ``-`` line in the diff (the diff is of the function alone)."""
    if def_line is None:
        return "?"
    offset, n = 0, 0
    for line in diff.splitlines():
        if line.startswith("@@"):
            n = int(re.match(r"@@ -(\d+)", line).group(1)) - 1
            continue
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            offset = n
            break
        if line.startswith("+"):
            offset = n
            break
        n += 1
    return str(def_line + offset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("var/mutants/report.md"))
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON")
    parser.add_argument("--sampled", nargs="*", default=[],
                        help="modules (checkpoints/x.py) whose mutants were sampled")
    parser.add_argument("--sample-note", default="")
    parser.add_argument("--wall", default="", help="wall time of the run, for the header")
    args = parser.parse_args(argv)

    metas = sorted(Path("mutants").rglob("*.py.meta"))
    if not metas:
        raise SystemExit("no mutants/*.meta: run `make mutants` (mutmut run) first")
    rows, survivors, numbers = [], [], {}
    totals: Counter[str] = Counter()
    for meta in metas:
        source = Path(str(meta.relative_to("mutants"))[: -len(".meta")])
        data = SourceFileMutationData(path=source)
        data.load()
        statuses = {k: status_by_exit_code[v] for k, v in data.exit_code_by_key.items()}
        for k in statuses:
            if (str(source), function_of(k)) in IMPORT_TIME:
                statuses[k] = "import time"
        count = Counter(statuses.values())
        ran = sum(count[s] for s in RAN)
        if not data.exit_code_by_key:
            continue
        killed = count["killed"] + count["timeout"]
        rate = f"{100 * killed / ran:.1f}%" if ran else "-"
        sampled = str(source) in args.sampled
        rows.append(f"| {source}{' (sample)' if sampled else ''} | {len(statuses)} | {ran} | "
                    f"{count['killed']} | {count['timeout']} | {count['survived']} | "
                    f"{count['no tests']} | {count['import time']} | {count['not checked']} "
                    f"| {rate} |")
        numbers[str(source)] = dict(count, generated=len(statuses), ran=ran, sampled=sampled)
        totals.update(count)
        totals["generated"] += len(statuses)
        totals["ran"] += ran
        lines = function_lines(source)
        for key, status in sorted(statuses.items()):
            if status not in ("survived", "suspicious"):
                continue
            func = function_of(key)
            diff = get_diff_for_mutant(key, path=source)
            survivors.append((str(source), func, key, location(diff, lines.get(func)), diff,
                              status))

    killed = totals["killed"] + totals["timeout"]
    overall = f"{100 * killed / totals['ran']:.1f}%" if totals["ran"] else "-"
    out = [
        "# Mutation testing: survivors report",
        "",
        f"mutmut 3.8.1, {time.strftime('%Y-%m-%d %H:%M')}"
        + (f", wall time {args.wall}" if args.wall else "") + ".",
        "Kill rate = (killed + timeout) / mutants run; \"no tests\": no test of the selection "
        "reaches the function (not counted as run); \"not checked\": generated, not run "
        "(outside the sample, or the run was stopped); \"import time\": the function only "
        "runs while the module is imported, where mutmut cannot switch a mutant on (not "
        "counted as run).",
        "",
    ]
    if args.sample_note:
        out += [f"Sample: {args.sample_note}", ""]
    out += [
        "| module | generated | run | killed | timeout | survived | no tests | import time "
        "| not checked | kill rate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        f"| **all** | {totals['generated']} | {totals['ran']} | {totals['killed']} | "
        f"{totals['timeout']} | {totals['survived']} | {totals['no tests']} | "
        f"{totals['import time']} | {totals['not checked']} | **{overall}** |",
        "",
        "## Survivors by function",
        "",
    ]
    by_function: dict[tuple[str, str], int] = defaultdict(int)
    for file, func, *_ in survivors:
        by_function[(file, func)] += 1
    out += [f"- {file} `{func}`: {n}" for (file, func), n in
            sorted(by_function.items(), key=lambda kv: (-kv[1], kv[0]))]
    out += ["", "## Each survivor", ""]
    for file, func, key, line, diff, status in survivors:
        body = "\n".join(diff.splitlines()[2:])  # drop the ---/+++ header
        out += [f"### {file}:{line} `{func}` ({key}{', ' + status if status != 'survived' else ''})",
                "", "```diff", body, "```", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out) + "\n", "utf-8")
    if args.json:
        args.json.write_text(json.dumps({"modules": numbers, "total": dict(totals),
                                         "kill_rate": overall}, indent=2) + "\n", "utf-8")
    print("\n".join(out[: 8 + len(rows) + 3]))
    print(f"\nreport: {args.out} ({len(survivors)} survivors)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
