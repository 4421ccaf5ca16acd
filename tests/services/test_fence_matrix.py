"""Fence matrix over every fenced write path (issue 7, item 1; CONTRACT.md 3: once a run
has had an owner, every write must carry the current fencing token; an older or missing
token is refused with 409 ``fenced`` and kept as a conflict).

- **Sources of truth**: the write paths are read from the ``checkpoints/services/`` package and
  ``checkpoints/jobs/reconciliation.py``: every public service that writes under a run's lock
  (reaches ``_lock_run``/``_get_run``) is classified in ``WRITE_PATHS``, and every public
  service with a ``fencing_token`` parameter is in ``FENCED``
  (``test_every_run_write_path_is_classified``). The effect moves a runtime may make come
  from ``policy.EFFECT_TRANSITIONS`` (by ``runtime``, and by ``retry`` after a consumed
  retry), so a new transition is a new row by itself.
- **Axes**: how the writer was ousted (a new owner's live lease; that lease expired too;
  an approved retry claimed by ``POST …/resume``) x write path (checkpoint create,
  update, create of an existing id; effect create, create of an existing id, each move)
  x the token sent (the old one, one from the future, none) x surface (the service, the
  HTTP API). 38 (ousting, path) rows x 3 tokens x 2 surfaces = 228 cells, plus 4 cells
  of a token sent for a run that does not exist, the lease and resume rows.
- **Each cell**: the write is refused (``Fenced``; 409 ``{"error": "fenced",
  "fencing_token": current}``), exactly one conflict row is kept on the run that owns the
  target (reason ``fenced``, the tokens sent and current, the revisions), with its one
  ``<type>.conflict`` audit event, the run's conflict count and recovery state, and
  nothing else in the database changed (every row of every model compared). The same
  write with the current token is accepted (positive control), so the token alone made
  the difference.
- **Killed mutants** (scratch edits): the fence check removed from the effect update
  branch; removed from the create-of-an-existing-id branch.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from django.db import transaction
from django.urls import reverse

from checkpoints import policy, selectors, services
from checkpoints.exceptions import Fenced, LeaseHeld, StaleRevision
from checkpoints.interop import langgraph, runifold
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Conflict, ResumeDecision, Run
from checkpoints.vocab import EffectSource
from tests.conftest import _person, bearer_client
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect
from tests.matrixhelpers import (
    db_diff,
    db_state,
    interop_modules,
    public_functions_reaching,
    service_modules,
)

# --------------------------------------------------------------------------------------
# Source of truth: the write paths under a run
# --------------------------------------------------------------------------------------

FENCED = {"checkpoint_put", "effect_put", "graph_put", "graph_put_writes"}
WRITE_PATHS = {
    "checkpoint_put": "fenced: this matrix",
    "effect_put": "fenced: this matrix",
    "lease_acquire": "takes ownership; refused while another owner's lease is live: "
                     "test_an_ousted_owner_cannot_lease_over_the_new_one",
    "lease_revoke": "reviewer action, carries no token; ends the live lease and bumps the "
                    "token, so the ousted owner's writes are fenced: tests/services/"
                    "test_lease_revoke.py::test_the_old_owners_writes_are_refused_as_fenced_"
                    "and_kept",
    "lease_release": "the holder gives its lease back with its own token (stop 39); bumps "
                     "the token, so a write still on its way is fenced: tests/api/"
                     "test_lease_release.py::test_the_holder_gives_the_lease_back_and_the_"
                     "next_owner_takes_it_at_once",
    "resume_claim": "takes ownership (consumes an approved retry): the 'retry claimed' "
                    "column; test_a_claim_with_nothing_to_consume_changes_nothing",
    "retry_request": "reviewer action, carries no token; never over a live owner "
                     "(owner_live: tests/faults/test_owner_live.py)",
    "retry_approve": "approver action, carries no token",
    "retry_reject": "approver action, carries no token",
    "retry_withdraw": "reviewer action (the requester's own request), carries no token",
    "effect_mark_unknown": "reviewer action, carries no token; never over a live owner",
    "run_close": "reviewer action, carries no token; the next runtime write reopens",
    "conflicts_acknowledge": "reviewer action, carries no token",
    "run_reconcile": "reviewer action, carries no token; never over a live owner",
    "execute": "reconciliation (system), under the run lock; never over a live owner",
    "checkpoints_migrate": "operator action (issue 19, item 2), under the run lock with the "
                           "run's current token; never over a live owner (owner_live); bumps "
                           "the token so the ousted owner's late write is fenced: "
                           "tests/services/test_migrations.py::test_a_zombie_owner_writing_"
                           "after_the_migration_is_fenced_and_kept",
    "migration_preview": "a dry run of checkpoints_migrate (issue 19, item 2): no lock, no "
                         "write (tests/services/test_migration_jobs.py::test_the_preview_"
                         "writes_nothing_and_says_what_the_job_would_do)",
    "sweep_stale_runs": "system work (the stale-run sweep), carries no token; changes a run "
                        "only when its owner is gone (RunFacts.owner_gone, under the lock)",
    "counters_compact": "system work, takes no run lock: found here only because its "
                        "cursor's execute() has the name of reconciliation's execute",
    # LangGraph threads (issue 10, docs/langgraph.md).
    "graph_put": "fenced: tests/services/test_langgraph.py::"
                 "test_an_ousted_graph_is_fenced_on_every_langgraph_write_path",
    "graph_put_writes": "fenced: same test",
    "graph_thread_delete": "not fenced by design: LangGraph calls it outside any "
                           "invocation (an app deleting a conversation); a live graph's "
                           "next put is then a 412 (its parent is gone)",
    "graph_threads_prune": "not fenced by design, as graph_thread_delete",
    "graph_runs_delete": "not fenced by design, as graph_thread_delete",
    "graph_thread_copy": "not fenced by design, as graph_thread_delete; the target must be "
                         "empty (412)",
}


def _run_writers() -> set[str]:
    return public_functions_reaching((*service_modules(), *interop_modules(), reconciliation),
                                     {"_lock_run", "_get_run"})


def test_every_run_write_path_is_classified():
    found = _run_writers()
    missing = sorted(found - set(WRITE_PATHS))
    assert not missing, f"services that write under a run's lock, not in WRITE_PATHS: {missing}"
    stale = sorted(set(WRITE_PATHS) - found)
    assert not stale, f"WRITE_PATHS names services that no longer lock a run: {stale}"
    with_token = {name for module in (services, langgraph, runifold)
                  for name, fn in inspect.getmembers(module, inspect.isfunction)
                  if not name.startswith("_")
                  and "fencing_token" in inspect.signature(fn).parameters}
    assert with_token == FENCED, f"services taking a fencing token: {sorted(with_token)}"


# --------------------------------------------------------------------------------------
# The worlds: how the writer holding token 1 was ousted
# --------------------------------------------------------------------------------------

OLD = 1  # the ousted writer's token


@dataclass
class World:
    tenant: object
    writer: object            # the ousted writer's account (its token is OLD)
    heir: object              # the new owner's account
    run_id: uuid.UUID
    cp: dict                  # the run's checkpoint at its current revision
    now: int                  # the run's current token
    authorized: dict[str, dict] = field(default_factory=dict)  # from state -> effect body
    client: object = None     # the ousted writer's API client (made before any snapshot)

    def api(self):
        if self.client is None:
            self.client = bearer_client(self.writer)
        return self.client


def _lease(actor, tenant, run_id, owner, ttl=600) -> int:
    return services.lease_acquire(actor=actor, tenant=tenant, run_id=run_id, owner=owner,
                                  ttl_s=ttl).fencing_token


def ousted_by_live_lease(acme, wendy, heir, rita, april) -> World:
    cp = envelope(payload={"phase": "ready", "order_id": "A-1"})
    run_id = uuid.UUID(cp["run_id"])
    put_checkpoint(wendy, acme, cp)
    assert _lease(wendy, acme, run_id, "w1", ttl=60) == OLD
    age_world(120)  # w1's lease expires ...
    now = _lease(heir, acme, run_id, "w2")  # ... and w2 takes the run
    return World(acme, wendy, heir, run_id, cp, now)


def ousted_then_lease_expired(acme, wendy, heir, rita, april) -> World:
    world = ousted_by_live_lease(acme, wendy, heir, rita, april)
    age_world(1200)  # w2's lease expired too: no live lease, the token stays
    return world


def ousted_by_retry_claim(acme, wendy, heir, rita, april) -> World:
    cp = envelope(payload={"phase": "charging", "order_id": "A-1"})
    run_id = uuid.UUID(cp["run_id"])
    put_checkpoint(wendy, acme, cp)
    assert _lease(wendy, acme, run_id, "w1", ttl=60) == OLD
    unknown = effect_body(run_id=run_id, operation_key="charge:unknown")
    not_executed = effect_body(run_id=run_id, operation_key="charge:not-executed")
    _walk(wendy, acme, unknown, ["submitted"], OLD)
    _walk(wendy, acme, not_executed, ["submitted", "unresolved", "not_executed"], OLD)
    age_world(3600)
    services.sweep_stale_runs()  # submitted -> unresolved: the owner is gone
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=unknown["id"],
                                 reason="no look-up")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="died")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    claimed = services.resume_claim(actor=heir, tenant=acme, run_id=run_id, asked={})
    assert claimed["action"] == "retry"
    authorized = {}
    for state, body in (("unknown", unknown), ("not_executed", not_executed)):
        current = selectors.effect_get(user=wendy, tenant=acme, effect_id=body["id"])
        assert current.state == state
        authorized[state] = dict(body, revision=current.revision, state=state)
    return World(acme, wendy, heir, run_id, cp, claimed["fencing_token"], authorized)


OUSTINGS = {"live-lease": ousted_by_live_lease, "lease-expired": ousted_then_lease_expired,
            "retry-claimed": ousted_by_retry_claim}


def _walk(actor, tenant, body: dict, states: list[str], token) -> dict:
    """Create ``body`` as planned and move it through ``states`` with ``token``; returns
    the body at its last revision."""
    put_effect(actor, tenant, dict(body, revision=0, state="planned", receipt=None),
               token=token)
    current = dict(body, revision=0, state="planned", receipt=None)
    for state in states:
        current = dict(current, revision=current["revision"] + 1, state=state,
                       receipt={"charge_id": "ch_1"} if state == "confirmed" else None)
        put_effect(actor, tenant, current, expected=current["revision"] - 1, token=token)
    return current


# --------------------------------------------------------------------------------------
# The write paths: what the ousted writer attempts
# --------------------------------------------------------------------------------------

@dataclass
class Attempt:
    kind: str            # "checkpoint" | "effect"
    body: dict
    expected: int | None
    actual: int | None   # the target's revision in the store (None: it does not exist)
    accepted_with_current_token: bool = True  # False: a create of a taken id (id_exists)


def cp_create(w: World) -> Attempt:
    body = envelope(run_id=w.run_id, payload={"phase": "ready", "order_id": "A-2"})
    return Attempt("checkpoint", body, None, None)


def cp_update(w: World) -> Attempt:
    current = selectors.checkpoint_get(user=w.writer, tenant=w.tenant,
                                       checkpoint_id=w.cp["id"]).revision
    return Attempt("checkpoint", dict(w.cp, revision=current + 1), current, current)


def cp_create_existing(w: World) -> Attempt:
    current = selectors.checkpoint_get(user=w.writer, tenant=w.tenant,
                                       checkpoint_id=w.cp["id"]).revision
    return Attempt("checkpoint", dict(w.cp, revision=0), None, current,
                   accepted_with_current_token=False)


def fx_create(w: World) -> Attempt:
    return Attempt("effect", effect_body(run_id=w.run_id, operation_key="charge:new"), None,
                   None)


def fx_create_existing(w: World) -> Attempt:
    body = _walk(w.heir, w.tenant, effect_body(run_id=w.run_id, operation_key="charge:taken"),
                 [], w.now)
    return Attempt("effect", dict(body, revision=0), None, 0,
                   accepted_with_current_token=False)


def fx_move(from_state: str, to_state: str, by: str) -> Callable[[World], Attempt | None]:
    def build(w: World) -> Attempt | None:
        if by == EffectSource.RETRY:
            if from_state not in w.authorized:
                return None  # only after a consumed retry
            current = w.authorized[from_state]
        else:
            path = {"planned": [], "submitted": ["submitted"],
                    "unresolved": ["submitted", "unresolved"]}[from_state]
            current = _walk(w.heir, w.tenant, effect_body(
                run_id=w.run_id, operation_key=f"charge:{from_state}-{to_state}"), path, w.now)
        receipt = {"charge_id": "ch_2"} if to_state == "confirmed" else None
        body = dict(current, revision=current["revision"] + 1, state=to_state, receipt=receipt)
        return Attempt("effect", body, current["revision"], current["revision"])
    return build


PATHS: dict[str, Callable[[World], Attempt | None]] = {
    "checkpoint create": cp_create,
    "checkpoint update": cp_update,
    "checkpoint create of an existing id": cp_create_existing,
    "effect create": fx_create,
    "effect create of an existing id": fx_create_existing,
}
for (_from, _to), _by in sorted(policy.EFFECT_TRANSITIONS.items()):
    for _who in (EffectSource.RUNTIME, EffectSource.RETRY):
        if _who in _by:
            PATHS[f"effect {_from} -> {_to} ({_who})"] = fx_move(_from, _to, _who)

TOKENS = {"old token": lambda w: OLD, "future token": lambda w: w.now + 1,
          "no token": lambda w: None}


# --------------------------------------------------------------------------------------
# Doing one attempt, through the service or the API
# --------------------------------------------------------------------------------------

def by_service(w: World, a: Attempt, token):
    put = put_checkpoint if a.kind == "checkpoint" else put_effect
    try:
        put(w.writer, w.tenant, a.body, expected=a.expected, token=token)
    except (Fenced, StaleRevision) as exc:
        return exc
    return "accepted"


def by_api(w: World, a: Attempt, token):
    name = "api:checkpoint" if a.kind == "checkpoint" else "api:effect"
    key = "checkpoint_id" if a.kind == "checkpoint" else "effect_id"
    url = reverse(name, kwargs={"tenant": w.tenant.slug, key: a.body["id"]})
    headers = ({"HTTP_IF_NONE_MATCH": "*"} if a.expected is None
               else {"HTTP_IF_MATCH": f'"{a.expected}"'})
    if token is not None:
        headers["HTTP_FENCING_TOKEN"] = str(token)
    return w.api().put(url, data=json.dumps(a.body),
                                        content_type="application/json", **headers)


def _refused(surface: str, outcome, current: int) -> str:
    """"" if ``outcome`` is the fenced refusal, else what it was."""
    if surface == "service":
        if isinstance(outcome, Fenced) and outcome.extra["fencing_token"] == current:
            return ""
        return f"not Fenced({current}): {outcome!r}"
    body = outcome.json() if outcome.get("Content-Type", "").startswith("application/json") \
        else outcome.content[:200]
    if outcome.status_code == 409 and body == {"error": "fenced", "fencing_token": current}:
        return ""
    return f"not 409 fenced/{current}: {outcome.status_code} {body}"


def _counters_true() -> list[str]:
    """Every tenant's run state counters sum to its runs per state."""
    from collections import Counter

    from checkpoints.models import RunStateCount

    kept, real = Counter(), Counter()
    for tenant_id, state, n in RunStateCount.objects.values_list("tenant_id", "state", "n"):
        kept[(tenant_id, state)] += n
    for tenant_id, state in Run.objects.values_list("tenant_id", "recovery_state"):
        real[(tenant_id, state)] += 1
    kept = +kept  # drops zero counts
    return [] if kept == real else [f"state counters {dict(kept)} != runs {dict(real)}"]


