"""``make demo`` with ``CELERY_BROKER_URL`` naming a broker that does not answer: it
refuses before it recreates the SQLite database (it used to delete the database first,
then find the broker down, leaving the operator with neither)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import closed_port

from .conftest import ROOT


@pytest.mark.parametrize("broker", ["closed port", "notascheme://x"])
def test_a_demo_whose_broker_does_not_answer_keeps_the_database(tmp_path, broker):
    # An unknown scheme (stop 40's attack) was a KeyError traceback from kombu.
    database = tmp_path / "recovery.sqlite3"
    database.write_bytes(b"an earlier demo's database")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(RECOVERY_VAR_DIR=str(tmp_path),
               CELERY_BROKER_URL=f"redis://127.0.0.1:{closed_port()}/0"
               if broker == "closed port" else broker)
    proc = subprocess.run([sys.executable, "manage.py", "demo", "--no-serve"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "the broker in CELERY_BROKER_URL does not answer" in proc.stderr
    assert database.read_bytes() == b"an earlier demo's database"
