"""Race matrix on real PostgreSQL (issue 7, item 1): every "exactly one wins" rule that a
lock or a constraint enforces, raced by real threads.

- **Source of truth**: the locks the services take. ``RACES`` names, for each lock or
  unique constraint that decides a race, the test that races it; a lock-taking public
  service (one that calls ``_lock_run``/``_get_run`` or a ``locks.lock_*`` helper, found by
  reading the ``checkpoints/services/`` package and ``checkpoints/jobs/reconciliation.py``) must be named
  in ``RACED`` or ``NOT_RACED`` (with the reason), else ``test_every_locking_service_is_raced``
  fails.
- **How**: N threads, each on its own connection (``tests.transactional.test_races.race``),
  released together on a ``threading.Barrier``; the database decides.
- **Cells**: lease/lease (8 owners), approve/approve and approve/reject (2 approvers, 4
  rounds each), resume claim/claim (8 writers), reconcile claim/claim (8 workers on one
  request), create races naming their own runs for checkpoints and effects (8 writers, 4
  rounds each: no empty run is left, the conflicts belong to the winner's run): 7 races.
- **What it proves**: one winner, the token bumped once, one decision, one consume, one
  look-up, no orphan run, and one audit event per win; the audit chain verifies. Killed
  mutants (scratch edits): ``select_for_update`` dropped from the run lock (every lease
  owner "wins" token 1), orphan-run clean-up skipped (seven empty runs per race).

SQLite has one writer at a time and no row locks: these skip there (``postgres`` mark).
"""

from __future__ import annotations

import uuid
from collections import Counter
from functools import partial

import pytest

from checkpoints import services
from checkpoints.exceptions import InvalidTransition, LeaseHeld, NoLiveLease
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Conflict, Run
from checkpoints.services import reconcile_requests
from tests.conftest import _person
from tests.faults import stubs
from tests.faults.conftest import in_doubt_run
from tests.helpers import (
    age_world,
    ambiguous_run,
    effect_body,
    envelope,
    put_checkpoint,
    put_effect,
)
from tests.matrixhelpers import interop_modules, public_functions_reaching, service_modules
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

OWNERS = 8
ROUNDS = 4


def kinds_of(results) -> Counter:
    return Counter(type(r).__name__ for r in results)


def audit_count(action: str) -> int:
    return AuditEvent.objects.filter(action=action).count()


# --------------------------------------------------------------------------------------
# Source of truth: which public services take a lock, and which race covers each
# --------------------------------------------------------------------------------------

