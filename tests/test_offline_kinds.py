"""``RECOVERY_OFFLINE_KINDS`` (issue 19, item 2; docs/migrations.md, "Lazy and offline
kinds"): the kinds named there migrate offline from start-up on (``apps.set_offline_kinds``,
after the kind modules load), so a resume of a run whose latest checkpoint is an older
version answers ``reject`` / ``migration_required``, with the command that migrates it; a
name that is not a registered kind stops start-up naming it. Every test that changes a
kind's mode restores the registry (the ``kind_registry`` fixture)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from checkpoints import kinds, services
from checkpoints.apps import set_offline_kinds
from recovery.settings import _offline_kinds
from tests.api.apihelpers import get, new_checkpoint, post
from tests.helpers import age_world, envelope, put_checkpoint
from tests.twinworld import declared_kind

ROOT = Path(__file__).resolve().parent.parent
GOOD = "tests.kindmodules.good"  # registers testmod.ticket v1 and v2


def test_the_setting_reads_kind_names_comma_separated():
    assert _offline_kinds("") == []
    assert _offline_kinds(" acme.order , ,runifold.workflow,acme.order ") == [
        "acme.order", "runifold.workflow"]


def test_ready_makes_the_named_kinds_offline_after_loading_the_kind_modules(kind_registry,
                                                                            settings):
    settings.RECOVERY_KIND_MODULES = [GOOD]
    settings.RECOVERY_OFFLINE_KINDS = ["acme.order", "testmod.ticket"]
    assert not kinds.migration_required("acme.order", 1)

    apps.get_app_config("checkpoints").ready()

    assert kinds.migration_required("acme.order", 1)
    assert not kinds.migration_required("acme.order", 2)  # the newest
    assert kinds.migration_required("testmod.ticket", 1)  # a kind module's kind
    assert not kinds.migration_required("runifold.workflow", 3)  # not named: lazy


@pytest.mark.parametrize("name", ["nope.kind", "acme", "testmod.ticket"])
def test_a_kind_that_is_not_registered_stops_start_up_naming_it(kind_registry, name):
    """``testmod.ticket``: its module is not loaded here. Nothing is changed, not even the
    kinds named before it."""
    with pytest.raises(ImproperlyConfigured) as refused:
        set_offline_kinds(["acme.order", name])
    message = str(refused.value)
    assert message.startswith(f"RECOVERY_OFFLINE_KINDS: kind {name!r} is not registered"), message
    # The kinds in code, in order (others loaded by earlier tests may sit between them).
    listed = message.split("registered: ", 1)[1].split(", ")
    assert [k for k in listed if k in kinds.BUILTIN_KINDS] == sorted(kinds.BUILTIN_KINDS)
    assert not kinds.migration_required("acme.order", 1)


@pytest.mark.django_db
def test_a_tenants_declared_kind_cannot_be_offline(kind_registry, acme, adam):
    services.kind_declare(actor=adam, tenant=acme, kind="acme.ticket", version=1,
                          body=declared_kind("tickets"))
    with pytest.raises(ImproperlyConfigured, match="kind 'acme.ticket' is not registered"):
        set_offline_kinds(["acme.ticket"])


# --- at start, in a process of its own (settings are read once) ---------------------------

def _manage(tmp_path, offline: str, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RECOVERY_OFFLINE_KINDS=offline, RECOVERY_VAR_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")]))
    env.pop("RECOVERY_KIND_MODULES", None)
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *argv], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_process_applies_the_setting_at_start(tmp_path):
    done = _manage(tmp_path, "acme.order", "shell", "-c",
                   "from checkpoints import kinds; "
                   "print(kinds.migration_required('acme.order', 1), "
                   "kinds.migration_required('runifold.workflow', 3))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].split() == ["True", "False"]


def test_a_bad_kind_stops_manage_py_check_naming_it(tmp_path):
    done = _manage(tmp_path, "acme.order,acme.ordr", "check")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: "
                           "RECOVERY_OFFLINE_KINDS: kind 'acme.ordr' is not registered"), \
        done.stderr


# --- the resume answer names the command ---------------------------------------------------

@pytest.fixture
def acme_offline(kind_registry):
    set_offline_kinds(["acme.order"])


def _v1_order(acme, wendy, phase="charged") -> str:
    body = envelope(schema_version=1, payload={"phase": phase, "amount_cents": 2599})
    put_checkpoint(wendy, acme, body)
    return body["run_id"]


@pytest.mark.django_db
def test_the_resume_answer_names_the_command_that_migrates_the_run(acme, wendy, acme_offline):
    run_id = _v1_order(acme, wendy)
    preview = services.resume_preview(actor=wendy, tenant=acme, run_id=uuid.UUID(run_id),
                                      asked={})
    claim = services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(run_id),
                                  asked={})

    command = (f"python manage.py migrate_checkpoints acme.order --to 2 --tenant acme "
               f"--run {run_id}")
    for answer in (preview, claim):
        assert (answer["action"], answer["reason"]) == ("reject", "migration_required")
        assert answer["detail"].startswith("acme.order v1 must be migrated to v2 before this "
                                           "run is resumed")
        assert command in answer["detail"]
        assert "Migrate to v2 on the tenant's Kinds page" in answer["detail"]
        assert "2599" not in answer["detail"]  # never a payload value


@pytest.mark.django_db
def test_only_a_migration_required_answer_has_a_detail(acme, wendy, acme_offline):
    body = envelope(schema_version=2, payload={"phase": "charged",
                                               "amount": {"cents": 1, "currency": "USD"}})
    put_checkpoint(wendy, acme, body)
    answer = services.resume_claim(actor=wendy, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                                   asked={})
    assert (answer["action"], answer["reason"]) == ("continue", "stable")
    assert "detail" not in answer


@pytest.mark.django_db
def test_the_api_answers_it_in_the_documented_shape(api_as, wendy, acme, acme_offline):
    """The OpenAPI check (tests/openapi_check.py) holds each answer to the served schema."""
    w = api_as(wendy)
    run_id = new_checkpoint(w, "acme", payload={"phase": "charging", "amount_cents": 5},
                            schema_version=1)["run_id"]
    age_world(3600)
    preview = get(w, "acme", f"runs/{run_id}/resume")
    claim = post(w, "acme", f"runs/{run_id}/resume", {"workflow": "acme.order"})

    for r in (preview, claim):
        assert r.status_code == 200, r.content
        answer = r.json()
        assert (answer["action"], answer["reason"]) == ("reject", "migration_required")
        assert f"--tenant acme --run {run_id}" in answer["detail"]
