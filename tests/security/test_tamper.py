"""The tamper set (issue 6, fault 2): every way found to empty or rewrite the audit trail,
each refused (by a trigger or the app role's rights) or detected (by ``verify_audit_chain``,
or by ``--against`` a head exported earlier). Prints the results as a table.

Attackers: the **app role** the service runs as (``setup_database_roles``), the **owner**
(or a superuser) issuing plain SQL, and a **superuser with the triggers off**
(``session_replication_role = replica``), who gets past every refusal; none of them has
the audit key. The refusals need PostgreSQL; on SQLite (no triggers, no roles: anyone
with the file is the last attacker) only the detections run, and the table says so.
"""

from __future__ import annotations

import io
import json

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection

from checkpoints import services
from checkpoints.models import AuditEvent, AuditTenant, Tenant
from tests.helpers import age_world, envelope, put_checkpoint
from tests.lifecycle.governance import DAY, keep_tombstones, purged_runs
from tests.security import tampering

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS, HEADS = tampering.EVENTS, tampering.HEADS
REGISTRY = AuditTenant._meta.db_table
_WORLD = {"suffix": ""}


def record(attack: str, by: str, outcome: str, how: str) -> None:
    """A row of the table printed at the end (tests/security/conftest.py), the attack
    marked when it ran on a chain after deletions."""
    tampering.record(attack + _WORLD["suffix"], by, outcome, how)


def _after_deletions(acme, wendy, adam, april, out_dir) -> None:
    """Issue 20: retention deletes two runs (tombstones), the audit is exported, and a
    four-eyes purge deletes the tombstones; the chain must still verify, and every
    attack below must still be refused or detected."""
    purged_runs(wendy, acme, 2)
    keep_tombstones(acme, 30)
    services.audit_export(actor=None, tenant=acme, out_dir=out_dir)
    age_world(31 * DAY)
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    services.tombstone_purge_approve(actor=april, tenant=acme, purge_id=purge.uuid)
    services.tombstone_purge_execute(actor=adam, tenant=acme, purge_id=purge.uuid)


@pytest.fixture(params=["fresh", "after deletions"])
def chain(request, acme, globex, wendy, wes, adam, april, tmp_path):
    """Two tenants with a few events each; the attacks are on acme. Each attack runs on
    a fresh chain and on one after a retention purge and a tombstone purge."""
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    put_checkpoint(wendy, acme, dict(body, revision=2), expected=1)
    put_checkpoint(wes, globex, envelope())
    _WORLD["suffix"] = ""
    if request.param == "after deletions":
        _after_deletions(acme, wendy, adam, april, tmp_path / "export")
        _WORLD["suffix"] = " (after deletions)"
    return acme


def n_events(tenant) -> int:
    return AuditEvent.objects.filter(tenant=tenant).count()


def broken(*args, **options) -> str:
    """Run ``verify_audit_chain``; it must fail. Returns its message."""
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", *args, stdout=io.StringIO(), **options)
    return str(caught.value)


def intact(*args, **options) -> None:
    call_command("verify_audit_chain", *args, stdout=io.StringIO(), **options)


def refused_for_app(db_roles, sql: str, error: str) -> str:
    """Run ``sql`` as the app role; it must be refused. Returns PostgreSQL's message."""
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=error) as caught:
            cur.execute(sql)
    return str(caught.value).splitlines()[0]


def refused_for_owner(sql: str) -> str:
    """Run plain ``sql`` as the owner/superuser (triggers on); it must be refused."""
    with pytest.raises(DatabaseError, match="append-only") as caught, connection.cursor() as cur:
        cur.execute(sql)
    return str(caught.value).splitlines()[0]


postgres_only = pytest.mark.postgres


# --- refused ---------------------------------------------------------------------------------

