"""``manage.py generate_load`` (issue 8): the counts asked for, runs in every recovery
state consistent with the policy, a page that renders, and no loading of a real database.

Small sizes only; the benchmark (``make bench``) runs it at its real sizes.
"""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from checkpoints import policy, services
from checkpoints.models import (
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    RetryRequest,
    Run,
    Tenant,
)
from checkpoints.vocab import RecoveryState, RetryState

LONG_RUN = uuid.UUID("0193a4f2-0000-7000-8000-000000000030")


def _load(*args: str) -> str:
    out = StringIO()
    call_command("generate_load", *args, "--no-progress", "--seed", "7", stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_generates_the_counts_asked_in_every_state():
    _load("--tenants", "3", "--runs", "60", "--revisions", "150", "--batch", "25",
          "--long-run", str(LONG_RUN), "--long-run-revisions", "40")
    tenants = Tenant.objects.filter(slug__startswith="load-").order_by("slug")
    assert [t.slug for t in tenants] == ["load-00", "load-01", "load-02"]
    runs = Run.objects.for_tenant(tenants)
    assert runs.count() == 61
    assert CheckpointRevision.objects.for_tenant(tenants).count() == 150 + 40
    assert Checkpoint.objects.for_tenant(tenants).count() == 61
    assert set(runs.values_list("recovery_state", flat=True)) == set(RecoveryState.values)
    assert Effect.objects.for_tenant(tenants).exists()
    assert EffectRevision.objects.for_tenant(tenants).count() >= Effect.objects.for_tenant(
        tenants).count()
    assert RetryRequest.objects.for_tenant(tenants).filter(state=RetryState.APPROVED).exists()

    long_run = runs.get(uuid=LONG_RUN)
    assert long_run.tenant.slug == "load-00"
    assert long_run.latest_checkpoint.revision == 39
    assert CheckpointRevision.objects.for_tenant(long_run.tenant).filter(
        checkpoint__run=long_run).count() == 40

    # Each run is what the services would have written: the stored state and reason are
    # the policy's for the run's facts, the conflict count its unacknowledged conflicts,
    # the latest checkpoint the run's and its last revision.
    for run in runs.select_related("tenant", "latest_checkpoint"):
        state, reason = policy.recovery_state(services.run_facts(run))
        assert (run.recovery_state, run.recovery_reason) == (state, reason[:256]), run.uuid
        assert run.unacknowledged_conflicts == Conflict.objects.for_tenant(run.tenant).filter(
            run=run, acknowledged_at__isnull=True).count()
        cp = run.latest_checkpoint
        assert cp.run_id == run.pk and (cp.kind, cp.phase_class) == (run.kind, run.phase_class)
        assert CheckpointRevision.objects.for_tenant(run.tenant).filter(
            checkpoint=cp).order_by("-revision").values_list("revision", flat=True)[0] \
            == cp.revision

    # A second call adds to the same tenants.
    _load("--tenants", "3", "--runs", "10", "--revisions", "10")
    assert Run.objects.for_tenant(tenants).count() == 71


@pytest.mark.django_db
def test_the_inbox_and_run_page_render():
    _load("--tenants", "1", "--runs", "20", "--long-run", str(LONG_RUN),
          "--long-run-revisions", "25")
    client = Client()
    client.force_login(get_user_model().objects.get(username="load-00-reviewer"))
    for state in (*RecoveryState.INBOX_TABS, "all"):
        assert client.get(f"/t/load-00/?state={state}").status_code == 200
    page = client.get(f"/t/load-00/runs/{LONG_RUN}/")
    assert page.status_code == 200
    assert client.get(f"/api/v1/tenants/load-00/runs/{LONG_RUN}").status_code == 200
    assert client.get("/t/load-00/report/").status_code == 200


@pytest.mark.django_db
def test_refuses_a_database_with_other_tenants_unless_forced(acme):
    with pytest.raises(CommandError, match="tenants it did not make"):
        _load("--tenants", "1", "--runs", "5")
    assert not Tenant.objects.filter(slug__startswith="load-").exists()
    _load("--tenants", "1", "--runs", "5", "--force")
    assert Run.objects.for_tenant(Tenant.objects.get(slug="load-00")).count() == 5
    assert not Run.objects.for_tenant(acme).exists()


@pytest.mark.django_db
def test_refuses_a_hand_made_tenant_named_like_its_own(db):
    """A tenant someone called ``load-00`` is somebody's data: the slug alone does not
    make it generated."""
    from checkpoints import services

    services.tenant_create(slug="load-00", name="Real customer")
    with pytest.raises(CommandError, match="tenants it did not make"):
        _load("--tenants", "1", "--runs", "5")
    assert not Run.objects.for_all_tenants(reason="test: nothing was added").exists()


@pytest.mark.parametrize("args", [
    ("--batch", "0"), ("--batch", "-5"), ("--runs", "3", "--revisions", "99999999999"),
    ("--long-run-revisions", "0"), ("--tenants", "0"),
])
@pytest.mark.django_db
def test_refuses_arguments_that_would_never_end(db, args):
    with pytest.raises(CommandError):
        _load("--runs", "5", *args)
    assert not Tenant.objects.exists()
