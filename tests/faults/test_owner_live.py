"""Issue 5, faults 1 and 2 of "What to build": reconcile while the owner is alive, and a
"not found" that comes within the settle delay.

A runtime that holds a live lease (or wrote recently) may have its call still on the
wire: the provider has not seen the key *yet*. Reconciling then must not call the charge
"not executed". So the API refuses while the owner is live (409 owner_live), a job queued
earlier waits when its owner comes back (before or during the look-up), and a 404 settles
``not_executed`` only once the owner is gone *and* the settle delay since ``submitted`` has
passed; until then the request waits and a later run settles it.
"""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.exceptions import OwnerLive
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Effect, EffectRevision, ReconcileRequest, Run
from tests.api.apihelpers import get, post, snapshot
from tests.faults.conftest import in_doubt_run, request_for
from tests.helpers import age_world

RECEIPT = b'{"status": "succeeded", "charge_id": "ch_9", "amount_cents": 2599}'


def test_it_refuses_to_reconcile_a_run_whose_lease_is_live_and_changes_nothing(
        acme, wendy, rita, api_as, stub):
    run = in_doubt_run(wendy, acme, lease_ttl=3600)
    # Quiet for longer than the tenant's threshold: only the live lease keeps the owner.
    age_world(400)
    before = snapshot()

    r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "stuck?"})

    assert r.status_code == 409, r.content
    body = r.json()
    assert body["error"] == "owner_live"
    leased_until = Run.objects.get(uuid=run.run_id).lease_expires_at
    assert body["lease_expires_at"] == leased_until.isoformat()
    assert snapshot() == before
    assert not ReconcileRequest.objects.exists()
    assert stub.seen == []  # the provider was never asked


def test_a_queued_request_waits_when_its_owner_came_back_before_the_look_up(
        acme, wendy, rita, stub, django_capture_on_commit_callbacks):
    run = in_doubt_run(wendy, acme)
    age_world(400)  # the owner went quiet: reconcile is allowed
    with django_capture_on_commit_callbacks(execute=False):
        queued = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                        reason="worker died?")
    (req,) = queued.requests
    # Before any worker ran it, the runtime restarts and takes the run again.
    lease = services.lease_acquire(actor=wendy, tenant=acme, run_id=run.run_id,
                                   owner="worker-2", ttl_s=60)

    result = reconciliation.execute(req.pk)

    assert result["result"] == "waiting"
    effect = Effect.objects.get(uuid=run.effects["charge:A-1"])
    assert (effect.state, effect.revision) == ("submitted", 1)
    assert stub.seen == []
    req.refresh_from_db()
    assert req.state == "queued" and req.next_attempt_at > lease.lease_expires_at
    assert "live" in req.last_error
    (attempt,) = req.attempt_log.all()
    assert (attempt.answer, attempt.applied) == ("owner_live", "")
    assert not AuditEvent.objects.filter(action="effect.reconcile").exists()


def test_an_answer_is_dropped_when_the_owner_came_back_during_the_look_up(
        acme, wendy, rita, stub, monkeypatch, django_capture_on_commit_callbacks):
    run = in_doubt_run(wendy, acme)
    age_world(400)
    with django_capture_on_commit_callbacks(execute=False):
        (req,) = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                        reason="worker died?").requests
    real_lookup = reconciliation.lookup_with_timeout

    def owner_returns_while_we_ask(configured, ref):
        answer = real_lookup(configured, ref)  # 404: the provider has not seen the key yet
        services.lease_acquire(actor=wendy, tenant=acme, run_id=run.run_id,
                               owner="worker-2", ttl_s=60)
        return answer

    monkeypatch.setattr(reconciliation, "lookup_with_timeout", owner_returns_while_we_ask)

    assert reconciliation.execute(req.pk)["result"] == "waiting"

    assert stub.looked_up("charge:A-1") == 1
    effect = Effect.objects.get(uuid=run.effects["charge:A-1"])
    assert (effect.state, effect.revision) == ("submitted", 1)
    req.refresh_from_db()
    assert req.state == "queued"
    assert req.attempt_log.get().answer == "owner_live"
    # The owner then confirms its charge: accepted, not a 412 against "not executed".
    services.effect_put(
        actor=wendy, tenant=acme,
        body=services.parse_effect(
            {**_effect_json(effect), "revision": 2, "state": "confirmed",
             "receipt": {"charge_id": "ch_9"}}, url_id=effect.uuid),
        expected_revision=1,
        fencing_token=Run.objects.get(uuid=run.run_id).fencing_token)
    assert Effect.objects.get(pk=effect.pk).state == "confirmed"


def _effect_json(effect) -> dict:
    return {"id": str(effect.uuid), "run_id": str(effect.run.uuid),
            "operation_key": effect.operation_key, "service": effect.service,
            "effect_class": effect.effect_class,
            "request_fingerprint": effect.request_fingerprint, "receipt": None}


def test_the_service_refuses_reconcile_for_a_live_owner_with_its_expiry(acme, wendy, rita):
    run = in_doubt_run(wendy, acme, lease_ttl=120)
    with pytest.raises(OwnerLive) as caught:
        services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="x")
    expires = Run.objects.get(uuid=run.run_id).lease_expires_at
    assert caught.value.body()["lease_expires_at"] == expires.isoformat()
    assert not ReconcileRequest.objects.exists()


@pytest.fixture
def long_settle(settings):
    settings.RECOVERY_RECONCILE_SETTLE_DELAY_S = 600
    return 600


