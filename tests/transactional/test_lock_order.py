"""The lock order of ``checkpoints/locks.py``, observed on real PostgreSQL (issue 17,
item 10): every write path waits for the tenant's audit chain head *before* it holds its
run, and no path locks the tenant's row (which every insert's foreign-key check needs).

Each cell: one connection holds the tenant's audit head; the path runs in a thread and
must queue on it; while it queues, a third connection locks the run with ``NOWAIT``
(which fails at once if the path already holds the run) and takes a ``FOR KEY SHARE`` of
the tenant row as an insert's foreign-key check does; then the head is released and the
path completes. A path that took the run first and the head last (what the sweep did, and
the ORM's effect writes against the SQL write path's checkpoint updates) fails here
deterministically, where the load test (``test_lock_order_load.py``) needs luck.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction

from checkpoints import locks, services
from checkpoints.models import Run
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            box["pid"] = connection.cursor().connection.info.backend_pid
            box["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - asserted on by the caller
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _wait_until_blocked(box: dict, timeout_s: float = 20) -> None:
    """Poll ``pg_stat_activity`` until the thread's backend waits for a lock."""
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            pid = box.get("pid")
            if pid is not None:
                cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                               [pid])
                row = cursor.fetchone()
                if row and row[0] == "Lock":
                    return
            if "error" in box or "result" in box:
                raise AssertionError(f"the path did not wait for the audit head: {box}")
            time.sleep(0.02)
    raise AssertionError("the path never queued on the tenant's audit head")


def _probe(run_pk: int, tenant_pk: int) -> dict:
    """From a third connection: lock the run NOWAIT, and key-share the tenant row."""
    out: dict = {}

    def probe() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
                cursor.execute(f"SELECT id FROM {Run._meta.db_table} WHERE id = %s "
                               f"FOR NO KEY UPDATE NOWAIT", [run_pk])
                out["run"] = "free"
                cursor.execute("SELECT id FROM checkpoints_tenant WHERE id = %s "
                               "FOR KEY SHARE", [tenant_pk])
                out["tenant"] = "free"
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(timeout=30)
    return out


def _world(acme, wendy):
    body = envelope(payload={"phase": "charging", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    fx = effect_body(run_id=body["run_id"], operation_key="charge:A-1")
    put_effect(wendy, acme, fx)
    put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0)
    return body, fx


def _paths(acme, wendy, body, fx):
    run_id = uuid.UUID(body["run_id"])
    return {
        "checkpoint update (SQL write path)": lambda: put_checkpoint(
            wendy, acme, dict(body, revision=1, payload={"phase": "charging", "n": 1}),
            expected=0),
        "effect update (ORM)": lambda: put_effect(
            wendy, acme, dict(fx, revision=2, state="confirmed",
                              receipt={"charge_id": "ch_1"}), expected=1),
        "lease": lambda: services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id,
                                                owner="w1", ttl_s=60),
        "sweep": services.sweep_stale_runs,
    }


@pytest.mark.parametrize("path", ["checkpoint update (SQL write path)", "effect update (ORM)",
                                  "lease", "sweep"])
def test_a_write_queues_on_the_audit_head_before_it_holds_its_run(acme, wendy, path,
                                                                  settings):
    settings.RECOVERY_SQL_WRITE_PATH = True
    body, fx = _world(acme, wendy)
    if path == "sweep":
        age_world(3600)  # the run's owner went quiet an hour ago
    run = Run.objects.get()
    write = _paths(acme, wendy, body, fx)[path]

    holder_ready, release = threading.Event(), threading.Event()

    def hold_head() -> None:
        try:
            with transaction.atomic():
                locks.lock_audit_head(acme)
                holder_ready.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_head)
    holder.start()
    assert holder_ready.wait(timeout=20)
    try:
        thread, box = _in_thread(write)
        _wait_until_blocked(box)
        probe = _probe(run.pk, acme.pk)
    finally:
        release.set()
        holder.join(timeout=30)
    thread.join(timeout=30)
    assert probe == {"run": "free", "tenant": "free"}, (path, probe)
    assert "error" not in box, (path, box)
    if path == "sweep":
        assert box["result"]["runs_ambiguous"] == 1
        assert Run.objects.get().recovery_state == "ambiguous"


