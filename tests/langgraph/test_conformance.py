"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``, written by
LangGraph's maintainers) against ``RecoverySaver`` talking to a live server (issue 10).

Runs on both backends; in the PostgreSQL pass it is the issue's "live server on
PostgreSQL" run. Every capability, base and extended, must be detected and pass. The
report (per capability, with each failing test's name and error) is written to
``$RECOVERY_VAR_DIR/langgraph-conformance.txt`` and printed past pytest's capture, so CI
output shows it. The suite is async: it runs in its own event loop in this (test) thread
while the live server answers from its own threads; nothing here touches the database
from inside the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io

import pytest
from django.conf import settings
from django.db import connection
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, BASE_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from checkpoints.models import GraphCheckpoint
from recovery_client.langgraph import RecoverySaver

pytestmark = pytest.mark.django_db(transaction=True)


def run_conformance(url: str, token: str):
    """The suite's report and the per-test lines (``✓``/``✗`` name, error)."""
    lines: list[str] = []

    @checkpointer_test(name="RecoverySaver (live server)")
    async def recovery_saver():
        async with RecoverySaver(url, "acme", token) as saver:
            yield saver

    def on_result(capability, test, passed, error):
        lines.append(f"    {'✓' if passed else '✗'} {capability}: {test}")
        if error:
            lines.extend(f"        {line}" for line in error.rstrip().splitlines()[-6:])

    report = asyncio.run(validate(recovery_saver,
                                  progress=ProgressCallbacks(on_test_result=on_result)))
    return report, lines


def test_the_saver_passes_langgraphs_conformance_suite(live_server, wendy_token, capsys):
    report, lines = run_conformance(live_server.url, wendy_token)

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report.print_report()
    text = (f"LangGraph checkpoint conformance, RecoverySaver against a live server on "
            f"{connection.vendor}\n{printed.getvalue()}\n" + "\n".join(lines) + "\n")
    out = settings.VAR_DIR / "langgraph-conformance.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    with capsys.disabled():
        print(f"\n{text}(written to {out})")

    results = report.results
    assert {c.value for c in ALL_CAPABILITIES} <= set(results)
    not_detected = sorted(c for c, r in results.items() if not r.detected)
    assert not_detected == [], f"capabilities not implemented: {not_detected}"
    failed = {c: r.failures for c, r in results.items() if r.passed is not True}
    assert failed == {}, f"failing capabilities: {failed}"
    assert report.passed_all_base() and report.conformance_level() == "FULL"
    assert all(results[c.value].tests_passed > 0 for c in BASE_CAPABILITIES)
    # It really went through the server: the suite's checkpoints are rows of the store.
    assert GraphCheckpoint.objects.exists()
