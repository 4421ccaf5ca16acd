"""Issue 22, item 2: a checkpoint update in two round trips on PostgreSQL.

``checkpoints_write_lock`` does the first half of ``services.writepath.checkpoint_update``
in one call: it takes the tenant's write gate shared, locks the run (the lock order of
``checkpoints/locks.py``), and only then reads the checkpoint, the data policy and the
facts the run's recovery state needs. Inside a PL/pgSQL function each statement takes a
new snapshot (READ COMMITTED), so what it reads after the lock includes every write
that committed while it waited: one statement could not (its snapshot is taken before
the wait). The second half (compare-and-swap, history, run, audit event) is one
statement sent with ``COMMIT``.

Names and types are read from the models as they are at this migration; a later change
of one of these columns needs a migration that replaces the function. SQLite has no
such function: the ORM path is its only one.
"""

from django.db import migrations

RUN_COLUMNS = ["id", "fencing_token", "lease_owner", "lease_expires_at", "closed_at",
               "recovery_state", "state_changed_at", "unacknowledged_conflicts",
               "payloads_deleted_at"]
CHECKPOINT_COLUMNS = ["id", "run", "kind", "revision", "usage"]
POLICY_COLUMNS = ["secrets_policy", "payload_flag_bytes", "subject_fields"]


def function_sql(apps, connection, *, name: str = "checkpoints_write_lock",
                 run_columns: list[str] = RUN_COLUMNS) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` of ``checkpoints_write_lock`` (migration 0041
    makes ``name`` with more ``run_columns`` from it)."""
    q = connection.ops.quote_name
    models = {name: apps.get_model("checkpoints", name) for name in
              ("AuditChainHead", "Run", "Checkpoint", "DataPolicy", "Effect", "RetryRequest")}

    def table(name):
        return q(models[name]._meta.db_table)

    def col(name, field):
        return q(models[name]._meta.get_field(field).column)

    def typ(name, field):
        f = models[name]._meta.get_field(field)
        if f.is_relation:
            f = f.target_field
        return f.rel_db_type(connection) if f.primary_key else f.db_type(connection)

    out = ([(f"o_run_{f}", typ("Run", f)) for f in run_columns] + [("o_now", "timestamptz")]
           + [(f"o_cp_{f}", typ("Checkpoint", f)) for f in CHECKPOINT_COLUMNS]
           + [(f"o_p_{f}", typ("DataPolicy", f)) for f in POLICY_COLUMNS]
           + [("o_effect_states", "json"), ("o_open_retry", typ("RetryRequest", "state"))])
    returns = ", ".join(f"{name} {t}" for name, t in out)
    run_select = ", ".join(f"x.{col('Run', f)}" for f in run_columns)
    run_out = ", ".join(f"r.{col('Run', f)}" for f in run_columns)
    cp_out = ", ".join(f"c.{col('Checkpoint', f)}" for f in CHECKPOINT_COLUMNS)
    policy_out = ", ".join(f"p.{col('DataPolicy', f)}" for f in POLICY_COLUMNS)
    e, rr = "Effect", "RetryRequest"
    return f"""
CREATE OR REPLACE FUNCTION {name}(
    p_tenant bigint, p_checkpoint uuid, p_run uuid, p_needs_retry text[], p_open_retry text[])
RETURNS TABLE ({returns})
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_now timestamptz;
    r record;
BEGIN
    PERFORM 1 FROM {table('AuditChainHead')} h WHERE h.{col('AuditChainHead', 'tenant')} = p_tenant
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT {run_select} INTO r FROM {table('Run')} x
        WHERE x.{col('Run', 'tenant')} = p_tenant AND x.{col('Run', 'uuid')} = p_run
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The database time once both locks are held (not the statement's start, which can
    -- be long before when a tenant-wide operation or another write held them).
    v_now := clock_timestamp();
    RETURN QUERY SELECT {run_out}, v_now, {cp_out}, {policy_out},
        (SELECT COALESCE(json_object_agg(s.state, s.n), '{{}}'::json) FROM
            (SELECT ef.{col(e, 'state')} AS state, COUNT(*) AS n FROM {table(e)} ef
             WHERE ef.{col(e, 'tenant')} = p_tenant AND ef.{col(e, 'run')} = r.{col('Run', 'id')}
             AND NOT (ef.{col(e, 'state')} = ANY(p_needs_retry)
                      AND ef.{col(e, 'retry_authorized_by')} IS NOT NULL)
             GROUP BY ef.{col(e, 'state')}) s),
        (SELECT rq.{col(rr, 'state')} FROM {table(rr)} rq
         WHERE rq.{col(rr, 'tenant')} = p_tenant AND rq.{col(rr, 'run')} = r.{col('Run', 'id')}
         AND rq.{col(rr, 'state')} = ANY(p_open_retry) LIMIT 1)
    FROM (SELECT 1) AS one
    LEFT JOIN {table('Checkpoint')} c ON c.{col('Checkpoint', 'tenant')} = p_tenant
        AND c.{col('Checkpoint', 'uuid')} = p_checkpoint
    LEFT JOIN {table('DataPolicy')} p ON p.{col('DataPolicy', 'tenant')} = p_tenant;
END;
$fn$;
"""


def up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(function_sql(apps, schema_editor.connection), params=None)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS checkpoints_write_lock("
                              "bigint, uuid, uuid, text[], text[]);", params=None)


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0038_state_counter_deltas")]
    operations = [migrations.RunPython(up, down)]