RACED = {
    "lease_acquire": "test_eight_owners_racing_for_one_lease",
    "lease_revoke": "test_two_reviewers_ending_one_lease",
    "lease_release": "test_the_owner_giving_its_lease_back_while_a_reviewer_ends_it",
    "retry_approve": "test_two_approvers_deciding_one_request",
    "retry_reject": "test_two_approvers_deciding_one_request",
    "retry_withdraw": "test_two_approvers_deciding_one_request[withdraw]",
    "resume_claim": "test_resume_claims_racing_for_one_approved_retry",
    "execute": "test_workers_racing_to_claim_one_reconcile_request",
    "checkpoint_put": "test_checkpoint_creates_naming_their_own_runs_leave_no_empty_run "
                      "(+ tests/transactional/test_races.py)",
    "effect_put": "test_effect_creates_naming_their_own_runs_leave_no_empty_run "
                  "(+ tests/transactional/test_races.py)",
    "sweep_stale_runs": "tests/transactional/test_races.py::"
                        "test_it_sweeps_once_when_many_workers_sweep_at_once",
    "runifold_import": "tests/test_runifold_io.py::"
                       "test_two_imports_of_one_file_at_once_write_it_once",
    "run_reconcile": "tests/transactional/test_reconcile_races.py::"
                     "test_many_reviewers_reconciling_one_run_at_once_store_one_request_per_"
                     "effect",
    # LangGraph threads (issue 10): tests/transactional/test_langgraph_races.py.
    "graph_put": "test_langgraph_races.py::test_graphs_resuming_one_thread_at_once_make_"
                 "exactly_one_winner_and_no_fork (+ first puts on a new thread)",
    "graph_put_writes": "test_langgraph_races.py::test_pending_writes_racing_the_next_put_"
                        "make_no_conflict",
    "graph_thread_delete": "test_langgraph_races.py::test_deleting_a_thread_while_graphs_"
                           "write_to_it_leaves_no_half_thread",
    # Retention (issue 20): tests/lifecycle/test_retention_races.py.
    "retention_purge": "test_retention_races.py::test_purgers_at_once_delete_each_run_once "
                       "(+ a purger fenced by a take-over, a write racing its run's purge)",
    "retention_purge_all": "test_retention_races.py::test_purgers_at_once_delete_each_run_"
                           "once (four retention_purge_all at once, two tenants)",
    # Migrations (issue 19, item 2): tests/transactional/test_migration_races.py.
    "checkpoints_migrate": "test_migration_races.py::test_migrations_racing_each_other_"
                           "migrate_each_checkpoint_once (+ a zombie owner racing one)",
    # Legal holds and erasure (issue 20): tests/lifecycle/test_races.py.
    "erasure_approve": "tests/lifecycle/test_races.py::test_two_approvers_deciding_one_"
                       "erasure_request (+ a hold racing an approval)",
    "erasure_reject": "tests/lifecycle/test_races.py::test_two_approvers_deciding_one_"
                      "erasure_request[reject]",
    "legal_hold_release": "tests/lifecycle/test_races.py::test_two_releases_of_one_hold",
    "legal_hold_place": "tests/lifecycle/test_races.py::test_a_hold_racing_an_approval_"
                        "never_lets_a_held_run_go",
    # Notification endpoints and the sender (issue 21):
    # tests/transactional/test_notify_endpoint_races.py.
    "claim_due": "test_notify_endpoint_races.py::test_senders_claiming_at_once_take_each_"
                 "due_message_once",
    "notification_resend": "test_notify_endpoint_races.py::test_two_admins_resending_one_"
                           "message",
    "endpoint_create": "test_notify_endpoint_races.py::test_creates_racing_for_the_last_"
                       "endpoint_make_one",
    "disable_failing": "test_notify_endpoint_races.py::test_senders_disabling_one_failing_"
                       "endpoint_disable_it_once",
    # An endpoint's delete against every writer of a row naming it (stop 34's attack):
    # tests/transactional/test_notify_endpoint_delete_races.py.
    "endpoint_delete": "test_notify_endpoint_delete_races.py::test_a_writer_during_the_"
                       "delete_waits_then_skips_the_endpoint (+ a delete during a digest "
                       "or a drain)",
    "hold_endpoints": "test_notify_endpoint_delete_races.py (every hold: the digest's, the "
                      "drain's, the flush's, the sender's, an admin's and the delete's)",
}
NOT_RACED = {
    "tenant_create": "takes the new tenant's write gate row (locks.lock_audit_head, made "
                     "there) in the transaction that creates the tenant: no other "
                     "transaction can see the tenant yet (two creations of one slug meet "
                     "at the tenant's unique key)",
    "counters_compact": "under the tenant's compaction lock, tried (locks.try_transaction_key): "
                        "a second compaction of the same tenant skips it; writers only insert "
                        "counter rows, and rows committed after the compaction's snapshot "
                        "are left as they are (tests/services/test_state_counts.py)",
    # Notification endpoints (issue 21): the endpoint row lock, under the audit head.
    "endpoint_update": "an admin setting under the endpoint's row lock; last write wins by "
                       "design (the second reads the first's row under the lock)",
    "endpoint_rotate_secret": "under the endpoint's row lock: two rotations are serialized "
                              "(the second's previous secret is the first's new one)",
    "notification_test": "inserts a new message with a fresh event id under the endpoint's "
                         "lock; nothing to win (two tests are two messages)",
    "record_attempt": "locks the endpoint, then its message (the order of every writer of "
                      "both); the outcome applies only to a message still pending, so a "
                      "lost claim's late record adds its attempt and changes nothing else; "
                      "during the endpoint's delete it waits, then answers gone "
                      "(test_notify_endpoint_delete_races.py)",
    "dispatch_round": "raced in tests/transactional/test_notify_races.py: several rounds "
                      "at once write each message, incident and digest once; against "
                      "an endpoint's delete in test_notify_endpoint_delete_races.py",
    "erasure_request": "inserts a new request under the tenant's audit head; nothing to "
                       "win (two requests are two requests, each decided on its own)",
    "graph_threads_prune": "the delete of graph_thread_delete per thread (same run lock, "
                           "same code), raced there",
    "graph_runs_delete": "the delete of graph_thread_delete per thread, raced there",
    "graph_thread_copy": "locks both runs in run-id order, then writes like graph_put "
                         "(raced there); a second copy onto the target is refused (412)",
    "tenant_set_ambiguity_threshold": "operator setting; last write wins by design",
    "tokens_revoke": "idempotent: a second revocation finds nothing live",
    "payloads_rotate_keys": "operator command; each row is rewritten by compare-and-swap "
                            "(a second rotation finds it current); it locks only the "
                            "audit heads it appends to",
    "account_deactivate": "row lock on the account; the second call is refused "
                          "(InvalidTransition), tested in tests/test_commands.py",
    "reconciler_configure": "operator setting; last write wins by design",
    "effect_mark_unknown": "reviewer action under the run lock; the second finds the effect "
                           "unknown (422); same lock as lease_acquire, raced there",
    "run_close": "reviewer action under the run lock; the second is refused (422); same "
                 "lock as lease_acquire, raced there",
    "conflicts_acknowledge": "idempotent under the run lock (the dashboard's only_open: the "
                             "second is refused, 422); same lock as lease_acquire",
    "retry_request": "at most one open request per run is a database constraint "
                     "(retry_one_open_request_per_run); same run lock as lease_acquire",
    "redrive": "part of sweep_stale_runs, raced there",
    "migration_preview": "a dry run: takes no lock (checkpoints_migrate's lock is on its "
                         "write path, raced there)",
    "data_policy_set": "takes only the tenant's audit head, which serializes two admins' "
                       "policies (the second reads the first under it); a purge reads the "
                       "policy once per pass and re-judges each run under its lock",
    # Issue 20: operator commands and four-eyes steps, each serialized by the tenant's
    # audit head (its first lock) and re-judged under it.
    "audit_export": "reads a prefix of the sealed tree (a signed head: fixed for ever, so no "
                    "lock), then records under the tenant's audit head; two exports are "
                    "two files, the watermark only moves forward",
    "keyring_restore": "operator command after a restore, all or nothing, under each "
                       "tenant's audit head; a second run finds nothing to do",
    "tenant_shred": "operator command under the tenant's audit head; a second finds the "
                    "keys destroyed (tests/lifecycle/test_shred.py)",
    "tombstone_purge_prepare": "under the tenant's audit head: two preparations freeze "
                               "what each finds; execution re-checks the fingerprint",
    "tombstone_purge_approve": "the purge row is locked under the audit head; a second "
                               "decision finds it decided (409), as erasure_approve, raced "
                               "there",
    "tombstone_purge_reject": "as tombstone_purge_approve",
    "tombstone_purge_execute": "under the audit head: re-checks state, holds, fingerprint "
                               "and deadline; the late-hold race is forced in tests/"
                               "lifecycle/test_tombstone_purge.py (a hold placed after "
                               "the preparation blocks the execution)",
    "kind_declare": "takes only the tenant's audit head, which serializes two declarations "
                    "of one version (the second finds the first: unchanged, or replaced "
                    "while unused); its race with a checkpoint write of the version is "
                    "forced deterministically in tests/api/test_declared_kinds.py "
                    "(test_a_declaration_replaced_mid_write_is_read_again_under_the_head)",
}


