"""A retention purge SIGKILLed in the middle of a batch, then run again (issue 20,
"Tests": "a purge SIGKILLed mid-batch resumes to the same result"): ``manage.py
purge_expired`` runs as a real process on the test database (SQLite's file, or
PostgreSQL's ``test_`` database), stops at the N-th run it deletes (``held_purge``:
inside that run's open transaction, or just after its commit), and the test SIGKILLs it
there. Its cleanup lease stays behind, held by a dead process: the next purge waits for
it to expire (aged here), takes it over and ends where a purge run in one go ends: every
eligible run deleted once, one tombstone and one ``run.purge`` event each, the audit
chain intact, the state counters right."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter

import pytest
from django.core.management import call_command

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint, Run, Tombstone
from checkpoints.services import retention
from tests.helpers import age_world
from tests.lifecycle.retention_world import DAY, completed_run, set_policy
from tests.services.test_state_counts import assert_counts

from .conftest import ROOT
from .held_purge import HELD
from .test_migration_death import database_env

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 10
BATCH = 4  # the kill lands in the second batch, with a third still to read
KILL_AT = 6


def killed_at(hold: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.crash.held_purge", "--hold-at", str(KILL_AT),
         "--hold", hold, "--", "purge_expired", "--batch-size", str(BATCH)],
        cwd=ROOT, env=database_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
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


def purged_once(tenant, runs) -> None:
    assert Counter(Tombstone.objects.filter(tenant=tenant).values_list("run_uuid", flat=True)) \
        == Counter({r.uuid: 1 for r in runs})
    assert Counter(AuditEvent.objects.filter(tenant=tenant, action="run.purge")
                   .values_list("target_ref", flat=True)) == Counter({str(r.uuid): 1 for r in runs})
    assert not Checkpoint.objects.filter(tenant=tenant).exists()
    assert Run.objects.filter(tenant=tenant, payloads_deleted_at__isnull=True).count() == 0
    ok, *problem = services.audit_verify(tenant=tenant)
    assert ok, problem


@pytest.mark.parametrize("hold", ["before_commit", "after_commit"])
def test_a_purge_killed_mid_batch_resumes_to_the_result_of_one_clean_purge(
        acme, globex, wendy, wes, hold):
    killed = [completed_run(wendy, acme, order_id=f"K-{i}", effect=i % 2 == 0)
              for i in range(RUNS)]
    clean = [completed_run(wes, globex, order_id=f"C-{i}", effect=i % 2 == 0)
             for i in range(RUNS)]
    set_policy(acme, payload_retention_days=1)
    age_world(2 * DAY)

    held = killed_at(hold)
    committed = KILL_AT - (hold == "before_commit")
    assert Tombstone.objects.filter(tenant=acme).count() == committed
    assert Run.objects.get(uuid=held).payloads_deleted_at is not None \
        or hold == "before_commit"
    assert services.retention_purge(tenant=acme)["lease"] == "held"  # the dead one's lease

    age_world(retention.LEASE_TTL_S + 1)
    call_command("purge_expired", "--batch-size", str(BATCH))
    purged_once(acme, killed)
    set_policy(globex, payload_retention_days=1)  # the twin, purged in one go
    call_command("purge_expired", "--tenant", "globex")
    purged_once(globex, clean)
    assert_counts(acme, globex)
