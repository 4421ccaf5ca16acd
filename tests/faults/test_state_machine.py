"""A hypothesis state machine over the whole recovery loop (issue 5, "Tests").

Rules: runtime writes (checkpoint writes, effect moves, the call to the provider, lease
renewals), deaths (a runtime stops mid-sequence; a live one whose lease ran out goes on
as a zombie), time passing (``age_world``), the sweep, reviewer actions (reconcile, mark
unknown, request / approve / reject a retry, close), reconciler answers (an in-memory
provider that counts executions per operation key and whose look-ups answer found /
not found / cannot tell / no look-up), the reconcile worker, and a restarted runtime that
previews (GET) then claims (POST) its resume decision.

Invariants, after every step:
- every effect's revision history only makes moves CONTRACT.md's effect table allows, by
  the party it names; back to ``planned`` (attempt + 1) only after a consumed retry;
- the provider never executes an operation key twice unless, in between, a retry was
  consumed whose approval's preview (audit event ``retry.approve``, ``after.preview``)
  named that key ``possible_duplicate`` or ``submit_again``;
- a resume preview changes nothing.
Runs on PostgreSQL and SQLite; bounded (``MAX_EXAMPLES`` x ``STEPS``).
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db.models import F
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from checkpoints import services
from checkpoints.exceptions import DomainError
from checkpoints.jobs import reconciliation
from checkpoints.models import (
    AuditEvent,
    Effect,
    EffectRevision,
    ReconcileRequest,
    RetryRequest,
    Run,
)
from tests import contract_tables
from tests.faults.stubs import FakeProvider, use_plugin
from tests.helpers import _AGED as AGED
from tests.helpers import FP

# A longer hunt: RECOVERY_HYPOTHESIS_EXAMPLES=600 (and -s to see what it reached).
MAX_EXAMPLES = int(os.environ.get("RECOVERY_HYPOTHESIS_EXAMPLES", "30"))
STEPS = 25
SERVICE = "pay"
RUNS = 2
EFFECTS_PER_RUN = 2

# CONTRACT.md 3, the effect table (read from docs/CONTRACT.md): (from, to) -> who may make
# the move, as the effect history records it. ``None`` is "new". An approved retry's move
# back to planned is recorded as the retrying runtime's write.
CONTRACT_MOVES: dict[tuple[str | None, str], set[str]] = {
    pair: {"runtime" if who == "retry" else who for who in actors}
    for pair, actors in contract_tables.effect_transitions().items()
}
# Reconciliation settles "never saw the key" on a submitted effect in two recorded steps,
# submitted -> unresolved -> not_executed, both by reconciliation: one of the code's named
# exceptions (contract_tables.CODE_BEYOND_CONTRACT). This machine's runtimes never settle
# an unresolved effect themselves, so the other exception is left out of the oracle.
assert ("submitted", "unresolved", "reconciliation") in contract_tables.CODE_BEYOND_CONTRACT
CONTRACT_MOVES[("submitted", "unresolved")] |= {"reconciliation"}
NOTES: Counter = Counter()  # what the examples reached (printed with -s)


def _note(what: str) -> None:
    NOTES[what] += 1
    try:
        event(what)
    except InvalidArgument:
        pass  # driven by hand, outside hypothesis (test_the_oracle_...)


BACK_TO_PLANNED = {("not_executed", "planned"), ("unknown", "planned")}
DUPLICATE_OK = {"possible_duplicate", "submit_again"}
MODES = ["truthful", "truthful", "found", "not_found", "cannot_tell", "no_lookup"]


@dataclass
class Local:
    """What one runtime process believes about one of its effects."""

    effect_id: uuid.UUID
    key: str
    revision: int | None = None  # None: not created yet
    state: str | None = None
    called: bool = False  # it called the provider for the current attempt


@dataclass
class Runtime:
    owner: str
    token: int | None
    alive: bool = True
    checkpoint_revision: int = 0
    effects: dict[int, Local] = field(default_factory=dict)


@dataclass
class RunModel:
    run_id: uuid.UUID
    checkpoint_id: uuid.UUID
    keys: list[str]
    effect_ids: list[uuid.UUID]
    runtimes: list[Runtime] = field(default_factory=list)


class RecoveryLoop(RuleBasedStateMachine):
    tenant = writer = reviewer = approver = None  # set by the test function
    counter = itertools.count()

    def __init__(self):
        super().__init__()
        FakeProvider.reset()
        self.prefix = f"x{next(self.counter)}-{uuid.uuid4().hex[:6]}"
        self.runs: list[RunModel] = []
        self.allowance: dict[str, int] = {}  # key -> consumed, approved re-executions
        self.owners = itertools.count(1)

    # ---- helpers -----------------------------------------------------------------------

    def _run(self, i: int) -> RunModel:
        return self.runs[i % len(self.runs)]

    def _runtime(self, model: RunModel, j: int) -> Runtime | None:
        alive = [r for r in model.runtimes if r.alive]
        return alive[j % len(alive)] if alive else None

    def _put_effect(self, model: RunModel, rt: Runtime, local: Local, state: str,
                    receipt=None) -> None:
        revision = 0 if local.revision is None else local.revision + 1
        body = services.parse_effect({
            "id": str(local.effect_id), "run_id": str(model.run_id), "revision": revision,
            "operation_key": local.key, "service": SERVICE, "effect_class": "non_idempotent",
            "request_fingerprint": FP, "state": state, "receipt": receipt,
        }, url_id=local.effect_id)
        services.effect_put(actor=self.writer, tenant=self.tenant, body=body,
                            expected_revision=local.revision, fencing_token=rt.token)
        local.revision, local.state = revision, state

    def _put_checkpoint(self, model: RunModel, rt: Runtime | None, phase: str,
                        create: bool = False) -> None:
        revision = 0 if create else rt.checkpoint_revision + 1
        env = services.parse_envelope({
            "id": str(model.checkpoint_id), "run_id": str(model.run_id), "revision": revision,
            "kind": "acme.order", "schema_version": 1,
            "payload": {"phase": phase, "order_id": model.keys[0]}, "updated_at_ms": 1,
        }, url_id=model.checkpoint_id)
        services.checkpoint_put(actor=self.writer, tenant=self.tenant, envelope=env,
                                expected_revision=None if create else rt.checkpoint_revision,
                                fencing_token=None if create else rt.token)
        if rt is not None:
            rt.checkpoint_revision = revision

    def _new_runtime(self, model: RunModel) -> Runtime:
        owner = f"{self.prefix}-w{next(self.owners)}"
        run = services.lease_acquire(actor=self.writer, tenant=self.tenant,
                                     run_id=model.run_id, owner=owner, ttl_s=60)
        rt = Runtime(owner, run.fencing_token,
                     checkpoint_revision=Run.objects.get(pk=run.pk).latest_checkpoint.revision)
        for i, (key, effect_id) in enumerate(zip(model.keys, model.effect_ids, strict=True)):
            row = Effect.objects.filter(tenant=self.tenant, uuid=effect_id).first()
            rt.effects[i] = Local(effect_id, key, row.revision if row else None,
                                  row.state if row else None)
        model.runtimes.append(rt)
        return rt

    # ---- runtime -----------------------------------------------------------------------

    @initialize(progress=st.lists(st.integers(0, 3), min_size=EFFECTS_PER_RUN,
                                  max_size=EFFECTS_PER_RUN),
                dies=st.booleans(),
                modes=st.lists(st.sampled_from(MODES), min_size=EFFECTS_PER_RUN,
                               max_size=EFFECTS_PER_RUN))
    def first_run(self, progress, dies, modes):
        """The first run, its runtime already some way through each effect (0 nothing,
        1 planned, 2 submitted, 3 called the provider), and perhaps dead there: each
        window of the crash matrix is a starting point; ``modes``: how the provider will
        answer look-ups of each effect's key."""
        self.start_run()
        model = self.runs[0]
        FakeProvider.modes.update(zip(model.keys, modes, strict=True))
        rt = model.runtimes[0]
        for e, steps in enumerate(progress):
            for _ in range(steps):
                if rt.alive:
                    self._step(model, rt, rt.effects[e])
        rt.alive = rt.alive and not dies

    @precondition(lambda self: len(self.runs) < RUNS)
    @rule()
    def start_run(self):
        n = len(self.runs)
        keys = [f"{self.prefix}-r{n}-op{i}" for i in range(EFFECTS_PER_RUN)]
        model = RunModel(uuid.uuid4(), uuid.uuid4(), keys,
                         [uuid.uuid4() for _ in keys])
        self._put_checkpoint(model, None, "charging", create=True)
        self.runs.append(model)
        self._new_runtime(model)

    def _ordered_runs(self, run_ids) -> list[uuid.UUID]:
        """``run_ids`` in the order this example created them (never by the random UUIDs:
        the same choices must pick the same run when hypothesis replays an example)."""
        wanted = set(run_ids)
        return [m.run_id for m in self.runs if m.run_id in wanted]

    def _alive(self) -> bool:
        return any(rt.alive for m in self.runs for rt in m.runtimes)

    def _mine(self):
        return {"run__uuid__in": [m.run_id for m in self.runs]}

    @precondition(_alive)
    @rule(i=st.integers(0, RUNS - 1), j=st.integers(0, 2), e=st.integers(0, 1),
          steps=st.integers(1, 4))
    def runtime_steps(self, i, j, e, steps):
        """Up to ``steps`` write-ahead steps of one effect: plan, submit, call, confirm;
        after a claimed retry, plan again what is ``not_executed``/``unknown``. (The
        process may die between any two: ``runtime_dies``.)"""
        model = self._run(i)
        rt = self._runtime(model, j)
        if rt is None:
            return
        local = rt.effects[e % EFFECTS_PER_RUN]
        for _ in range(steps):
            if not rt.alive or local.state in ("confirmed", "failed"):
                break
            self._step(model, rt, local)

    def _step(self, model: RunModel, rt: Runtime, local: Local) -> None:
        try:
            if local.state is None:
                self._put_effect(model, rt, local, "planned")
            elif local.state in ("not_executed", "unknown"):
                self._put_effect(model, rt, local, "planned")
                local.called = False
            elif local.state == "planned":
                self._put_effect(model, rt, local, "submitted")
            elif local.state == "submitted" and not local.called:
                self._call_provider(local.key)
                local.called = True
            elif local.state == "submitted":
                self._put_effect(model, rt, local, "confirmed",
                                 {"status": "succeeded", "key": local.key})
        except DomainError as exc:
            _note(f"runtime write refused: {type(exc).__name__}")
            rt.alive = False  # refused (fenced, stale, not allowed): this process stops

    def _call_provider(self, key: str) -> None:
        if FakeProvider.executed.get(key):
            assert self.allowance.get(key, 0) > 0, (
                f"{key} executed again without a consumed retry whose preview named it "
                f"(executions so far: {FakeProvider.executed[key]})")
            self.allowance[key] -= 1
            _note("the provider executed a key again, after an approved retry")
        FakeProvider.execute(key)

    @precondition(_alive)
    @rule(i=st.integers(0, RUNS - 1), j=st.integers(0, 2),
          phase=st.sampled_from(["charging", "charged", "completed"]))
    def runtime_checkpoint(self, i, j, phase):
        model = self._run(i)
        rt = self._runtime(model, j)
        if rt is None:
            return
        try:
            self._put_checkpoint(model, rt, phase)
        except DomainError:
            rt.alive = False

    @precondition(_alive)
    @rule(i=st.integers(0, RUNS - 1), j=st.integers(0, 2))
    def runtime_renews_lease(self, i, j):
        model = self._run(i)
        rt = self._runtime(model, j)
        if rt is None:
            return
        try:
            run = services.lease_acquire(actor=self.writer, tenant=self.tenant,
                                         run_id=model.run_id, owner=rt.owner, ttl_s=60)
            rt.token = run.fencing_token
        except DomainError:
            rt.alive = False

    @precondition(_alive)
    @rule(i=st.integers(0, RUNS - 1), j=st.integers(0, 2))
    def runtime_dies(self, i, j):
        rt = self._runtime(self._run(i), j)
        if rt is not None:
            rt.alive = False

    def _restartable(self) -> bool:
        return RetryRequest.objects.filter(state="approved", **self._mine()).exists() or any(
            not any(rt.alive for rt in m.runtimes) for m in self.runs)

    @precondition(_restartable)
    @rule(i=st.integers(0, RUNS - 1), steps=st.integers(0, 4))
    def runtime_restarts_and_resumes(self, i, steps):
        """A new process for the run: GET previews (must change nothing), POST claims;
        a claimed retry (or ``continue``) starts a new runtime, which takes a lease and
        goes on with each effect for up to ``steps`` write-ahead steps."""
        model = self._run(i)
        before = self._snapshot()
        preview = services.resume_preview(actor=self.writer, tenant=self.tenant,
                                          run_id=model.run_id, asked={})
        assert self._snapshot() == before, "a resume preview changed something"
        claimed = services.resume_claim(actor=self.writer, tenant=self.tenant,
                                        run_id=model.run_id, asked={})
        assert claimed["action"] == preview["action"]
        _note(f"resume claimed: {claimed['action']}")
        if claimed["action"] not in ("retry", "continue"):
            return
        if claimed["action"] == "retry":
            self._allow_what_the_approver_accepted(model)
        try:
            rt = self._new_runtime(model)
        except DomainError:
            return  # another owner's lease is live: this process gives up
        for e in range(EFFECTS_PER_RUN):
            for _ in range(steps):
                if not rt.alive or rt.effects[e].state in ("confirmed", "failed"):
                    break
                self._step(model, rt, rt.effects[e])

    def _snapshot(self) -> tuple:
        """Everything of this example's runs a write could change, and the audit count."""
        runs = [m.run_id for m in self.runs]
        mine = {"run__uuid__in": runs}
        return (
            sorted(Run.objects.filter(uuid__in=runs).values_list(
                "uuid", "recovery_state", "fencing_token", "lease_owner", "lease_expires_at",
                "last_write_at", "unacknowledged_conflicts", "closed_at")),
            sorted(Effect.objects.filter(**mine).values_list(
                "uuid", "revision", "state", "attempt", "retry_authorized_by")),
            EffectRevision.objects.filter(effect__run__uuid__in=runs).count(),
            sorted(RetryRequest.objects.filter(**mine).values_list("pk", "state")),
            sorted(ReconcileRequest.objects.filter(**mine).values_list("pk", "state",
                                                                       "attempts")),
            AuditEvent.objects.count(),
        )

    def _allow_what_the_approver_accepted(self, model: RunModel) -> None:
        retry = RetryRequest.objects.filter(run__uuid=model.run_id,
                                            state="consumed").order_by("-pk").first()
        approval = AuditEvent.objects.get(action="retry.approve", target_ref=str(retry.pk))
        for row in approval.after["preview"]:
            if row["outcome"] in DUPLICATE_OK:
                self.allowance[row["operation_key"]] = \
                    self.allowance.get(row["operation_key"], 0) + 1

    # ---- the world ---------------------------------------------------------------------

    @rule(then_sweep=st.sampled_from([True, True, False]))
    def time_passes(self, then_sweep):
        self._age(400)  # past leases (60 s), the threshold (300 s), the settle delay (30 s)
        if then_sweep:
            self.sweep()

    def _age(self, seconds: int) -> None:
        """``tests.helpers.age_world`` for this example's rows only (the same columns)."""
        delta = timedelta(seconds=seconds)
        mine = {"run__uuid__in": [m.run_id for m in self.runs]}
        for model, where in ((Run, {"uuid__in": mine["run__uuid__in"]}), (Effect, mine),
                             (ReconcileRequest, mine)):
            for column in AGED[model.__name__]:
                model.objects.filter(**where, **{f"{column}__isnull": False}).update(
                    **{column: F(column) - delta})

    def sweep(self):
        services.sweep_stale_runs()  # also runs due reconcile requests (no broker)

    def _queued(self):
        return ReconcileRequest.objects.filter(state__in=["queued", "running"],
                                               **self._mine())

    def reconcile_worker_runs(self):
        for pk in self._queued().values_list("pk", flat=True):
            _note(f"reconcile request: {reconciliation.execute(pk)['result']}")

    @rule(i=st.integers(0, RUNS - 1), e=st.integers(0, 1),
          mode=st.sampled_from(MODES))
    def provider_answers(self, i, e, mode):
        FakeProvider.modes[self._run(i).keys[e % EFFECTS_PER_RUN]] = mode

    # ---- reviewers ---------------------------------------------------------------------

    def _review(self, action, **kw):
        try:
            action(tenant=self.tenant, reason="state machine", **kw)
            _note(f"{action.__name__}: done")
        except DomainError as exc:
            # refused (owner live, nothing in doubt, wrong state...): changes nothing
            _note(f"{action.__name__}: {type(exc).__name__}")

    def _in_doubt(self):
        return Effect.objects.filter(state__in=["submitted", "unresolved"], **self._mine())

    @precondition(lambda self: self._in_doubt().exists())
    @rule(i=st.integers(0, RUNS - 1), now=st.booleans())
    def reviewer_reconciles(self, i, now):
        """Reconcile a run with an effect in doubt; with ``now`` a worker runs the stored
        requests at once (otherwise they wait for ``reconcile_worker_runs`` or the sweep)."""
        runs = self._ordered_runs(self._in_doubt().values_list("run__uuid", flat=True))
        self._review(services.run_reconcile, actor=self.reviewer, run_id=runs[i % len(runs)])
        if now and self._queued().exists():
            self.reconcile_worker_runs()

    @precondition(lambda self: self._in_doubt().exists())
    @rule(e=st.integers(0, RUNS * EFFECTS_PER_RUN - 1))
    def reviewer_marks_unknown(self, e):
        in_doubt = set(self._in_doubt().values_list("uuid", flat=True))
        effects = [e for m in self.runs for e in m.effect_ids if e in in_doubt]
        self._review(services.effect_mark_unknown, actor=self.reviewer,
                     effect_id=effects[e % len(effects)])

    def _retryable(self):
        return Run.objects.filter(uuid__in=[m.run_id for m in self.runs],
                                  recovery_state__in=["ambiguous", "unknown_outcome"])

    @precondition(lambda self: self._retryable().exists())
    @rule(i=st.integers(0, RUNS - 1), then=st.sampled_from(["approve", "approve", "wait"]))
    def reviewer_requests_retry(self, i, then):
        """Ask for a retry of a run listed ambiguous / unknown outcome (the service judges
        it again); usually a second person approves it at once."""
        runs = self._ordered_runs(self._retryable().values_list("uuid", flat=True))
        self._review(services.retry_request, actor=self.reviewer, run_id=runs[i % len(runs)])
        if then == "approve" and RetryRequest.objects.filter(state="requested",
                                                             **self._mine()).exists():
            self.approver_decides(True)

    @rule(i=st.integers(0, RUNS - 1), give_up=st.booleans())
    def reviewer_works_the_run(self, i, give_up):
        """What a reviewer does with an ambiguous run, in one go: reconcile it (a worker
        runs the look-ups at once), with ``give_up`` mark what is still in doubt unknown,
        then request a retry that a second person approves. Each step may be refused."""
        model = self._run(i)
        self._review(services.run_reconcile, actor=self.reviewer, run_id=model.run_id)
        if self._queued().exists():
            self.reconcile_worker_runs()
        if give_up:
            for effect_id in self._in_doubt().filter(run__uuid=model.run_id).values_list(
                    "uuid", flat=True).order_by("created_at", "id"):
                self._review(services.effect_mark_unknown, actor=self.reviewer,
                             effect_id=effect_id)
        self._review(services.retry_request, actor=self.reviewer, run_id=model.run_id)
        retry = RetryRequest.objects.filter(state="requested", run__uuid=model.run_id).first()
        if retry is not None:
            self._review(services.retry_approve, actor=self.approver, retry_id=retry.pk)

    @precondition(lambda self: RetryRequest.objects.filter(state="requested",
                                                           **self._mine()).exists())
    @rule(approve=st.sampled_from([True, True, True, False]))
    def approver_decides(self, approve):
        retry = RetryRequest.objects.filter(state="requested", **self._mine()).first()
        decide = services.retry_approve if approve else services.retry_reject
        self._review(decide, actor=self.approver, retry_id=retry.pk)

    @rule(i=st.integers(0, RUNS - 1), dice=st.integers(0, 3))
    def reviewer_closes(self, i, dice):
        if dice == 0:  # rarely: a closed run ends most of what can happen to it
            self._review(services.run_close, actor=self.reviewer,
                         run_id=self._run(i).run_id)

    def teardown(self):
        # Close this example's runs so later examples' sweeps do not examine them again.
        for model in self.runs:
            try:
                services.run_close(actor=self.reviewer, tenant=self.tenant,
                                   run_id=model.run_id, reason="example over")
            except DomainError:
                pass  # already closed

    # ---- invariants --------------------------------------------------------------------

    @invariant()
    def effect_histories_follow_the_contract(self):
        if not self.runs:
            return
        runs = [m.run_id for m in self.runs]
        consumed = {}
        for run_id in runs:
            consumed[run_id] = RetryRequest.objects.filter(run__uuid=run_id,
                                                           state="consumed").count()
        for effect in Effect.objects.filter(tenant=self.tenant, run__uuid__in=runs
                                            ).select_related("run"):
            history = list(EffectRevision.objects.filter(effect=effect).order_by("revision")
                           .values_list("revision", "state", "source", "attempt"))
            assert [h[0] for h in history] == list(range(effect.revision + 1)), history
            assert history[-1][1] == effect.state
            previous, attempt, back = None, 1, 0
            for _revision, state, source, rev_attempt in history:
                allowed = CONTRACT_MOVES.get((previous, state), set())
                assert source in allowed, (
                    f"{effect.operation_key}: {previous} -> {state} by {source} is not in "
                    f"the contract's effect table; history {history}")
                if (previous, state) in BACK_TO_PLANNED:
                    attempt, back = attempt + 1, back + 1
                assert rev_attempt == attempt, history
                previous = state
            assert back <= consumed[effect.run.uuid], (
                f"{effect.operation_key} went back to planned {back} times with "
                f"{consumed[effect.run.uuid]} consumed retries")


