"""``make demo``'s database errors are one paragraph saying what to do (a newcomer's
finding): with ``DATABASE_URL`` naming a missing database it printed a ~100-line
traceback ending ``database "x" does not exist``; run twice on one database it said
``the demo tenants already exist`` with no way out."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management.base import CommandError

from checkpoints.management.commands.demo import Command

from .conftest import ROOT


def test_a_missing_database_is_one_paragraph_naming_the_command_that_creates_it(tmp_path):
    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        pytest.skip("PostgreSQL's missing database: the PostgreSQL pass")
    name = "recovery_demo_missing_db"
    env = dict(os.environ, RECOVERY_VAR_DIR=str(tmp_path), DATABASE_URL=(
        f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"))
    done = subprocess.run([sys.executable, "manage.py", "demo", "--no-serve"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("CommandError")]
    assert len(error) == 1, done.stderr[-3000:]
    assert f'"{name}"' in error[0] and "does not exist" in error[0]
    assert f"createdb -h {db['HOST'] or '127.0.0.1'}" in error[0] and name in error[0]
    assert "unset DATABASE_URL" in error[0]
    assert "uses DATABASE_URL" in error[0]


@pytest.mark.django_db
def test_a_second_run_on_one_database_says_how_to_start_afresh(acme):
    with pytest.raises(CommandError) as raised:
        Command()._refuse_filled_database()
    said = str(raised.value)
    assert "already exist" in said and "unset DATABASE_URL" in said
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        assert f"rm {db['NAME']}" in said
    else:
        assert f"dropdb -h {db['HOST'] or 'localhost'}" in said and "createdb" in said


@pytest.mark.django_db
def test_an_empty_database_is_taken():
    Command()._refuse_filled_database()  # no demo tenants: nothing to refuse
