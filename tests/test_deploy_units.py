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


def _environment(name: str) -> dict[str, str]:
    """Every ``Environment=`` of a unit (configparser keeps only the last of a key)."""
    found = {}
    for line in (UNITS / name).read_text().splitlines():
        if line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            found[key] = value
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_unit_gives_the_service_a_writable_var_dir(name):
    """(the operator's walk, item 4) ``User=recovery`` in /opt/recovery without
    ``RECOVERY_VAR_DIR``: the login-slot folder was var/login-slots in the checkout, not
    the user's, and every login answered 500. Each unit sets it to the folder systemd
    makes for the user (``StateDirectory=recovery`` is /var/lib/recovery), and beat keeps
    its schedule there, not in the checkout; the header and the README say so."""
    unit = _unit(name)
    assert _environment(name)["RECOVERY_VAR_DIR"] == "/var/lib/recovery"
    assert unit["Service"]["StateDirectory"] == "recovery"
    assert unit["Service"]["User"] == "recovery"
    assert "RECOVERY_VAR_DIR" in (UNITS / name).read_text().split("[Unit]")[0]
    if name == "recovery-beat.service":
        assert "--schedule /var/lib/recovery/" in unit["Service"]["ExecStart"]
    production = (ROOT / "README.md").read_text().split("## Production")[1]
    assert "RECOVERY_VAR_DIR=/var/lib/recovery" in production
