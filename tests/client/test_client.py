"""``recovery_client.client`` and ``recovery_client.aclient`` against the real API (pytest-django
``live_server``); every test runs for both clients (``conftest.open_store``).

The client must mirror runifold-core's store (load / compare_and_swap with error kinds
not_found, conflict, invalid_payload, storage), carry fencing tokens after a lease or a
claimed retry, preview resume decisions without claiming them, and walk effects
planned -> submitted -> confirmed (CONTRACT.md 3, DESIGN.md 1 and 4).
"""

from __future__ import annotations

import json
import socket
import uuid

import pytest

from checkpoints import services
from checkpoints.models import AuditEvent, Conflict, Effect
from recovery_client.client import (
    CheckpointError,
    EffectFailed,
    EffectInDoubt,
    fingerprint,
    next_revision,
)
from tests.api.apihelpers import snapshot
from tests.client.drivers import Pauses, perform
from tests.helpers import age_world, envelope

pytestmark = pytest.mark.django_db(transaction=True)


def create(store, **kw) -> dict:
    body = envelope(**kw)
    assert store.compare_and_swap(body, None) == 0
    return body


def test_it_creates_loads_and_updates_a_checkpoint(store):
    first = create(store)
    second = next_revision(first, {"phase": "charging", "order_id": "A-1042"})

    assert store.compare_and_swap(second, 0) == 1
    loaded = store.load(first["id"])
    assert loaded == second
    assert [r["revision"] for r in store.revisions(first["id"])] == [0, 1]


def test_it_answers_none_when_loading_a_missing_checkpoint(store):
    assert store.load(str(uuid.uuid4())) is None


def test_it_raises_conflict_with_the_current_revision_on_a_stale_write(acme, store):
    first = create(store)
    store.compare_and_swap(next_revision(first, {"phase": "charging"}), 0)

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(next_revision(first, {"phase": "cancelled"}), 0)

    assert (err.value.kind, err.value.status, err.value.current_revision) == ("conflict", 412, 1)
    assert Conflict.objects.filter(target_uuid=first["id"]).count() == 1


def test_it_raises_conflict_when_creating_an_existing_id(store):
    first = create(store)
    before = snapshot()

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(first, None)

    assert err.value.kind == "conflict"
    assert err.value.current_revision == 0
    # The refused create is kept as a conflict of the run (CONTRACT.md 3), nothing else.
    after = snapshot()
    assert len(after.pop("conflicts")) == len(before.pop("conflicts")) + 1
    assert (after.pop("runs")[0][4], before.pop("runs")[0][4]) == (1, 0)
    assert after["checkpoints"] == before["checkpoints"]


def test_it_raises_not_found_when_updating_a_missing_checkpoint(store):
    body = envelope(revision=1)
    before = snapshot()

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(body, 0)

    assert (err.value.kind, err.value.status) == ("not_found", 404)
    assert snapshot() == before


def test_it_raises_invalid_payload_for_a_wrong_revision(store):
    first = create(store)
    before = snapshot()

    with pytest.raises(CheckpointError) as err:
        store.compare_and_swap(dict(first, revision=5), 0)

    assert (err.value.kind, err.value.status) == ("invalid_payload", 400)
    assert "revision" in err.value.message
    assert snapshot() == before


def test_it_raises_storage_when_the_server_cannot_be_reached(open_store):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pauses = Pauses()
    store = open_store(f"http://127.0.0.1:{port}", "acme", "rcv_x", timeout_s=2, sleep=pauses)

    with pytest.raises(CheckpointError) as err:
        store.load(str(uuid.uuid4()))

    assert (err.value.kind, err.value.status, err.value.sent) == ("storage", 0, False)
    assert len(pauses) == 3  # tried again three times (the default retries), then raised


def test_it_answers_not_found_in_a_tenant_the_token_has_no_role_in(acme, wes, make_store, store):
    first = create(store)
    outsider = make_store(wes, tenant="acme")

    assert outsider.load(first["id"]) is None
    with pytest.raises(CheckpointError) as err:
        outsider.compare_and_swap(next_revision(first, {"phase": "cancelled"}), 0)
    assert err.value.kind == "not_found"
    assert store.load(first["id"])["revision"] == 0