def _history_of(run_pk, changed: dict) -> list[str]:
    """The run-history rows a kept conflict added: only added, only of the run, the last
    one leading to the run's state."""
    from checkpoints.models import RunTransition

    if set(changed) - {"added"}:
        return [f"run history changed, not only added: {changed}"]
    rows = list(RunTransition.objects.filter(pk__in=changed.get("added", []))
                .order_by("at", "id").values_list("run_id", "to_state"))
    if any(run != run_pk for run, _ in rows):
        return [f"history added for another run: {rows}"]
    state = Run.objects.filter(pk=run_pk).values_list("recovery_state", flat=True).first()
    if rows and rows[-1][1] != state:
        return [f"history ends in {rows[-1][1]}, the run is {state}"]
    return []


def _outbox_of(run_pk, changed: dict) -> list[str]:
    """The outbox rows a kept conflict added: only added, only of the run."""
    from checkpoints.models import NotificationOutbox

    if set(changed) - {"added"}:
        return [f"outbox changed, not only added: {changed}"]
    runs = set(NotificationOutbox.objects.filter(pk__in=changed.get("added", []))
               .values_list("run_id", flat=True))
    return [f"outbox rows for another run: {runs}"] if runs - {run_pk} else []


def _check_kept_as_conflict(w: World, a: Attempt, token, before, after, run_before,
                            run_pk) -> list[str]:
    problems = []
    diff = db_diff(before, after)
    added_conflicts = diff.pop("checkpoints.Conflict", {})
    added_events = diff.pop("checkpoints.AuditEvent", {})
    diff.pop("checkpoints.AuditChainHead", None)
    # Every event is queued for the audit sequencer by a trigger (migration 0035): the
    # queue's rows are the events' (its primary key is the event's).
    if diff.pop("checkpoints.AuditPending", {}) != added_events:
        problems.append("the audit queue does not hold exactly the events added")
    run_diff = diff.pop("checkpoints.Run", {})
    # The state counters follow the run's state (triggers, migration 0011): derived, so
    # checked against the runs instead of diffed.
    diff.pop("checkpoints.RunStateCount", None)
    diff.pop("checkpoints.EffectStateCount", None)
    # So is the run's history (triggers, migration 0013): only rows of this run, added.
    problems += _history_of(run_pk, diff.pop("checkpoints.RunTransition", {}))
    # The report's rollups (triggers, migration 0036) count the conflict and the run's
    # transition (tests/services/test_size_rollups.py checks them against the rows); a
    # refused write stores no revision, so never a size.
    diff.pop("checkpoints.ReportCount", None)
    if diff.pop("checkpoints.CheckpointSizeRollup", None):
        problems.append("a refused write was counted in the checkpoint sizes")
    # And the notification outbox (trigger, migration 0031): the run turned conflicted,
    # a state a person acts on; only rows of this run, added.
    problems += _outbox_of(run_pk, diff.pop("checkpoints.NotificationOutbox", {}))
    if diff:
        problems.append(f"changed beyond the conflict record: {diff}")
    problems += _counters_true()
    if set(added_conflicts) != {"added"} or len(added_conflicts["added"]) != 1:
        return problems + [f"not exactly one new conflict row: {added_conflicts}"]
    if set(added_events) != {"added"} or len(added_events["added"]) != 1:
        problems.append(f"not exactly one new audit event: {added_events}")
    else:
        action = AuditEvent.objects.get(pk=added_events["added"][0]).action
        if action != f"{a.kind}.conflict":
            problems.append(f"audit action {action}")
    if run_diff not in ({}, {"changed": [run_pk]}):
        problems.append(f"runs changed: {run_diff}")
    run_after = Run.objects.filter(pk=run_pk).values().get()
    moved = {k for k in run_after if run_after[k] != run_before[k]}
    if moved - {"unacknowledged_conflicts", "recovery_state", "recovery_reason",
                "state_changed_at", "updated_at"}:
        problems.append(f"the run changed beyond its conflict count and state: {moved}")
    if run_after["unacknowledged_conflicts"] != run_before["unacknowledged_conflicts"] + 1:
        problems.append("the run's open conflict count did not go up by one")
    c = Conflict.objects.get(pk=added_conflicts["added"][0])
    got = (c.run_id, c.reason, c.target_type, str(c.target_uuid), c.fencing_token_sent,
           c.fencing_token_current, c.expected_revision, c.actual_revision,
           c.attempted_revision)
    want = (run_pk, "fenced", a.kind, a.body["id"], token, w.now, a.expected, a.actual,
            a.body["revision"])
    if got != want:
        problems.append(f"conflict row {got}, expected {want}")
    return problems


