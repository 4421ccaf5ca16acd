"""What to do next with a run, in words: the one rule behind the run page's "Next step"
line, the inbox's reason column and the API run list's ``next_step`` (issue 21, item 7).

``next_step`` is pure: it reads a ``StepInput`` (the run's state, its effects, its open
retry request, its reconcile requests, whether its owner is live) and answers a ``Step``,
a full sentence for the run page and a short one ("payments confirmed · a retry replays
it") for a list. The run page builds its ``StepInput`` from what it has loaded anyway
(``dashboard.run``); ``page_steps`` builds one per run of a list page in a fixed number of
queries whatever the page's length (``tests/views/test_next_step.py`` pins it).
Presentation only: the services decide what is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC
from types import SimpleNamespace

from .. import heartbeat, kinds, policy, roles
from ..dbclock import NOW, db_now, page_now
from ..exceptions import NotFound
from ..models import Effect, ReconcileRequest, RetryRequest, Run, Tenant
from ..permissions import require
from ..vocab import EffectState, PhaseClass, ReconcileState, RecoveryState, RetryState
from .common import LEASE_LIVE, RUN_LIST_FIELDS

#: The separator of a short sentence's two halves: what is true · what a person does.
DOT = " · "


@dataclass(frozen=True)
class Step:
    """``text``: the run page's sentence (``""``: nothing to say); ``short``: the same
    advice in a few words for the inbox and the API run list (``""`` likewise)."""

    text: str = ""
    short: str = ""


@dataclass(frozen=True)
class StepInput:
    """What ``next_step`` reads about one run.

    ``effects``: objects with ``service``, ``operation_key``, ``state`` (creation order);
    ``open_retry``: the open retry request or ``None``, ``requester`` its requester's
    username; ``reconcile_rows``: ``reconcile_rows``' dicts, newest request first;
    ``owner``: ``{"owner": lease owner or "", "until": datetime or None}`` when the run's
    owner is live (reconcile waits), else ``None``; ``may_decide``/``may_withdraw``: the
    viewer's part in an open request (the run page's long sentence only)."""

    state: str
    phase_class: str = ""
    closed: bool = False
    closed_by: str = ""
    recovery_reason: str = ""
    kind: str = ""
    schema_version: int | None = None
    run_id: str = ""
    deleted: bool = False
    effects: Sequence = ()
    open_retry: object | None = None
    requester: str = ""
    reconcile_rows: Sequence[dict] = field(default_factory=tuple)
    owner: dict | None = None
    may_decide: bool = False
    may_withdraw: bool = False
    tenant: str = ""


def approved_retry_waits_for(kind: str, schema_version: int) -> str:
    """What a run whose retry is approved waits for, in words: ``"a migration"`` when its
    kind's version must be migrated before any resume (``kinds.migration_required``: the
    resume answers ``migration_required`` until then), else ``"the runtime"`` (its next
    resume call retries). The run page's header, its live line and its next step say the
    same (a newcomer saw "waiting for the runtime" above "waiting for a migration")."""
    return "a migration" if kinds.migration_required(kind, schema_version) else "the runtime"


#: The reason shown for an approved retry that must wait for a migration (``state_reason``).
APPROVED_WAITS_FOR_MIGRATION = ("retry approved, waiting for a migration before the runtime "
                                "can resume")


def state_reason(state: str, reason: str, kind: str, schema_version: int | None) -> str:
    """A run's recovery reason as the dashboard and the API show it: the stored one
    (``policy.recovery_state``'s, written with the run's state), except for an approved
    retry whose kind's version must be migrated first (``approved_retry_waits_for``),
    which the stored words cannot know (the kind can become offline without a write). The
    run page's header and the API's ``recovery_reason`` say the same (the attack found
    them apart)."""
    if (state == RecoveryState.RETRY_APPROVED
            and approved_retry_waits_for(kind, schema_version) == "a migration"):
        return APPROVED_WAITS_FOR_MIGRATION
    return reason


def words_now():
    """The time relative words ("3 min ago", "in 10 min") are measured against when the
    caller gives none (aware UTC): the request's database time (``dbclock.page_now``),
    never this process's clock (stop 32, the attack's finding: a node an hour ahead
    called a live lease's expiry "50 min ago"). ``ago`` and the dashboard's ``when``
    (which also writes it into ``data-now``) both read it here."""
    return page_now()


def ago(when, now=None) -> str:
    """``"12 s ago"``, ``"in 4 min"`` (``templatetags.dashboard.ago``'s words, which call
    this); ``"—"`` for none. ``now``: the database time the value was read with; else
    the request's (``words_now``), never this process's clock."""
    if not when:
        return "—"
    if now is not None and now.tzinfo is None:  # SQLite answers its 'now' without a zone
        now = now.replace(tzinfo=UTC)
    delta = ((now or words_now()) - when).total_seconds()
    # A time in the future by under a second is "in 0 s", not "0 s ago" (the newcomer's
    # finding: a live lease read "Expires 0 s ago live").
    future = delta < 0
    seconds = int(abs(delta))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size or unit == "s":
            text = f"{seconds // size} {unit}"
            break
    return f"in {text}" if future else f"{text} ago"


def owner_live_words(owner: dict, doing: str = "reconcile") -> str:
    """The sentence for a live owner: *The owner X is live until T (in 4 min); reconcile
    after it is gone.* ``owner`` is ``{"owner": lease owner or "", "until": when it counts
    as gone, or None}``; ``doing``: what waits for it (``request a retry``)."""
    who = (f"The owner {owner['owner']}" if owner["owner"]
           else "The run's owner (no lease; it wrote recently)")
    until = owner["until"]
    when = (f" until {until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({ago(until)})"
            if until else "")
    return f"{who} is live{when}; {doing} after it is gone."


def reconcile_rows(requests) -> list[dict]:
    """The run's reconcile requests (newest first, each with its ``effect``) as the rule
    and the run page's Reconciliation section read them: ``req``, ``effect``,
    ``broker_down`` (a queued request waits for the task queue to come back: its last
    error holds ``heartbeat.BROKER_DOWN``, or a broker is configured and it was never
    dispatched) and ``waits_for_human`` (a request that gave up, the newest of its
    effect, the effect still in doubt)."""
    broker = heartbeat.broker_configured()
    seen: set[int] = set()
    rows = []
    for r in requests:
        latest = r.effect_id not in seen
        seen.add(r.effect_id)
        queued = r.state == ReconcileState.QUEUED
        rows.append({
            "req": r,
            "effect": r.effect,
            "broker_down": queued and (heartbeat.BROKER_DOWN in r.last_error
                                       or (broker and r.dispatched_at is None)),
            "waits_for_human": (r.state == ReconcileState.GAVE_UP and latest
                                and r.effect.state in EffectState.IN_DOUBT),
        })
    return rows


def _services(effects) -> str:
    return ", ".join(sorted({e.service for e in effects}))


def _reconcile_step(in_doubt, rows: list[dict], owner: dict | None) -> Step:
    """While an effect is in doubt: wait for a reconciliation under way, wait for a live
    owner, decide after one gave up, or reconcile."""
    doubtful = [r for r in rows if r["effect"].state in EffectState.IN_DOUBT]
    open_rows = [r for r in doubtful if r["req"].state in ReconcileState.OPEN]
    if any(r["broker_down"] for r in open_rows):
        return Step("Reconciliation is queued and will run when the worker is back (nothing "
                    "is lost); nothing to do meanwhile",
                    f"reconcile queued{DOT}runs when the worker is back")
    waiting = [r["req"].waiting_for_worker_since for r in open_rows
               if r["req"].waiting_for_worker_since]
    if waiting:
        return Step(f"Reconcile job waiting for a worker since {min(waiting):%Y-%m-%d %H:%M:%S} "
                    f"UTC; the next stale-run sweep sends it again (nothing is lost)",
                    f"reconcile waits for a worker{DOT}nothing is lost")
    running = [r["effect"] for r in open_rows if r["req"].state == ReconcileState.RUNNING]
    if running:
        return Step(f"Reconciliation is asking {_services(running)} now; reload in a moment",
                    f"asking {_services(running)} now{DOT}wait for the answer")
    if open_rows:
        req = open_rows[0]["req"]  # read with the database's time (``db_now``)
        when = ago(req.next_attempt_at, getattr(req, "db_now", None))
        when = f"due {when}" if when.startswith("in ") else "due now"
        return Step(f"Reconciliation is queued; its next look-up is {when}: wait for the "
                    f"answer", f"reconcile queued{DOT}wait for the answer")
    if owner is not None:
        words = owner_live_words(owner).rstrip(".")
        return Step(f"Wait: {words[0].lower()}{words[1:]}",
                    f"owner still live{DOT}reconcile after it is gone")
    gave_up = [r["effect"] for r in rows if r["waits_for_human"]]
    if gave_up:
        e = gave_up[0]
        return Step(f"Reconciliation gave up on {e.service} {e.operation_key}: reconcile "
                    f"again, or mark the outcome unknown",
                    f"reconcile gave up{DOT}reconcile again or mark unknown")
    return Step(f"Reconcile first: ask {_services(in_doubt)} by operation key",
                f"{_services(in_doubt)} in doubt{DOT}reconcile first")


#: What a reconciliation that settled an in-flight run's effect leads to, best news
#: first: the run page's sentence and the short one.
_RECONCILED = {
    EffectState.CONFIRMED: (
        "Reconciliation confirmed {e}: request a retry (it replays the confirmed receipt; "
        "not called again) or close the run", "{s} confirmed" + DOT + "a retry replays it"),
    EffectState.NOT_EXECUTED: (
        "Reconciliation found that {e} never ran: request a retry (it is submitted again "
        "with the same key) or close the run", "{s} never ran" + DOT + "a retry calls it once"),
    EffectState.FAILED: (
        "Reconciliation found that the service refused {e}: request a retry (the run "
        "follows its failure path) or close the run",
        "{s} refused" + DOT + "a retry takes the failure path"),
}


def _reconciled(rows: list[dict]) -> Step | None:
    """The step for a run whose effect reconciliation settled, if one did and it still
    stands (the newest such request; ``confirmed`` before the others)."""
    for outcome, (text, short) in _RECONCILED.items():
        for r in rows:
            req, effect = r["req"], r["effect"]
            if (req.state == ReconcileState.DONE and req.outcome == outcome
                    and effect.state == outcome):
                return Step(text.format(e=f"{effect.service} {effect.operation_key}"),
                            short.format(s=effect.service))
    return None


def _settled_step(effects, rows: list[dict]) -> Step:
    """An in-flight ambiguous run whose every effect is settled: a retry re-runs the step
    and replays what was confirmed."""
    if not effects:
        return Step("No side effect was recorded; a retry re-runs the step, or close the run",
                    f"no side effect{DOT}a retry re-runs the step")
    reconciled = _reconciled(rows)
    if reconciled is not None:
        return reconciled
    confirmed = [e for e in effects if e.state == EffectState.CONFIRMED]
    short = (f"{_services(confirmed)} confirmed{DOT}a retry replays it"
             if len(confirmed) == len(effects) else f"effects settled{DOT}a retry replays them")
    return Step("Every recorded effect is settled; a retry re-runs the step and replays "
                "confirmed receipts (not called again), or close the run", short)


def _approval_step(i: StepInput) -> Step:
    short = f"retry requested by {i.requester}{DOT}an approver decides"
    if i.may_decide:
        return Step(f"Your decision: {i.requester} asked for this retry; read the preview, "
                    f"then approve or reject it", short)
    if i.may_withdraw:
        return Step(f"Waiting for an approver other than {i.requester} (you); you may "
                    f"withdraw your request below", short)
    return Step(f"Waiting for an approver other than {i.requester}", short)


def next_step(i: StepInput) -> Step:
    """The run's next step (``Step``): it leads a reviewer to an end state, the run retried
    (and finished by its runtime) or closed. The first situation that applies wins:
    payloads deleted, closed, schema mismatch, awaiting approval, retry approved, an effect
    in doubt (``_reconcile_step``), an unknown outcome, an in-flight run whose effects are
    settled (``_settled_step``), refused writes; else nothing to say."""
    state, effects = i.state, list(i.effects)
    in_doubt = [e for e in effects if e.state in EffectState.IN_DOUBT]
    unknown = [e for e in effects if e.state == EffectState.UNKNOWN]
    rows = list(i.reconcile_rows)
    if i.deleted:
        return Step("", f"payloads deleted{DOT}nothing to do")
    if i.closed:
        who = i.closed_by or "a reviewer"
        return Step(f"Closed by {who}: nothing to do here; a new write by the runtime "
                    f"reopens it", f"closed by {who}{DOT}nothing to do")
    if state == RecoveryState.SCHEMA_MISMATCH:
        return Step(f"Schema mismatch: {i.recovery_reason or 'unsupported kind or schema version'}",
                    f"unreadable checkpoint{DOT}the kind needs a fix or a migration")
    if state == RecoveryState.AWAITING_APPROVAL and i.open_retry is not None:
        return _approval_step(i)
    if state == RecoveryState.RETRY_APPROVED:
        if approved_retry_waits_for(i.kind, i.schema_version) == "a migration":
            # What the runtime's resume answers (reject / migration_required) until then.
            return Step("Approved, but waiting for a migration: "
                        + policy.migration_required_detail(i.kind, i.schema_version,
                                                           tenant=i.tenant, run_id=i.run_id),
                        f"retry approved{DOT}waits for a migration")
        return Step("Approved: the runtime's next resume call will retry",
                    f"retry approved{DOT}waits for the runtime")
    if in_doubt and state in RecoveryState.RETRYABLE:
        return _reconcile_step(in_doubt, rows, i.owner)
    if unknown and (i.open_retry is None or not policy.retry_applies(i.phase_class)):
        e = unknown[0]
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        nobody = f"Nobody can tell whether {e.service} ran {e.operation_key}{more}"
        if not policy.retry_applies(i.phase_class):
            # A completed run is replayed, never retried: what is left is to close it
            # once someone found out (stop 33, the second attack's finding).
            return Step(f"{nobody}; the run completed, so it is replayed, never retried: "
                        f"find out with the service, then close the run",
                        f"completed{DOT}nobody can tell")
        return Step(f"{nobody}: request a retry (accepts a possible duplicate) or close the "
                    f"run", f"nobody can tell{DOT}possible duplicate")
    if (state == RecoveryState.AMBIGUOUS and i.phase_class == PhaseClass.IN_FLIGHT
            and i.open_retry is None and all(e.state in EffectState.SETTLED for e in effects)):
        return _settled_step(effects, rows)
    if state == RecoveryState.CONFLICTED:
        return Step("Refused writes to acknowledge", f"refused writes{DOT}acknowledge them")
    return Step()


# --------------------------------------------------------------------------------------
# A list page: one Step per run in a fixed number of queries
# --------------------------------------------------------------------------------------

#: Runs whose step may depend on their reconcile requests and owner (an effect in doubt,
#: or an in-flight run whose effects reconciliation settled).
_RECONCILABLE = RecoveryState.RETRYABLE


def page_steps(*, user, tenant: Tenant, rows: list[dict]) -> dict:
    """``{run id: Step}`` for a page of ``selectors.run_list`` rows (``RUN_LIST_FIELDS``
    dicts), by ``next_step``, the run page's rule. At most four queries whatever the
    page's length (none for an empty page): the effects of the page's open runs (service,
    key, state), their open retry requests, the reconcile requests of those that may be
    reconciled (ambiguous, unknown outcome), and the database's clock when one has an
    effect in doubt (is its owner live?, ``policy.RunFacts``). Raises what
    ``permissions.require`` raises."""
    require(user, tenant, roles.VIEW)
    active = [r["id"] for r in rows if r["closed_at"] is None and r["payloads_deleted_at"] is None]
    effects: dict[int, list] = {pk: [] for pk in active}
    by_pk = {}
    retries: dict[int, RetryRequest] = {}
    requests: dict[int, list] = {}
    if active:
        for e in (Effect.objects.for_tenant(tenant).filter(run_id__in=active)
                  .only("id", "run_id", "service", "operation_key", "state")
                  .order_by("created_at", "id")):
            effects[e.run_id].append(e)
            by_pk[e.pk] = e
        for r in (RetryRequest.objects.for_tenant(tenant)
                  .filter(run_id__in=active, state__in=list(RetryState.OPEN))
                  .select_related("requested_by")):
            retries[r.run_id] = r
        reconcilable = [r["id"] for r in rows if r["id"] in effects
                        and r["recovery_state"] in _RECONCILABLE]
        if reconcilable:
            for req in (ReconcileRequest.objects.for_tenant(tenant)
                        .filter(run_id__in=reconcilable)
                        .only("id", "run_id", "effect_id", "state", "outcome", "last_error",
                              "dispatched_at", "claimed_until", "next_attempt_at",
                              "created_at")
                        .annotate(db_now=NOW)  # waiting_for_worker_since reads it
                        .order_by("-created_at", "-id")):
                req.effect = by_pk.get(req.effect_id)
                if req.effect is not None:
                    requests.setdefault(req.run_id, []).append(req)
    doubtful = [r for r in rows if r["recovery_state"] in _RECONCILABLE
                and any(e.state in EffectState.IN_DOUBT for e in effects.get(r["id"], ()))]
    now = db_now() if doubtful else None
    steps = {}
    for row in rows:
        pk = row["id"]
        owner = None
        if now is not None and row in doubtful:
            facts = policy.RunFacts.of(SimpleNamespace(**row), now=now,
                                       ambiguity_threshold_s=tenant.ambiguity_threshold_s)
            if not facts.owner_gone:
                owner = {"owner": row["lease_owner"], "until": facts.owner_gone_at}
        retry = retries.get(pk)
        steps[pk] = next_step(StepInput(
            state=row["recovery_state"], phase_class=row["phase_class"],
            closed=row["closed_at"] is not None,
            closed_by=row.get("closed_by__username") or "",
            recovery_reason=row["recovery_reason"], kind=row["kind"],
            schema_version=row["schema_version"], run_id=str(row["uuid"]),
            deleted=row["payloads_deleted_at"] is not None,
            effects=effects.get(pk, ()), open_retry=retry,
            requester=retry.requested_by.get_username() if retry else "",
            reconcile_rows=reconcile_rows(requests.get(pk, ())),
            owner=owner, tenant=tenant.slug))
    return steps


def run_step(*, user, tenant: Tenant, run) -> Step:
    """The next step of one ``run`` (a ``Run`` of ``tenant``) as the API's run list and
    the inbox give it (``page_steps`` over the run's ``RUN_LIST_FIELDS`` row, one query
    more): the API's run detail says what its list says (``run_get``'s ``next_step``;
    the newcomer's finding, stop 35). Raises what ``permissions.require`` raises, and
    ``NotFound`` for a run deleted since the caller read it (a 404, as a moment later)."""
    require(user, tenant, roles.VIEW)
    row = (Run.objects.for_tenant(tenant).filter(pk=run.pk).annotate(lease_live=LEASE_LIVE)
           .values(*RUN_LIST_FIELDS).first())
    if row is None:  # retention's phase 2 deleted it since the caller read it
        raise NotFound("no such run")
    return page_steps(user=user, tenant=tenant, rows=[row])[run.pk]
