"""Bulk actions (issue 9, item 3): one review action on many runs of a tenant.

``bulk_submit`` records the request (a ``BulkAction`` row and a ``bulk.submit`` audit
event, one transaction), then acts on each selected run with the run page's own service
function (``run_reconcile``, ``effect_mark_unknown`` for each in-doubt effect,
``retry_request``, ``run_close``, ``conflicts_acknowledge``, ``lease_revoke``), each run in its own
transaction together with its ``BulkActionItem`` result, and finally stores the counts
(``bulk.finish`` audit event). The rules are those functions' rules, not a copy of them:
a run refused by its rule (owner live, nothing in doubt, not retryable, already closed,
not found ...) gets a ``refused`` result with the service's plain words and its error
code, and nothing of its action is written; the other runs go on. Each run's action
writes its usual audit event, with the bulk's public id in the event's ``after``
(``"bulk_id"``; covered by the event's hash, so old events keep their hashes).

Idempotency: ``client_token`` (the dashboard form's hidden UUID, the API's
``Idempotency-Key``) is unique per (tenant, requester) in the database. A resubmission
with the same token and the same request (action, reason, selection: the
``fingerprint``) acts on nothing and answers the first submission's row (finished, or
still running when both arrive together: the second one's INSERT waits for the first's
commit and then finds it); the same token with a different request is refused 400
naming ``client_token``.

Where it runs: inline, in the request that submits it, up to ``BULK_MAX_RUNS`` (500)
runs; each run costs one short transaction (a few milliseconds on PostgreSQL), so a full
inline bulk answers in seconds (measured in docs/bulk.md). A bigger selection, up to
``BULK_JOB_MAX_RUNS`` (issue 22, item 6), is stored as a job (``queued``) and run by a
worker (``jobs.bulk``, through ``bulk_jobs``' dispatch and the sweep's re-drive; the
in-process worker without a broker): the same per-run step (``_act_on``) in batches, each
run's transaction also moving the job's counts and claim on (``bulk_job_act``), so a
worker killed mid-way is resumed from the first run without a result, and a reviewer's
``bulk_abort`` stops it before its next run. An inline bulk whose process dies mid-way
stays ``running`` with the results of the runs it finished; the reviewer submits a new
bulk action for the rest (runs already acted on are then refused by their own rule).

Rights: exactly the single actions' (``roles.REVIEW`` on the tenant, from tenant grants
only), checked before anything is written and again by each run's service; a stored
job's worker reads the requester again from the database before each batch and acts on
that batch's runs as that reading (``jobs.bulk``: deactivated, or the right lost, the
job ``failed``).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F

from .. import roles, selectors
from ..audit import audit_record, incident_now
from ..dbclock import NOW, db_now
from ..exceptions import AlreadyDone, DomainError, InvalidPayload, InvalidTransition, NotFound
from ..jsonparse import dumps
from ..models import (
    BULK_JOB_MAX_RUNS,
    BULK_MAX_RUNS,
    BulkAction,
    BulkActionItem,
    Effect,
    Run,
    Tenant,
)
from ..permissions import require
from ..vocab import AuditAction, BulkActionKind, BulkOutcome, BulkState, EffectState, TargetType
from .bulk_jobs import bulk_job_dispatch
from .common import _actor_name, _client_token_check, _require_reason, _resubmitted, _run_ids_check
from .leases import lease_revoke, owner_check
from .migration_jobs import stored_job_fail
from .reconcile_requests import run_reconcile
from .review import conflicts_acknowledge, effect_mark_unknown, retry_request, run_close

logger = logging.getLogger(__name__)

#: The right each bulk action needs: the single action's (CONTRACT.md 4).
RIGHTS = {kind: roles.REVIEW for kind in BulkActionKind.values}


# --------------------------------------------------------------------------------------
# One run: the single action's service, returning the words of the result table
# --------------------------------------------------------------------------------------

class Requested(str):
    """A reconcile's result words, carrying the stored requests' pks (``requests``): the
    result row keeps them, and the result page follows them to each run's outcome."""

    requests: list[int]


def _reconcile(*, actor, tenant, run_id, reason, bulk_id) -> str:
    queued = run_reconcile(actor=actor, tenant=tenant, run_id=run_id, reason=reason,
                           bulk_id=bulk_id)
    n = len(queued.requests)
    words = Requested(f"reconciliation of {n} effect{'s' if n != 1 else ''} requested "
                      f"(task {queued.task_id[:8]})")
    words.requests = [r.pk for r in queued.requests]
    return words


