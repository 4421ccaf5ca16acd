"""Sizes a newcomer can read (issue 18, "Done when"): no module over 600 lines and no
function over 80 lines, unless the exception says why. A long function says so in a
comment starting ``# Long on purpose:`` at the top of its body; a long module is listed
in ``LONG_MODULES`` with its reason.

Reads the server (``checkpoints/`` without migrations, ``recovery/``) and the runtime
SDK (``clients/python/recovery_client/``) with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("checkpoints", "recovery", "clients/python/recovery_client")
MODULE_MAX, FUNCTION_MAX = 600, 80
WHY = "# Long on purpose:"

#: Modules allowed past ``MODULE_MAX`` lines, each with its reason.
LONG_MODULES: dict[str, str] = {
    "recovery/settings.py": "every setting read from the environment, in one place "
                            "(CONTRACT.md 7)",
    "checkpoints/vocab.py": "every vocabulary word of the code, in one place "
                            "(tests/test_vocab.py reads it)",
    "clients/python/recovery_client/core.py": "the sans-IO protocol core of the vendored "
                                              "pair (core.py, client.py): two files, not "
                                              "more (tests/test_vendoring.py)",
    "clients/python/recovery_client/client.py": "the standard-library runtime client a "
                                                "runtime vendors with core.py: two files, "
                                                "not more (tests/test_vendoring.py)",
    "checkpoints/services/writepath.py": "the checkpoint write's two dialects side by side, "
                                         "the ORM reference and the SQL path that mirrors "
                                         "it step by step (one rule, read in one place)",
}


def _modules():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def long_functions(source: str, name: str) -> list[str]:
    """``file:line name (n lines)`` for each function over ``FUNCTION_MAX`` lines whose
    body does not start (after its docstring) with a ``# Long on purpose:`` comment."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length <= FUNCTION_MAX:
            continue
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            start = first.end_lineno  # the line after the docstring (0-based index)
        else:
            start = first.lineno - 1
        head = [line.strip() for line in lines[node.lineno:start + 3]]
        if not any(line.startswith(WHY) for line in head):
            found.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_long_without_saying_why():
    found = []
    for path in _modules():
        found += long_functions(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, (f"functions over {FUNCTION_MAX} lines without a '{WHY}' comment at "
                       "the top of their body:\n" + "\n".join(found))


def long_modules(sizes: dict[str, int], listed) -> tuple[list[str], list[str]]:
    """Of ``sizes`` (module: lines), the modules over ``MODULE_MAX`` lines that ``listed``
    does not name, and those ``listed`` names that are not over it (stale)."""
    long = {name for name, n in sizes.items() if n > MODULE_MAX}
    return sorted(long - set(listed)), sorted(set(listed) - long)


def test_no_module_is_long_unless_listed():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in _modules()}
    assert {"clients/python/recovery_client/client.py", "checkpoints/models/__init__.py",
            "recovery/settings.py"} <= set(sizes)  # the walk reads every tree it names
    unlisted, stale = long_modules(sizes, LONG_MODULES)
    assert not unlisted, (
        f"modules over {MODULE_MAX} lines: {unlisted} (split them, "
        "or list them in LONG_MODULES with the reason)")
    assert not stale, f"LONG_MODULES lists modules that are short now: {stale}"


def test_the_module_check_tells_a_long_module_from_a_listed_or_short_one():
    sizes = {"a.py": MODULE_MAX + 1, "b.py": MODULE_MAX, "c.py": 10}
    assert long_modules(sizes, {}) == (["a.py"], [])
    assert long_modules(sizes, {"a.py": "why"}) == ([], [])
    assert long_modules(sizes, {"a.py": "why", "c.py": "why"}) == ([], ["c.py"])


def test_the_function_check_tells_a_reasoned_function_from_a_bare_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_MAX))
    bare = f'def f():\n    """Doc."""\n{body}'
    assert long_functions(bare, "m.py") == [f"m.py:1 f ({FUNCTION_MAX + 2} lines)"]
    reasoned = f'def f():\n    """Doc."""\n    {WHY} one table.\n{body}'
    assert long_functions(reasoned, "m.py") == []
    short = 'def f():\n    return 1\n'
    assert long_functions(short, "m.py") == []
