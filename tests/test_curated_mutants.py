"""The curated mutant list (tests/mutants/curated.toml) still fits the code: every entry's
old text occurs exactly once in its file, the mutated file compiles, its test paths exist.

The mutants themselves run in ``make mutants-curated`` (after both suite runs of ``make
test``); this check fails the suite as soon as code moves under an entry, naming it.
"""

from __future__ import annotations

from pathlib import Path

from tests.mutants import curated


def test_every_curated_mutant_still_names_exactly_one_place_in_the_code():
    mutants = curated.load()
    assert curated.validate(mutants) == []


def test_no_curated_mutant_is_excused_as_pending():
    # make test runs the list with --strict: every mutant must be killed by tests that are
    # on this branch; none may wait, marked pending, for tests elsewhere.
    assert [m.id for m in curated.load() if m.pending] == []


def test_the_runner_refuses_an_entry_whose_old_text_moved(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "rules.py").write_text("ALLOWED = {1, 2}\nALLOWED2 = {1, 2}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_rules.py").write_text("")
    entry = dict(description="d", file="checkpoints/rules.py", tests=["tests/test_rules.py"])
    gone = curated.Mutant(id="gone", old="ALLOWED = {1}", new="ALLOWED = set()", **entry)
    twice = curated.Mutant(id="twice", old="{1, 2}", new="{1}", **entry)
    broken = curated.Mutant(id="broken", old="ALLOWED = {1, 2}\n", new="ALLOWED = {\n", **entry)
    fine = curated.Mutant(id="fine", old="ALLOWED = {1, 2}\n", new="ALLOWED = {1}\n", **entry)
    problems = curated.validate([gone, twice, broken, fine], root=tmp_path)
    assert problems == [
        "mutant gone: old text not found in checkpoints/rules.py",
        "mutant twice: old text found 2 times in checkpoints/rules.py (make it longer so it "
        "names one place)",
        "mutant broken: the mutated checkpoints/rules.py does not compile "
        "('{' was never closed, line 1)",
    ]


def _worker(tmp_path) -> curated.Worker:
    """A runner's worker on a tiny tree of its own (not a copy of the repository)."""
    worker = object.__new__(curated.Worker)
    worker.number, worker.tree, worker.var = 0, tmp_path / "tree", tmp_path / "var"
    worker.pg_url, worker.db_made = None, set()
    (worker.tree / "tests").mkdir(parents=True)
    worker.var.mkdir()
    (worker.tree / "rules.py").write_text("LOOP = False\n")
    (worker.tree / "tests" / "test_rules.py").write_text(
        "import time\n\nimport rules\n\n\ndef test_it_answers():\n"
        "    while rules.LOOP:\n        time.sleep(0.05)\n")
    return worker


def test_a_mutant_whose_test_hangs_is_killed_by_the_test_timeout_and_says_so(tmp_path):
    """Issue 17, item 15: the per-test timeout (pytest-timeout) fails the hanging test, so
    the mutant counts as killed, reported apart; the whole selection's timeout is an
    error (a selection too big), never a kill."""
    worker = _worker(tmp_path)
    entry = dict(description="d", file="rules.py", old="LOOP = False", new="LOOP = True",
                 tests=["tests/test_rules.py"])
    hangs = curated.Mutant(id="hangs", test_timeout=2, **entry)
    too_big = curated.Mutant(id="too-big", timeout=3, test_timeout=60, **entry)

    worker.run_mutant(hangs, timeout=120, test_timeout=120)
    worker.run_mutant(too_big, timeout=120, test_timeout=120)

    assert hangs.status == "killed (timed out)", hangs.output
    assert "Timeout" in hangs.output and "test_it_answers" in hangs.output
    assert hangs.seconds < 60
    assert too_big.status == "timeout", too_big.output
    assert (tmp_path / "tree" / "rules.py").read_text() == "LOOP = False\n"  # restored
    assert curated.line(hangs).startswith("KILLED (TIMED OUT)")


def test_a_timeout_in_a_fixtures_set_up_is_an_error_never_a_kill(tmp_path):
    worker = _worker(tmp_path)
    (worker.tree / "tests" / "test_rules.py").write_text(
        "import time\n\nimport pytest\n\nimport rules\n\n\n@pytest.fixture\n"
        "def world():\n    while rules.LOOP:\n        time.sleep(0.05)\n\n\n"
        "def test_it_answers(world):\n    pass\n")
    slow = curated.Mutant(id="slow-set-up", description="d", file="rules.py",
                          old="LOOP = False", new="LOOP = True", tests=["tests/test_rules.py"],
                          test_timeout=2)

    worker.run_mutant(slow, timeout=120, test_timeout=120)

    assert slow.status == "error (a test's set-up timed out)", slow.output


def test_every_curated_mutant_names_tests_that_exist():
    """A renamed test left a mutant pointing at nothing: the runner's baseline then fails
    for every mutant (found when issue 22 renamed a query-count test)."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    data = tomllib.loads((root / "tests" / "mutants" / "curated.toml").read_text())
    missing = []
    for mutant in data["mutant"]:
        for test in mutant["tests"]:
            path, _, name = test.partition("::")
            source = root / path
            name = name.split("[")[0].split("::")[-1]
            if not source.exists() or (name and f"def {name}(" not in source.read_text()):
                missing.append(f"{mutant['id']}: {test}")
    assert not missing, missing


def test_a_worker_drops_the_test_database_pytest_django_made_for_an_encoded_name():
    """(attack-clock) ``--pg-url`` as Django reads it: dj-database-url decodes the
    database name (``%2D`` is ``-``), so pytest-django made ``test_<decoded>_curated_w0``;
    the worker must drop that one, not a database named after the still-encoded text
    (the run would leave its test database behind)."""
    import os
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    import pytest

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("needs a PostgreSQL server (DATABASE_URL)")
    server = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    made = "test_attack%clock-w_curated_w0"
    base = urlunsplit(urlsplit(url)._replace(path="/attack%25clock%2Dw"))
    worker = object.__new__(curated.Worker)
    worker.number, worker.db_made = 0, {"postgres"}
    worker.pg_url = curated.pg_url_for(base, 0)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{made}"')
        conn.execute(f'CREATE DATABASE "{made}"')
    try:
        worker.drop_databases()
        with psycopg.connect(server, autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                                [made]).fetchone()[0]
        assert left == 0
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{made}"')