def _locking_public_functions() -> set[str]:
    """Public functions of services/reconciliation that (transitively, through module
    functions) lock a row: call ``_lock_run``, ``_get_run`` or a helper of the lock module
    (``checkpoints/locks.py``, the only place that takes row locks)."""
    from checkpoints import locks

    helpers = {name for name in vars(locks) if name.startswith("lock_")}
    return public_functions_reaching((*service_modules(), *interop_modules(), reconciliation),
                                     {"_lock_run", "_get_run", *helpers},
                                     attributes=True)


@pytest.mark.django_db(transaction=False)
def test_every_locking_service_is_raced():
    found = _locking_public_functions()
    unclassified = sorted(found - set(RACED) - set(NOT_RACED))
    assert not unclassified, (
        f"public services that take a lock but are in neither RACED nor NOT_RACED: "
        f"{unclassified}; race them here or say why not")
    stale = sorted((set(RACED) | set(NOT_RACED)) - found)
    assert not stale, f"classified services that no longer take a lock: {stale}"


# --------------------------------------------------------------------------------------
# The races
# --------------------------------------------------------------------------------------

def test_eight_owners_racing_for_one_lease(acme, wendy):
    """lease/lease: one owner wins, the others get LeaseHeld, the token goes 0 -> 1 once."""
    for rnd in range(ROUNDS):
        body = envelope(payload={"phase": "ready"})
        put_checkpoint(wendy, acme, body)
        run_id = uuid.UUID(body["run_id"])
        results = race(OWNERS, lambda i, run_id=run_id, rnd=rnd: services.lease_acquire(
            actor=wendy, tenant=acme, run_id=run_id, owner=f"owner-{rnd}-{i}", ttl_s=60))
        assert kinds_of(results) == {"Run": 1, "LeaseHeld": OWNERS - 1}, results
        (winner,) = [r for r in results if isinstance(r, Run)]
        assert winner.fencing_token == 1
        run = services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
        assert run["fencing_token"] == 1, "the token moved more than once"
        assert all("leased by another owner" in str(r) for r in results
                   if isinstance(r, LeaseHeld))
    assert audit_count("lease.acquire") == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_two_reviewers_ending_one_lease(acme, wendy, rita):
    """revoke/revoke: one ends the lease, the other finds none live (``NoLiveLease``) and
    writes nothing; the token goes up once."""
    rita2 = _person("rita2", acme, "reviewer")
    reviewers = [rita, rita2]
    for rnd in range(ROUNDS):
        body = envelope(payload={"phase": "ready"})
        put_checkpoint(wendy, acme, body)
        run_id = uuid.UUID(body["run_id"])
        services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner=f"o-{rnd}",
                               ttl_s=600)
        results = race(2, lambda i, run_id=run_id, rnd=rnd: services.lease_revoke(
            actor=reviewers[i], tenant=acme, run_id=run_id, reason=f"gone {i}",
            expected_owner=f"o-{rnd}"))
        assert kinds_of(results) == {"Run": 1, "NoLiveLease": 1}, results
        assert all(isinstance(r, (Run, NoLiveLease)) for r in results)
        assert Run.objects.get(uuid=run_id).fencing_token == 2, "the token moved twice"
    assert audit_count("lease.revoke") == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_the_owner_giving_its_lease_back_while_a_reviewer_ends_it(acme, wendy, rita):
    """release/revoke (stop 39): one ends the lease, the other finds none live
    (``NoLiveLease``) and writes nothing; the token goes up once, one event in all."""
    for rnd in range(ROUNDS):
        body = envelope(payload={"phase": "ready"})
        put_checkpoint(wendy, acme, body)
        run_id = uuid.UUID(body["run_id"])
        token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id,
                                       owner=f"o-{rnd}", ttl_s=600).fencing_token
        owner = f"o-{rnd}"
        calls = [partial(services.lease_release, actor=wendy, tenant=acme, run_id=run_id,
                         owner=owner, held_token=token),
                 partial(services.lease_revoke, actor=rita, tenant=acme, run_id=run_id,
                         reason="gone", expected_owner=owner)]
        results = race(2, lambda i, calls=calls: calls[i]())
        assert kinds_of(results) == {"Run": 1, "NoLiveLease": 1}, results
        assert Run.objects.get(uuid=run_id).fencing_token == token + 1, "moved twice"
    assert audit_count("lease.release") + audit_count("lease.revoke") == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


