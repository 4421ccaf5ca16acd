"""Operator commands (CONTRACT.md 5): each calls services, and bad input is a clear
``CommandError`` (exit 1 with a message), never a traceback."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from checkpoints import services
from checkpoints.models import ApiToken, AuditEvent, Tenant
from checkpoints.permissions import role_names, tenant_perms
from tests.helpers import envelope, put_checkpoint

User = get_user_model()
ROOT = Path(__file__).resolve().parent.parent


def run(*args, stdin: str | None = None) -> str:
    out = io.StringIO()
    kwargs = {"stdout": out}
    if stdin is not None:
        kwargs["stdin"] = io.StringIO(stdin)
    call_command(*args, **kwargs)
    return out.getvalue()


def test_it_creates_a_tenant_with_an_audited_first_event(db):
    assert "created tenant acme (Acme Corp)" in run("create_tenant", "acme", "--name", "Acme Corp")
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Corp"
    assert AuditEvent.objects.get(tenant=tenant).action == "tenant.create"


@pytest.mark.parametrize(("args", "message"), [
    (["bad slug!"], "slug"),
    (["x" * 65], "slug"),
    (["acme"], "already exists"),
    (["ok", "--name", "n" * 201], "--name"),
    (["ok", "--name", "  "], "name: must not be blank"),
    (["ok", "--name", "\u200c\u200d"], "name: must not be blank"),
])
def test_it_refuses_bad_tenants(acme, args, message):
    with pytest.raises(CommandError, match=message):
        run("create_tenant", *args)
    assert Tenant.objects.count() == 1


def test_it_creates_a_login_account_from_stdin(db):
    assert "created account rita" in run("create_account", "rita", "--password-stdin",
                                         stdin="s3cret pass phrase\n")
    user = User.objects.get(username="rita")
    assert user.check_password("s3cret pass phrase")
    assert not user.is_superuser and not user.is_staff


def test_it_creates_a_service_account_without_a_password(db):
    run("create_account", "bot", "--service")
    assert not User.objects.get(username="bot").has_usable_password()


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["rita", "--service", "--password-stdin"], "pw\n", "--service"),
    (["rita", "--password-stdin"], "\n", "empty password"),
    (["bad name!"], None, "username"),
    (["wendy"], None, "already exists"),
])
def test_it_refuses_bad_accounts(wendy, args, stdin, message):
    with pytest.raises(CommandError, match=message):
        run("create_account", *args, stdin=stdin)
    assert list(User.objects.values_list("username", flat=True)) == ["wendy"]


def test_it_grants_a_role_with_its_rights_and_an_audit_event(acme, db):
    run("create_account", "ann", "--password-stdin", stdin="a-sound-pass-phrase\n")
    assert "granted approver in acme to ann" in run("grant", "ann", "approver", "acme")
    ann = User.objects.get(username="ann")
    assert role_names(ann, acme) == ["approver"]
    assert tenant_perms(ann, acme) == {"view_runs", "reveal_payload", "approve_retry"}
    event = AuditEvent.objects.get(action="role.grant")
    assert (event.actor_name, event.target_ref, event.after) == ("system", "ann",
                                                                {"role": "approver"})


@pytest.mark.parametrize(("args", "message"), [
    (["rita", "superuser", "acme"], "role"),
    (["nobody", "viewer", "acme"], "no account"),
    (["rita", "viewer", "initech"], "no tenant"),
])
def test_it_refuses_bad_grants(rita, acme, args, message):
    before = AuditEvent.objects.count()
    with pytest.raises(CommandError, match=message):
        run("grant", *args)
    assert AuditEvent.objects.count() == before
    assert role_names(rita, acme) == ["reviewer"]


def test_it_prints_a_token_once_and_stores_only_its_hash(acme, wendy, api_as):
    token = run("issue_token", "wendy").strip()
    stored = ApiToken.objects.get(user=wendy)
    assert stored.key_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored.key_hash and stored.prefix == token[:12]
    assert services.token_authenticate(token) == wendy
    assert run("issue_token", "wendy").strip() != token


def test_it_refuses_a_token_for_an_unknown_account(db):
    with pytest.raises(CommandError, match="no account"):
        run("issue_token", "ghost")
    assert not ApiToken.objects.exists()


def test_it_sweeps_stale_runs(acme, wendy):
    from tests.helpers import age_world

    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging"}))
    age_world(600)
    assert "1 became ambiguous" in run("sweep_stale_runs")
    assert "0 became ambiguous" in run("sweep_stale_runs")


def test_it_verifies_the_audit_chain_and_fails_when_broken(acme, globex, wendy):
    put_checkpoint(wendy, acme, envelope())
    out = run("verify_audit_chain")
    assert "acme: intact" in out and "globex: intact" in out
    assert "globex" not in run("verify_audit_chain", "acme")
    with pytest.raises(CommandError, match="no tenant"):
        run("verify_audit_chain", "initech")
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute(f"UPDATE {AuditEvent._meta.db_table} SET action = 'forged' "
                    f"WHERE id = %s", [AuditEvent.objects.for_tenant(acme).order_by("seq")
                                       .values_list("id", flat=True).first()])
    with pytest.raises(CommandError, match="broken for: acme"):
        run("verify_audit_chain")


# Its own SQLite file in a child process whichever pass runs it: make test runs it once.
@pytest.mark.once
def test_it_exits_non_zero_with_a_message_not_a_traceback(tmp_path):
    """The real command line: an unknown role exits 1 and prints one clear line."""
    env = {"PATH": "/usr/bin:/bin", "RECOVERY_VAR_DIR": str(tmp_path),
           "RECOVERY_SQLITE_PATH": str(tmp_path / "cli.sqlite3")}
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True, capture_output=True)
    done = subprocess.run([*manage, "grant", "nobody", "wizard", "acme"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "CommandError: role: unknown role 'wizard'" in done.stderr
    assert "Traceback" not in done.stderr