@postgres_only
@pytest.mark.parametrize("attack, sql, error", [
    ("truncate", f"TRUNCATE {EVENTS}", "permission denied for table"),
    ("delete", f"DELETE FROM {EVENTS}", "permission denied for table"),
    ("rewrite one event", f"UPDATE {EVENTS} SET reason = 'x' WHERE seq = 2",
     "permission denied for table"),
    ("disable trigger", f"ALTER TABLE {EVENTS} DISABLE TRIGGER ALL", "must be owner"),
    ("drop trigger", f"DROP TRIGGER checkpoints_audit_append_only ON {EVENTS}",
     "must be owner"),
    ("triggers off (replica)", "SET session_replication_role = replica",
     "permission denied to set parameter"),
    ("delete the chain heads", f"DELETE FROM {HEADS}", "permission denied for table"),
    ("delete a tenant registration", f"DELETE FROM {REGISTRY}", "permission denied for table"),
    ("rewrite a tenant registration", f"UPDATE {REGISTRY} SET slug = 'x'",
     "permission denied for table"),
    ("truncate the tenant registry", f"TRUNCATE {REGISTRY}", "permission denied for table"),
])
def test_the_app_role_is_refused(db_roles, chain, attack, sql, error):
    n = n_events(chain)
    message = refused_for_app(db_roles, sql, error)
    assert n_events(chain) == n
    intact()
    record(attack, "app role", "refused", f"role rights: {message}")


@postgres_only
@pytest.mark.parametrize("attack, sql", [
    ("truncate", f"TRUNCATE {EVENTS}"),
    ("truncate events and heads", f"TRUNCATE {EVENTS}, {HEADS}"),
    ("delete", f"DELETE FROM {EVENTS} WHERE seq = 2"),
    ("rewrite one event", f"UPDATE {EVENTS} SET reason = 'x' WHERE seq = 2"),
    ("delete the chain heads", f"DELETE FROM {HEADS}"),
    ("delete a tenant registration", f"DELETE FROM {REGISTRY}"),
    ("rewrite a tenant registration", f"UPDATE {REGISTRY} SET slug = 'x'"),
])
def test_plain_sql_of_the_owner_is_refused(chain, attack, sql):
    n = n_events(chain)
    message = refused_for_owner(sql)
    assert n_events(chain) == n
    intact()
    record(attack, "owner / superuser", "refused", f"trigger: {message}")


# --- detected --------------------------------------------------------------------------------

def bypass() -> str:
    """Who gets past every refusal: on PostgreSQL a superuser with the triggers off (as
    the owner could do with ALTER TABLE ... DISABLE TRIGGER), on SQLite anyone with the file."""
    return "superuser, triggers off" if connection.vendor == "postgresql" else "anyone with the file"


def test_truncate_is_detected(chain):
    """The fault: TRUNCATE, then "intact (0 events)"."""
    n = n_events(chain)
    tampering.empty(EVENTS, truncate=True)
    message = broken()
    assert message.startswith(f"audit chain broken for: acme: the chain head is at seq {n} but "
                              "the events end at seq 0 (events missing); globex: ")
    record("truncate", bypass(), "detected", "verifier: head is past the last event")


def test_truncating_events_and_heads_is_detected(chain):
    tampering.empty(EVENTS, HEADS, truncate=True)
    assert broken("acme") == ("audit chain broken for: acme: no audit chain at all (every "
                              "tenant's creation is audited)")
    record("truncate events and heads", bypass(), "detected", "verifier: tenant without a chain")


def test_deleting_an_event_is_detected(chain):
    tampering.raw(f"DELETE FROM {EVENTS} WHERE tenant_id = %s AND seq = 2", [chain.pk])
    assert broken("acme") == "audit chain broken for: acme: gap before seq 3 (seq 2 expected)"
    record("delete one event", bypass(), "detected", "verifier: gap in seq")


def test_a_rewrite_with_every_later_hash_recomputed_is_detected(chain):
    victim = AuditEvent.objects.get(tenant=chain, seq=3)
    tampering.rewrite(chain, 3, reason="nothing to see", actor_name="mallory")
    assert broken() == (f"audit chain broken for: acme: event seq 3 (id {victim.pk}) does not "
                        "match its hash (HMAC)")
    record("rewrite one event, rehash the rest (SHA-256)", bypass(), "detected",
           "verifier: HMAC of the rewritten event")


