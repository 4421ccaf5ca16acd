"""The lock order is written once (issue 17, item 10): every row lock of ``checkpoints/``
is taken in ``checkpoints/locks.py``.

Parses every module of ``checkpoints/`` (migrations aside) with ``ast`` and fails, naming
file:line, on a ``select_for_update`` anywhere but the lock module, and on a string of
SQL (not a docstring) that takes a row or advisory lock (``FOR UPDATE``, ``FOR NO KEY
UPDATE``, ``FOR SHARE``, ``FOR KEY SHARE``, ``pg_advisory…``, ``LOCK TABLE``): a new lock
must be a helper there, placed in ``locks.ORDER``, so two paths cannot take the same
rows in opposite orders.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "checkpoints"
LOCK_MODULE = ROOT / "locks.py"
SKIP = ("migrations",)
LOCK_SQL = re.compile(r"\bFOR\s+(NO\s+KEY\s+)?UPDATE\b|\bFOR\s+(KEY\s+)?SHARE\b"
                      r"|\bpg_(try_)?advisory|\bLOCK\s+TABLE\b", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def lock_sites(source: str, name: str) -> list[str]:
    """``file:line what`` for each lock taken outside the lock module in ``source``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "select_for_update":
            found.append(f"{name}:{node.lineno} select_for_update")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs and LOCK_SQL.search(node.value)):
            found.append(f"{name}:{node.lineno} SQL lock {LOCK_SQL.search(node.value)[0]!r}")
    return found


def test_every_row_lock_is_taken_in_the_lock_module():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if path == LOCK_MODULE or rel.parts[0] in SKIP:
            continue
        found += lock_sites(path.read_text(), str(rel))
    assert not found, ("row locks outside checkpoints/locks.py (take them through a helper "
                       "there, in locks.ORDER): " + "; ".join(found))


def test_the_lint_sees_each_kind_of_lock():
    """The lint itself: each form is caught, a docstring that names one is not."""
    samples = {
        "Run.objects.for_tenant(t).select_for_update().get(pk=1)": 1,
        'SQL = f"SELECT 1 FROM {t} r FOR UPDATE OF r"': 1,
        'SQL = "SELECT 1 FROM t for no key update"': 1,
        'SQL = "SELECT pg_advisory_xact_lock(1)"': 1,
        'SQL = "LOCK TABLE t IN EXCLUSIVE MODE"': 1,
        'def f():\n    """Locked FOR UPDATE by the caller."""\n    return 1': 0,
        'SQL = "SELECT 1 FROM t"': 0,
    }
    for source, expected in samples.items():
        assert len(lock_sites(source, "x.py")) == expected, source