@pytest.mark.parametrize("second", ["approve", "reject", "withdraw"])
def test_two_approvers_deciding_one_request(acme, wendy, rita, april, second):
    """approve/approve, approve/reject and approve/the requester's withdraw: one decision
    per request; the other is refused (``AlreadyDone``, a 422 ``InvalidTransition`` naming
    who acted first) and writes nothing."""
    april2 = _person("april2", acme, "approver")
    deciders = [(april, services.retry_approve),
                {"approve": (april2, services.retry_approve),
                 "reject": (april2, services.retry_reject),
                 "withdraw": (rita, services.retry_withdraw)}[second]]
    for _ in range(ROUNDS):
        run_id = ambiguous_run(wendy, acme, envelope(payload={"phase": "charging"}))
        retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="died")
        results = race(2, lambda i, pk=retry.pk: deciders[i][1](
            actor=deciders[i][0], tenant=acme, retry_id=pk, reason=f"decider {i}"))
        counts = kinds_of(results)
        assert counts == {"RetryRequest": 1, "AlreadyDone": 1}, results
        (won,) = [r for r in results if not isinstance(r, InvalidTransition)]
        (lost,) = [r for r in results if isinstance(r, InvalidTransition)]
        retry.refresh_from_db()
        assert (retry.state, retry.decided_by_id) == (won.state, won.decided_by_id)
        assert lost.what == won.state  # "already approved by april" etc.
    decisions = (audit_count("retry.approve") + audit_count("retry.reject")
                 + audit_count("retry.withdraw"))
    assert decisions == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_resume_claims_racing_for_one_approved_retry(acme, wendy, rita, april):
    """claim/claim: one POST …/resume consumes the approval and bumps the token once;
    the others are told what the run looks like after that."""
    writers = [wendy] + [_person(f"wendy{i}", acme, "writer", service=True)
                         for i in range(1, OWNERS)]
    for _ in range(ROUNDS):
        run_id = ambiguous_run(wendy, acme, envelope(payload={"phase": "charging"}))
        retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="died")
        services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
        before = services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
        assert before["action"] == "retry"
        results = race(OWNERS, lambda i, run_id=run_id: services.resume_claim(
            actor=writers[i], tenant=acme, run_id=run_id, asked={}))
        assert all(isinstance(r, dict) for r in results), results
        retries = [r for r in results if r["action"] == "retry"]
        assert len(retries) == 1, results
        after = services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
        assert after["fencing_token"] == before["fencing_token"] + 1
        assert retries[0]["fencing_token"] == after["fencing_token"]
        retry.refresh_from_db()
        assert retry.state == "consumed"
        assert retry.consumed_fencing_token == after["fencing_token"]
    assert audit_count("retry.consume") == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_workers_racing_to_claim_one_reconcile_request(acme, wendy, rita, monkeypatch):
    """reconcile claim/claim: eight deliveries of one request; one claims it, one look-up,
    one transition, one ``effect.reconcile`` event; the rest are skipped."""
    monkeypatch.setattr(stubs.CountingPlugin, "lookups", {})
    stubs.use_plugin(acme, "payments", "tests.faults.stubs.CountingPlugin")
    for rnd in range(ROUNDS):
        key = f"charge:claim-{rnd}"
        run = in_doubt_run(wendy, acme, keys=(key,))
        age_world(3600)
        with monkeypatch.context() as mp:  # store the request; execute nothing yet
            mp.setattr(reconcile_requests, "dispatch",
                       lambda pks, **kw: reconcile_requests.Sent(True, ""))
            (req,) = services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id,
                                            reason="died").requests
        results = race(OWNERS, lambda i, pk=req.pk: reconciliation.execute(pk))
        assert sorted(r["result"] for r in results) == ["confirmed"] + ["skipped"] * (
            OWNERS - 1), results
        assert stubs.CountingPlugin.lookups[key] == 1
        req.refresh_from_db()
        assert (req.state, req.attempts) == ("done", 1)
    assert audit_count("effect.reconcile") == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_checkpoint_creates_naming_their_own_runs_leave_no_empty_run(acme, wendy):
    """Orphan-run clean-up: each loser made a run for itself before losing the create;
    it is dropped, and its conflict is the winner's run's (CONTRACT.md 3: a create that
    finds the id taken is a conflict of the run that owns the id)."""
    for rnd in range(ROUNDS):
        cid = uuid.uuid4()
        results = race(OWNERS, lambda i, cid=cid, rnd=rnd: put_checkpoint(
            wendy, acme, envelope(checkpoint_id=cid, payload={"phase": "ready",
                                                              "order_id": f"{rnd}-{i}"})))
        assert kinds_of(results) == {"Checkpoint": 1, "StaleRevision": OWNERS - 1}, results
        assert Run.objects.count() == rnd + 1, "a losing writer's empty run was left behind"
        (winner,) = [r for r in results if not isinstance(r, Exception)]
        assert set(Conflict.objects.filter(target_uuid=cid).values_list("run_id", flat=True)) \
            == {winner.run_id}
    assert services.audit_verify(tenant=acme)[0]


def test_effect_creates_naming_their_own_runs_leave_no_empty_run(acme, wendy):
    """The same for effects: the losers of a create race for one effect id leave no run
    of their own behind, and their conflicts are the winner's run's."""
    for rnd in range(ROUNDS):
        eid = uuid.uuid4()
        results = race(OWNERS, lambda i, eid=eid, rnd=rnd: put_effect(
            wendy, acme, effect_body(effect_id=eid, operation_key=f"charge:own-{rnd}")))
        assert kinds_of(results) == {"Effect": 1, "StaleRevision": OWNERS - 1}, results
        assert Run.objects.count() == rnd + 1, "a losing writer's run was left behind"
        (winner,) = [r for r in results if not isinstance(r, Exception)]
        assert set(Conflict.objects.filter(target_uuid=eid).values_list("run_id", flat=True)) \
            == {winner.run_id}
    assert services.audit_verify(tenant=acme)[0]