def test_a_rewrite_passed_off_as_legacy_sha256_is_detected(chain):
    tampering.rewrite(chain, 3, downgrade=True, reason="nothing to see")
    assert "event seq 3 " in broken("acme")
    assert "uses the unkeyed legacy hash outside the sealed legacy range" in broken("acme")
    record("same, labelled legacy SHA-256", bypass(), "detected",
           "verifier: unkeyed hash outside the sealed range")


@pytest.mark.parametrize("relabel", [False, True], ids=["as is", "labelled scheme 2"])
def test_changing_an_events_actor_id_is_detected(chain, wendy, wes, relabel):
    """Issue 17, item 13: ``actor_id`` is covered by the HMAC (scheme 3), so pointing an
    event at another account is found; relabelling the event as scheme 2 (which does not
    cover it) is found too, since scheme 3 names itself in the MAC input."""
    victim = (AuditEvent.objects.filter(tenant=chain, action="checkpoint.write")
              .order_by("seq").first())
    assert victim.actor_id == wendy.pk and victim.hash_scheme == 3
    tampering.raw(f"UPDATE {EVENTS} SET actor_id = %s" + (", hash_scheme = 2" if relabel else "")
                  + " WHERE id = %s", [wes.pk, victim.pk])
    assert broken() == (f"audit chain broken for: acme: event seq {victim.seq} (id {victim.pk}) "
                        "does not match its hash (HMAC)")
    record("point an event at another account (actor_id)"
           + (", labelled scheme 2" if relabel else ""), bypass(), "detected",
           "verifier: HMAC covers actor_id (scheme 3)")


def test_a_tenant_deleted_whole_is_named(chain):
    """Issue 17, item 13: the owner deletes a tenant's row, events and head (and every
    other row of it); the verifier used to list nothing and exit 0. The tenant registry
    names it."""
    globex = Tenant.objects.get(slug="globex")
    tampering.delete_tenant(globex)
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", stdout=out)
    assert str(caught.value).startswith("audit chain broken for: globex: the tenant "
                                        "registered on ")
    assert f"(id {globex.pk}) is gone: its row, events and chain head were deleted" in str(
        caught.value)
    assert "acme: intact" in out.getvalue()
    record("delete a whole tenant (row, events, head)", bypass(), "detected",
           "verifier: tenant registry")


def test_a_tenant_deleted_with_its_registration_leaves_a_gap(chain):
    tampering.delete_tenant(chain, registration=True)  # acme, registered before globex
    assert broken() == ("audit chain broken for: (tenant registry): gap before seq 2 (seq 1 "
                        "expected: a tenant's registration was deleted)")
    record("delete a tenant and its registration", bypass(), "detected",
           "verifier: gap in the tenant registry")


def test_a_rewritten_registration_is_detected(chain):
    tampering.raw(f"UPDATE {REGISTRY} SET slug = 'initech' WHERE slug = 'globex'")
    assert "globex: the tenant is not in the tenant registry" in broken()
    assert "does not match its MAC (changed?)" in broken()
    record("rewrite a tenant registration", bypass(), "detected", "verifier: registry MAC")


def test_the_last_tenant_deleted_with_its_registration_is_detected_against_an_export(
        chain, tmp_path):
    """Deleting the newest registration leaves no gap: the verifier alone cannot tell (as
    for a cut tail); a head exported before names the tenant."""
    exported = tmp_path / "heads.jsonl"
    call_command("export_audit_head", out=str(exported), stdout=io.StringIO())
    tampering.delete_tenant(Tenant.objects.get(slug="globex"), registration=True)
    intact()
    assert broken(against=str(exported)).startswith(
        "audit chain broken for: globex: the tenant no longer exists")
    record("delete the newest tenant and its registration", bypass(), "detected",
           "--against exported head (verifier alone: intact)")