@pytest.mark.django_db
def test_no_sequence_breaks_the_effect_table_or_executes_twice_unapproved(
        acme, wendy, rita, april):
    use_plugin(acme, SERVICE, "tests.faults.stubs.FakeProvider")
    RecoveryLoop.tenant, RecoveryLoop.writer = acme, wendy
    RecoveryLoop.reviewer, RecoveryLoop.approver = rita, april
    run_state_machine_as_test(RecoveryLoop, settings=settings(
        max_examples=MAX_EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]))
    print("\nstate machine reached:", *sorted(NOTES.items()), sep="\n  ")


@pytest.mark.django_db
def test_the_oracle_catches_a_late_effect_sent_again_unapproved(acme, wendy, rita, april):
    """One path, driven by hand, that the machine's duplicate oracle exists for (it failed
    before ``resume_claim`` authorised only what the approval's preview named): the old
    owner, only slow, sends a new effect after the retry was approved; nobody can tell
    whether it happened; the consumed retry must not let it be sent again."""
    use_plugin(acme, SERVICE, "tests.faults.stubs.FakeProvider")
    RecoveryLoop.tenant, RecoveryLoop.writer = acme, wendy
    RecoveryLoop.reviewer, RecoveryLoop.approver = rita, april
    machine = RecoveryLoop()
    machine.first_run([0, 0], False, ["truthful", "no_lookup"])
    machine.time_passes(then_sweep=True)  # the lease ran out; the owner lives on, quiet
    machine.reviewer_works_the_run(0, give_up=False)  # in flight, nothing sent: approved
    assert RetryRequest.objects.filter(state="approved").exists()
    machine.runtime_steps(0, 0, 1, 3)  # the old owner plans, submits and sends op1
    assert FakeProvider.executed == {machine.runs[0].keys[1]: 1}
    machine.reviewer_works_the_run(0, give_up=True)  # no look-up: op1 is unknown
    machine.runtime_restarts_and_resumes(0, 4)  # claims the retry, goes on with each effect
    machine.effect_histories_follow_the_contract()
    assert FakeProvider.executed[machine.runs[0].keys[1]] == 1  # never sent again
    late = Effect.objects.get(operation_key=machine.runs[0].keys[1])
    assert (late.state, late.retry_authorized_by) == ("unknown", None)