def _mark_unknown(*, actor, tenant, run_id, reason, bulk_id) -> str:
    # Every in-doubt effect of the run, each through effect_mark_unknown (its rules:
    # owner gone, run not closed, a move the reviewer may make); all or none of the run's.
    if not Run.objects.for_tenant(tenant).filter(uuid=run_id).exists():
        raise NotFound("no such run")
    effects = list(Effect.objects.for_tenant(tenant)
                   .filter(run__uuid=run_id, state__in=EffectState.IN_DOUBT)
                   .order_by("id").values_list("uuid", flat=True))
    if not effects:
        raise InvalidTransition("run: no effect is submitted or unresolved")
    for effect_id in effects:
        effect_mark_unknown(actor=actor, tenant=tenant, effect_id=effect_id, reason=reason,
                            bulk_id=bulk_id)
    n = len(effects)
    return f"{n} effect{'s' if n != 1 else ''} marked outcome unknown"


def _request_retry(*, actor, tenant, run_id, reason, bulk_id) -> str:
    retry = retry_request(actor=actor, tenant=tenant, run_id=run_id, reason=reason,
                          bulk_id=bulk_id)
    return f"retry requested (request {retry.pk}); an approver must decide"


def _close(*, actor, tenant, run_id, reason, bulk_id) -> str:
    run_close(actor=actor, tenant=tenant, run_id=run_id, reason=reason, bulk_id=bulk_id)
    return "closed; a new write by the runtime reopens it"


def _end_lease(*, actor, tenant, run_id, reason, bulk_id, lease_owner) -> str:
    # expected_owner: a run whose live lease another owner holds (taken since the
    # selection, or never the gone owner's) is refused lease_held, not ended.
    run = lease_revoke(actor=actor, tenant=tenant, run_id=run_id, reason=reason,
                       expected_owner=lease_owner, bulk_id=bulk_id)
    return (f"lease of {lease_owner} ended; fencing token now {run.fencing_token}: "
            "its old token is refused")


def _acknowledge(*, actor, tenant, run_id, reason, bulk_id) -> str:
    # only_open: a run with nothing left to acknowledge is "refused: already acknowledged
    # by X", not "0 acknowledged" (someone acted first, in words).
    n = conflicts_acknowledge(actor=actor, tenant=tenant, run_id=run_id, reason=reason,
                              only_open=True, bulk_id=bulk_id)
    return f"{n} conflict{'s' if n != 1 else ''} acknowledged"


#: Bulk action -> the call made for each run (keyword arguments ``actor, tenant, run_id,
#: reason, bulk_id``, and ``PARAMETERS``' of the action from the request; returns the
#: result's words, raises the service's ``DomainError``).
ACTIONS: dict[str, Callable[..., str]] = {
    BulkActionKind.RECONCILE: _reconcile,
    BulkActionKind.MARK_UNKNOWN: _mark_unknown,
    BulkActionKind.REQUEST_RETRY: _request_retry,
    BulkActionKind.CLOSE: _close,
    BulkActionKind.ACKNOWLEDGE_CONFLICTS: _acknowledge,
    BulkActionKind.END_LEASE: _end_lease,
}

#: An action's own parameters, required for it and refused for the others; kept in the
#: request's ``selection`` (so its fingerprint covers them) and passed to each run's call.
PARAMETERS: dict[str, tuple[str, ...]] = {BulkActionKind.END_LEASE: ("lease_owner",)}


def _refusal_words(exc: DomainError) -> str:
    if isinstance(exc, NotFound):
        return "not found in this tenant"
    detail = exc.detail or exc.error.replace("_", " ")
    # The services name the field first ("run: ..."): the table's column says it is the run.
    return detail.removeprefix("run: ")


# --------------------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------------------

def _run_ids(values) -> list[uuid.UUID]:
    return _run_ids_check(values, field="run_ids", most=BULK_JOB_MAX_RUNS,
                         what="per bulk action", empty="select at least one run")


def _existing(tenant: Tenant, actor, token: uuid.UUID, fingerprint: str) -> BulkAction | None:
    return _resubmitted(BulkAction, tenant=tenant, actor=actor, token=token,
                       fingerprint=fingerprint,
                       what="bulk request (another action, reason or selection)")


