"""``make demo`` with ``CELERY_BROKER_URL`` set (a newcomer's finding): it started no
Celery worker or beat yet said "(no broker: its in-process worker)"; the README's
reconcile answered 202 "queued for a worker" and nothing happened, and ``/readyz`` said
``worker: failed: WorkerSilent`` all along. Now the demo starts a worker with beat as a
child process, waits for its first sweep, says so, and stops it on exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from .conftest import ROOT

pytestmark = [
    pytest.mark.slow, pytest.mark.matrix, pytest.mark.celery_worker,
    pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL"),
                       reason="CELERY_BROKER_URL is not set: no broker for the demo's worker"),
]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_demo_with_a_broker_runs_a_worker_and_beat_and_stops_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # its own SQLite
    env["RECOVERY_VAR_DIR"] = str(tmp_path)
    port = 19300 + (os.getpid() % 300) * 2
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--workers", "2", "--langgraph", "0",
         "--parallel", "2", "--port", str(port), "--payments-port", str(port + 1),
         "--receiver-port", str(port + 20_000)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    said = []
    try:
        for line in demo.stdout:
            said.append(line)
            if line.startswith("Serving"):
                break
        text = "".join(said)
        assert said and said[-1].startswith("Serving"), text[-3000:]
        assert "no broker" not in text and "in-process worker" not in text
        assert "a Celery worker with beat" in said[-1]
        assert (tmp_path / "demo-celery.log").exists()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz",  # noqa: S310
                                        timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 503: the body names what failed
            body = json.load(exc)
        assert body["checks"]["worker"] == "ok", body
        assert body["heartbeat"]["sweep.celery"] < 60, body
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=60)
        deadline = time.monotonic() + 20  # the worker's warm shutdown, after the demo's
        while _group_alive(demo.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = subprocess.run(["ps", "-o", "pid,cmd", "-g", str(demo.pid)],
                              capture_output=True, text=True).stdout
        assert not _group_alive(demo.pid), f"still running after SIGINT:\n{left}"
    finally:
        if _group_alive(demo.pid):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.stdout.close()


def test_the_demo_empties_the_brokers_queue_of_an_earlier_run_before_its_worker_starts():
    # A second demo's worker ran the jobs a first demo left queued (or delivered and not
    # acknowledged, restored later by kombu) against the new database, whose rows they do
    # not name. The demo purges the queue, and with Redis kombu's unacked keys, on the
    # broker URL's own database, before it starts its worker.
    import io

    import redis
    from celery import current_app

    from checkpoints.management.commands.demo import Command

    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    for pk in (101, 102):  # an earlier demo's reconcile requests
        current_app.send_task("checkpoints.tasks.reconcile_effect", args=[pk])
    client.hset("unacked", "stale-tag", "an earlier demo's delivered message")
    client.zadd("unacked_index", {"stale-tag": 1})
    queue = current_app.conf.task_default_queue
    assert client.llen(queue) >= 2

    command = Command(stdout=io.StringIO())
    command._purge_broker()

    assert client.llen(queue) == 0
    assert not client.exists("unacked", "unacked_index")
    assert "message(s) of an earlier run dropped" in command.stdout.getvalue()
