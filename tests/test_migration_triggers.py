"""Every trigger the migrations create is there after ``migrate`` (issue 17): on SQLite an
``AlterField`` rebuilds its table and drops that table's triggers, which silently stopped
the state counters (``/metrics``, the inbox's tab counts) and the report's transition
history once ``Run.schema_version`` was widened. A later migration that rebuilds a table
with triggers fails here until it creates them again."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# (trigger, table) as the migrations create them, per backend.
SQLITE = {
    ("checkpoints_runstatecount_ins", "checkpoints_run"),
    ("checkpoints_runstatecount_del", "checkpoints_run"),
    ("checkpoints_runstatecount_upd", "checkpoints_run"),
    ("checkpoints_effectstatecount_ins", "checkpoints_effect"),
    ("checkpoints_effectstatecount_del", "checkpoints_effect"),
    ("checkpoints_effectstatecount_upd", "checkpoints_effect"),
    ("checkpoints_runtransition_ins", "checkpoints_run"),
    ("checkpoints_runtransition_upd", "checkpoints_run"),
    ("checkpoints_notificationoutbox_ins", "checkpoints_run"),
    ("checkpoints_notificationoutbox_upd", "checkpoints_run"),
    ("checkpoints_checkpointsizerollup_ins", "checkpoints_checkpointrevision"),
    ("checkpoints_reportcount_transition_ins", "checkpoints_runtransition"),
    ("checkpoints_reportcount_conflict_ins", "checkpoints_conflict"),
}
POSTGRES = {
    ("checkpoints_runstatecount_keep", "checkpoints_run"),
    ("checkpoints_effectstatecount_keep", "checkpoints_effect"),
    ("checkpoints_runtransition_keep", "checkpoints_run"),
    ("checkpoints_notificationoutbox_keep", "checkpoints_run"),
    ("checkpoints_checkpointsizerollup_keep", "checkpoints_checkpointrevision"),
    ("checkpoints_reportcount_transition", "checkpoints_runtransition"),
    ("checkpoints_reportcount_conflict", "checkpoints_conflict"),
    ("checkpoints_audit_append_only", "checkpoints_auditevent"),
    ("checkpoints_audit_no_truncate", "checkpoints_auditevent"),
    ("checkpoints_audit_head_no_delete", "checkpoints_auditchainhead"),
    ("checkpoints_audit_head_no_truncate", "checkpoints_auditchainhead"),
    ("checkpoints_audittenant_append_only", "checkpoints_audittenant"),
    ("checkpoints_audittenant_no_truncate", "checkpoints_audittenant"),
    ("checkpoints_tombstone_no_update", "checkpoints_tombstone"),
    ("checkpoints_tombstone_no_truncate", "checkpoints_tombstone"),
}


def triggers() -> set[tuple[str, str]]:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'")
        else:
            # pg_trigger, not information_schema.triggers: that one leaves out TRUNCATE.
            cursor.execute("SELECT t.tgname, c.relname FROM pg_trigger t "
                           "JOIN pg_class c ON c.oid = t.tgrelid "
                           "WHERE NOT t.tgisinternal "
                           "AND c.relnamespace = current_schema()::regnamespace")
        return set(cursor.fetchall())


def test_every_trigger_of_the_migrations_is_there():
    expected = SQLITE if connection.vendor == "sqlite" else POSTGRES
    assert expected - triggers() == set()


def test_a_run_written_moves_its_state_counter_and_history(acme, wendy):
    from checkpoints.models import RunStateCount, RunTransition
    from tests.helpers import envelope, put_checkpoint

    put_checkpoint(wendy, acme, envelope(payload={"phase": "ready"}))
    assert sum(RunStateCount.objects.filter(tenant=acme).values_list("n", flat=True)) == 1
    assert RunTransition.objects.filter(tenant=acme).count() == 1