def test_it_sends_the_fencing_token_after_a_lease_and_is_fenced_once_taken_over(
        wendy, make_store, store):
    first = create(store)
    lease = store.lease(first["run_id"], "worker-1", ttl_s=30)
    assert store.fencing_token == lease["fencing_token"] == 1
    store.compare_and_swap(next_revision(first, {"phase": "charging"}), 0)

    other = make_store(wendy)
    before = snapshot()
    with pytest.raises(CheckpointError) as held:
        other.lease(first["run_id"], "worker-2", ttl_s=30)
    assert (held.value.kind, held.value.error) == ("conflict", "lease_held")
    assert snapshot() == before  # worker-1 keeps the lease and token 1
    with pytest.raises(CheckpointError) as fenced:  # no token while the lease is live
        other.compare_and_swap(next_revision(dict(first, revision=1), {"phase": "charged"}), 1)
    assert (fenced.value.kind, fenced.value.status, fenced.value.error) == (
        "conflict", 409, "fenced")


def test_it_previews_and_claims_resume_decisions_with_identity(store):
    first = create(store, payload={"phase": "ready", "order_id": "A-1", "workflow": "acme.order"})

    preview = store.resume_preview(first["run_id"], workflow="acme.order")
    claimed = store.resume(first["run_id"], workflow="acme.order")
    mismatch = store.resume(first["run_id"], workflow="other.flow")

    assert (preview["action"], preview["reason"]) == ("continue", "stable")
    assert (preview["checkpoint_id"], preview["revision"]) == (first["id"], 0)
    assert (claimed["action"], claimed["reason"]) == ("continue", "stable")
    assert (claimed["checkpoint_id"], claimed["revision"]) == (first["id"], 0)
    assert isinstance(claimed["fencing_token"], int)
    assert (mismatch["action"], mismatch["reason"]) == ("reject", "identity_mismatch")
    assert store.resume_preview(first["run_id"], workflow="other.flow")["reason"] == (
        "identity_mismatch")
    assert store.fencing_token is None  # only a claimed retry hands over a token


def test_it_sends_the_runtimes_usage_with_a_resume_claim(store):
    """Sync and async (``store`` is both): the counters reach the server's usage rule."""
    from tests.services.test_usage import agent_payload  # one fixture payload for both

    first = create(store, kind="runifold.agent", payload=agent_payload(tokens=40, turns=1))
    same = store.resume(first["run_id"], usage={"tokens": 40, "turns": 1})
    more = store.resume(first["run_id"], usage={"tokens": 41, "turns": 1})
    assert (same["action"], same["reason"]) == ("continue", "stable")
    assert (more["action"], more["reason"]) == ("reject", "usage_mismatch")


def test_it_raises_for_resume_on_a_missing_run_or_without_the_writer_role(
        rita, make_store, store):
    run_id = create(store)["run_id"]
    reviewer = make_store(rita)

    for call in (store.resume, store.resume_preview):
        with pytest.raises(CheckpointError) as missing:
            call(str(uuid.uuid4()))
        assert (missing.value.kind, missing.value.status) == ("not_found", 404)
    with pytest.raises(CheckpointError) as forbidden:
        reviewer.resume(run_id)
    assert (forbidden.value.kind, forbidden.value.status) == ("storage", 403)
    with pytest.raises(TypeError):
        store.resume(run_id, agnet="typo")  # a misspelt identity is never sent silently


def test_the_claim_body_is_a_strict_json_object(store):
    run_id = create(store)["run_id"]
    before = snapshot()

    with pytest.raises(CheckpointError) as unknown:
        store.request("POST", f"runs/{run_id}/resume", {"workflow": "acme.order", "bogus": 1})
    with pytest.raises(CheckpointError) as not_a_string:
        store.request("POST", f"runs/{run_id}/resume", {"workflow": 7})

    assert (unknown.value.kind, unknown.value.status) == ("invalid_payload", 400)
    assert (not_a_string.value.kind, not_a_string.value.status) == ("invalid_payload", 400)
    assert snapshot() == before


