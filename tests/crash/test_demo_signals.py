"""``make demo`` stops everything it started however it is told to stop (the older notes'
"SIGINT to a background demo stops only the supervisor").

A shell without job control starts a background command with SIGINT ignored, and Python
keeps it ignored: ``kill -INT`` of the demo's process group then stopped only the demo's
supervisor (which handles SIGINT itself) and left the web server, the payment service
and the webhook receiver running on their ports. The test starts the whole demo at its
smallest size on its own SQLite database and ports, as such a shell would, and signals
the group once it serves: every process of the group must be gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import ROOT

# Its own SQLite database and ports whatever backend the suite runs on: once is enough.
# `once`, not `matrix` (stop 40): the demo runs on a SQLite file of its own whichever pass
# starts it, so make test runs it in the SQLite pass only.
pytestmark = [pytest.mark.slow, pytest.mark.once]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_background_demo_stops_every_process_it_started_on_sigint(tmp_path):
    # SIGTERM takes the same handler (``demo._interrupt``); one demo start is 30-40 s.
    signum = signal.SIGINT
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["RECOVERY_VAR_DIR"] = str(tmp_path)
    port = 18700 + (os.getpid() % 400) * 2
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--workers", "2", "--langgraph", "0",
         "--parallel", "2", "--port", str(port), "--payments-port", str(port + 1),
         "--receiver-port", str(port + 20_000)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
        # What `cmd &` in a shell without job control does (POSIX, "Asynchronous Lists").
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    said = []
    try:
        for line in demo.stdout:
            said.append(line)
            if line.startswith("Serving"):
                break
        assert said and said[-1].startswith("Serving"), "".join(said[-30:])
        os.killpg(demo.pid, signum)
        demo.wait(timeout=60)
        deadline = time.monotonic() + 15  # the children's own clean-up, after the parent's
        while _group_alive(demo.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = subprocess.run(["ps", "-o", "pid,cmd", "-g", str(demo.pid)],
                              capture_output=True, text=True).stdout
        assert not _group_alive(demo.pid), f"still running after {signum.name}:\n{left}"
    finally:
        if _group_alive(demo.pid):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.stdout.close()
