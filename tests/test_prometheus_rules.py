"""The shipped Prometheus alerting rules (issue 21, item 6; deploy/prometheus/,
docs/operations/alerts.md).

- ``promtool check rules`` accepts the file and ``promtool test rules`` passes its unit
  tests (recovery-rules.test.yml). promtool is Debian's ``prometheus`` package: without it
  these two skip, saying how to install it, except under CI (``CI`` set: ``.ci/run`` sets
  it and installs the package when missing), where its absence fails.
- Every alert carries a severity, a summary, a description and a runbook link to its own
  heading in docs/operations/alerts.md, and the unit tests show it firing and quiet.
- Every ``recovery_*`` metric an expression reads is served by ``/metrics``, with the
  label values the expression matches (state names, heartbeat names), in a world where
  every kind of background work has run once.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from checkpoints import replica, services

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "recovery-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "recovery-rules.test.yml"
ALERTS_DOC = ROOT / "docs" / "operations" / "alerts.md"
TOKEN = "metrics-token-" + "r" * 30
SEVERITIES = {"critical", "warning"}

SELECTOR = re.compile(r"\b(recovery_[a-z_]+)\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def promtool() -> str:
    """promtool's path; skips the test without it, or fails it under CI."""
    found = shutil.which("promtool")
    if found:
        return found
    message = ("promtool is missing: apt-get install -y --no-install-recommends prometheus "
               "(Debian's package carries it)")
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; under CI it must be there (.ci/run installs it)")
    pytest.skip(message)


def run_promtool(*args: str) -> None:
    done = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=RULES.parent)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def rules() -> list[dict]:
    """Every alerting rule of the file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def selectors() -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """``(alert, metric, [(label, op, value)])`` for every ``recovery_*`` selector read by
    an alert's expression."""
    out = []
    for rule in rules():
        expr = re.sub(r"#.*", "", rule["expr"])  # PromQL comments
        for metric, inside in SELECTOR.findall(expr):
            out.append((rule["alert"], metric, MATCHER.findall(inside or "")))
    return out


# --------------------------------------------------------------------------------------
# promtool
# --------------------------------------------------------------------------------------

def test_promtool_accepts_the_rules():
    run_promtool("check", "rules", RULES.name)


def test_promtool_unit_tests_pass():
    run_promtool("test", "rules", RULE_TESTS.name)


# --------------------------------------------------------------------------------------
# What every alert carries
# --------------------------------------------------------------------------------------

def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings (lower case, spaces to hyphens, punctuation gone)."""
    out = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", markdown, flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_every_alert_has_a_severity_a_summary_a_description_and_its_runbook():
    headings = anchors(ALERTS_DOC.read_text())
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations/alerts.md#{name.lower()}", name
        assert name.lower() in headings, f"docs/operations/alerts.md has no '### {name}'"


def test_every_alert_is_shown_firing_and_quiet_by_the_unit_tests():
    cases: dict[str, set[bool]] = {}
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for rule in rules():
        assert cases.get(rule["alert"]) == {True, False}, (
            f"{rule['alert']}: recovery-rules.test.yml needs a case where it fires and one "
            "where it does not")


# --------------------------------------------------------------------------------------
# The rules read only what /metrics serves
# --------------------------------------------------------------------------------------

@pytest.fixture
def served(client, settings, acme, globex, monkeypatch) -> dict[str, dict[str, set[str]]]:
    """``{metric: {label: values}}`` of a scrape after every kind of background work the
    rules watch ran once: sweeps by a Celery worker and the embedded worker, a retention
    round and a verification of every audit chain; with a read replica configured (its
    families exist only then), streaming and caught up."""
    monkeypatch.setattr(replica, "configured", lambda: True)
    monkeypatch.setattr(replica, "lag_s", lambda: 0.0)
    services.sweep_stale_runs(by="celery")
    services.sweep_stale_runs(by="inprocess")
    services.retention_purge_all()
    call_command("verify_audit_chain", stdout=io.StringIO())
    settings.RECOVERY_METRICS_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    out: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            labels = out.setdefault(sample.name, {})
            for key, value in sample.labels.items():
                labels.setdefault(key, set()).add(value)
    return out


def alternatives(op: str, value: str) -> set[str]:
    """The label values a matcher names (``a|b`` of a regex; dots taken literally)."""
    return set(value.split("|")) if op == "=~" else {value}


@pytest.mark.django_db
def test_every_metric_the_rules_read_is_served_with_the_label_values_they_match(served):
    missing = []
    for alert, metric, matchers in selectors():
        if metric in served:
            labels = served[metric]
        else:
            missing.append(f"{alert}: {metric} is not served by /metrics")
            continue
        for label, op, value in matchers:
            if label not in labels:
                missing.append(f"{alert}: {metric} has no label {label!r}")
                continue
            known = labels[label]
            if known is None or op in ("!=", "!~"):
                continue
            for v in sorted(alternatives(op, value) - set(known)):
                missing.append(f"{alert}: {metric}{{{label}={v!r}}} is never served "
                               f"(served: {sorted(known)})")
    assert not missing, "\n".join(missing)
