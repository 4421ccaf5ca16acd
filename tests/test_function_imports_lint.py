"""No import inside a function unless a comment says why (issue 18, item 1;
docs/architecture.md). An import hidden in a function hides a dependency from the layer
contract's reader and usually papers over a cycle: either it moves to the top of its
module, or the comment right above it (or on its line) names the reason.

Parses every module of the server (``checkpoints/`` without migrations, ``recovery/``)
and of the runtime SDK (``clients/python/recovery_client/``) with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("checkpoints", "recovery", "clients/python/recovery_client")


def unexplained_imports(source: str, name: str) -> list[str]:
    """``file:line import`` for each import inside a function of ``source`` with no
    comment on its line nor on the lines right above it (a comment block ending there)."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            line = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            # Several imports in a row share the comment above the first of them.
            k = node.lineno - 2
            while k > 0 and lines[k].strip().startswith(("from ", "import ")):
                k -= 1
            block_above = lines[k].strip() if k >= 0 else ""
            if "#" in line or above.startswith("#") or block_above.startswith("#"):
                continue
            found.append(f"{name}:{node.lineno} {line.strip()}")
    return found


def _modules():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            yield path


def test_every_import_inside_a_function_says_why():
    found = []
    for path in _modules():
        found += unexplained_imports(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, ("imports inside functions without a comment naming the reason "
                       "(move them to the top of the module, or say why not):\n"
                       + "\n".join(found))


def test_the_lint_reads_the_trees_it_names():
    paths = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"checkpoints/apps.py", "recovery/celery.py",
            "clients/python/recovery_client/effects.py"} <= paths
    assert not any("/migrations/" in p for p in paths)


def test_the_lint_tells_an_explained_import_from_a_bare_one():
    bare = "def f():\n    import json\n    return json\n"
    assert unexplained_imports(bare, "m.py") == ["m.py:2 import json"]
    above = "def f():\n    # late: a cycle with m2\n    import json\n    return json\n"
    assert unexplained_imports(above, "m.py") == []
    inline = "def f():\n    import json  # noqa: a cycle\n    return json\n"
    assert unexplained_imports(inline, "m.py") == []
    pair = "def f():\n    # late: a cycle\n    import json\n    import os\n    return os\n"
    assert unexplained_imports(pair, "m.py") == []
    top = "import json\n\ndef f():\n    return json\n"
    assert unexplained_imports(top, "m.py") == []
