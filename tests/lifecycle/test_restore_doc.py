"""The restore of docs/operations/backup.md, run verbatim with a real dump and the owner
and app roles (the operator's walk: restoring as the owner failed on the ``pg_trgm``
extension, and ``migrate`` as the owner on a superuser's restore failed on
``django_migrations``; the restore drill restores and serves as the superuser, so it
never saw either).

The test database (with a tenant's checkpoint written here) is dumped as backup.md
writes it (``pg_dump --format=custom --no-owner``), the heads exported before and the
keyring after. The shell block after the marker comment in backup.md is run by
``bash -eu`` with only its inputs set (``PGHOST``, ``PGPORT``, ``SUPERUSER``, ``OWNER``,
``APP``, ``DB``, ``DUMP``, ``HEADS``, ``KEYRING``; unique role and database names, dropped
afterwards), so the doc and the test cannot drift. Then, as the app role, the drill's
check (``restore_drill --check``): the tables belong to the owner and the copy serves
the checkpoint's payload through the API.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from checkpoints.ops import restoredrill
from tests.helpers import documented_block, envelope, put_checkpoint

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations" / "backup.md"
MARKER = "<!-- tests/lifecycle/test_restore_doc.py runs this block verbatim"


def documented_steps() -> str:
    """The shell block that follows the marker in docs/operations/backup.md."""
    return documented_block(DOC, MARKER)


@pytest.fixture
def restore_inputs(on_postgres, tmp_path):
    """The block's inputs: a new database's name and two unique role names (none exists
    yet; the block makes them), with the database and roles dropped afterwards."""
    if not on_postgres:
        pytest.skip("the restore needs PostgreSQL (set DATABASE_URL)")
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.skip("pg_dump / pg_restore are not installed")
    s = connection.settings_dict
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    name = f"{s['NAME']}_restored_{tag}"[:63]
    roles = (f"rcv_restore_owner_{tag}", f"rcv_restore_app_{tag}")
    admin = dict(dbname="postgres", user=s["USER"], host=s["HOST"] or None,
                 port=s["PORT"] or None, autocommit=True)
    try:
        yield {"PGHOST": s["HOST"] or "127.0.0.1", "PGPORT": str(s["PORT"] or 5432),
               "SUPERUSER": s["USER"], "OWNER": roles[0], "APP": roles[1], "DB": name,
               "DUMP": str(tmp_path / "recovery.dump"),
               "HEADS": str(tmp_path / "heads.jsonl"),
               "KEYRING": str(tmp_path / "keyring.jsonl")}
    finally:
        with psycopg.connect(**admin) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            for role in roles:
                con.execute(f'DROP ROLE IF EXISTS "{role}"')


def _env(inputs: dict, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"
           and not k.startswith("PG") and not k.endswith("_FILE")}
    env.update(inputs)
    env.update({  # step 1: the keys of today, the ones this process has
        "SECRET_KEY": settings.SECRET_KEY,
        "RECOVERY_AUDIT_KEYS": ",".join(settings.RECOVERY_AUDIT_KEYS),
        "RECOVERY_ENCRYPTION_KEYS": ",".join(settings.RECOVERY_ENCRYPTION_KEYS),
        "DEBUG": "1" if settings.DEBUG else "0",
    })
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RECOVERY_VAR_DIR"] = str(tmp_path / "var")
    env.pop("CELERY_BROKER_URL", None)
    return env


@pytest.mark.slow  # a dump, a restore and five commands in new processes: 30 to 60 s
def test_the_documented_restore_works_with_the_owner_and_app_roles(
        acme, wendy, restore_inputs, tmp_path):
    payload = {"phase": "charging", "note": "restored-7c1e"}
    body = envelope(payload=payload)
    put_checkpoint(wendy, acme, body)
    call_command("export_audit_head", out=restore_inputs["HEADS"])
    restoredrill.dump(restore_inputs["DUMP"])
    call_command("export_keyring", out=restore_inputs["KEYRING"])

    env = _env(restore_inputs, tmp_path)
    steps = subprocess.run(["bash", "-euc", documented_steps()], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=800)
    assert steps.returncode == 0, steps.stdout + steps.stderr
    assert "Traceback" not in steps.stderr
    assert "acme: holds exported head" in steps.stdout

    app_env = dict(env, DATABASE_URL="postgres://{APP}@{PGHOST}:{PGPORT}/{DB}".format(**env))
    check = subprocess.run([sys.executable, "manage.py", "restore_drill", "--check"],
                           cwd=ROOT, env=app_env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads([x for x in check.stdout.splitlines() if x.startswith("{")][-1])
    assert report["chain"]["ok"]
    text = json.dumps(payload, sort_keys=True)
    assert report["tenants"]["acme"]["payloads"] == {
        body["id"]: hashlib.sha256(text.encode()).hexdigest()}

    s = connection.settings_dict
    with psycopg.connect(dbname=env["DB"], user=s["USER"], host=s["HOST"] or None,
                         port=s["PORT"] or None) as con:
        owners = {row[0] for row in con.execute(
            "SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")}
    assert owners == {env["OWNER"]}