def test_it_lists_runs_by_recovery_state_across_pages(store):
    made = {create(store)["run_id"] for _ in range(3)}
    done = create(store, payload={"phase": "completed", "order_id": "A-9"})["run_id"]

    healthy = {r["run_id"] for r in store.list_runs(recovery_state="healthy", limit=2)}
    everything = [r["run_id"] for r in store.list_runs(limit=1)]

    assert healthy == made
    assert sorted(everything) == sorted([*made, done])
    assert [r["run_id"] for r in store.list_runs(recovery_state="completed")] == [done]
    assert list(store.list_runs(recovery_state="retry_approved")) == []


def test_it_computes_a_stable_lower_case_fingerprint():
    assert fingerprint({"b": 1, "a": [1, 2]}) == fingerprint({"a": [1, 2], "b": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert len(fingerprint({})) == 64 and fingerprint({}) == fingerprint({}).lower()


def _effect(store, run_id, call, key="charge:A-7", request=None, **kw):
    return perform(store, run_id=run_id, service="payments", operation_key=key,
                          effect_class="non_idempotent",
                          request=request or {"order_id": "A-7", "amount_cents": 700},
                          call=call, **kw)


def test_it_walks_an_effect_to_confirmed_with_the_key_as_idempotency_key(store):
    run_id = create(store)["run_id"]
    calls, steps = [], []

    receipt = _effect(store, run_id, lambda key: calls.append(key) or {"charge_id": "ch_7"},
                      on_step=steps.append)

    assert receipt == {"charge_id": "ch_7"}
    assert calls == ["charge:A-7"]
    assert steps == ["submitted", "called", "confirmed"]
    effect = Effect.objects.get(operation_key="charge:A-7")
    assert (effect.state, effect.revision, effect.receipt) == ("confirmed", 2, receipt)


def test_it_stores_the_request_of_an_idempotent_effect_for_the_replay_reconciler(store):
    from checkpoints import crypto

    run_id = create(store)["run_id"]
    request = {"order_id": "A-8", "amount_cents": 800}
    perform(store, run_id=run_id, service="refunds", operation_key="refund:A-8",
                   effect_class="idempotent", request=request, call=lambda key: {"ok": 1})
    _effect(store, run_id, lambda key: {"charge_id": "ch_7"})
    kept = Effect.objects.get(operation_key="refund:A-8").request_ciphertext
    assert json.loads(crypto.decrypt_text(kept)) == request
    assert Effect.objects.get(operation_key="charge:A-7").request_ciphertext == ""


def test_it_replays_a_confirmed_effect_without_calling_again(store):
    run_id = create(store)["run_id"]
    _effect(store, run_id, lambda key: {"charge_id": "ch_7"})
    calls = []

    receipt = _effect(store, run_id, lambda key: calls.append(key) or {"charge_id": "ch_8"})

    assert receipt == {"charge_id": "ch_7"}
    assert calls == []
    assert Effect.objects.filter(operation_key="charge:A-7").count() == 1


def test_it_refuses_to_reuse_a_key_for_another_request(store):
    run_id = create(store)["run_id"]
    _effect(store, run_id, lambda key: {"charge_id": "ch_7"})
    before = snapshot()

    with pytest.raises(CheckpointError) as err:
        _effect(store, run_id, lambda key: pytest.fail("must not call"),
                request={"order_id": "A-7", "amount_cents": 1})

    assert (err.value.kind, err.value.status, err.value.error) == (
        "invalid_payload", 422, "idempotency_key_reuse")
    assert snapshot() == before


def test_it_records_failed_when_the_service_refuses(store):
    run_id = create(store)["run_id"]

    def refuse(key):
        raise EffectFailed("card declined", {"error": "card_declined"})

    with pytest.raises(EffectFailed):
        _effect(store, run_id, refuse)

    effect = Effect.objects.get(operation_key="charge:A-7")
    assert (effect.state, effect.receipt) == ("failed", {"error": "card_declined"})


def test_it_leaves_the_effect_submitted_and_refuses_to_call_again_after_an_error(store):
    run_id = create(store)["run_id"]

    def lost(key):
        raise TimeoutError("no answer")

    with pytest.raises(TimeoutError):
        _effect(store, run_id, lost)
    with pytest.raises(EffectInDoubt) as err:
        _effect(store, run_id, lambda key: pytest.fail("must not call an in-doubt effect"))

    assert err.value.effect["state"] == "submitted"


def test_it_calls_again_only_after_an_approved_retry_was_consumed(acme, rita, april, store):
    first = create(store)
    run_id = first["run_id"]
    store.lease(run_id, "worker-1", ttl_s=30)
    with pytest.raises(TimeoutError):
        _effect(store, run_id, lambda key: (_ for _ in ()).throw(TimeoutError("lost")))
    effect = Effect.objects.get(operation_key="charge:A-7")
    age_world(3600)  # the owner is gone: a reviewer may declare it
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid,
                                 reason="the processor cannot tell")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=effect.run.uuid,
                                   reason="customer confirmed no charge")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    with pytest.raises(EffectInDoubt):  # not without retry=True
        _effect(store, run_id, lambda key: pytest.fail("must not call"))

    previews = [store.resume_preview(run_id) for _ in range(2)]
    assert store.fencing_token == 1  # a preview hands over nothing
    decision = store.resume(run_id)
    again = store.resume(run_id)
    receipt = _effect(store, run_id, lambda key: {"charge_id": "ch_2"}, retry=True)

    assert [(p["action"], p["reason"]) for p in previews] == [("retry", "retry_approved")] * 2
    assert (decision["action"], decision["reason"]) == ("retry", "retry_approved")
    assert again["action"] != "retry"  # one approval, one claim
    assert store.fencing_token == decision["fencing_token"] == 2
    effect.refresh_from_db()
    assert (effect.state, effect.attempt, receipt) == ("confirmed", 2, {"charge_id": "ch_2"})
    consumed = AuditEvent.objects.filter(run_uuid=effect.run.uuid, action="retry.consume")
    assert consumed.count() == 1


