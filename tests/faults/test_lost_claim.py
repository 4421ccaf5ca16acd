"""A reconcile result whose claim was lost is dropped, and one for an effect that moved on
meanwhile is not applied (issue 17, items 14 and 15; DESIGN.md 4,
``checkpoints/jobs/reconciliation.py`` step 3).

A worker claims a request (``running``, ``attempts + 1``, ``claimed_until``), asks the
service, and applies the answer in a second transaction. If the look-up outlives the
claim, the sweep's re-drive lets another worker claim the same request (``attempts``
moves on); when the first worker comes back, its answer belongs to a claim that is no
longer its own. ``_apply`` then answers ``lost_claim`` and writes nothing: no effect
transition, no attempt row, no audit event, the request left to the worker that holds it.
"""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Effect, EffectRevision, ReconcileAttempt
from checkpoints.reconcile import Answer
from tests.faults import stubs
from tests.faults.conftest import in_doubt_run, request_for
from tests.helpers import age_world, effect_body, put_effect
from tests.views.reconcilers import Scripted


@pytest.fixture
def queued(acme, wendy, rita, monkeypatch, django_capture_on_commit_callbacks):
    """A request for a gone owner's submitted effect, stored but not yet run; the
    tenant's reconciler answers ``found`` with a receipt."""
    stubs.use_plugin(acme, "payments", "tests.views.reconcilers.Scripted")
    monkeypatch.setattr(Scripted, "answers", [Answer.found({"charge_id": "ch_late"}, "late")])
    monkeypatch.setattr(Scripted, "asked", [])
    run = in_doubt_run(wendy, acme)
    age_world(3600)
    with django_capture_on_commit_callbacks(execute=False):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="died")
    return run


def _reclaimed_during_the_look_up(monkeypatch, pk: int, then=None) -> list:
    """While the first worker waits for the service, its claim lapses and a second
    worker claims the request (``_claim``, as a re-drive's delivery would); ``then`` runs
    after that claim (the second worker's own progress). Returns the second claims."""
    real = reconciliation.lookup_with_timeout
    second: list = []

    def slow_look_up(configured, ref):
        answer = real(configured, ref)
        if not second:
            age_world(configured.timeout_s + 3600)  # past claimed_until
            second.append(reconciliation._claim(pk))
            if then:
                then()
        return answer

    monkeypatch.setattr(reconciliation, "lookup_with_timeout", slow_look_up)
    return second


def test_an_answer_whose_claim_another_worker_took_is_dropped(acme, queued, monkeypatch):
    req = request_for(queued.effects["charge:A-1"])
    second = _reclaimed_during_the_look_up(monkeypatch, req.pk)
    events = AuditEvent.objects.count()

    result = reconciliation.execute(req.pk)

    assert result == {"request": req.pk, "result": "lost_claim"}
    assert second and second[0] is not None, "the second worker could not claim"
    effect = Effect.objects.get(uuid=queued.effects["charge:A-1"])
    assert (effect.state, effect.receipt) == ("submitted", None)
    assert not EffectRevision.objects.filter(effect=effect, source="reconciliation").exists()
    assert not ReconcileAttempt.objects.filter(request=req).exists()
    assert AuditEvent.objects.count() == events
    req.refresh_from_db()
    # The request is the second worker's: still running under its claim (attempt 2).
    assert (req.state, req.attempts) == ("running", 2)


def test_an_answer_whose_claim_was_finished_elsewhere_is_dropped(acme, queued, monkeypatch):
    """The second worker claimed and settled it before the first came back: the first
    one's answer changes nothing, and the request keeps the second one's outcome."""
    req = request_for(queued.effects["charge:A-1"])
    effect_id = queued.effects["charge:A-1"]
    settled: list = []

    def second_worker_settles():
        claim = reconciliation._claim(req.pk)  # already claimed: the re-drive's copy
        assert claim is None
        fresh, started = second[0]
        effect = Effect.objects.get(uuid=effect_id)
        settled.append(reconciliation._apply(
            fresh, effect, effect.attempt, Answer.not_executed("never seen"), None, "",
            "scripted", started))

    second = _reclaimed_during_the_look_up(monkeypatch, req.pk, then=second_worker_settles)

    result = reconciliation.execute(req.pk)

    assert result["result"] == "lost_claim"
    assert settled[0]["result"] == "not_executed"
    effect = Effect.objects.get(uuid=effect_id)
    assert effect.state == "not_executed"
    assert EffectRevision.objects.filter(effect=effect, source="reconciliation",
                                         state="confirmed").count() == 0
    req.refresh_from_db()
    assert (req.state, req.outcome, req.attempts) == ("done", "not_executed", 2)
    assert ReconcileAttempt.objects.filter(request=req).count() == 1
    assert AuditEvent.objects.filter(action="effect.reconcile",
                                     target_ref=str(effect_id)).count() == 1


def test_an_answer_for_an_effect_the_runtime_settled_during_the_look_up_is_moved_on(
        acme, wendy, queued, monkeypatch):
    """Apply re-reads the effect under the run's lock: the runtime came back and
    confirmed it while the service was asked, so the answer is not applied (the
    runtime's receipt stays) and the request ends ``moved_on`` (same attempt number:
    only the state moved)."""
    req = request_for(queued.effects["charge:A-1"])
    effect_id = queued.effects["charge:A-1"]
    real = reconciliation.lookup_with_timeout

    def runtime_confirms_meanwhile(configured, ref):
        answer = real(configured, ref)
        fx = effect_body(effect_id, queued.run_id, operation_key="charge:A-1")
        put_effect(wendy, acme, dict(fx, revision=2, state="confirmed",
                                     receipt={"charge_id": "ch_runtime"}), expected=1)
        return answer

    monkeypatch.setattr(reconciliation, "lookup_with_timeout", runtime_confirms_meanwhile)

    result = reconciliation.execute(req.pk)

    assert result["result"] == "moved_on", result
    effect = Effect.objects.get(uuid=effect_id)
    assert (effect.state, effect.receipt) == ("confirmed", {"charge_id": "ch_runtime"})
    assert not EffectRevision.objects.filter(effect=effect, source="reconciliation").exists()
    req.refresh_from_db()
    assert (req.state, req.outcome) == ("done", "moved_on")
    assert AuditEvent.objects.filter(action="reconcile.moved_on",
                                     target_ref=str(effect_id)).count() == 1
