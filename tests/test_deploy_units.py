"""The systemd units the README's production section points to (issue 17, item 11): each
of the three production commands has one, restarted whatever ends it, never given up on,
running the command the README prints."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "deploy" / "systemd"
COMMANDS = {
    "recovery-web.service": "gunicorn recovery.wsgi",
    "recovery-worker.service": "celery -A recovery worker",
    "recovery-beat.service": "celery -A recovery beat",
}


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(UNITS / name)
    return parser


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_production_process_has_a_unit_that_restarts_it(name):
    unit = _unit(name)
    assert unit["Service"]["Restart"] == "always"
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    exec_start = unit["Service"]["ExecStart"]
    assert re.sub(r"^\S*/", "", exec_start).startswith(COMMANDS[name])
    assert unit["Service"]["EnvironmentFile"] == "/etc/recovery/recovery.env"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_readme_runs_those_commands_and_points_to_the_units():
    readme = (ROOT / "README.md").read_text()
    production = readme[readme.index("## Production"):]
    for name, command in COMMANDS.items():
        assert command in production
        assert name.removesuffix(".service") in production
    assert "deploy/systemd/" in production
    assert set(COMMANDS) == {p.name for p in UNITS.glob("*.service")}
