"""The server imports only ``recovery_client.protocol`` of the runtime SDK (issue 18,
item 3: the SDK apart, clients/python/).

Parses every module of the server (``checkpoints/`` and ``recovery/``) with ``ast`` and
fails, naming file:line, on an import of any other ``recovery_client`` module (or of the
bare package, whose attributes would reach the rest). ``checkpoints/demo/`` is left out:
its runtime workers are clients of the server and may use ``recovery_client.client``.
The SDK's own tests (``clients/python/tests``) check the other direction: it never pulls
in Django.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ("checkpoints", "recovery")
CLIENTS = ("checkpoints/demo/",)
ALLOWED = "recovery_client.protocol"


def imported(tree: ast.AST):
    """(line, dotted name) of every module or module attribute ``tree`` imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def sdk_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(line, name) for line, name in imported(tree)
            if name == "recovery_client" or name.startswith("recovery_client.")]


def allowed(name: str) -> bool:
    return name == ALLOWED or name.startswith(ALLOWED + ".")


def server_modules() -> list[Path]:
    found = [p for top in SERVER for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in found
            if not p.relative_to(ROOT).as_posix().startswith(CLIENTS)]


def test_the_server_imports_only_the_protocol_of_the_sdk():
    wrong = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
             for path in server_modules() for line, name in sdk_imports(path)
             if not allowed(name)]
    assert not wrong, "the server may import only recovery_client.protocol:\n" + "\n".join(wrong)


def test_the_walk_sees_the_servers_imports():
    # The lint reads what it should: the server's modules, the protocol's importers
    # among them, and the demo's workers (left out) importing the client.
    paths = {p.relative_to(ROOT).as_posix() for p in server_modules()}
    assert {"checkpoints/selectors/search.py", "recovery/settings.py"} <= paths
    assert not any(p.startswith("checkpoints/demo/") for p in paths)
    users = {p.relative_to(ROOT).as_posix() for p in server_modules() if sdk_imports(p)}
    assert {"checkpoints/selectors/search.py", "checkpoints/interop/langgraph/parse.py"} <= users
    worker = sdk_imports(ROOT / "checkpoints/demo/worker.py")
    assert any(name.startswith("recovery_client.client.") for _, name in worker)


def test_the_lint_catches_each_way_of_importing_the_rest(tmp_path):
    for source in ("import recovery_client.client", "from recovery_client import effects",
                   "from recovery_client.langgraph import RecoverySaver",
                   "import recovery_client", "def f():\n    import recovery_client.aclient"):
        module = tmp_path / "m.py"
        module.write_text(source + "\n")
        assert [name for _, name in sdk_imports(module) if not allowed(name)], source
    module.write_text("from recovery_client import protocol as T\n"
                      "from recovery_client.protocol import thread_run_id\n")
    assert all(allowed(name) for _, name in sdk_imports(module))
