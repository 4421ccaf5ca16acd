"""After a dashboard POST that succeeds without htmx: 303 See Other, every one
(``common.see_other``; a reviewer's finding: the hold form answered 303, the hold's
release on the same page 302). Django's ``redirect`` answers 302; only ``see_other``
and two GETs (``inbox.home``'s ``/``, a run page's short id) call it. The isolation table
(tests/security/test_isolation_table.py) checks each POST's answer; this keeps a new
view from calling ``redirect`` itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from checkpoints.models import LegalHold
from tests.lifecycle.retention_world import completed_run, set_policy

DASHBOARD = Path(__file__).resolve().parent.parent.parent / "checkpoints" / "dashboard"

#: The functions that may call Django's ``redirect`` (302 unless told): ``see_other``,
#: and two GETs: ``/`` (``inbox.home``) and a run page's short id (``run._run_by_prefix``,
#: to the run's full URL; a GET, so a 302 changes no method).
MAY_REDIRECT = {"common.py:see_other", "inbox.py:home", "run.py:_run_by_prefix"}


def redirect_callers() -> set[str]:
    """``file:function`` of each function of the dashboard that calls ``redirect`` (or
    builds an ``HttpResponseRedirect``)."""
    found = set()
    for path in sorted(DASHBOARD.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("redirect", "HttpResponseRedirect"):
                    found.add(f"{path.name}:{fn.name}")
    return found


def test_only_see_other_and_the_home_page_call_redirect():
    assert redirect_callers() == MAY_REDIRECT


@pytest.mark.django_db
def test_a_hold_placed_and_released_on_one_page_both_answer_303(login, acme, adam, wendy):
    """The legal holds page's two forms: place (303 before) and release (302 before)."""
    set_policy(acme, subject_fields={"customer": "/customer/id"})
    run = completed_run(wendy, acme)
    client = login(adam)
    placed = client.post("/t/acme/legal-holds/place/",
                         {"scope": "runs", "runs": str(run.uuid), "reason": "case 7"})
    hold = LegalHold.objects.for_tenant(acme).get()
    released = client.post(f"/t/acme/legal-holds/{hold.uuid}/release/", {"reason": "done"})
    assert (placed.status_code, released.status_code) == (303, 303)
    assert placed["Location"] == released["Location"] == "/t/acme/legal-holds/"