# A retry's moves (x -> planned) exist only after a consumed retry: the retry-claimed row.
CASES = [(o, p) for o in OUSTINGS for p in PATHS
         if o == "retry-claimed" or f"({EffectSource.RETRY})" not in p]


@pytest.mark.django_db
@pytest.mark.parametrize(("ousting", "path"), CASES, ids=[f"{o}-{p}" for o, p in CASES])
def test_an_ousted_writer_is_fenced_on_every_write_path(acme, wendy, rita, april, ousting,
                                                        path):
    heir = _person("heir", acme, "writer", service=True)
    w = OUSTINGS[ousting](acme, wendy, heir, rita, april)
    attempt = PATHS[path](w)
    assert attempt is not None, f"{path} needs a consumed retry"
    run_pk = selectors.run_get(user=wendy, tenant=acme, run_id=w.run_id).pk
    w.api()
    failures = []
    for surface, do in (("service", by_service), ("api", by_api)):
        for token_name, token_of in TOKENS.items():
            token = token_of(w)
            with transaction.atomic():
                before = db_state()
                run_before = Run.objects.filter(pk=run_pk).values().get()
                outcome = do(w, attempt, token)
                problem = _refused(surface, outcome, w.now)
                problems = [problem] if problem else _check_kept_as_conflict(
                    w, attempt, token, before, db_state(), run_before, run_pk)
                transaction.set_rollback(True)
            failures += [f"{surface}, {token_name} ({token}): {p}" for p in problems]
        # Positive control: the current token is accepted (or, for a taken id, answered
        # as the id_exists conflict it is), so the token alone made the refusal.
        with transaction.atomic():
            outcome = do(w, attempt, w.now)
            if surface == "api":
                outcome = {200: "accepted", 201: "accepted", 412: "stale"}.get(
                    outcome.status_code, outcome.status_code)
            elif isinstance(outcome, StaleRevision):
                outcome = "stale"
            want = "accepted" if attempt.accepted_with_current_token else "stale"
            if outcome != want:
                failures.append(f"{surface}, current token: {outcome!r}, expected {want}")
            transaction.set_rollback(True)
    assert not failures, f"{ousting} / {path}:\n" + "\n".join(failures)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["checkpoint", "effect"])
