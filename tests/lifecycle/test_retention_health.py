"""A retention purge that fails or never runs is visible (the attack helper's finding):
one tenant's failure does not stop the others, the failure is logged as the purge's,
and ``/readyz`` names ``retention`` until a round succeeds for every tenant."""

from __future__ import annotations

import pytest

from checkpoints import heartbeat, services
from checkpoints.jobs import inprocess
from checkpoints.models import DataPolicy, Heartbeat
from checkpoints.ops import health
from checkpoints.services import retention
from tests.helpers import age_world

pytestmark = pytest.mark.django_db
DAY = 86_400


def _check() -> str:
    return health.readiness()[1]["retention"]


def test_readyz_names_retention_only_once_a_deleting_policy_went_without_a_round(
        acme, adam, settings):
    assert _check() == "not configured"
    services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=30)
    assert _check() == "ok"  # the policy is new: its first round may not have come
    age_world(3 * settings.RECOVERY_RETENTION_INTERVAL_S + 60)
    assert _check() == "failed: RetentionLate"
    assert health.readiness()[0] is False
    services.retention_purge_all()
    assert _check() == "ok"


def test_one_tenant_failing_does_not_stop_the_others_nor_look_like_success(
        acme, globex, adam, omar, monkeypatch, caplog):
    for tenant, admin in ((acme, adam), (globex, None)):
        services.data_policy_set(actor=admin, tenant=tenant, payload_retention_days=30)
    real = retention.retention_purge

    def broken(*, tenant, **kw):
        if tenant.slug == "acme":
            raise RuntimeError("disk full")
        return real(tenant=tenant, **kw)

    monkeypatch.setattr(retention, "retention_purge", broken)
    result = services.retention_purge_all()
    assert result["failed"] == ["acme"]
    assert [t["tenant"] for t in result["tenants"]] == ["globex"]
    beats = heartbeat.read()
    assert retention.ROUND_HEARTBEAT in beats and retention.HEARTBEAT not in beats
    assert "retention purge of tenant acme failed" in caplog.text
    # The in-process worker does not run it again until the next interval.
    assert inprocess.retention_due() is False


def test_the_in_process_round_logs_a_failed_purge_as_the_purges(monkeypatch, caplog):
    monkeypatch.setattr(inprocess, "retention_due", lambda: True)
    monkeypatch.setattr(services, "retention_purge_all",
                        lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    stats = inprocess.run_once()
    assert "retention" not in stats and "retention purge failed" in caplog.text
    assert "sweep.inprocess" in heartbeat.read()
    assert not DataPolicy.objects.exists() and Heartbeat.objects.exists()


def test_a_purge_of_one_tenant_is_not_a_round(acme, globex, adam):
    """``purge_expired --tenant T`` writes no round heartbeat: it would mark every tenant
    healthy in /readyz and postpone the scheduled round (the second attack's finding)."""
    services.data_policy_set(actor=adam, tenant=acme, payload_retention_days=30)
    services.retention_purge_all(tenant_slug="acme")
    beats = heartbeat.read()
    assert retention.HEARTBEAT not in beats and retention.ROUND_HEARTBEAT not in beats
