"""Issue 6, fault 4, outside the HTTP API: the kind registry's identity limits are the run
columns', and ``manage.py`` refuses command-line arguments that are not valid text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoints import kinds
from checkpoints.models import Run
from checkpoints.vocab import PhaseClass

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from manage import refuse_bad_arguments  # noqa: E402


def test_it_keeps_the_registry_identity_limits_equal_to_the_run_columns():
    for name, limit in kinds.IDENTITY_LIMITS.items():
        assert Run._meta.get_field(name).max_length == limit, name


@pytest.mark.parametrize("payload,part", [
    ({"phase": "ready", "definition_version": "v" * 65}, "definition_version"),
    ({"phase": "ready", "workflow": "w" * 257}, "workflow"),
])
def test_it_classifies_an_overlong_identity_as_unsupported_without_its_value(payload, part):
    cls = kinds.classify("acme.order", 1, payload)
    assert not cls.supported
    assert f"identity {part} is longer than" in cls.error
    assert "vvv" not in cls.error and "www" not in cls.error


def test_it_refuses_identity_parts_that_are_not_text():
    spec = kinds.VersionSpec(lambda p: None, lambda p: kinds.Phase(PhaseClass.STABLE, "ok"),
                             lambda p: kinds.Identity(agent=p["agent"]))
    kinds.register("test.identity", 1, spec)
    try:
        assert kinds.classify("test.identity", 1, {"agent": "ok"}).supported
        for bad in ("a\x00", "a\ud800", 7):
            cls = kinds.classify("test.identity", 1, {"agent": bad})
            assert not cls.supported and "identity agent" in cls.error
    finally:
        kinds._REGISTRY.pop("test.identity")


def test_it_names_the_first_argument_that_is_not_utf8():
    assert refuse_bad_arguments(["manage.py", "create_tenant", "acme"]) == ""
    assert refuse_bad_arguments(["manage.py", "create_tenant", "acmé"]) == ""
    problem = refuse_bad_arguments(["manage.py", "grant", "rita\udcff", "viewer", "acme"])
    assert problem == "argument 2 (rita\\udcff): not valid UTF-8 text"


@pytest.mark.parametrize("argv", [
    [b"create_tenant", b"ac\xffme"],
    [b"create_tenant", b"acme", b"--name", b"Acme \xed\xa0\x80"],
    [b"create_account", b"\xff"],
    [b"grant", b"rita", b"viewer", b"\xc3"],
    [b"set_reconciler", b"acme", b"pay\xffments", b"none"],
])
def test_it_refuses_non_utf8_arguments_before_django_starts(tmp_path, argv):
    """A real process, as an operator runs it; the state directory stays untouched
    (settings would create it), so nothing was stored anywhere."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["RECOVERY_VAR_DIR"] = str(tmp_path / "var")
    done = subprocess.run([sys.executable, b"manage.py", *argv], cwd=ROOT, env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert b"not valid UTF-8 text" in done.stderr
    assert b"Traceback" not in done.stderr
    assert not (tmp_path / "var").exists()