def test_a_cut_tail_is_detected_against_an_exported_head(chain, wendy, tmp_path):
    exported = tmp_path / "heads.jsonl"
    call_command("export_audit_head", "acme", out=str(exported), stdout=io.StringIO())
    seq = json.loads(exported.read_text())["seq"]
    put_checkpoint(wendy, chain, envelope())
    tampering.cut_tail(chain, keep=seq - 2)
    intact()  # a consistent, shorter chain: the verifier alone cannot tell
    assert f"exported head seq {seq} of " in broken(against=str(exported))
    assert "is no longer in the chain (events were cut)" in broken(against=str(exported))
    record("cut the tail, rewind the head", bypass(), "detected",
           "--against exported head (verifier alone: intact)")


def test_an_altered_export_is_detected(chain, wendy, tmp_path):
    """After the cut above, the attacker also edits the outside copy to match."""
    exported = tmp_path / "heads.jsonl"
    call_command("export_audit_head", "acme", out=str(exported), stdout=io.StringIO())
    line = json.loads(exported.read_text())
    tampering.cut_tail(chain, keep=line["seq"] - 2)
    kept = AuditEvent.objects.get(tenant=chain, seq=line["seq"] - 2)
    exported.write_text(json.dumps(dict(line, seq=kept.seq, last_hash=kept.hash)) + "\n")
    assert "the signature does not verify" in broken(against=str(exported))
    record("cut the tail and edit the exported head", bypass(), "detected",
           "--against: export signature (HMAC)")


@postgres_only
def test_an_owner_who_disables_the_triggers_is_detected(db_roles, chain):
    with db_roles.connect(db_roles.owner) as owner, owner.cursor() as cur:
        cur.execute(f"ALTER TABLE {EVENTS} DISABLE TRIGGER USER")
        cur.execute(f"DELETE FROM {EVENTS} WHERE tenant_id = %s AND seq = 2", [chain.pk])
        cur.execute(f"ALTER TABLE {EVENTS} ENABLE TRIGGER USER")
    assert broken("acme") == "audit chain broken for: acme: gap before seq 3 (seq 2 expected)"
    record("disable the triggers, delete an event", "owner", "detected", "verifier: gap in seq")


@postgres_only
def test_a_forged_event_appended_by_the_app_role_is_detected(db_roles, chain):
    """The app role may INSERT events and move the head, but has no key."""
    last = AuditEvent.objects.filter(tenant=chain).order_by("-seq").first()
    forged = "f" * 64
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(
            f"INSERT INTO {EVENTS} (tenant_id, seq, created_at, actor_name, action, target_type, "
            "target_ref, reason, prev_hash, hash, hash_scheme, key_id) VALUES "
            "(%s, %s, now(), 'rita', 'retry.approve', 'run', 'x', 'looks fine', %s, %s, 2, %s)",
            [chain.pk, last.seq + 1, last.hash, forged, last.key_id])
        cur.execute(f"UPDATE {HEADS} SET seq = %s, last_hash = %s WHERE tenant_id = %s",
                    [last.seq + 1, forged, chain.pk])
    assert f"event seq {last.seq + 1} " in broken("acme")
    assert broken("acme").endswith("does not match its hash (HMAC)")
    record("append a forged event, move the head", "app role", "detected",
           "verifier: HMAC (no key)")


@postgres_only
def test_a_head_rewound_by_the_app_role_is_detected(db_roles, chain):
    kept = AuditEvent.objects.get(tenant=chain, seq=2)
    with db_roles.connect(db_roles.app) as app, app.cursor() as cur:
        cur.execute(f"UPDATE {HEADS} SET seq = 2, last_hash = %s WHERE tenant_id = %s",
                    [kept.hash, chain.pk])
    assert broken("acme") == ("audit chain broken for: acme: event seq 3 is past the chain head "
                              "(seq 2)")
    record("rewind the head", "app role", "detected", "verifier: events past the head")


def test_the_untouched_chain_verifies(chain):
    """Control: the chain the attacks start from verifies, so each detection above is the
    attack's doing."""
    intact()
    assert services.audit_verify(tenant=chain)[0]
