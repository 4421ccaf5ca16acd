"""Migration 0004 (issue 6): clear receipts of existing rows are encrypted, labels that
quoted a payload value are scrubbed, and going back restores the receipts."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from checkpoints import crypto

BEFORE = [("checkpoints", "0003_reconcile_jobs_close")]
SECRET = "rcpt-OLD-5150"


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _latest():
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes("checkpoints")


# PostgreSQL only: the upgrade of an install that holds data, which production runs on; on
# SQLite each step rebuilds its tables: this test and its twin (receipts, uuid names) took
# 84 s and 46 s of the SQLite pass (stop 40).
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_encrypts_old_receipts_and_scrubs_leaky_labels_then_restores_on_the_way_back():
    apps = _migrate(BEFORE)
    try:
        tenant = apps.get_model("checkpoints", "Tenant").objects.create(slug="old", name="old")
        Run = apps.get_model("checkpoints", "Run")
        leaky = "payload does not match acme.order v1: payload.phase must be one of " \
                "['ready'], not 'TOPSECRET'"
        run = Run.objects.create(tenant=tenant, run_id=uuid.uuid4(), kind="acme.order",
                                 schema_version=1, phase_class="unsupported", phase_label=leaky,
                                 recovery_state="schema_mismatch", recovery_reason=leaky)
        demo = Run.objects.create(tenant=tenant, run_id=uuid.uuid4(), kind="acme.order",
                                  schema_version=1, phase_class="in_flight",
                                  phase_label="charging order A-77")
        Effect = apps.get_model("checkpoints", "Effect")
        effect = Effect.objects.create(
            tenant=tenant, run=run, effect_id=uuid.uuid4(), revision=1, operation_key="k",
            service="payments", effect_class="non_idempotent", request_fingerprint="0" * 64,
            state="confirmed", receipt={"charge_id": SECRET, "big": 2**60 + 1})
        apps.get_model("checkpoints", "EffectRevision").objects.create(
            tenant=tenant, effect=effect, revision=1, state="confirmed",
            receipt={"charge_id": SECRET, "big": 2**60 + 1}, actor_name="w", source="runtime")
        Effect.objects.create(
            tenant=tenant, run=run, effect_id=uuid.uuid4(), revision=0, operation_key="k2",
            service="payments", effect_class="non_idempotent", request_fingerprint="0" * 64,
            state="planned", receipt=None)

        apps = _migrate(_latest())
        Effect = apps.get_model("checkpoints", "Effect")
        tokens = dict(Effect.objects.values_list("operation_key", "receipt_ciphertext"))
        assert tokens["k2"] == ""
        assert SECRET not in tokens["k"]
        assert crypto.decrypt_text(tokens["k"]) == (
            '{"big":1152921504606846977,"charge_id":"' + SECRET + '"}')
        revision = apps.get_model("checkpoints", "EffectRevision").objects.get()
        assert SECRET in crypto.decrypt_text(revision.receipt_ciphertext)
        Run = apps.get_model("checkpoints", "Run")
        run = Run.objects.get(pk=run.pk)
        assert run.phase_label == run.recovery_reason == "payload does not match acme.order v1"
        assert Run.objects.get(pk=demo.pk).phase_label == "charging"

        apps = _migrate(BEFORE)
        receipts = dict(apps.get_model("checkpoints", "Effect").objects
                        .values_list("operation_key", "receipt"))
        assert receipts == {"k": {"charge_id": SECRET, "big": 2**60 + 1}, "k2": None}
    finally:
        _migrate(_latest())
