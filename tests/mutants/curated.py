"""Curated rule mutants (issue 7): each breaks one rule on purpose; the suite must notice.

``curated.toml`` beside this file lists the mutants. Each one names the file, the exact
text to replace (it must occur exactly once), the replacement, the tests that must fail
once it is applied (kept narrow: seconds per mutant), and the database those tests need
(``sqlite`` or ``postgres``). The runner:

1. checks every mutant first (the file exists, the old text occurs exactly once, the
   mutated file still compiles); a stale entry is an error, never a skip, so the list is
   re-targeted when code moves (``mutant X: old text not found in FILE``);
2. copies the working tree once per worker into a temporary directory (the real tree is
   never written), and runs the union of the selections on the unmutated copy (the
   baseline: a selection that fails already would "kill" everything);
3. per mutant: writes the mutated file into its worker's copy, runs
   ``python -m pytest -x -q -p no:cacheprovider --timeout=<test timeout> <tests>``,
   restores the file. Exit code 1 is "killed", 0 is "survived"; any other exit code is an
   error (a selection that no longer exists, an internal error).

Two timeouts (issue 17, item 15), so a mutant that makes a test loop or wait forever
cannot hang CI:

- **per test** (pytest-timeout, ``--test-timeout``, default 120 s; an entry's
  ``test_timeout``): a test that runs longer fails ("Timeout (>N s)"). The unmutated
  selection passes within the same bound (the baseline; under ``make test`` the two suite
  runs, bounded at 300 s a test by pyproject.toml), so the mutant is what made it hang:
  the suite detected the broken rule, and the mutant counts as **killed**, reported as
  ``KILLED (timed out)`` with the test that hung, apart from the kills by an assertion
  (a hang is a slower, costlier way to fail: a rule whose breakage only hangs deserves a
  test that says what is wrong). A timeout in a test's set-up (fixtures, the test
  database's creation) is an error instead: it is no evidence against the mutant.
- **per mutant** (the whole selection, ``--timeout``, default 240 s; an entry's
  ``timeout``): with every test bounded, a selection running past it has too many tests;
  that is an **error** (narrow the selection), never a kill, since a slow selection would
  otherwise pass for one.

Exit status: 0 when every mutant is killed; 1 when one survived; 2 for a stale or
broken entry (with ``--strict``, also any entry still marked ``pending``), a failing
baseline, a timeout or an error. A mutant with ``pending = "why"`` waits for tests that are not on
this branch yet: its survival is reported but does not fail the run until the mark is
deleted (or ``--strict`` is given); a pending mutant that is killed says its mark can go.

Usage::

    python -m tests.mutants.curated                 # all, two at a time
    python -m tests.mutants.curated --check         # only validate the list (no tests run)
    python -m tests.mutants.curated --only ID ...   # some
    python -m tests.mutants.curated --list

PostgreSQL mutants need ``--pg-url`` (or ``CURATED_PG_URL`` / ``DATABASE_URL``): the
runner derives one database per worker (``<name>_curated_w0`` ...) from it; without a URL
they are an error unless ``--skip-postgres`` is given (then they are reported as skipped
and the exit status is 2).
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("curated.toml")
DATABASES = ("sqlite", "postgres")
# Copied into each worker's tree: everything the tests read, none of the bulky or
# generated folders.
IGNORE = shutil.ignore_patterns(".git", ".venv", "var", "mutants", "__pycache__", "*.pyc",
                                ".pytest_cache", ".ruff_cache", "node_modules", "*.egg-info",
                                "build")
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
TIMED_OUT = "Failed: Timeout (>"  # how pytest-timeout fails a test
TIMED_OUT_KILL = "killed (timed out)"
KILLED = ("killed", TIMED_OUT_KILL)


@dataclass
class Mutant:
    """One entry of ``curated.toml``."""

    id: str
    description: str
    file: str
    old: str
    new: str
    tests: list[str]
    db: str = "sqlite"
    pending: str = ""  # why it may survive for now (the tests that kill it are elsewhere)
    timeout: int = 0  # seconds for the whole selection; 0: the runner's --timeout
    test_timeout: int = 0  # seconds per test; 0: the runner's --test-timeout
    status: str = "not run"
    seconds: float = 0.0
    output: str = ""
    problems: list[str] = field(default_factory=list)

    def mutated(self, source: str) -> str:
        return source.replace(self.old, self.new, 1)


def load(path: Path = LIST) -> list[Mutant]:
    """The mutants of ``path``; raises ``SystemExit(2)`` naming each malformed entry."""
    data = tomllib.loads(path.read_text("utf-8"))
    known = set(Mutant.__dataclass_fields__) - {"status", "seconds", "output", "problems"}
    mutants, errors = [], []
    for n, entry in enumerate(data.get("mutant", []), start=1):
        name = entry.get("id", f"#{n}")
        unknown = set(entry) - known
        missing = {"id", "description", "file", "old", "new", "tests"} - set(entry)
        if unknown or missing:
            errors.append(f"mutant {name}: unknown keys {sorted(unknown)}, "
                          f"missing keys {sorted(missing)}")
            continue
        mutants.append(Mutant(**entry))
    ids = [m.id for m in mutants]
    errors += [f"mutant {i}: id used twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    if errors:
        print("\n".join(errors), file=sys.stderr)
        raise SystemExit(2)
    return mutants


def validate(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """Problems that make an entry unusable: the list must follow the code."""
    problems = []
    for m in mutants:
        path = root / m.file
        if m.db not in DATABASES:
            m.problems.append(f"mutant {m.id}: db must be one of {', '.join(DATABASES)}")
        if not m.tests:
            m.problems.append(f"mutant {m.id}: no tests to kill it")
        if m.old == m.new:
            m.problems.append(f"mutant {m.id}: the replacement equals the old text")
        if not path.is_file():
            m.problems.append(f"mutant {m.id}: file {m.file} does not exist")
        else:
            source = path.read_text("utf-8")
            count = source.count(m.old)
            if count == 0:
                m.problems.append(f"mutant {m.id}: old text not found in {m.file}")
            elif count > 1:
                m.problems.append(f"mutant {m.id}: old text found {count} times in {m.file} "
                                  "(make it longer so it names one place)")
            else:
                try:
                    compile(m.mutated(source), m.file, "exec")
                except SyntaxError as exc:
                    m.problems.append(f"mutant {m.id}: the mutated {m.file} does not compile "
                                      f"({exc.msg}, line {exc.lineno})")
        for test in m.tests:
            test_file = test.split("::", 1)[0]
            if not (root / test_file).exists():
                m.problems.append(f"mutant {m.id}: test path {test_file} does not exist")
        problems += m.problems
    return problems


def pg_url_for(base: str, worker: int) -> str:
    """``postgres://u@h:p/name`` -> the same server, database ``name_curated_w<worker>``
    (pytest-django then creates ``test_name_curated_w<worker>``)."""
    parts = urlsplit(base)
    name = parts.path.lstrip("/") or "recovery"
    return urlunsplit(parts._replace(path=f"/{name}_curated_w{worker}"))


class Worker:
    """A private copy of the tree, its own var dir and its own databases."""

    def __init__(self, number: int, scratch: Path, pg_url: str | None):
        self.number = number
        self.tree = scratch / f"w{number}" / "tree"
        self.var = scratch / f"w{number}" / "var"
        shutil.copytree(ROOT, self.tree, ignore=IGNORE, symlinks=True)
        self.var.mkdir(parents=True)
        self.pg_url = pg_url_for(pg_url, number) if pg_url else None
        self.db_made: set[str] = set()

    def env(self, db: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "PYTEST_ADDOPTS")}
        # No bytecode: a mutated file must never be served from a stale .pyc.
        env.update(PYTHONDONTWRITEBYTECODE="1", RECOVERY_VAR_DIR=str(self.var / db),
                   # the tree's server, and its SDK (clients/python: recovery_client)
                   PYTHONPATH=os.pathsep.join((str(self.tree),
                                               str(self.tree / "clients" / "python"))))
        if db == "postgres":
            env["DATABASE_URL"] = self.pg_url or ""
        return env

    def pytest(self, db: str, tests: list[str], timeout: int,
               test_timeout: int) -> tuple[str, float, str]:
        """Run ``tests`` on this worker's tree, each test bounded by ``test_timeout``
        seconds and the whole run by ``timeout``: ``(outcome, seconds, output tail)`` with
        outcome ``passed`` / ``failed`` / ``test timed out`` (a test failed by
        pytest-timeout) / ``timeout`` (the whole run) / ``error (exit N)``."""
        # The first run on each database builds the test database; later runs keep it
        # (migrations do not change between mutants: only rule code does).
        reuse = "--reuse-db" if db in self.db_made else "--create-db"
        cmd = [sys.executable, *PYTEST, f"--timeout={test_timeout}", reuse, *tests]
        start = time.monotonic()
        # Its own process group, so a timeout ends the tests' own subprocesses too.
        proc = subprocess.Popen(cmd, cwd=self.tree, env=self.env(db), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return "timeout", time.monotonic() - start, (out or "")[-3000:]
        seconds = time.monotonic() - start
        self.db_made.add(db)
        outcome = {0: "passed", 1: "failed"}.get(proc.returncode,
                                                 f"error (exit {proc.returncode})")
        if outcome == "failed":
            summary = [x for x in (out or "").splitlines() if TIMED_OUT in x]
            if any(x.startswith("ERROR") for x in summary):
                # In a fixture's set-up (the first test also builds the test database):
                # not evidence that the mutant hangs a test. An error, never a kill.
                outcome = "error (a test's set-up timed out)"
            elif summary:
                outcome = "test timed out"
        return outcome, seconds, (out or "")[-3000:]

    def drop_databases(self) -> None:
        """Drop the test database this worker's runs kept (``--reuse-db``), so a finished
        run leaves nothing on the server (a newcomer's finding: ``make test`` left
        ``test_recovery_curated_w0`` and ``_w1`` behind)."""
        if not self.pg_url or "postgres" not in self.db_made:
            return
        import psycopg
        from psycopg import sql

        parts = urlsplit(self.pg_url)
        # The name as Django reads it (dj-database-url decodes it), quoted as an identifier.
        name = "test_" + unquote(parts.path.lstrip("/"))
        server = urlunsplit(parts._replace(path="/postgres"))
        try:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))
        except psycopg.Error as exc:  # the run's verdict stands; say what was left
            print(f"curated: could not drop {name}: {exc}", file=sys.stderr)

    def run_mutant(self, m: Mutant, timeout: int, test_timeout: int) -> None:
        path = self.tree / m.file
        original = path.read_text("utf-8")
        try:
            path.write_text(m.mutated(original), "utf-8")
            outcome, m.seconds, m.output = self.pytest(
                m.db, m.tests, m.timeout or timeout, m.test_timeout or test_timeout)
        finally:
            path.write_text(original, "utf-8")
        m.status = {"failed": "killed", "test timed out": TIMED_OUT_KILL,
                    "passed": "survived"}.get(outcome, outcome)


def baseline(worker: Worker, mutants: list[Mutant], timeout: int,
             test_timeout: int) -> list[str]:
    """Run each database's selections unmutated, each test under the largest per-test
    timeout any of them is given; they must pass."""
    problems = []
    for db in DATABASES:
        tests = sorted({t for m in mutants if m.db == db for t in m.tests})
        if not tests:
            continue
        bound = max([test_timeout] + [m.test_timeout for m in mutants if m.db == db])
        outcome, seconds, tail = worker.pytest(db, tests, timeout * 3, bound)
        print(f"baseline {db}: {len(tests)} selections {outcome} in {seconds:.0f}s", flush=True)
        if outcome != "passed":
            problems.append(f"baseline {db}: the unmutated tree does not pass the selections "
                            f"({outcome}); every mutant would look killed:\n{tail}")
    return problems


def line(m: Mutant) -> str:
    status = m.status.upper()
    if m.pending and m.status == "survived":
        status = "SURVIVED (pending)"
    elif m.pending and m.status in KILLED:
        status += " (pending mark can go)"
    return f"{status:<34} {m.id:<40} {m.seconds:6.1f}s  {m.file}"


def write_report(path: Path, mutants: list[Mutant], wall: float) -> None:
    rows = ["# Curated rule mutants", "",
            f"Run {time.strftime('%Y-%m-%d %H:%M')}, wall time {wall:.0f} s.", "",
            "| id | db | result | pending | seconds | description |",
            "| --- | --- | --- | --- | --- | --- |"]
    for m in mutants:
        rows.append(f"| {m.id} | {m.db} | {m.status} | {m.pending or ''} | {m.seconds:.0f} "
                    f"| {m.description} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", "utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants.curated",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--check", action="store_true",
                        help="validate the list against the code, run nothing")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (2)")
    parser.add_argument("--timeout", type=int, default=240,
                        help="seconds per mutant (its whole selection) before it is an "
                             "error: the selection is too big (240)")
    parser.add_argument("--test-timeout", type=int, default=120,
                        help="seconds per test (pytest-timeout) before that test fails; a "
                             "mutant whose tests time out counts as killed, reported as "
                             "'killed (timed out)' (120)")
    parser.add_argument("--pg-url", default=os.environ.get("CURATED_PG_URL")
                        or os.environ.get("DATABASE_URL"),
                        help="PostgreSQL server for the postgres mutants")
    parser.add_argument("--skip-postgres", action="store_true",
                        help="report postgres mutants as skipped (exit status 2)")
    parser.add_argument("--strict", action="store_true",
                        help="no pending entry is allowed: one is an error, like a stale "
                             "entry (make test and make mutants-curated use it)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run of the selections")
    parser.add_argument("--report", type=Path, help="also write a Markdown table here")
    args = parser.parse_args(argv)

    mutants = load()
    if args.only:
        wanted = set(args.only)
        unknown = wanted - {m.id for m in mutants}
        if unknown:
            print(f"no such mutant: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.id in wanted]
    if args.list:
        for m in mutants:
            pending = f"  [pending: {m.pending}]" if m.pending else ""
            print(f"{m.id:<40} {m.db:<8} {m.file}: {m.description}{pending}")
        return 0
    problems = validate(mutants)
    if args.strict:
        # Under --strict (``make test``) the list itself may not excuse a survivor.
        problems += [f"mutant {m.id}: pending ({m.pending}); --strict allows no pending "
                     "entry: point `tests` at the tests that kill it and delete the mark"
                     for m in mutants if m.pending]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"{len(problems)} problem(s) in {LIST.relative_to(ROOT)}: fix the entries "
              "(re-target the old text where the code moved)", file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(mutants)} mutants: every old text occurs exactly once and compiles")
        return 0

    skipped = []
    if not args.pg_url and any(m.db == "postgres" for m in mutants):
        if not args.skip_postgres:
            print("postgres mutants need --pg-url (or CURATED_PG_URL / DATABASE_URL); "
                  "--skip-postgres reports them as skipped", file=sys.stderr)
            return 2
        skipped = [m for m in mutants if m.db == "postgres"]
        for m in skipped:
            m.status = "skipped (no PostgreSQL)"
        mutants = [m for m in mutants if m.db != "postgres"]

    start = time.monotonic()
    jobs = max(1, min(args.jobs, len(mutants) or 1))
    with tempfile.TemporaryDirectory(prefix="curated-mutants-") as scratch:
        workers = [Worker(i, Path(scratch), args.pg_url) for i in range(jobs)]
        try:
            if not args.no_baseline:
                problems = baseline(workers[0], mutants, args.timeout, args.test_timeout)
                if problems:
                    print("\n".join(problems), file=sys.stderr)
                    return 2
            todo: queue.Queue[Mutant] = queue.Queue()
            for m in mutants:
                todo.put(m)
            lock = threading.Lock()

            def work(worker: Worker) -> None:
                while True:
                    try:
                        m = todo.get_nowait()
                    except queue.Empty:
                        return
                    worker.run_mutant(m, args.timeout, args.test_timeout)
                    with lock:
                        print(line(m), flush=True)

            threads = [threading.Thread(target=work, args=(w,)) for w in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for w in workers:
                w.drop_databases()
    wall = time.monotonic() - start

    everything = mutants + skipped
    required = [m for m in mutants if args.strict or not m.pending]
    survivors = [m for m in required if m.status == "survived"]
    errors = [m for m in mutants if m.status.startswith("error") or m.status == "timeout"]
    for m in errors:
        why = (f"ran longer than {m.timeout or args.timeout}s: narrow its selection (or "
               "give it a timeout)" if m.status == "timeout" else m.status)
        print(f"\nmutant {m.id}: {why}; the selection {' '.join(m.tests)} said:\n"
              f"{m.output}", file=sys.stderr)
    for m in survivors:
        print(f"\nSURVIVED {m.id}: {m.description}\n  {m.file}: tests {' '.join(m.tests)} "
              "all pass with this rule broken", file=sys.stderr)
    for m in mutants:
        if m.status == TIMED_OUT_KILL:
            hung = [x for x in m.output.splitlines() if TIMED_OUT in x and "FAILED" in x]
            print(f"\nmutant {m.id}: killed by a timeout (a test hung with the rule "
                  f"broken): {' '.join(hung) or m.output[-500:]}", file=sys.stderr)
    counts = {s: sum(m.status == s for m in everything)
              for s in ("killed", TIMED_OUT_KILL, "survived")}
    pending_alive = sum(m.pending != "" and m.status == "survived" for m in mutants)
    print(f"\ncurated mutants: {len(everything)}, "
          f"killed {counts['killed'] + counts[TIMED_OUT_KILL]} "
          f"({counts[TIMED_OUT_KILL]} of them by a timeout), "
          f"survived {counts['survived']} "
          f"({pending_alive} of them pending), errors {len(errors)}, skipped {len(skipped)}; "
          f"{wall:.0f}s with {jobs} at a time")
    if args.report:
        write_report(args.report, everything, wall)
    if errors or skipped:
        return 2
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
