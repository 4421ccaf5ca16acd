"""The read replica's router and the PgBouncer settings, in one process (issue 22, item 4;
the deployment itself: test_two_nodes.py).

- ``RECOVERY_REPLICA_URL`` and ``?pgbouncer=1``/``RECOVERY_PGBOUNCER`` as settings read
  them (a fresh interpreter each): the replica alias, the router, prepared statements and
  server-side cursors off; a replica without a PostgreSQL primary is refused.
- ``replica.read_alias``: the replica only inside a ``replica_reads`` block, never inside
  a transaction, never when none is configured; writes and migrations are the primary's.
- ``locks.try_session_lock`` behind PgBouncer: a transaction lock on a connection of its
  own, exclusive while the block runs, free once it ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction

from checkpoints import locks, replica
from checkpoints.jobs import inprocess

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import json, django; django.setup(); from django.conf import settings as s; "
         "print(json.dumps({'aliases': sorted(s.DATABASES), 'routers': s.DATABASE_ROUTERS, "
         "'bouncer': s.RECOVERY_PGBOUNCER, 'options': s.DATABASES['default'].get('OPTIONS'), "
         "'cursors': s.DATABASES['default'].get('DISABLE_SERVER_SIDE_CURSORS', False), "
         "'replica': s.DATABASES.get('replica', {}).get('NAME'), "
         "'replica_port': s.DATABASES.get('replica', {}).get('PORT')}))")


def settings_with(tmp_path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DATABASE_URL", "RECOVERY_REPLICA_URL", "RECOVERY_PGBOUNCER")}
    clean.update(DJANGO_SETTINGS_MODULE="recovery.settings", RECOVERY_VAR_DIR=str(tmp_path),
                 **env)
    return subprocess.run([sys.executable, "-W", "ignore", "-c", PROBE], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)


def test_the_settings_read_the_replica_and_pgbouncer(tmp_path):
    done = settings_with(tmp_path, DATABASE_URL="postgres://u@127.0.0.1:6432/app?pgbouncer=1",
                         RECOVERY_REPLICA_URL="postgres://u@127.0.0.1:5433/app")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "aliases": ["default", "replica"], "routers": ["checkpoints.replica.ReplicaRouter"],
        "bouncer": True, "options": {"prepare_threshold": None}, "cursors": True,
        "replica": "app", "replica_port": 5433}

    done = settings_with(tmp_path, DATABASE_URL="postgres://u@127.0.0.1:5432/app")
    assert done.returncode == 0, done.stderr
    # Straight to PostgreSQL the store's own statements are prepared (issue 22, item 2).
    assert json.loads(done.stdout) == {"aliases": ["default"], "routers": [],
                                       "bouncer": False, "options": {"prepare_threshold": 5},
                                       "cursors": False, "replica": None,
                                       "replica_port": None}

    done = settings_with(tmp_path, RECOVERY_REPLICA_URL="postgres://u@127.0.0.1:5433/app")
    assert done.returncode != 0
    assert "RECOVERY_REPLICA_URL needs DATABASE_URL" in done.stderr

    # Any boolean word, any case, is read and never reaches psycopg (an attack's finding:
    # ?pgbouncer=0 made every connection fail); anything else stops the process.
    for word, on in (("0", False), ("TRUE", True), ("yes", True), ("off", False)):
        done = settings_with(tmp_path, DATABASE_URL=f"postgres://u@h:5432/app?pgbouncer={word}",
                             RECOVERY_REPLICA_URL=f"postgres://u@h:5433/app?pgbouncer={word}")
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["bouncer"] is on and "pgbouncer" not in seen["options"], word
    done = settings_with(tmp_path, DATABASE_URL="postgres://u@h:5432/app?pgbouncer=maybe")
    assert done.returncode != 0
    assert "DATABASE_URL: pgbouncer must be 0 or 1, not 'maybe'" in done.stderr


@pytest.mark.django_db(transaction=True)  # outside the test's own transaction
def test_reads_go_to_the_replica_only_inside_the_block_and_outside_a_transaction(monkeypatch):
    router = replica.ReplicaRouter()
    # None configured (the suite): the block changes nothing.
    with replica.replica_reads():
        assert replica.read_alias() == "default"
    monkeypatch.setattr(replica, "configured", lambda: True)
    monkeypatch.setattr(replica, "_down_until", [0.0])
    assert replica.read_alias() == router.db_for_read(None) == "default"
    token = replica._reading.set(True)  # what replica_reads sets, without connecting
    try:
        assert replica.read_alias() == router.db_for_read(None) == "replica"
        assert router.db_for_write(None) == "default"
        with transaction.atomic():  # a service, a lock, an action's answer: the primary
            assert replica.read_alias() == "default"
        assert replica.read_alias() == "replica"
        replica._down_until[0] = float("inf")  # it did not answer lately
        assert replica.read_alias() == "default"
    finally:
        replica._reading.reset(token)
    assert replica.read_alias() == "default"
    assert router.allow_migrate("default", "checkpoints")
    assert not router.allow_migrate("replica", "checkpoints")


@pytest.mark.django_db(transaction=True)
def test_a_replica_that_fails_the_readyz_check_is_not_read(monkeypatch, caplog):
    """The rule ``/readyz`` judges the replica by (answers, streams, lags at most
    ``RECOVERY_REPLICA_MAX_LAG_S``) is the rule the reads follow: a lagging or broken
    replica is left alone for ``DOWN_S`` seconds and the block reads from the primary
    (before, only a replica that did not answer was, and the inbox showed a replica
    minutes behind as current). A good check holds for ``DOWN_S`` seconds."""
    monkeypatch.setattr(replica, "configured", lambda: True)
    monkeypatch.setattr(replica, "_down_until", [0.0])
    monkeypatch.setattr(replica, "_good_until", [0.0])
    clock = [1000.0]
    monkeypatch.setattr(replica.time, "monotonic", lambda: clock[0])
    verdicts = []

    def check():
        verdict = verdicts.pop(0)
        if verdict is not None:
            raise verdict
    monkeypatch.setattr(replica, "replica_check", check)

    verdicts.append(replica.ReplicaLagging("lag 95.0 s > 30 s"))
    with replica.replica_reads():
        assert replica.read_alias() == "default"
    assert "ReplicaLagging: lag 95.0 s > 30 s" in caplog.text
    clock[0] += replica.DOWN_S - 1
    with replica.replica_reads():  # still left alone: not checked again
        assert replica.read_alias() == "default"
    clock[0] += 1
    verdicts.append(replica.ReplicaBroken("the replica is not streaming from the primary"))
    with replica.replica_reads():
        assert replica.read_alias() == "default"
    clock[0] += replica.DOWN_S
    verdicts.append(None)  # healthy again
    with replica.replica_reads():
        assert replica.read_alias() == "replica"
    clock[0] += replica.DOWN_S - 1
    with replica.replica_reads():  # the good check holds: not checked again
        assert replica.read_alias() == "replica"
    assert verdicts == []


@pytest.mark.postgres
@pytest.mark.django_db
def test_behind_pgbouncer_the_one_at_a_time_lock_is_a_transaction_lock_of_its_own(settings):
    settings.RECOVERY_PGBOUNCER = True
    key = inprocess.CATCH_UP_LOCK
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        def free() -> bool:
            got = other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]
            if got:
                other.execute("SELECT pg_advisory_unlock(%s)", [key])
            return got

        with locks.try_session_lock(key) as mine:
            assert mine
            assert not free()  # held, on a connection other than the request's
            with locks.try_session_lock(key) as again:
                assert not again
            # The request's own connection holds no session lock PgBouncer could strand.
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                               "AND pid = pg_backend_pid()")
                assert cursor.fetchone()[0] == 0
        assert free()
