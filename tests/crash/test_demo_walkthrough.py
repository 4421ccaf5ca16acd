"""The README's demo walk-through finds what it says it finds (the last stop's note: the
README said a search or a hold "by that subject finds that order's runs", and the
LangGraph refund runs were found by neither ``order`` search).

The test runs the real demo (``manage.py demo --no-serve``) at a small size on its own
SQLite database and ports, then asks that database, through the same selectors the
inbox and the hold service use, for each claim of ``CLAIMS``: the README must say the
words, and the demo's runs must answer them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

# Its own SQLite database and ports whatever backend the suite runs on: once is enough.
# `once`, not `matrix` (stop 40): the demo runs on a SQLite file of its own whichever pass
# starts it, so make test runs it in the SQLite pass only.
pytestmark = [pytest.mark.slow, pytest.mark.once]

#: (the README's words, a search ``q`` in acme, the workflows or agents it must find).
SEARCHES = [
    ("`A-1003` through `charge:A-1003`", "A-1003", {"acme.order"}),
    ("a LangGraph refund's order `LG-2001` through\n  `refund:LG-2001`", "LG-2001",
     {"langgraph_refund"}),
    ("a thread id (`refund-LG-2001`) its one run", "refund-LG-2001", {"langgraph_refund"}),
    ("In the demo, `order` finds the\n  `acme.order` runs (their workflow), not the "
     "LangGraph refunds", "order", {"acme.order"}),
    ("`refund` finds those, with the `refund-assistant` agent's turns", "refund",
     {"langgraph_refund", "refund-assistant"}),
    ("so its order id finds nothing in the search box", "A-1001", set()),
]
#: (the README's words, a subject field and value in acme, how many runs a hold finds).
SUBJECTS = [
    ("`A-1001` finds that order's\n   run", "order", "A-1001", 1),
    ("`refund-LG-2001` finds the\n   refund of order `LG-2001`", "thread", "refund-LG-2001", 1),
    ("so `order` with `LG-2001` finds nothing", "order", "LG-2001", 0),
]

PROBE = """
import json
from checkpoints.models import Run, RunSubject, Tenant
from checkpoints.selectors.search import search_match
from checkpoints.services.lifecycle import subject_digest
acme = Tenant.objects.get(slug="acme")
runs = Run.objects.for_tenant(acme)
found = {q: sorted({r.workflow or r.agent for r in runs.filter(search_match(acme, q))})
         for q in QUERIES}
held = {f"{f}={v}": RunSubject.objects.for_tenant(acme).filter(
            field=f, digest=subject_digest(acme, f, v)).values("run_id").distinct().count()
        for f, v in SUBJECTS}
print("PROBE " + json.dumps({"found": found, "held": held}))
"""


def _langgraph_installed() -> bool:
    from checkpoints.management.commands.demo import _langgraph_installed
    return _langgraph_installed()


def test_every_search_and_hold_of_the_readme_walk_through_finds_what_it_says(tmp_path):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    for words, *_ in [*SEARCHES, *SUBJECTS]:
        assert words in readme, words
    if not _langgraph_installed():
        pytest.skip("the LangGraph example is not installed: the demo leaves it out")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["RECOVERY_VAR_DIR"] = str(tmp_path)
    port = 18900 + (os.getpid() % 400) * 2
    demo = subprocess.run(
        [sys.executable, "manage.py", "demo", "--no-serve", "--workers", "12",
         "--langgraph", "3", "--parallel", "3", "--seed", "11", "--port", str(port),
         "--payments-port", str(port + 1), "--receiver-port", str(port + 20_000)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    code = (f"QUERIES = {[q for _, q, _ in SEARCHES]!r}\n"
            f"SUBJECTS = {[(f, v) for _, f, v, _ in SUBJECTS]!r}\n" + PROBE)
    probe = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
    line = next((x for x in probe.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, probe.stdout[-2000:] + probe.stderr[-2000:]
    answer = json.loads(line.removeprefix("PROBE "))
    for words, q, names in SEARCHES:
        assert set(answer["found"][q]) == names, (q, words)
    for words, field, value, count in SUBJECTS:
        assert answer["held"][f"{field}={value}"] == count, (field, value, words)