def _matching(actor, tenant: Tenant, filters: selectors.RunFilters) -> list[uuid.UUID]:
    """The runs ``filters`` select, at most ``BULK_JOB_MAX_RUNS``; 400 naming ``filters``
    when none or too many match."""
    ids = selectors.run_ids_matching(user=actor, tenant=tenant, filters=filters,
                                     limit=BULK_JOB_MAX_RUNS + 1)
    if not ids:
        raise InvalidPayload("filters: no run matches them")
    if len(ids) > BULK_JOB_MAX_RUNS:
        raise InvalidPayload(f"filters: more than {BULK_JOB_MAX_RUNS} runs match; a bulk "
                             f"action takes at most {BULK_JOB_MAX_RUNS}: narrow the filters")
    return ids


def bulk_search(q: str) -> str:
    """A bulk action's search ``q`` (its ``filters``' ``q``, given) as the search reads it
    (``selectors.search_terms``: stripped). The one rule of the API's ``filters.q`` and
    the dashboard bulk bar's ``filters`` ``q=``: an empty search (``""``, only spaces) is
    refused, ``InvalidPayload`` ``"q: ..."`` (the caller names where: ``filters.q``), and
    so is a ``q`` no search can read (``search_terms``'s refusals). A list treats an
    empty ``q`` as no search; for an action on every matching run that is every run, as
    ``{}``, from a search box left empty: a foot-gun. Leaving ``q`` out keeps meaning
    every run the other filters match."""
    text = selectors.search_terms(q)
    if not text:
        raise InvalidPayload("q: an empty search would act on every run; search for "
                             "something, or leave q out")
    return text


def _parameters(action: str, lease_owner) -> dict:
    """The action's own parameters (``PARAMETERS``), checked: ``end_lease`` needs
    ``lease_owner`` (the owner that is gone: a lease owner's rule, ``owner_check``), no
    other action takes it. Raises ``InvalidPayload`` naming ``lease_owner``."""
    if "lease_owner" not in PARAMETERS.get(action, ()):
        if lease_owner is not None:
            raise InvalidPayload(f"lease_owner: only {BulkActionKind.END_LEASE} takes an "
                                 "owner")
        return {}
    if lease_owner is None:
        raise InvalidPayload("lease_owner: required for end_lease: the owner whose leases "
                             "end (the runtime that is gone); a run leased by another "
                             "owner is refused, not ended")
    owner_check(lease_owner, "lease_owner")
    return {"lease_owner": lease_owner}


def bulk_submit(*, actor, tenant: Tenant, action: str, reason: str, client_token,
                run_ids=None, filters: selectors.RunFilters | None = None,
                lease_owner: str | None = None) -> tuple[BulkAction, bool]:
    """Act with ``action`` (a ``BulkActionKind``) on the runs ``run_ids`` (UUIDs or UUID
    strings, duplicates dropped, order kept) or on every run ``filters`` selects (the
    inbox's filters, newest write first); returns ``(bulk, created)``: ``created`` is
    false when ``client_token`` was already used for this same request (nothing was done
    again; ``bulk`` is that first submission). ``lease_owner``: ``end_lease``'s owner
    (``_parameters``), whose live lease on each run is ended; a run whose live lease
    another owner holds is refused ``lease_held``, one with none ``no_live_lease``.

    At most ``BULK_MAX_RUNS`` runs are acted on here, in the request. A bigger selection
    (up to ``BULK_JOB_MAX_RUNS``; issue 22, item 6) is stored as a job instead:
    ``queued``, handed to a worker after commit (``bulk_jobs.bulk_job_dispatch``; the
    in-process worker's sweep without a broker) and answered at once, its results filling
    in as the worker goes (``jobs.bulk``).

    Raises, before writing anything: ``Forbidden``/``NotFound`` (the action's right,
    ``RIGHTS``), ``InvalidPayload`` naming the field (``action`` unknown, ``reason``
    too long, ``client_token`` not a UUID or used for another request, ``run_ids`` not
    a list of UUIDs, empty or over the maximum, both or neither of ``run_ids`` and
    ``filters``, ``filters`` matching no run or too many, ``lease_owner`` missing for
    ``end_lease``, given for another action, or no owner's name), ``ReasonRequired``. A run's
    own refusal is never raised: it is that run's ``refused`` result.
    """
    if action not in BulkActionKind.values:
        raise InvalidPayload(f"action: must be one of {', '.join(BulkActionKind.values)}")
    require(actor, tenant, RIGHTS[action])
    reason = _require_reason(reason)
    token = _client_token_check(client_token)
    params = _parameters(action, lease_owner)
    if (run_ids is None) == (filters is None):
        raise InvalidPayload("run_ids: give the selected runs (run_ids) or the filters "
                             "they match (filters), one of the two")
    if run_ids is not None:
        ids = _run_ids(run_ids)
        selection = {"run_ids": [str(i) for i in ids]}
    else:
        ids = None
        selection = {"filters": asdict(filters)}
    selection.update(params)
    fingerprint = hashlib.sha256(dumps({"action": action, "reason": reason,
                                        "selection": selection}).encode()).hexdigest()
    bulk = _existing(tenant, actor, token, fingerprint)
    if bulk is not None:
        return bulk, False
    if ids is None:
        ids = _matching(actor, tenant, filters)
    bulk = _record(actor, tenant, action=action, reason=reason, token=token,
                   selection=selection, fingerprint=fingerprint, ids=ids)
    if bulk is None:  # the same token at the same moment: theirs, already recorded
        return _existing(tenant, actor, token, fingerprint), False
    if bulk.background:
        return bulk, True
    counts = {outcome: 0 for outcome in BulkOutcome.values}
    for position, run_id in enumerate(ids):
        counts[_act_on(bulk, actor, tenant, position, run_id)] += 1
    _finish(bulk, actor, tenant, counts)
    return bulk, True