def test_a_claimed_retry_fences_the_old_owner(acme, rita, april, wendy, make_store, store):
    first = create(store, payload={"phase": "charging", "order_id": "A-8"})
    run_id = first["run_id"]
    store.lease(run_id, "worker-1", ttl_s=1)
    age_world(3600)  # worker-1's lease has long expired (database clock; no sleeping)
    services.sweep_stale_runs()
    retry = services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(run_id),
                                   reason="worker died")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    restarted = make_store(wendy)

    decision = restarted.resume(run_id)
    restarted.compare_and_swap(next_revision(first, {"phase": "charged", "order_id": "A-8"}),
                               0)

    assert decision["action"] == "retry"
    assert restarted.fencing_token == decision["fencing_token"] == 2
    with pytest.raises(CheckpointError) as fenced:  # the zombie still holds token 1
        store.compare_and_swap(next_revision(dict(first, revision=1), {"phase": "cancelled"}),
                               1)
    assert (fenced.value.kind, fenced.value.error, fenced.value.body["fencing_token"]) == (
        "conflict", "fenced", 2)
    assert restarted.load(first["id"])["payload"]["phase"] == "charged"  # not cancelled


def test_a_reviewer_ends_a_dead_owners_lease_and_its_writes_are_fenced(
        acme, rita, omar, make_store, store):
    """``revoke_lease`` (``POST …/runs/{id}/lease/revoke``): the lease's end, with its
    409s as conflicts naming the server's word, both clients."""
    first = create(store, payload={"phase": "charging", "order_id": "A-9"})
    run_id = first["run_id"]
    assert store.lease(run_id, "worker-1", ttl_s=3600)["fencing_token"] == 1
    reviewer, outsider = make_store(rita), make_store(omar)  # each token issue is audited

    before = snapshot()
    with pytest.raises(CheckpointError) as held:  # not the lease the reviewer saw
        reviewer.revoke_lease(run_id, "worker-1 died", owner="worker-2")
    assert (held.value.kind, held.value.status, held.value.error) == (
        "conflict", 409, "lease_held")
    with pytest.raises(CheckpointError) as taken_again:
        reviewer.revoke_lease(run_id, "worker-1 died", owner="worker-1", fencing_token=7)
    assert (taken_again.value.kind, taken_again.value.error) == ("conflict", "lease_held")
    with pytest.raises(CheckpointError) as no_reason:
        reviewer.revoke_lease(run_id, "")
    assert (no_reason.value.kind, no_reason.value.status) == ("invalid_payload", 400)
    with pytest.raises(CheckpointError) as writer:  # the writer's token has no review right
        store.revoke_lease(run_id, "worker-1 died")
    assert (writer.value.kind, writer.value.status) == ("storage", 403)
    for who, rid in ((outsider, run_id), (reviewer, str(uuid.uuid4()))):
        with pytest.raises(CheckpointError) as missing:
            who.revoke_lease(rid, "worker-1 died")
        assert missing.value.kind == "not_found"
    assert snapshot() == before  # nothing refused wrote anything

    ended = reviewer.revoke_lease(run_id, "worker-1 died", owner="worker-1", fencing_token=1)
    assert (ended["owner"], ended["fencing_token"]) == ("worker-1", 2)
    assert isinstance(ended["expires_at"], str)
    assert reviewer.fencing_token is None  # the reviewer's store holds no lease
    [event] = AuditEvent.objects.filter(run_uuid=run_id, action="lease.revoke")
    assert (event.actor_name, event.reason) == ("rita", "worker-1 died")
    with pytest.raises(CheckpointError) as fenced:  # worker-1 still sends token 1
        store.compare_and_swap(next_revision(first, {"phase": "charged", "order_id": "A-9"}), 0)
    assert (fenced.value.kind, fenced.value.error) == ("conflict", "fenced")
    with pytest.raises(CheckpointError) as again:  # ended once: nothing left to end
        reviewer.revoke_lease(run_id, "worker-1 died")
    assert (again.value.kind, again.value.status, again.value.error) == (
        "conflict", 409, "no_live_lease")


