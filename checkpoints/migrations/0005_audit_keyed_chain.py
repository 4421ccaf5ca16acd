"""The audit chain becomes keyed and refuses TRUNCATE (issue 6, fault 2;
docs/security/audit.md).

1. Each event records its hash scheme and key id. Existing events keep their plain
   SHA-256 hashes: they become scheme 1 (``hash_scheme`` default for existing rows only).
2. Every chain that already has events is sealed with the newest ``RECOVERY_AUDIT_KEYS``
   key (``AuditChainHead.legacy_seq``/``legacy_mac``): unkeyed events verify only up to
   there. Run ``migrate`` with the same ``RECOVERY_AUDIT_KEYS`` as the service, or keep the
   key it used listed (the verifier names an unknown key id).
3. PostgreSQL: the append-only trigger function names the table it guards, and triggers
   now also refuse TRUNCATE of the event table, and DELETE and TRUNCATE of the chain heads.
   The function and triggers belong to the table owner (``setup_database_roles``); the
   service's role cannot alter, disable or drop them. A superuser can still switch
   triggers off (``session_replication_role``); the verifier and exported heads catch what
   that lets through. SQLite gets no trigger (see 0002).
"""

from django.db import migrations, models

PG_UP = """
CREATE OR REPLACE FUNCTION checkpoints_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS checkpoints_audit_no_truncate ON checkpoints_auditevent;
CREATE TRIGGER checkpoints_audit_no_truncate
    BEFORE TRUNCATE ON checkpoints_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION checkpoints_audit_append_only();
DROP TRIGGER IF EXISTS checkpoints_audit_head_no_delete ON checkpoints_auditchainhead;
CREATE TRIGGER checkpoints_audit_head_no_delete
    BEFORE DELETE ON checkpoints_auditchainhead
    FOR EACH ROW EXECUTE FUNCTION checkpoints_audit_append_only();
DROP TRIGGER IF EXISTS checkpoints_audit_head_no_truncate ON checkpoints_auditchainhead;
CREATE TRIGGER checkpoints_audit_head_no_truncate
    BEFORE TRUNCATE ON checkpoints_auditchainhead
    FOR EACH STATEMENT EXECUTE FUNCTION checkpoints_audit_append_only();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS checkpoints_audit_head_no_truncate ON checkpoints_auditchainhead;
DROP TRIGGER IF EXISTS checkpoints_audit_head_no_delete ON checkpoints_auditchainhead;
DROP TRIGGER IF EXISTS checkpoints_audit_no_truncate ON checkpoints_auditevent;
CREATE OR REPLACE FUNCTION checkpoints_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'checkpoints_auditevent is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def triggers_up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)


def triggers_down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)


def seal_legacy(apps, schema_editor):
    from checkpoints.audit import seal_legacy_chains

    seal_legacy_chains(apps.get_model("checkpoints", "AuditChainHead"))


def refuse_if_keyed(apps, schema_editor):
    """Unapplying would drop the scheme and key id of keyed events, which then no longer
    verify anywhere: refused once one exists."""
    from django.db.migrations.exceptions import IrreversibleError

    keyed = apps.get_model("checkpoints", "AuditEvent").objects.filter(hash_scheme__gte=2).count()
    if keyed:
        raise IrreversibleError(
            f"{keyed} audit event(s) are keyed (hash_scheme 2 or 3): unapplying 0005 would make "
            "them unverifiable")


class Migration(migrations.Migration):

    dependencies = [
        ('checkpoints', '0003_reconcile_jobs_close'),
    ]

    operations = [
        migrations.AddField(
            model_name='auditchainhead',
            name='legacy_key_id',
            field=models.CharField(blank=True, default='', max_length=16),
        ),
        migrations.AddField(
            model_name='auditchainhead',
            name='legacy_mac',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='auditchainhead',
            name='legacy_seq',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='auditevent',
            name='hash_scheme',
            field=models.PositiveSmallIntegerField(choices=[(1, 'sha256 (legacy, unkeyed)'), (2, 'hmac-sha256')], default=1),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='auditevent',
            name='key_id',
            field=models.CharField(blank=True, default='', help_text='id of the RECOVERY_AUDIT_KEYS key of the HMAC', max_length=16),
        ),
        migrations.RunPython(seal_legacy, refuse_if_keyed),
        migrations.RunPython(triggers_up, triggers_down),
    ]