def test_a_token_for_a_run_that_does_not_exist_is_fenced_and_leaves_nothing(acme, wendy,
                                                                            kind):
    """A new run's token is 0: a writer naming another is fenced; the run it would have
    made is not left behind, and there is no run to keep a conflict on."""
    body = envelope(payload={"phase": "ready"}) if kind == "checkpoint" else effect_body()
    a = Attempt(kind, body, None, None)
    w = World(acme, wendy, wendy, uuid.UUID(body["run_id"]), body, 0)
    w.api()
    for surface, do in (("service", by_service), ("api", by_api)):
        before = db_state()
        outcome = do(w, a, 3)
        assert not _refused(surface, outcome, 0), _refused(surface, outcome, 0)
        assert not db_diff(before, db_state()), f"{surface}: something was written"


@pytest.mark.django_db
@pytest.mark.parametrize("ousting", ["live-lease", "retry-claimed"])
def test_an_ousted_owner_cannot_lease_over_the_new_one(acme, wendy, rita, april, ousting):
    heir = _person("heir", acme, "writer", service=True)
    w = OUSTINGS[ousting](acme, wendy, heir, rita, april)
    if ousting == "retry-claimed":  # the heir claimed without a lease: it takes one now
        w.now = _lease(heir, acme, w.run_id, "w2")
    client = w.api()
    before = db_state()
    with pytest.raises(LeaseHeld):
        _lease(wendy, acme, w.run_id, "w1")
    r = client.post(
        reverse("api:run-lease", kwargs={"tenant": "acme", "run_id": str(w.run_id)}),
        data={"owner": "w1", "ttl_s": 60}, format="json")
    assert r.status_code == 409, r.content
    assert not db_diff(before, db_state()), "a refused lease changed something"
    assert w.now == services.resume_preview(actor=wendy, tenant=acme, run_id=w.run_id,
                                            asked={})["fencing_token"]


