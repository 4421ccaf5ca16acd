"""The audit commands operators script (issue 6, fault 2): ``export_audit_head``,
``verify_audit_chain [--against FILE]`` and ``setup_database_roles --print``."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F

from checkpoints import audittree, heartbeat, services
from checkpoints.models import AuditEvent, Heartbeat
from tests.helpers import envelope, put_checkpoint
from tests.security import tampering

ROOT = Path(__file__).resolve().parent.parent


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def test_it_prints_one_signed_head_per_tenant_and_audits_each(acme, globex):
    lines = run("export_audit_head").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["tenant"] for r in records] == ["acme", "globex"]
    for r in records:
        assert set(r) == {"tenant", "origin", "tree_size", "root_hash", "created_at", "key_id",
                          "public_key", "signature", "checkpoint"}
        event = AuditEvent.objects.filter(tenant__slug=r["tenant"]).order_by("seq").last()
        assert event.action == "audit.export_head"
        assert event.leaf.index == r["tree_size"] - 1  # the head covers the export's event
    assert "acme: intact (2 event(s))" in run("verify_audit_chain")


def test_it_appends_to_the_out_file_and_verifies_against_it(acme, globex, tmp_path):
    heads = tmp_path / "heads.jsonl"
    assert run("export_audit_head", "acme", out=str(heads)).strip() == (
        f"appended 1 signed head(s) to {heads}")
    run("export_audit_head", out=str(heads))
    records = [json.loads(line) for line in heads.read_text().splitlines()]
    assert [r["tenant"] for r in records] == ["acme", "acme", "globex"]
    out = run("verify_audit_chain", against=str(heads))
    assert "acme: intact" in out and "globex: intact" in out
    assert out.count("holds exported head") == 3
    only_globex = run("verify_audit_chain", "globex", against=str(heads))
    assert "acme" not in only_globex and "globex: holds exported head" in only_globex


def test_it_names_the_tenant_and_the_problem_against_a_cut_chain(acme, globex, wendy,
                                                                   tmp_path):
    heads = tmp_path / "heads.jsonl"
    services.audit_integrate(acme)
    keep = audittree.newest_head(acme.pk).tree_size
    run("export_audit_head", out=str(heads))
    acme_size = json.loads(heads.read_text().splitlines()[0])["tree_size"]
    put_checkpoint(wendy, acme, envelope())
    services.audit_integrate(acme)
    tampering.cut_tree(acme, keep=keep)  # leaves, events and heads past it
    assert "acme: intact" in run("verify_audit_chain")
    with pytest.raises(CommandError) as caught:
        run("verify_audit_chain", against=str(heads))
    assert str(caught.value).startswith(
        f"audit chain broken for: acme: the tree (size {keep}) is behind the exported head "
        f"size {acme_size} (events were cut)")
    assert "globex" not in str(caught.value)


@pytest.mark.parametrize("content, message", [
    ("not json\n", "line 1: line: malformed JSON"),
    ('\n{"tenant": "acme"}\n', "line 2: seq: missing"),
    ("", "holds no exported head"),         # a truncated file is no proof (the attack)
    ("\n  \n", "holds no exported head"),
])
def test_it_names_the_line_and_field_of_a_bad_against_file(acme, tmp_path, content, message):
    heads = tmp_path / "heads.jsonl"
    heads.write_text(content)
    with pytest.raises(CommandError, match=f"--against: {heads} {message}"):
        run("verify_audit_chain", against=str(heads))


def test_an_exported_heads_unsigned_time_must_be_the_stored_heads(acme, tmp_path):
    """The checkpoint text a head signs has no time: an edited ``created_at`` would be
    echoed back as fact by the check (the attack's finding), so it must be the stored
    head's."""
    heads = tmp_path / "heads.jsonl"
    run("export_audit_head", "acme", out=str(heads))
    assert "holds exported head" in run("verify_audit_chain", against=str(heads))
    record = json.loads(heads.read_text())
    heads.write_text(json.dumps(dict(record, created_at="1999-01-01T00:00:00+00:00")) + "\n")
    with pytest.raises(CommandError, match="its created_at is not the signed head's"):
        run("verify_audit_chain", against=str(heads))


def test_it_refuses_unreadable_files_and_unknown_tenants(acme, tmp_path):
    with pytest.raises(CommandError, match="--against: cannot read"):
        run("verify_audit_chain", against=str(tmp_path / "missing.jsonl"))
    with pytest.raises(CommandError, match="--out: cannot write"):
        run("export_audit_head", out=str(tmp_path / "no-such-dir" / "heads.jsonl"))
    with pytest.raises(CommandError, match="tenant: no tenant 'initech'"):
        run("export_audit_head", "initech")
    assert not AuditEvent.objects.filter(action="audit.export_head").exists()


def test_it_names_the_tenant_whose_event_was_given_another_actor_id(acme, globex, wendy,
                                                                   rita):
    """Issue 17, item 13: only the username is shown, but the ``actor_id`` column is
    covered by the MAC too: changing it is detected."""
    put_checkpoint(wendy, acme, envelope())
    event = AuditEvent.objects.get(tenant=acme, action="checkpoint.write")
    tampering.raw(f"UPDATE {tampering.EVENTS} SET actor_id = %s WHERE id = %s",
                  [rita.pk, event.pk])
    with pytest.raises(CommandError) as caught:
        run("verify_audit_chain")
    assert str(caught.value) == (f"audit chain broken for: acme: event seq {event.seq} "
                                 f"(id {event.pk}) does not match its hash (HMAC)")


def test_it_names_a_tenant_missing_from_the_registry_and_registers_existing_ones(acme, db):
    """A tenant made outside ``tenant_create`` (or whose registration was deleted) is
    reported; the migration that added the registry registers the tenants it finds
    (``register_existing_tenants``), after which the chain checks decide."""
    from checkpoints.audit import register_existing_tenants
    from checkpoints.models import AuditTenant, Tenant

    rogue = Tenant.objects.create(slug="rogue", name="rogue")
    with pytest.raises(CommandError) as caught:
        run("verify_audit_chain")
    assert str(caught.value).startswith("audit chain broken for: rogue: the tenant is not in "
                                        "the tenant registry")
    assert register_existing_tenants(Tenant, AuditTenant) == 1
    assert list(AuditTenant.objects.order_by("seq").values_list("seq", "tenant_pk", "slug")) \
        == [(1, acme.pk, "acme"), (2, rogue.pk, "rogue")]
    with pytest.raises(CommandError, match="rogue: no audit chain at all"):
        run("verify_audit_chain")
    assert "acme: intact" in run("verify_audit_chain", "acme")


@pytest.mark.parametrize("options, message", [
    ({"owner": "Owner", "app": "app"}, "--owner: a role name"),
    ({"owner": "owner", "app": "pg_app"}, "--app: a role name"),
    ({"owner": "owner", "app": "x; DROP TABLE y"}, "--app: a role name"),
    ({"owner": "same", "app": "same"}, "--app: must differ from --owner"),
])
def test_it_refuses_bad_role_names(db, options, message):
    with pytest.raises(CommandError, match=message):
        run("setup_database_roles", print_only=True, **options)


def test_it_prints_the_role_sql_on_any_backend(db):
    sql = run("setup_database_roles", owner="rcv_owner", app="rcv_app", print_only=True)
    assert sql.startswith("-- recovery: least-privilege roles") and "COMMIT;" in sql
    # Two transactions: part 2 needs the tables, so it runs after migrate (issue 17, item 4).
    part1, part2 = sql.split("-- Part 2: after `python manage.py migrate` as rcv_owner")
    assert part1.count("COMMIT;") == 1 and part2.count("COMMIT;") == 1
    assert "ALTER DEFAULT PRIVILEGES" in part1 and "checkpoints_audit" not in part1
    for statement in (
        'GRANT SELECT, INSERT ON "public"."checkpoints_auditevent" TO "rcv_app"',
        'REVOKE ALL ON "public"."checkpoints_auditevent", "public"."checkpoints_auditchainhead",'
        ' "public"."checkpoints_audittenant" FROM PUBLIC, "rcv_app"',
        'GRANT SELECT, INSERT ON "public"."checkpoints_audittenant" TO "rcv_app"',
        'ALTER FUNCTION public.checkpoints_audit_append_only() OWNER TO "rcv_owner"',
        'REVOKE CREATE ON SCHEMA "public" FROM PUBLIC',
    ):
        assert statement in sql


def test_it_runs_roles_only_on_postgresql(db, on_postgres):
    if on_postgres:
        pytest.skip("the PostgreSQL run is tests/security/test_db_roles.py")
    with pytest.raises(CommandError, match="database: roles need PostgreSQL"):
        run("setup_database_roles", owner="rcv_owner", app="rcv_app")


# Its own SQLite file in a child process whichever pass runs it: make test runs it once.
@pytest.mark.once
def test_the_real_command_line_exits_non_zero_naming_the_tenant(tmp_path):
    """``manage.py verify_audit_chain`` on a tampered embedded database: exit 1, one line
    naming the tenant and its first problem, no traceback."""
    db = tmp_path / "cli.sqlite3"
    env = {"PATH": "/usr/bin:/bin", "RECOVERY_VAR_DIR": str(tmp_path),
           "RECOVERY_SQLITE_PATH": str(db)}
    manage = [sys.executable, str(ROOT / "manage.py")]
    for args in (["migrate", "-v", "0"], ["create_tenant", "acme"], ["create_tenant", "globex"]):
        subprocess.run([*manage, *args], env=env, check=True, capture_output=True)
    with sqlite3.connect(db) as con:  # anyone with the file: no trigger on SQLite
        for table in ("checkpoints_auditpending", "checkpoints_auditevent"):
            con.execute(f"DELETE FROM {table} WHERE tenant_id = "
                        "(SELECT id FROM checkpoints_tenant WHERE slug = 'globex')")
    done = subprocess.run([*manage, "verify_audit_chain"], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert "acme: intact (1 event(s))" in done.stdout
    assert ("CommandError: audit chain broken for: globex: no audit chain at all (every "
            "tenant's creation is audited)") in done.stderr
    assert "Traceback" not in done.stderr


def test_a_run_over_every_tenant_records_its_heartbeats_and_a_break_leaves_intact_behind(
        acme, globex, wendy):
    """Issue 21, item 6: ``audit.verify`` when a run over every tenant ends, then
    ``audit.intact`` when everything held (never older than ``audit.verify`` of the same
    run); a run that finds a break records ``audit.verify`` only; a run for one tenant
    records nothing. ``/metrics`` serves them; the alerting rules compare them."""
    run("verify_audit_chain", "acme")
    assert not Heartbeat.objects.filter(name__startswith="audit.").exists()
    run("verify_audit_chain")
    beats = heartbeat.read()
    assert beats["audit.intact"].at >= beats["audit.verify"].at
    Heartbeat.objects.update(at=F("at") - timedelta(seconds=60))  # an earlier run
    put_checkpoint(wendy, acme, envelope())
    event = AuditEvent.objects.get(tenant=acme, action="checkpoint.write")
    tampering.raw(f"UPDATE {tampering.EVENTS} SET reason = %s WHERE id = %s",
                  ["changed", event.pk])
    with pytest.raises(CommandError):
        run("verify_audit_chain")
    after = heartbeat.read()
    assert after["audit.intact"].at == beats["audit.intact"].at - timedelta(seconds=60)
    assert after["audit.verify"].at > after["audit.intact"].at
    assert after["audit.verify"].age_s < 30
    with pytest.raises(CommandError):
        run("verify_audit_chain", "acme")
    assert heartbeat.read()["audit.verify"].at == after["audit.verify"].at