def _record(actor, tenant: Tenant, *, action: str, reason: str, token: uuid.UUID,
            selection: dict, fingerprint: str, ids: list[uuid.UUID]) -> BulkAction | None:
    """Write the ``BulkAction`` and its ``bulk.submit`` event (one transaction): inline
    (``running``) up to ``BULK_MAX_RUNS`` runs, else a stored job (``queued``, its run
    list in ``targets`` when filters chose them, dispatched after commit). Returns None
    when the same client token was recorded at the same moment (our INSERT waited for
    theirs to commit)."""
    background = len(ids) > BULK_MAX_RUNS
    after = {"action": action, "runs": len(ids), **selection}
    if background:
        # A job's ids (up to 50,000) stay on its row; the event names them by the
        # request's fingerprint (SHA-256 of action, reason and selection).
        after = {"action": action, "runs": len(ids), "job": True, "fingerprint": fingerprint,
                 **{k: v for k, v in selection.items() if k != "run_ids"}}
    try:
        with transaction.atomic():
            bulk = BulkAction.objects.create(
                tenant=tenant, uuid=uuid.uuid4(), client_token=token, requested_by=actor,
                requested_by_name=_actor_name(actor), action=action, reason=reason,
                # A stored job's events carry the request's incident, as an inline
                # bulk's do (the stop-38 attack: they carried none).
                incident_ref=incident_now() or None,
                selection=selection, fingerprint=fingerprint, total=len(ids),
                background=background,
                state=BulkState.QUEUED if background else BulkState.RUNNING,
                targets=([str(i) for i in ids] if background and "filters" in selection
                         else None))
            audit_record(tenant=tenant, actor=actor, action=AuditAction.BULK_SUBMIT,
                         target_type=TargetType.BULK_ACTION, target_id=bulk.uuid,
                         reason=reason, after=after)
            if background:
                pk = bulk.pk
                transaction.on_commit(lambda: bulk_job_dispatch([pk]))
    except IntegrityError:
        if _existing(tenant, actor, token, fingerprint) is None:
            raise
        return None
    return bulk


def _act_on(bulk: BulkAction, actor, tenant: Tenant, position: int, run_id: uuid.UUID,
            hold: Callable[[str], None] | None = None) -> str:
    """One run: its action and its result row in one transaction (so ``done`` means
    committed); a refusal rolls back that run's action only. Returns the outcome.

    ``hold`` (a stored job's, ``bulk_jobs.bulk_job_act``): called with the outcome in
    the same transaction, after the result row; it moves the job's counts on and raises
    when the job is no longer this worker's (aborted, re-driven), which rolls the run's
    action and result back."""
    if hold is None:
        return _act(bulk, actor, tenant, position, run_id)
    with transaction.atomic():
        outcome = _act(bulk, actor, tenant, position, run_id)
        hold(outcome)
    return outcome


