"""Migration 0008 (issue 7): the UUID columns are renamed (``Run.run_id`` -> ``Run.uuid``,
``AuditEvent.run_id`` -> ``run_uuid``, ...) with every value kept, the per-tenant unique
constraints still hold on the renamed columns, and going back restores the old names."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("checkpoints", "0007_merge_20261130_1552")]
AFTER = [("checkpoints", "0008_uuid_field_names")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _latest():
    return MigrationExecutor(connection).loader.graph.leaf_nodes("checkpoints")


# PostgreSQL only: the upgrade of an install that holds data, which production runs on; on
# SQLite each step rebuilds its tables: this test and its twin (receipts, uuid names) took
# 84 s and 46 s of the SQLite pass (stop 40).
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_renames_the_uuid_columns_keeping_values_and_constraints():
    rid, cid, eid, task = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    apps = _migrate(BEFORE)
    try:
        model = lambda name: apps.get_model("checkpoints", name)  # noqa: E731
        tenant = model("Tenant").objects.create(slug="old", name="old")
        run = model("Run").objects.create(tenant=tenant, run_id=rid)
        cp = model("Checkpoint").objects.create(
            tenant=tenant, run=run, checkpoint_id=cid, revision=0, kind="k", schema_version=1,
            payload_ciphertext="x", payload_size=1, phase_class="stable", updated_at_ms=0,
            received_at="2026-01-01T00:00:00Z")
        effect = model("Effect").objects.create(
            tenant=tenant, run=run, effect_id=eid, revision=0, operation_key="k",
            service="payments", effect_class="idempotent", request_fingerprint="0" * 64,
            state="planned")
        model("Conflict").objects.create(tenant=tenant, run=run, target_type="effect",
                                         target_id=eid, writer_name="w")
        model("ReconcileRequest").objects.create(
            tenant=tenant, run=run, effect=effect, task_id=task, requested_by_name="r",
            next_attempt_at="2026-01-01T00:00:00Z")

        apps = _migrate(AFTER)
        model = lambda name: apps.get_model("checkpoints", name)  # noqa: E731
        assert model("Run").objects.get(pk=run.pk).uuid == rid
        assert model("Checkpoint").objects.get(pk=cp.pk).uuid == cid
        assert model("Effect").objects.get(pk=effect.pk).uuid == eid
        assert model("Conflict").objects.get().target_uuid == eid
        assert model("ReconcileRequest").objects.get().task_uuid == task
        # The unique constraint moved with the column: the same UUID twice in one tenant.
        with pytest.raises(IntegrityError), transaction.atomic():
            model("Run").objects.create(tenant_id=tenant.pk, uuid=rid)

        apps = _migrate(BEFORE)
        assert apps.get_model("checkpoints", "Run").objects.get(pk=run.pk).run_id == rid
        assert apps.get_model("checkpoints", "Effect").objects.get(pk=effect.pk).effect_id == eid
    finally:
        _migrate(_latest())
