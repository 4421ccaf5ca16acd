"""A legal hold keeps what is left of a run: its tombstone when only that is left, a held
subject's tombstones, and the subject field it relies on (the attack helper's and the
newcomer's findings, issue 20)."""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.exceptions import InvalidPayload, PurgeRefused
from checkpoints.models import Run, Tombstone
from tests.helpers import age_world, envelope, put_checkpoint
from tests.lifecycle.governance import DAY, keep_tombstones

pytestmark = pytest.mark.django_db


def _customer_run(wendy, acme, customer: str) -> Run:
    body = envelope(payload={"phase": "ready", "customer": customer})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, {**body, "revision": 1,
                                 "payload": {"phase": "completed", "customer": customer}},
                   expected=0)
    return Run.objects.for_tenant(acme).get(uuid=body["run_id"])


@pytest.fixture
def policy(acme, adam):
    services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=1,
                             effect_retention_days=2, restart_interval_s=DAY,
                             subject_fields={"customer": "/customer"})


def _expired(acme, runs):
    """Retention deletes the runs' payloads, then their records (both phases)."""
    age_world(3 * DAY)
    services.retention_purge(tenant=acme)
    age_world(3 * DAY)
    services.retention_purge(tenant=acme)
    assert not Run.objects.for_tenant(acme).filter(pk__in=[r.pk for r in runs]).exists()


def test_a_subject_hold_keeps_its_tombstones_from_the_purge(acme, adam, april, wendy, policy,
                                                            tmp_path):
    held, free = _customer_run(wendy, acme, "c-1"), _customer_run(wendy, acme, "c-2")
    _expired(acme, [held, free])
    stone = Tombstone.objects.for_tenant(acme).get(run_uuid=held.uuid)
    assert [field for field, _ in stone.subjects] == ["customer"]
    assert "c-1" not in str(stone.subjects)  # a keyed digest, never the value
    services.legal_hold_place(actor=adam, tenant=acme, reason="case 9",
                              subject={"field": "customer", "value": "c-1"})
    keep_tombstones(acme, 1)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "e")
    age_world(2 * DAY)
    purge = services.tombstone_purge_prepare(actor=adam, tenant=acme)
    kept = Tombstone.objects.for_tenant(acme).get(run_uuid=held.uuid).pk
    assert kept not in purge.tombstone_ids
    assert Tombstone.objects.for_tenant(acme).get(run_uuid=free.uuid).pk in purge.tombstone_ids


def test_a_run_known_only_by_its_tombstone_can_be_held_and_its_tombstone_stays(
        acme, adam, wendy, policy, tmp_path):
    run = _customer_run(wendy, acme, "c-3")
    _expired(acme, [run])
    hold = services.legal_hold_place(actor=adam, tenant=acme, runs=[str(run.uuid)],
                                     reason="case 10")
    assert hold.scope == "runs"
    keep_tombstones(acme, 1)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "e")
    age_world(2 * DAY)
    with pytest.raises(PurgeRefused):  # its one tombstone is held: nothing to purge
        services.tombstone_purge_prepare(actor=adam, tenant=acme)


def test_an_erasure_of_a_run_only_its_tombstone_is_left_of_says_already_deleted(
        acme, rita, april, wendy, policy):
    run = _customer_run(wendy, acme, "c-4")
    _expired(acme, [run])
    request = services.erasure_request(actor=rita, tenant=acme, runs=[str(run.uuid)],
                                       reason="art. 17")
    services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid)
    request.refresh_from_db()
    assert request.counts["runs"] == 1 and request.counts["already_deleted"] == 1
    assert request.counts["erased"] == 0


def test_a_held_subject_field_cannot_be_removed_or_repointed(acme, adam, policy):
    services.legal_hold_place(actor=adam, tenant=acme, reason="case 11",
                              subject={"field": "customer", "value": "c-5"})
    for fields in ({}, {"customer": "/other"}):
        with pytest.raises(InvalidPayload, match="subject_fields.customer: an active legal"):
            services.data_policy_set(actor=adam, tenant=acme, subject_fields=fields)
    services.data_policy_set(actor=adam, tenant=acme,  # adding one is fine
                             subject_fields={"customer": "/customer", "order": "/order_id"})
