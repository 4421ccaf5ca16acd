"""The per-tenant state counters (``RunStateCount``, ``EffectStateCount``; migration 0011's
triggers) always equal a count of the rows, after every kind of change, on both
databases, and the inbox and report read them in a constant number of queries (issue 8).
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import transaction

from checkpoints import selectors, services
from checkpoints.exceptions import StaleRevision
from checkpoints.models import Effect, EffectStateCount, Run, RunStateCount
from checkpoints.services.runs import _drop_if_empty, _lock_run
from tests.helpers import (
    ambiguous_run,
    effect_body,
    envelope,
    put_checkpoint,
    sweep_later,
    walk_effect,
)


def counted(model, tenant) -> dict[str, int]:
    out = Counter()
    for state, n in model.objects.for_tenant(tenant).values_list("state", "n"):
        out[state] += n
    return {state: n for state, n in out.items() if n}


def actual(tenant) -> tuple[dict, dict]:
    runs = Counter(Run.objects.for_tenant(tenant).values_list("recovery_state", flat=True))
    effects = Counter(Effect.objects.for_tenant(tenant).values_list("state", flat=True))
    return dict(runs), dict(effects)


def assert_counts(*tenants):
    for tenant in tenants:
        runs, effects = actual(tenant)
        assert counted(RunStateCount, tenant) == runs, tenant.slug
        assert counted(EffectStateCount, tenant) == effects, tenant.slug
        shown = {s: n for s, n in selectors.state_counts(tenant=tenant).items() if n}
        assert shown == runs


@pytest.mark.django_db
def test_the_counters_follow_every_kind_of_change(acme, globex, wendy, wes, rita):
    assert_counts(acme, globex)
    healthy = envelope()
    put_checkpoint(wendy, acme, healthy)                      # run insert
    put_checkpoint(wes, globex, envelope())                   # the other tenant
    assert_counts(acme, globex)
    put_checkpoint(wendy, acme, dict(healthy, revision=1,
                                     payload={"phase": "done", "order_id": "A-1"}), expected=0)
    assert_counts(acme, globex)                               # healthy -> completed
    run_id = ambiguous_run(wendy, acme)                       # in flight, swept: ambiguous
    assert_counts(acme, globex)
    body = effect_body(run_id=uuid.uuid4())
    walk_effect(wendy, acme, body, "submitted")               # effect inserts and moves
    sweep_later()                                             # submitted -> unresolved
    assert_counts(acme, globex)
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="handled")
    assert_counts(acme, globex)                               # -> closed
    with pytest.raises(StaleRevision):                        # a conflict: -> conflicted
        put_checkpoint(wendy, acme, dict(healthy, revision=1), expected=0)
    assert_counts(acme, globex)


@pytest.mark.django_db
def test_a_deleted_run_and_a_rolled_back_write_leave_the_counts_true(acme, wendy):
    put_checkpoint(wendy, acme, envelope())
    with transaction.atomic():
        run = _lock_run(acme, uuid.uuid4(), create=True)     # the loser of a create race
        _drop_if_empty(run)
    assert_counts(acme)
    with pytest.raises(RuntimeError), transaction.atomic():
        put_checkpoint(wendy, acme, envelope())
        raise RuntimeError("the write's transaction rolls back")
    assert_counts(acme)
    assert sum(counted(RunStateCount, acme).values()) == 1


@pytest.mark.django_db
def test_generated_load_is_counted(db):
    call_command("generate_load", tenants=2, runs=60, revisions=120, seed=3, verbosity=0)
    from checkpoints.models import Tenant

    tenants = list(Tenant.objects.filter(slug__startswith="load-"))
    assert tenants
    assert_counts(*tenants)


@pytest.mark.django_db
def test_counts_and_report_cost_the_same_for_few_and_many_runs(acme, wendy,
                                                                django_assert_num_queries):
    def costs():
        with django_assert_num_queries(1):
            selectors.state_counts(tenant=acme)

    put_checkpoint(wendy, acme, envelope())
    costs()
    for _ in range(30):
        put_checkpoint(wendy, acme, envelope())
    costs()
    assert selectors.state_counts(tenant=acme)["healthy"] == 31


@pytest.mark.django_db
def test_compaction_folds_the_deltas_and_keeps_every_count(acme, globex, wendy, wes):
    for _ in range(4):                                          # runs inserted, then moved
        put_checkpoint(wendy, acme, dict(envelope(), payload={"phase": "done",
                                                              "order_id": "A-1"}))
        ambiguous_run(wendy, acme)
    put_checkpoint(wes, globex, envelope())
    before = RunStateCount.objects.for_tenant(acme).count()
    assert before > 4                                           # one delta per change
    assert services.counters_compact(above=4) >= 1
    assert_counts(acme, globex)
    states = {s for s, n in counted(RunStateCount, acme).items()}
    assert RunStateCount.objects.for_tenant(acme).count() == len(states) < before
    assert set(RunStateCount.objects.for_tenant(acme).values_list("shard", flat=True)) == {0}
    # a tenant below the threshold is left alone; a second pass changes nothing
    assert RunStateCount.objects.for_tenant(globex).count() == 1
    assert services.counters_compact(above=4) == 0
    assert_counts(acme, globex)