def test_the_sql_write_path_stamps_a_write_with_the_time_its_locks_were_held(acme, wendy,
                                                                               settings):
    """An attack's finding: the write lock function read the database time when its
    statement began, so a write that waited for a tenant-wide operation was stamped with
    a time from before the wait (a run's last write could go back in time). The time is
    read once both locks are held, so it is after the holder's release."""
    from checkpoints.dbclock import db_now
    from checkpoints.models import CheckpointRevision

    settings.RECOVERY_SQL_WRITE_PATH = True
    body, _fx = _world(acme, wendy)
    released = {}

    def hold_head(holder_ready, release) -> None:
        try:
            with transaction.atomic():
                locks.lock_audit_head(acme)
                holder_ready.set()
                release.wait(timeout=30)
                released["at"] = db_now()  # the database's time just before the commit
        finally:
            connection.close()

    _write_while_held(hold_head, lambda: put_checkpoint(
        wendy, acme, dict(body, revision=1, payload={"phase": "charging", "n": 1}),
        expected=0))
    stamped = CheckpointRevision.objects.get(revision=1).received_at
    assert stamped >= released["at"]
    assert Run.objects.get().last_write_at == stamped


def _write_while_held(hold, write) -> dict:
    """Run ``hold(holder_ready, release)`` in a thread until it holds its lock, then
    ``write`` in another; once ``write`` queues on that lock, release it and wait for
    both. Returns ``write``'s box (``_in_thread``), which holds no error."""
    holder_ready, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=(holder_ready, release))
    holder.start()
    assert holder_ready.wait(timeout=20)
    try:
        thread, box = _in_thread(write)
        _wait_until_blocked(box)
    finally:
        release.set()
        holder.join(timeout=30)
    thread.join(timeout=30)
    assert "error" not in box, box.get("error")
    return box


def _hold_run_and_change_it(run_pk: int, released: dict, holder_ready, release) -> None:
    """Lock the run and change its row, as every committed write of a run does, then
    wait for ``release`` and note the database time just before committing."""
    from checkpoints.dbclock import db_now

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {Run._meta.db_table} WHERE id = %s "
                           f"FOR NO KEY UPDATE", [run_pk])
            cursor.execute(f"UPDATE {Run._meta.db_table} SET updated_at = CLOCK_TIMESTAMP() "
                           f"WHERE id = %s", [run_pk])
            holder_ready.set()
            release.wait(timeout=30)
            released["at"] = db_now()
    finally:
        connection.close()


@pytest.mark.parametrize("path", ["checkpoint update (ORM path)", "lease"])
def test_an_orm_write_that_waited_for_its_run_is_stamped_after_the_wait(acme, wendy, path,
                                                                       settings):
    """The ORM path read the database time with its run lock as ``STATEMENT_TIMESTAMP()``,
    the statement's start, before its wait for the run: a write that waited for another
    write of its run was stamped before the write it waited for (its run's last write
    went back in time; the SQL path reads the time once its locks are held). It is now
    ``dbclock.LOCKED_NOW``, which PostgreSQL computes again once the lock is taken."""
    from checkpoints.models import CheckpointRevision

    settings.RECOVERY_SQL_WRITE_PATH = False
    body, _fx = _world(acme, wendy)
    run = Run.objects.get()
    run_id = uuid.UUID(body["run_id"])
    write = {
        "checkpoint update (ORM path)": lambda: put_checkpoint(
            wendy, acme, dict(body, revision=1, payload={"phase": "charging", "n": 1}),
            expected=0),
        "lease": lambda: services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id,
                                                owner="w1", ttl_s=60),
    }[path]
    released: dict = {}
    _write_while_held(functools.partial(_hold_run_and_change_it, run.pk, released), write)
    run.refresh_from_db()
    if path == "lease":
        stamped = run.lease_expires_at - timedelta(seconds=60)
    else:
        stamped = CheckpointRevision.objects.get(revision=1).received_at
        assert run.last_write_at == stamped
    assert stamped >= released["at"], (path, released["at"] - stamped)