def test_not_found_waits_for_the_settle_delay_then_a_later_sweep_settles_it(
        acme, wendy, rita, api_as, stub, long_settle, django_capture_on_commit_callbacks):
    run = in_doubt_run(wendy, acme, keys=("charge:A-1", "charge:A-2"), lease_ttl=60)
    stub.answer("charge:A-2", RECEIPT)  # A-2 happened; A-1 the provider never saw (yet)
    age_world(61)  # the lease expired: the owner is gone, but A-1 was submitted 61 s ago
    with django_capture_on_commit_callbacks(execute=True):
        r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "died"})
    assert r.status_code == 202, r.content

    waiting = Effect.objects.get(uuid=run.effects["charge:A-1"])
    assert waiting.state == "submitted"  # not "not_executed": the call may be on its way
    found = Effect.objects.get(uuid=run.effects["charge:A-2"])
    assert found.state == "confirmed"  # a found answer needs no settle delay
    req = request_for(waiting.uuid)
    assert (req.state, req.failures) == ("queued", 0)
    assert req.attempt_log.get().answer == "settling"
    shown = {q["operation_key"]: q for q in
             get(api_as(rita), "acme", f"runs/{run.run_id}").json()["reconcile_requests"]}
    assert shown["charge:A-1"]["state"] == "queued"
    assert "settle delay" in shown["charge:A-1"]["last_error"]

    # Run again before the delay: not due yet, nothing asked, nothing moved.
    assert reconciliation.execute(req.pk)["result"] == "skipped"
    services.sweep_stale_runs()  # owner gone: submitted -> unresolved; the request not due
    assert stub.looked_up("charge:A-1") == 1
    assert Effect.objects.get(pk=waiting.pk).state == "unresolved"

    age_world(long_settle)
    services.sweep_stale_runs()  # re-drives the due request (in-process without a broker)

    settled = Effect.objects.get(pk=waiting.pk)
    assert settled.state == "not_executed"
    req.refresh_from_db()
    assert (req.state, req.outcome, req.attempts) == ("done", "not_executed", 2)
    assert stub.looked_up("charge:A-1") == 2
    assert list(EffectRevision.objects.filter(effect=settled).values_list("state", "source")) \
        == [("planned", "runtime"), ("submitted", "runtime"), ("unresolved", "sweep"),
            ("not_executed", "reconciliation")]
    assert AuditEvent.objects.filter(action="effect.reconcile",
                                     target_ref=str(settled.uuid)).count() == 1
    assert services.audit_verify(tenant=acme)[0]


def test_not_found_is_asked_again_only_once_the_settle_delay_has_passed(
        acme, wendy, rita, stub, long_settle, django_capture_on_commit_callbacks):
    run = in_doubt_run(wendy, acme)
    age_world(301)  # quiet past the threshold (no lease), submitted 301 s ago < 600 s
    with django_capture_on_commit_callbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="died")
    req = request_for(run.effects["charge:A-1"])
    effect = Effect.objects.get(uuid=run.effects["charge:A-1"])
    settle_at = effect.submitted_at.timestamp() + long_settle
    assert req.next_attempt_at.timestamp() >= settle_at
    for _ in range(4):
        age_world(60)  # 301 + 240 < 600: still inside the settle delay
        assert reconciliation.execute(req.pk)["result"] == "skipped"
        services.sweep_stale_runs()
    req.refresh_from_db()
    assert (req.state, req.attempts, req.failures) == ("queued", 1, 0)  # waiting: no failure
    assert stub.looked_up("charge:A-1") == 1
    assert Effect.objects.get(pk=effect.pk).state == "unresolved"  # the sweep's move only


def test_an_answer_still_applies_when_the_sweep_unresolved_the_effect_during_the_look_up(
        acme, wendy, rita, stub, monkeypatch, django_capture_on_commit_callbacks):
    """The sweep (beat, on another worker) moves ``submitted`` -> ``unresolved`` while a
    slow look-up is out: the effect is still in doubt, so the answer must still settle it
    (not be dropped as "moved on", leaving an unresolved effect nobody reconciles)."""
    run = in_doubt_run(wendy, acme)
    stub.answer("charge:A-1", RECEIPT)
    age_world(400)
    with django_capture_on_commit_callbacks(execute=False):
        (req,) = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                        reason="worker died?").requests
    real_lookup = reconciliation.lookup_with_timeout

    def sweep_meanwhile(configured, ref):
        answer = real_lookup(configured, ref)
        assert services.sweep_stale_runs()["effects_unresolved"] == 1
        return answer

    monkeypatch.setattr(reconciliation, "lookup_with_timeout", sweep_meanwhile)

    assert reconciliation.execute(req.pk)["result"] == "confirmed"

    effect = Effect.objects.get(uuid=run.effects["charge:A-1"])
    assert (effect.state, effect.receipt["charge_id"]) == ("confirmed", "ch_9")
    assert list(EffectRevision.objects.filter(effect=effect).values_list("state", "source")) \
        == [("planned", "runtime"), ("submitted", "runtime"), ("unresolved", "sweep"),
            ("confirmed", "reconciliation")]
    req.refresh_from_db()
    assert (req.state, req.outcome) == ("done", "confirmed")
    # Still ambiguous only for its in-flight checkpoint: no effect is left in doubt.
    assert Run.objects.get(uuid=run.run_id).recovery_reason == \
        "checkpoint in flight, owner gone"
