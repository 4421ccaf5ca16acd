"""Kinds from the user's own modules (issue 19): ``RECOVERY_KIND_MODULES`` names modules
imported once at start (``apps.ready``), each registering kinds with
``checkpoints.kinds.register``. A working module classifies its payloads (its runs are
not ``schema_mismatch``); a module that cannot be imported, whose registration raises, or
that touches a built-in kind stops start-up (``manage.py check`` included) with a message
naming the module and the cause. The worked example of docs/kinds.md
(``examples/kinds/acme_refunds.py``) refusing what it must. Every test that registers
restores the registry (the ``kind_registry`` fixture)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from checkpoints import kinds
from checkpoints.apps import load_kind_modules
from checkpoints.models import Run
from recovery.settings import _kind_modules
from tests.helpers import envelope, put_checkpoint
from tests.kind_fixtures import payload as fixture_payload

ROOT = Path(__file__).resolve().parent.parent
GOOD = "tests.kindmodules.good"
EXAMPLE = "examples.kinds.acme_refunds"
BUILTIN = {"runifold.agent", "runifold.workflow", "acme.order", "langgraph.checkpoint"}


# --- loading ------------------------------------------------------------------------------

def test_a_kind_module_registers_its_kinds_and_they_classify(kind_registry):
    assert kinds.classify("testmod.ticket", 1, {"queue": "q", "state": "open"}).error
    load_kind_modules([GOOD])
    assert kinds.registered()["testmod.ticket"] == [1, 2]
    v1 = kinds.classify("testmod.ticket", 1, {"queue": "billing", "state": "working"})
    assert (v1.phase.phase_class, v1.phase.label) == ("in_flight", "ticket working")
    assert v1.identity == kinds.Identity(workflow="tickets/billing")
    assert kinds.classify("testmod.ticket", 2, {"queue": "q", "phase": "done"}) \
        .phase.phase_class == "completed"
    refused = kinds.classify("testmod.ticket", 2, {"queue": "q", "state": "done"})
    assert not refused.supported and "payload.phase must be one of" in refused.error
    assert "supported: 1, 2" in kinds.classify("testmod.ticket", 3, {}).error


def test_ready_loads_the_modules_the_setting_names(kind_registry, settings):
    settings.RECOVERY_KIND_MODULES = [GOOD, EXAMPLE]
    apps.get_app_config("checkpoints").ready()
    assert {"testmod.ticket", "acme.refund"} <= set(kinds.registered())


def test_a_module_is_imported_once(kind_registry):
    load_kind_modules([GOOD])
    first = kinds._REGISTRY["testmod.ticket"].versions[1]
    load_kind_modules([GOOD])
    assert kinds._REGISTRY["testmod.ticket"].versions[1] is first


@pytest.mark.django_db
def test_the_runs_of_a_loaded_kind_are_not_schema_mismatch(kind_registry, acme, wendy):
    def write(payload: dict) -> Run:
        body = envelope(kind="testmod.ticket", schema_version=1, payload=payload)
        put_checkpoint(wendy, acme, body)
        return Run.objects.get(tenant=acme, uuid=body["run_id"])

    before = write({"queue": "billing", "state": "open"})  # not registered yet
    assert before.recovery_state == "schema_mismatch"
    load_kind_modules([GOOD])
    run = write({"queue": "billing", "state": "open"})
    assert (run.recovery_state, run.phase_class, run.phase_label) == ("healthy", "stable",
                                                                      "ticket open")
    assert run.workflow == "tickets/billing"
    done = write({"queue": "billing", "state": "done"})
    assert (done.recovery_state, done.phase_class) == ("completed", "completed")


@pytest.mark.parametrize(("module", "words"), [
    ("tests.kindmodules.no_such_module",
     "ModuleNotFoundError: No module named 'tests.kindmodules.no_such_module'"),
    ("tests.kindmodules.missing_dependency",
     "ModuleNotFoundError: No module named 'recovery_tests_no_such_package'"),
    ("tests.kindmodules.bad_version",
     "ValueError: testmod.badversion: schema version must be an integer in 0..4294967295"),
    ("tests.kindmodules.replaces_builtin",
     "BuiltinKindError: kind 'acme.order' is built in: a kind module may not replace it"),
])
def test_a_module_that_fails_stops_start_up_naming_module_and_cause(kind_registry, module,
                                                                     words):
    with pytest.raises(ImproperlyConfigured) as caught:
        load_kind_modules([GOOD, module])
    message = str(caught.value)
    assert message.startswith(f"RECOVERY_KIND_MODULES: kind module {module!r} could not be "
                              "loaded: "), message
    assert words in message


def test_a_module_cannot_replace_a_built_in_kind(kind_registry):
    versions = dict(kinds._REGISTRY["acme.order"].versions)
    with pytest.raises(ImproperlyConfigured):
        load_kind_modules(["tests.kindmodules.replaces_builtin"])
    assert kinds._REGISTRY["acme.order"].versions == versions
    assert kinds.classify("acme.order", 1, {"phase": "charging"}).phase.label == "charging"


@pytest.mark.parametrize("kind", sorted(BUILTIN))
def test_register_refuses_every_built_in_kind_at_any_version(kind_registry, kind):
    assert kinds.BUILTIN_KINDS == BUILTIN
    spec = kinds.VersionSpec(lambda p: None, lambda p: kinds.Phase("stable", ""),
                             lambda p: kinds.Identity())
    before = kinds.registered()
    for version in (1, 99):
        with pytest.raises(kinds.BuiltinKindError, match=f"kind '{kind}' is built in"):
            kinds.register(kind, version, spec)
    assert kinds.registered() == before


@pytest.mark.parametrize(("version", "spec"), [
    (-1, None), (2**32, None), (True, None), (1.0, None), ("1", None),
    (1, "not a spec"), (1, kinds.VersionSpec(lambda p: None, "phase", lambda p: None)),
])
def test_register_refuses_a_bad_version_or_spec(kind_registry, version, spec):
    good = kinds.VersionSpec(lambda p: None, lambda p: kinds.Phase("stable", ""),
                             lambda p: kinds.Identity())
    with pytest.raises(ValueError, match="testmod.bad"):
        kinds.register("testmod.bad", version, good if spec is None else spec)
    assert "testmod.bad" not in kinds.registered()


def test_the_setting_reads_dotted_names_comma_separated():
    assert _kind_modules("") == []
    assert _kind_modules(" a.b , c,, a.b ") == ["a.b", "c"]
    for bad in ("examples/kinds/acme_refunds.py", "a..b", "1abc", "a.b-c"):
        with pytest.raises(ImproperlyConfigured, match="not a dotted module name"):
            _kind_modules(bad)


# --- manage.py check, in a process of its own (settings are read once, at start) --------

def _check(modules: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, RECOVERY_KIND_MODULES=modules, RECOVERY_VAR_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]))
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_manage_py_check_passes_with_working_modules(tmp_path):
    done = _check(f"{GOOD},{EXAMPLE}", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout


@pytest.mark.parametrize(("module", "cause"), [
    ("tests.kindmodules.missing_dependency",
     "ModuleNotFoundError: No module named 'recovery_tests_no_such_package'"),
    ("tests.kindmodules.replaces_builtin", "BuiltinKindError: kind 'acme.order' is built in"),
])
def test_manage_py_check_fails_naming_the_module_and_the_cause(tmp_path, module, cause):
    done = _check(f"{GOOD},{module}", tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: "
                           f"RECOVERY_KIND_MODULES: kind module {module!r}"), done.stderr
    assert cause in last


# --- the worked example of docs/kinds.md ---------------------------------------------------

@pytest.fixture
def refunds(kind_registry):
    load_kind_modules([EXAMPLE])
    return kind_registry


# Its fixtures, one per phase (tests/fixtures/kinds/acme.refund/v1/), are classified,
# given their resume decision and round-tripped by tests/test_kind_fixtures.py, which
# loads this module (tests/kind_fixtures.py, KIND_MODULES).


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda p: p.update(phase="refunding"), "payload.attempt"),  # no attempt
    (lambda p: p.update(phase="lost"), "payload.phase"),
    (lambda p: p.update(amount_cents=True), "payload.amount_cents"),
    (lambda p: p.update(amount_cents=0), "payload.amount_cents"),
    (lambda p: p.update(refund_id="R" * 65), "payload.refund_id"),
    (lambda p: p.pop("order_id"), "payload.order_id"),
    (lambda p: p.update(definition_version="1"), "payload.definition_version"),
])
def test_the_example_refuses_a_payload_naming_the_field_never_the_value(refunds, mutate,
                                                                         field):
    payload = fixture_payload("acme.refund/v1/requested")
    payload["refund_id"] = "SECRET-REFUND-ID"
    mutate(payload)
    result = kinds.classify("acme.refund", 1, payload)
    assert not result.supported
    assert field in result.error
    assert "SECRET" not in result.error and "SECRET" not in result.phase.label


def test_the_example_refuses_what_is_not_an_object_and_other_versions(refunds):
    assert "payload must be an object" in kinds.classify("acme.refund", 1, ["x"]).error
    assert "supported: 1" in kinds.classify("acme.refund", 2, {}).error


def _buggy(step: str):
    """A spec whose ``step`` function is broken the ways a user's kind can be."""
    def phase(p):
        if step == "phase-raises":
            raise KeyError("missing")
        if step == "phase-wrong":
            return kinds.Phase("weird_and_far_too_long_for_the_column", "x")
        return kinds.Phase("stable", "ok")

    def usage(p):
        return {"tokens": -1} if step == "usage-wrong" else {}

    def validate(p):
        if step == "validate-raises":
            raise ZeroDivisionError

    return kinds.VersionSpec(validate, phase, lambda p: kinds.Identity(), usage)


@pytest.mark.parametrize(("step", "named"), [
    ("validate-raises", "its validate function raised ZeroDivisionError"),
    ("phase-raises", "its phase function raised KeyError"),
    ("phase-wrong", "its phase function raised TypeError"),
    ("usage-wrong", "its usage function raised TypeError"),
])
def test_a_bug_in_a_kind_keeps_the_write_and_names_the_function(kind_registry, acme, wendy,
                                                                 step, named):
    """Never a 500 and never a lost write: the payload is stored, its run is
    schema_mismatch, and the reason names the function and the exception's type only."""
    kind_registry.register("team.buggy", 1, _buggy(step))
    result = kind_registry.classify("team.buggy", 1, {"secret": "s3cr3t"})
    assert result.phase.phase_class == "unsupported"
    assert named in result.error and "missing" not in result.error
    body = envelope(kind="team.buggy", payload={"secret": "s3cr3t"})
    cp = put_checkpoint(wendy, acme, body)
    assert cp.phase_class == "unsupported"
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "schema_mismatch"
