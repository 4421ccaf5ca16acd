"""The least-privilege set-up as docs/security/audit.md writes it, run verbatim on a fresh,
empty database (issue 17, item 4: on an empty database ``setup_database_roles`` failed on
the missing trigger function, and ``migrate`` as the owner then failed).

The shell block after the marker comment in the doc is run by ``bash -eu`` with only its
inputs (``PGHOST``, ``PGPORT``, ``DB``, ``SUPERUSER``, ``OWNER``, ``APP``) set, so the doc
and the test cannot drift. Then, as the app role: the operator commands, a checkpoint
write through the service, the verifier; and UPDATE, DELETE, TRUNCATE of the audit events
refused by the role's rights."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.helpers import documented_block

pytestmark = [pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security" / "audit.md"
MARKER = "<!-- tests/security/test_role_setup_doc.py runs this block verbatim"

AS_APP = r"""
import json, uuid
import psycopg
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint, Tenant
from tests.helpers import envelope, put_checkpoint

tenant = Tenant.objects.get(slug="acme")
writer = get_user_model().objects.get(username="orders-runtime")
body = envelope()
put_checkpoint(writer, tenant, body)
put_checkpoint(writer, tenant, dict(body, revision=1), expected=0)
refused = {}
for sql in ("UPDATE checkpoints_auditevent SET reason = 'x'",
            "DELETE FROM checkpoints_auditevent", "TRUNCATE checkpoints_auditevent",
            "DELETE FROM checkpoints_auditchainhead", "DELETE FROM checkpoints_audittenant"):
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql)
        refused[sql] = "allowed"
    except Exception as exc:
        refused[sql] = str(exc).splitlines()[0]
with connection.cursor() as cur:
    cur.execute("SELECT current_user")
    user = cur.fetchone()[0]
print(json.dumps({
    "user": user,
    "revision": Checkpoint.objects.get(tenant=tenant, uuid=uuid.UUID(body["id"])).revision,
    "writes": AuditEvent.objects.filter(tenant=tenant, action="checkpoint.write").count(),
    "refused": refused,
}))
"""


def documented_steps() -> str:
    """The shell block that follows the marker in docs/security/audit.md."""
    return documented_block(DOC, MARKER)


@pytest.fixture
def fresh_database(on_postgres):
    """An empty database made for this test (as the test's superuser), and two unique
    role names; both dropped afterwards."""
    if not on_postgres:
        pytest.skip("the role set-up needs PostgreSQL (set DATABASE_URL)")
    s = connection.settings_dict
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    name = f"{s['NAME']}_roles_{tag}"[:63]
    roles = (f"rcv_doc_owner_{tag}", f"rcv_doc_app_{tag}")
    admin = dict(dbname="postgres", user=s["USER"], host=s["HOST"] or None,
                 port=s["PORT"] or None, autocommit=True)
    with psycopg.connect(**admin) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"PGHOST": s["HOST"] or "127.0.0.1", "PGPORT": str(s["PORT"] or 5432),
               "DB": name, "SUPERUSER": s["USER"], "OWNER": roles[0], "APP": roles[1]}
    finally:
        with psycopg.connect(**admin) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            for role in roles:
                con.execute(f'DROP ROLE IF EXISTS "{role}"')


def _env(inputs: dict, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"
           and not k.startswith("PG")}
    env.update(inputs)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RECOVERY_VAR_DIR"] = str(tmp_path)
    env.pop("CELERY_BROKER_URL", None)
    return env


def test_the_documented_steps_work_on_an_empty_database(fresh_database, tmp_path):
    env = _env(fresh_database, tmp_path)
    steps = subprocess.run(["bash", "-euc", documented_steps()], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert steps.returncode == 0, steps.stdout + steps.stderr
    assert "Traceback" not in steps.stderr
    assert "set-up not finished" in steps.stdout  # part 1 said what comes next
    assert steps.stdout.rstrip().endswith(f"app {env['APP']} (the service's DATABASE_URL)")

    app_env = dict(env, DATABASE_URL="postgres://{APP}@{PGHOST}:{PGPORT}/{DB}".format(**env))
    manage = [sys.executable, "manage.py"]
    for args in (["create_tenant", "acme"], ["create_account", "orders-runtime", "--service"],
                 ["grant", "orders-runtime", "writer", "acme"],
                 ["issue_token", "orders-runtime"]):
        done = subprocess.run([*manage, *args], cwd=ROOT, env=app_env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([*manage, "shell", "-c", AS_APP], cwd=ROOT, env=app_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["user"] == env["APP"]
    assert result["revision"] == 1 and result["writes"] == 2
    for sql, answer in result["refused"].items():
        assert answer.startswith("permission denied for table"), (sql, answer)

    verify = subprocess.run([*manage, "verify_audit_chain"], cwd=ROOT, env=app_env,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