def _act(bulk: BulkAction, actor, tenant: Tenant, position: int, run_id: uuid.UUID) -> str:
    item = dict(tenant=tenant, bulk=bulk, position=position, run_uuid=run_id)
    try:
        with transaction.atomic():
            params = {p: bulk.selection[p] for p in PARAMETERS.get(bulk.action, ())}
            detail = ACTIONS[bulk.action](actor=actor, tenant=tenant, run_id=run_id,
                                          reason=bulk.reason, bulk_id=bulk.uuid, **params)
            BulkActionItem.objects.create(**item, outcome=BulkOutcome.DONE, detail=str(detail),
                                          reconcile_requests=getattr(detail, "requests", None))
        return BulkOutcome.DONE
    except DomainError as exc:
        outcome, error, detail = BulkOutcome.REFUSED, exc.error, _refusal_words(exc)
    except Exception as exc:  # one run's bug or outage must not stop the others
        logger.exception("bulk action %s: run %s failed", bulk.uuid, run_id)
        outcome, error = BulkOutcome.FAILED, type(exc).__name__[:64]
        detail = "an unexpected error; nothing of this run's action was kept (server log)"
    BulkActionItem.objects.create(**item, outcome=outcome, error=error, detail=detail)
    return outcome


def _finish(bulk: BulkAction, actor, tenant: Tenant, counts: dict[str, int]) -> None:
    with transaction.atomic():
        now = db_now()
        (BulkAction.objects.for_tenant(tenant).filter(pk=bulk.pk)
         .update(state=BulkState.FINISHED, finished_at=now, done=counts[BulkOutcome.DONE],
                 refused=counts[BulkOutcome.REFUSED], failed=counts[BulkOutcome.FAILED]))
        bulk.state, bulk.finished_at = BulkState.FINISHED, now
        bulk.done = counts[BulkOutcome.DONE]
        bulk.refused = counts[BulkOutcome.REFUSED]
        bulk.failed = counts[BulkOutcome.FAILED]
        audit_record(tenant=tenant, actor=actor, action=AuditAction.BULK_FINISH,
                     target_type=TargetType.BULK_ACTION, target_id=bulk.uuid,
                     before={"state": BulkState.RUNNING},
                     after={"state": BulkState.FINISHED, **counts})


# --------------------------------------------------------------------------------------
# A stored job's steps (issue 22, item 6): the worker is ``jobs.bulk``
# --------------------------------------------------------------------------------------

class BulkJobLost(Exception):
    """The bulk job is no longer this attempt's (a reviewer aborted it, or it was
    re-driven after its claim passed): the run in progress is rolled back; stop."""


def _held(job: BulkAction):
    """The job's row while this attempt holds it: ``running``, same ``attempts``."""
    return BulkAction.objects.for_tenant(job.tenant_id).filter(
        pk=job.pk, state=BulkState.RUNNING, attempts=job.attempts)


def bulk_job_act(job: BulkAction, position: int, run_id, *, actor, claim_s: int) -> str:
    """Act on one run of a claimed bulk job (``job``: its row as claimed, with
    ``attempts``) as ``actor``, as the inline path does (``_act_on``: the action's own
    service, which checks ``actor``'s right, and its result row), and in the same
    transaction move the job's count of that outcome on by
    one and its claim to ``claim_s`` seconds from now (database clock), provided the job
    is still ``running`` under this attempt. Returns the outcome. Raises ``BulkJobLost``
    (nothing of the run kept) when it is not: aborted, or taken over by another worker
    (also when the run already has its result row: another attempt acted on it).

    ``actor``: the job's requester as the worker read them again before this batch
    (``jobs.bulk._requester``: a fresh user object, never ``job.requested_by`` as loaded
    at the claim, whose kept rights and ``is_active`` would outlive a revocation or a
    deactivation).

    Lock order (``locks``): the action takes the tenant's audit head and the run, then
    this touches the job's row (``bulk_abort`` and ``bulk_job_finish`` likewise append
    their event before touching it)."""
    def hold(outcome: str) -> None:
        moved = _held(job).update(claimed_until=NOW + timedelta(seconds=claim_s),
                                  updated_at=NOW, **{outcome: F(outcome) + 1})
        if moved != 1:
            raise BulkJobLost(f"bulk job {job.uuid}: no longer this worker's")

    try:
        return _act_on(job, actor, job.tenant, position, uuid.UUID(str(run_id)), hold=hold)
    except IntegrityError:
        # The run's result row exists (its unique key): another attempt did this run.
        raise BulkJobLost(f"bulk job {job.uuid}: run {run_id} already has a result") from None