@pytest.mark.django_db
@pytest.mark.parametrize("ousting", list(OUSTINGS))
def test_a_claim_with_nothing_to_consume_changes_nothing(acme, wendy, rita, april, ousting):
    """``POST …/resume`` by the ousted writer (or anyone) with no approved retry to
    consume: an answer, no token bump, nothing of the run changed (CONTRACT.md 3); the
    only row written is the claim's own record (``ResumeDecision``, issue 9 item 6),
    one per claim, with the answer's action."""
    heir = _person("heir", acme, "writer", service=True)
    w = OUSTINGS[ousting](acme, wendy, heir, rita, april)
    client = w.api()
    before = db_state()
    answer = services.resume_claim(actor=wendy, tenant=acme, run_id=w.run_id, asked={})
    assert answer["action"] != "retry" and answer["fencing_token"] == w.now
    r = client.post(
        reverse("api:run-resume", kwargs={"tenant": "acme", "run_id": str(w.run_id)}),
        data={}, format="json")
    assert r.status_code == 200 and r.json()["fencing_token"] == w.now, r.content
    diff = db_diff(before, db_state())
    records = diff.pop("checkpoints.ResumeDecision", {})
    assert not diff
    assert set(records) == {"added"} and len(records["added"]) == 2
    assert set(ResumeDecision.objects.filter(pk__in=records["added"])
               .values_list("run__uuid", "action")) == {(w.run_id, answer["action"])}


# A rule matrix whose cases reach PostgreSQL-only SQL (the write path's statements), so
# `make test` runs it once, on PostgreSQL (test-sqlite deselects the `matrix` marker).
pytestmark = pytest.mark.matrix
