"""``manage.py migrate_checkpoints`` (issue 19, item 2; docs/migrations.md): the operator's
command over ``services.checkpoints_migrate``. Its output (refusals, examples, counts per
tenant) and exit status: 0 when nothing was left behind, 3 when some checkpoints were
refused or lost to a conflict, 1 for a bad kind, version, tenant or run id, before
anything is done."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint
from tests.helpers import age_world
from tests.matrixhelpers import db_diff, db_state
from tests.services.test_migrations import order

ROOT = Path(__file__).resolve().parent.parent


def run(*args) -> str:
    out = io.StringIO()
    call_command("migrate_checkpoints", *args, stdout=out)
    return out.getvalue()


def left_behind(*args) -> tuple[str, CommandError]:
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("migrate_checkpoints", *args, stdout=out)
    return out.getvalue(), failed.value


def test_it_migrates_every_tenant_and_prints_the_counts(acme, globex, wendy, wes):
    order(wendy, acme)
    order(wes, globex)
    order(wes, globex, "completed")
    age_world(3600)
    out = run("acme.order", "--to", "2")
    counts = [line for line in out.splitlines() if ": acme.order to v2: " in line]
    assert counts[0].startswith("acme: acme.order to v2: 1 migrated, 0 skipped, 0 refused, "
                                "0 conflict(s) (batch ")
    assert counts[1].startswith("globex: acme.order to v2: 2 migrated, 0 skipped")
    assert "globex: v1 -> v2, 2 checkpoint(s): added amount; removed amount_cents (e.g. " \
        "checkpoint " in out
    assert "2599" not in out and "A-1042" not in out  # key paths, never payload values
    assert Checkpoint.objects.filter(schema_version=2).count() == 3
    assert "0 migrated" in run("acme.order", "--to", "2", "--tenant", "acme")


def test_a_dry_run_writes_nothing_and_lists_what_would_be_refused(acme, wendy):
    order(wendy, acme)
    live = order(wendy, acme)
    age_world(3600)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(live["run_id"]),
                           owner="w1", ttl_s=600)
    before = db_state()
    out, failed = left_behind("acme.order", "--to", "2", "--tenant", "acme", "--dry-run")
    assert db_diff(before, db_state()) == {}
    assert failed.returncode == 3 and "1 checkpoint(s) would be left behind" in str(failed)
    assert f"acme: refused owner_live: checkpoint {live['id']} (run {live['run_id']}, v1): " \
        "its owner w1 is live until" in out
    assert "(dry run): 1 would be migrated, 0 skipped, 1 would be refused" in out


def test_refusals_exit_3_after_migrating_the_rest(acme, wendy):
    done, live = order(wendy, acme), order(wendy, acme)  # live: wrote just now
    age_world(3600)
    again = order(wendy, acme)
    out, failed = left_behind("acme.order", "--to", "2", "--batch-size", "1")
    assert failed.returncode == 3
    assert f"refused owner_live: checkpoint {again['id']}" in out
    assert {str(c) for c in Checkpoint.objects.filter(schema_version=2)
            .values_list("uuid", flat=True)} == {done["id"], live["id"]}
    assert AuditEvent.objects.filter(action="checkpoint.migrate").count() == 2


def test_it_migrates_only_the_runs_named_and_back_with_reverse(acme, wendy):
    one, other = order(wendy, acme), order(wendy, acme)
    age_world(3600)
    run("acme.order", "--to", "2", "--run", one["run_id"])
    assert Checkpoint.objects.get(uuid=other["id"]).schema_version == 1
    age_world(3600)
    _, failed = left_behind("acme.order", "--to", "1", "--run", one["run_id"], other["run_id"])
    assert failed.returncode == 3  # down needs --reverse: refused, no_path
    out = run("acme.order", "--to", "1", "--reverse", "--run", one["run_id"])
    assert "1 migrated" in out
    assert Checkpoint.objects.get(uuid=one["id"]).schema_version == 1


@pytest.mark.parametrize(("args", "message"), [
    (["acme.invoice", "--to", "1"], "kind: 'acme.invoice' is not registered"),
    (["acme.order", "--to", "7"], "--to: acme.order has no version 7 (versions: 1, 2)"),
    (["acme.order", "--to", "2", "--tenant", "nope"], "tenant: no tenant 'nope'"),
    # The API's reading of a version (intranges.SCHEMA_VERSION.parse), not int()'s.
    (["acme.order", "--to", "02"], "--to: must be an integer in 0..4294967295"),
    (["acme.order", "--to", "\u0662"], "--to: must be an integer in 0..4294967295"),
    (["acme.order", "--to", "2", "--run", "x"], "--run: 'x' is not a run id"),
    (["acme.order", "--to", "2", "--batch-size", "0"], "--batch-size: must be in 1..10000"),
])
def test_it_refuses_bad_arguments_before_doing_anything(acme, wendy, args, message):
    order(wendy, acme)
    age_world(3600)
    before = db_state()
    with pytest.raises(CommandError, match=re.escape(message)) as failed:
        run(*args)
    assert failed.value.returncode == 1
    assert db_diff(before, db_state()) == {}


# Its own SQLite file in a child process whichever pass runs it: make test runs it once.
@pytest.mark.once
def test_the_real_command_line_exits_1_with_a_message(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RECOVERY_VAR_DIR": str(tmp_path),
           "RECOVERY_SQLITE_PATH": str(tmp_path / "cli.sqlite3")}
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True, capture_output=True)
    done = subprocess.run([*manage, "migrate_checkpoints", "acme.order", "--to", "9"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "CommandError: --to: acme.order has no version 9" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([*manage, "migrate_checkpoints", "acme.order", "--to", "2"],
                          env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "")  # no tenant, nothing to do


def test_a_declared_kind_some_tenant_lacks_the_version_of_is_refused_before_anything(
        acme, globex, wendy, api_as):
    """Attack finding (the command's checks vs the service's): without ``--tenant``, the
    command checked ``--to`` against the versions of every tenant that declared the kind
    together, then migrated tenant by tenant; a tenant without that version stopped it
    with exit 1 after the tenants before it had been migrated. Each tenant is now checked
    by the service's own rule (``migration_target_check``) before anything is done."""
    from tests.api.apihelpers import new_checkpoint
    from tests.api.test_declared_kinds import KIND, V1, V2

    for tenant in (acme, globex):
        services.kind_declare(actor=None, tenant=tenant, kind=KIND, version=1, body=V1)
    services.kind_declare(actor=None, tenant=acme, kind=KIND, version=2, body=V2)
    new_checkpoint(api_as(wendy), "acme", kind=KIND,
                   payload={"state": "ready", "refund_id": "rf_1"})
    age_world(3600)
    before = db_state()
    with pytest.raises(CommandError, match=re.escape(
            f"--to: globex's {KIND} has no version 2 (versions: 1)")) as failed:
        run(KIND, "--to", "2")
    assert failed.value.returncode == 1
    assert db_diff(before, db_state()) == {}
    assert "1 migrated" in run(KIND, "--to", "2", "--tenant", "acme")
