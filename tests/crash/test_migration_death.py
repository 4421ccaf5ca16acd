"""A migration SIGKILLed in the middle of a batch, then run again (issue 19, "Tests";
docs/migrations.md "Resumable"): ``manage.py migrate_checkpoints`` runs as a real
process on the test database (SQLite's file, or PostgreSQL's ``test_`` database), stops
at the N-th checkpoint it writes (``held_migration``: inside that checkpoint's open
transaction, or just after its commit), and the test SIGKILLs it there: no handler, no
rollback of its own, the database alone decides what survived. Run again to the end, the
killed tenant must be in the state of a tenant migrated in one go: every checkpoint
migrated once (one ``checkpoint.migrate`` event and one new revision each, keyed on the
checkpoint and the revision it replaced), the audit chain intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from django.db import connection

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision
from tests.helpers import age_world
from tests.services.test_migrations import order

from .conftest import ROOT
from .held_migration import HELD

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 10  # per tenant
BATCH = 4  # so the kill lands in the second batch, with a third one still to read
KILL_AT = 6


def database_env() -> dict:
    """The environment that points a child process at this test's database."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",
                                                             "RECOVERY_SQLITE_PATH")}
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
        env["DATABASE_URL"] = (f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:"
                               f"{s['PORT'] or 5432}/{s['NAME']}")
    else:
        assert os.path.isfile(s["NAME"]), "the SQLite test database must be a file"
        env["RECOVERY_SQLITE_PATH"] = s["NAME"]
    return env


def migrate_argv(*extra) -> list[str]:
    return ["migrate_checkpoints", "acme.order", "--to", "2", "--batch-size", str(BATCH),
            *extra]


def killed_at(hold: str, *extra) -> str:
    """Start the command, wait for it to hold at the ``KILL_AT``-th checkpoint, SIGKILL
    it; returns the id of the checkpoint it held at."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.crash.held_migration", "--hold-at", str(KILL_AT),
         "--hold", hold, "--", *migrate_argv(*extra)],
        cwd=ROOT, env=database_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the command prints nothing before its report
        assert line.startswith(f"{HELD} {KILL_AT} "), (line, proc.stderr.read())
        proc.kill()  # SIGKILL
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
    return line.split()[2]


def migrated_once(tenant) -> None:
    events = Counter(AuditEvent.objects.filter(tenant=tenant, action="checkpoint.migrate")
                     .values_list("target_ref", "before__revision"))
    checkpoints = Checkpoint.objects.filter(tenant=tenant)
    assert events == Counter({(str(cp.uuid), cp.revision - 1): 1 for cp in checkpoints})
    for cp in checkpoints:
        assert cp.schema_version == 2
        assert list(CheckpointRevision.objects.filter(checkpoint=cp, schema_version=2)
                    .values_list("revision", flat=True)) == [cp.revision]
    ok, *problem = services.audit_verify(tenant=tenant)
    assert ok, problem


def final(tenant) -> list[tuple]:
    return [(services.checkpoint_envelope(cp)["payload"], cp.revision, cp.schema_version,
             cp.run.fencing_token, cp.run.recovery_state, cp.run.phase_class)
            for cp in Checkpoint.objects.filter(tenant=tenant).select_related("run")
            .order_by("id")]


@pytest.mark.parametrize("hold", ["before_commit", "after_commit"])
def test_a_migration_killed_mid_batch_resumes_to_the_state_of_one_clean_run(
        acme, globex, wendy, wes, hold):
    """acme's migration is killed at its sixth checkpoint (second batch of four) and run
    again; globex, with the same checkpoints, is migrated in one go by that second run."""
    for writer, tenant in ((wendy, acme), (wes, globex)):
        for i in range(RUNS):
            order(writer, tenant, ["ready", "charged", "completed"][i % 3],
                  revisions=1 + i % 2, order_id=f"A-{i}")
    age_world(3600)
    held = killed_at(hold, "--tenant", "acme")

    committed = KILL_AT - (hold == "before_commit")
    v2 = set(Checkpoint.objects.filter(tenant=acme, schema_version=2)
             .values_list("uuid", flat=True))
    assert len(v2) == committed
    assert (Checkpoint.objects.get(uuid=held).schema_version == 2) == (hold == "after_commit")
    assert AuditEvent.objects.filter(action="checkpoint.migrate").count() == committed
    assert CheckpointRevision.objects.filter(schema_version=2).count() == committed
    assert not Checkpoint.objects.filter(tenant=globex, schema_version=2).exists()

    again = subprocess.run([sys.executable, "manage.py", *migrate_argv()], cwd=ROOT,
                           env=database_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"acme: acme.order to v2: {RUNS - committed} migrated, 0 skipped, 0 refused, " \
        "0 conflict(s)" in again.stdout
    assert f"globex: acme.order to v2: {RUNS} migrated, 0 skipped, 0 refused" in again.stdout

    for tenant in (acme, globex):
        migrated_once(tenant)
    assert final(acme) == final(globex)
