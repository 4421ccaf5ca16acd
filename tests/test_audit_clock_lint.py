"""One rule, held in one place (issue 22, stop 31): an audit event of a run's write
carries the database time its run lock read, never this process's clock
(docs/security/audit.md, "Clocks"; ``dbclock.LOCKED_NOW``).

The time is passed by each writer (``created_at=run.db_now`` or the ``now`` read with
the lock), so a new call site could forget it, as the runifold import did until an attack
found it. This lint parses every module of ``checkpoints/`` with ``ast`` and fails,
naming file:line, on an ``audit_record`` call that names a run (``run_id=``) without
``created_at=``, unless its action is a reveal (``AuditAction.REVEALS``: a read, which
takes no run lock), and on an ``audit_record_many`` call without ``created_at=``.
(Without it an event still gets the database's time, ``audit_record``'s fallback, but
read after the lock, later than the history row it explains.)
"""

from __future__ import annotations

import ast
from pathlib import Path

from checkpoints.vocab import AuditAction

ROOT = Path(__file__).resolve().parent.parent / "checkpoints"
REVEAL_NAMES = {name for name in dir(AuditAction)
                if isinstance(getattr(AuditAction, name), str)
                and getattr(AuditAction, name) in AuditAction.REVEALS}
#: Calls whose action is a variable, each a reveal (checked by hand; file, function).
REVEAL_VARIABLES = {("services/checkpoints.py", "action")}


def unstamped(source: str, name: str) -> list[str]:
    """``file:line`` of each call in ``source`` that breaks the rule."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        keywords = {k.arg: k.value for k in node.keywords}
        if called == "audit_record_many" and "created_at" not in keywords:
            found.append(f"{name}:{node.lineno} audit_record_many without created_at")
        if called != "audit_record" or "run_id" not in keywords or "created_at" in keywords:
            continue
        action = keywords.get("action")
        if isinstance(action, ast.Attribute) and action.attr in REVEAL_NAMES:
            continue
        if isinstance(action, ast.Name) and (name, action.id) in REVEAL_VARIABLES:
            continue
        found.append(f"{name}:{node.lineno} audit_record of a run without created_at")
    return found


def test_every_run_event_of_a_write_is_stamped_with_its_locks_database_time():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        found += unstamped(path.read_text("utf-8"), path.relative_to(ROOT).as_posix())
    assert found == [], "\n".join(found)


def test_the_lint_finds_an_unstamped_write_event_and_passes_a_reveal():
    assert unstamped("audit_record(tenant=t, action=AuditAction.RUN_CLOSE, run_id=r)",
                     "x.py") == ["x.py:1 audit_record of a run without created_at"]
    assert unstamped("audit_record_many(tenant=t, actor=a, events=e)", "x.py") == [
        "x.py:1 audit_record_many without created_at"]
    assert unstamped("audit_record(tenant=t, action=AuditAction.PAYLOAD_READ, run_id=r)",
                     "x.py") == []
    assert unstamped("audit_record(tenant=t, action=AuditAction.RUN_CLOSE, run_id=r, "
                     "created_at=now)", "x.py") == []
