"""``purge_expired --dry-run`` counts what the real run does in the same round, and both
say how many runs a legal hold keeps (the operator's walk: with a payload retention of 1
day and an effect retention of 2, a run ended 3 days ago was counted for payloads only,
then the real run expired it too; and a held run was not mentioned at all). One
selection serves both (``services.retention``: ``_payload_candidates``,
``_expiry_candidates``, ``_kept_by_holds``)."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command

from checkpoints import services
from checkpoints.models import AuditEvent, LegalHold, Run, Tombstone
from tests.helpers import age_world

from .retention_world import DAY, build, completed_run, hold_run, set_policy

pytestmark = pytest.mark.django_db


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_the_operators_walk_dry_run_and_real_run_agree_and_name_the_hold(acme, wendy, adam,
                                                                          capsys):
    run = completed_run(wendy, acme)
    hold = hold_run(adam, acme, run)
    set_policy(acme, payload_retention_days=1, effect_retention_days=2)
    age_world(3 * DAY)
    call_command("purge_expired", "--tenant", "acme", "--dry-run")
    assert _lines(capsys) == ["acme: 0 run(s) eligible for payload deletion, 0 for expiry, "
                              "1 kept by a legal hold (dry run: nothing written)"]
    call_command("purge_expired", "--tenant", "acme")
    assert _lines(capsys) == ["acme: 0 run(s)' payloads deleted, 0 run(s) expired, "
                              "0 skipped, 1 kept by a legal hold"]
    assert Run.objects.for_tenant(acme).filter(pk=run.pk, payloads_deleted_at=None).exists()
    LegalHold.objects.for_tenant(acme).filter(pk=hold.pk).update(released_at=hold.placed_at)
    events = AuditEvent.objects.count()
    call_command("purge_expired", "--tenant", "acme", "--dry-run")
    assert _lines(capsys) == ["acme: 1 run(s) eligible for payload deletion, 1 for expiry, "
                              "0 kept by a legal hold (dry run: nothing written)"]
    assert AuditEvent.objects.count() == events and not Tombstone.objects.exists()
    call_command("purge_expired", "--tenant", "acme")
    assert _lines(capsys) == ["acme: 1 run(s)' payloads deleted, 1 run(s) expired, "
                              "0 skipped, 0 kept by a legal hold"]
    assert not Run.objects.for_tenant(acme).filter(pk=run.pk).exists()


@pytest.mark.parametrize("tenant_hold", [False, True], ids=["run-hold", "tenant-hold"])
def test_the_dry_run_counts_what_the_round_then_does(acme, wendy, adam, tenant_hold):
    already = completed_run(wendy, acme, order_id="gone", effect=False)
    set_policy(acme, payload_retention_days=1, effect_retention_days=5)
    age_world(2 * DAY)
    assert services.retention_purge(tenant=acme)["purged"] == 1  # "gone": payloads only
    world = build(wendy, adam, acme)  # 3 done, one open, one in doubt, one held
    age_world(3 * DAY)
    fresh = completed_run(wendy, acme, order_id="fresh", effect=False)
    age_world(3 * DAY)  # done and held ended 6 days ago, "fresh" 3, "gone" 8
    if tenant_hold:
        LegalHold.objects.create(tenant=acme, uuid=uuid.uuid4(), scope="tenant",
                                 reason="case", placed_by=adam, placed_by_name="adam")
    dry = services.retention_purge(tenant=acme, dry_run=True)
    real = services.retention_purge(tenant=acme)
    if tenant_hold:  # every run a phase would delete: 3 done, "held", "fresh", "gone"
        expected = {"eligible_payloads": 0, "eligible_expiry": 0, "kept_by_hold": 6}
    else:  # payloads: 3 done + "fresh"; expiry: the 3 done (this round) + "gone"
        expected = {"eligible_payloads": 4, "eligible_expiry": 4, "kept_by_hold": 1}
    assert {k: dry[k] for k in expected} == expected
    assert (real["purged"], real["expired"], real["kept_by_hold"]) == (
        expected["eligible_payloads"], expected["eligible_expiry"], expected["kept_by_hold"])
    kept = set(Run.objects.for_tenant(acme).values_list("uuid", flat=True))
    assert {world.open.uuid, world.doubt.uuid, world.held.uuid, fresh.uuid} <= kept
    assert (already.uuid in kept) is tenant_hold
    assert (world.done[0].uuid in kept) is tenant_hold