def test_a_runtime_gives_back_its_lease_and_the_next_takes_the_run_at_once(
        wendy, make_store, store):
    """``release_lease`` (``POST …/runs/{id}/lease/release``, stop 39): the token this
    store holds is sent, then forgotten; a write still on its way with it is fenced; the
    next worker takes the lease at once. Both clients."""
    first = create(store, payload={"phase": "ready", "order_id": "A-10"})
    run_id = first["run_id"]
    with pytest.raises(CheckpointError) as none_held:  # nothing leased yet: nothing sent
        store.release_lease(run_id, "worker-1")
    assert (none_held.value.kind, none_held.value.sent) == ("invalid_payload", False)
    assert store.lease(run_id, "worker-1", ttl_s=3600)["fencing_token"] == 1
    with pytest.raises(CheckpointError) as not_holder:
        store.release_lease(run_id, "worker-2")
    assert (not_holder.value.kind, not_holder.value.error) == ("conflict", "lease_held")

    given = store.release_lease(run_id, "worker-1")
    assert (given["owner"], given["fencing_token"]) == ("worker-1", 2)
    assert store.fencing_token_of(run_id) is None
    [event] = AuditEvent.objects.filter(run_uuid=run_id, action="lease.release")
    assert event.actor_name == "wendy"
    other = make_store(wendy)
    assert other.lease(run_id, "worker-2", ttl_s=60)["fencing_token"] == 3
    assert other.compare_and_swap(next_revision(first, {"phase": "ready", "order_id": "A-10"}),
                                  0) == 1