def bulk_job_finish(job: BulkAction) -> dict[str, int]:
    """End a claimed bulk job whose every run has its result: ``finished`` with its
    ``bulk.finish`` event (the counts, as the job's row kept them with each run), one
    transaction. Returns the counts. Raises ``BulkJobLost`` (nothing written) when the job
    is no longer this attempt's (aborted meanwhile)."""
    with transaction.atomic():
        row = (_held(job).values("done", "refused", "failed").first())
        if row is None:
            raise BulkJobLost(f"bulk job {job.uuid}: no longer this worker's")
        counts = {outcome: row[outcome] for outcome in BulkOutcome.values}
        audit_record(tenant=job.tenant, actor=job.requested_by,
                     action=AuditAction.BULK_FINISH, target_type=TargetType.BULK_ACTION,
                     target_id=job.uuid, before={"state": BulkState.RUNNING},
                     after={"state": BulkState.FINISHED, **counts})
        if _held(job).update(state=BulkState.FINISHED, finished_at=NOW, claimed_until=None,
                             updated_at=NOW, failures=0, last_error="") != 1:
            raise BulkJobLost(f"bulk job {job.uuid}: no longer this worker's")
    return counts


def bulk_job_fail(job: BulkAction, *, last_error: str, reason: str,
                  failures: int | None = None) -> bool:
    """Give up a claimed bulk job (``job``: its row as claimed, with ``attempts``):
    ``failed`` with ``last_error`` (the words its page and API show) and one
    ``bulk.fail`` event by the system saying why (``reason``) and how far it got (the
    job's ``done``/``refused``/``failed`` counts, as its row kept them with each run, and
    ``total``), one transaction (``migration_jobs.stored_job_fail``, the one failing end
    of stored jobs). Returns False, writing nothing, when the job is no longer this
    attempt's (aborted meanwhile: ``bulk.abort`` is then its end; or taken over)."""
    def progress() -> dict | None:
        return _held(job).values(*BulkOutcome.values, "total").first()

    return stored_job_fail(
        job, _held(job), action=AuditAction.BULK_FAIL, target_type=TargetType.BULK_ACTION,
        running=BulkState.RUNNING, failed=BulkState.FAILED, last_error=last_error,
        reason=reason, failures=failures, progress=progress)


def bulk_abort(*, actor, tenant: Tenant, bulk_id, reason: str) -> BulkAction:
    """A reviewer stops a bulk action running as a stored job (issue 22, item 6): it
    becomes ``aborted`` (who, why, when: database clock) with a ``bulk.abort`` audit
    event, one transaction. The worker stops before its next run (each run's
    transaction checks the job is still running; a run in progress either commits
    before the abort or is rolled back); the runs done stay done, the others get no
    result. Returns the bulk action as aborted.

    Raises, writing nothing: ``NotFound``/``Forbidden`` (``roles.REVIEW``: the right of
    the actions it runs; an id of another tenant is not found), ``ReasonRequired``,
    ``InvalidTransition`` (422) for an inline bulk action (at most ``BULK_MAX_RUNS`` runs:
    it runs in the request that submitted it), ``AlreadyDone`` (422, who and when) when
    it already finished, failed or was aborted."""
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    try:
        bid = uuid.UUID(str(bulk_id))
    except ValueError:
        raise NotFound("no such bulk action") from None
    jobs = BulkAction.objects.for_tenant(tenant).defer("selection", "targets")
    with transaction.atomic():
        bulk = jobs.filter(uuid=bid).first()
        if bulk is None:
            raise NotFound("no such bulk action")
        if not bulk.background:
            raise InvalidTransition("bulk: it ran in the request that submitted it (at "
                                    f"most {BULK_MAX_RUNS} runs); there is nothing to abort")
        if bulk.state not in BulkState.OPEN:
            raise AlreadyDone("bulk", what=bulk.state, by=bulk.aborted_by_name,
                              at=bulk.finished_at, run_id=None)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.BULK_ABORT,
                     target_type=TargetType.BULK_ACTION, target_id=bulk.uuid, reason=reason,
                     before={"state": bulk.state}, after={"state": BulkState.ABORTED})
        stopped = jobs.filter(pk=bulk.pk, state__in=BulkState.OPEN).update(
            state=BulkState.ABORTED, finished_at=NOW, claimed_until=None, updated_at=NOW,
            aborted_by_name=_actor_name(actor), abort_reason=reason)
        bulk = jobs.get(pk=bulk.pk)
        if stopped != 1:  # it finished meanwhile: roll the event back, say so
            raise AlreadyDone("bulk", what=bulk.state, by=bulk.aborted_by_name,
                              at=bulk.finished_at, run_id=None)
    return bulk
