"""Bulk actions (issue 9, item 3): one review action on many runs of a tenant.

``bulk_submit`` records the request (a ``BulkAction`` row and a ``bulk.submit`` audit
event, one transaction), then acts on each selected run with the run page's own service
function (``run_reconcile``, ``effect_mark_unknown`` for each in-doubt effect,
``retry_request``, ``run_close``, ``conflicts_acknowledge``), each run in its own
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

Where it runs: inline, in the request that submits it. At most ``BULK_MAX_RUNS`` (500)
runs; each run costs one short transaction (a few milliseconds on PostgreSQL), so a full
bulk answers in seconds (measured in docs/bulk.md), and no task queue stands between the
reviewer and the result table. A process that dies mid-way leaves the bulk ``running``
with the results of the runs it finished (each committed with its action), shown as such;
the reviewer submits a new bulk action for the rest (runs already acted on are then
refused by their own rule, e.g. "already closed").

Rights: exactly the single actions' (``roles.REVIEW`` on the tenant, from tenant grants
only), checked before anything is written and again by each run's service.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict

from django.db import IntegrityError, transaction

from .. import roles, selectors
from ..audit import audit_record
from ..dbclock import db_now
from ..exceptions import DomainError, InvalidPayload, InvalidTransition, NotFound
from ..jsonparse import dumps
from ..models import BULK_MAX_RUNS, BulkAction, BulkActionItem, Effect, Run, Tenant
from ..permissions import require
from ..vocab import AuditAction, BulkActionKind, BulkOutcome, BulkState, EffectState, TargetType
from .common import _actor_name, _client_token_check, _require_reason, _resubmitted, _run_ids_check
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


def _acknowledge(*, actor, tenant, run_id, reason, bulk_id) -> str:
    # only_open: a run with nothing left to acknowledge is "refused: already acknowledged
    # by X", not "0 acknowledged" (someone acted first, in words).
    n = conflicts_acknowledge(actor=actor, tenant=tenant, run_id=run_id, reason=reason,
                              only_open=True, bulk_id=bulk_id)
    return f"{n} conflict{'s' if n != 1 else ''} acknowledged"


#: Bulk action -> the call made for each run (keyword arguments ``actor, tenant, run_id,
#: reason, bulk_id``; returns the result's words, raises the service's ``DomainError``).
ACTIONS: dict[str, Callable[..., str]] = {
    BulkActionKind.RECONCILE: _reconcile,
    BulkActionKind.MARK_UNKNOWN: _mark_unknown,
    BulkActionKind.REQUEST_RETRY: _request_retry,
    BulkActionKind.CLOSE: _close,
    BulkActionKind.ACKNOWLEDGE_CONFLICTS: _acknowledge,
}


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
    return _run_ids_check(values, field="run_ids", most=BULK_MAX_RUNS, what="per bulk action",
                         empty="select at least one run")


def _existing(tenant: Tenant, actor, token: uuid.UUID, fingerprint: str) -> BulkAction | None:
    return _resubmitted(BulkAction, tenant=tenant, actor=actor, token=token,
                       fingerprint=fingerprint,
                       what="bulk request (another action, reason or selection)")


def bulk_submit(*, actor, tenant: Tenant, action: str, reason: str, client_token,
                run_ids=None, filters: selectors.RunFilters | None = None,
                ) -> tuple[BulkAction, bool]:
    """Act with ``action`` (a ``BulkActionKind``) on the runs ``run_ids`` (UUIDs or UUID
    strings, duplicates dropped, order kept) or on every run ``filters`` selects (the
    inbox's filters, newest write first), at most ``BULK_MAX_RUNS``; returns
    ``(bulk, created)``: ``created`` is false when ``client_token`` was already used for
    this same request (nothing was done again; ``bulk`` is that first submission).

    Raises, before writing anything: ``Forbidden``/``NotFound`` (the action's right,
    ``RIGHTS``), ``InvalidPayload`` naming the field (``action`` unknown, ``reason``
    too long, ``client_token`` not a UUID or used for another request, ``run_ids`` not
    a list of UUIDs, empty or over the maximum, both or neither of ``run_ids`` and
    ``filters``, ``filters`` matching no run or too many), ``ReasonRequired``. A run's
    own refusal is never raised: it is that run's ``refused`` result.
    """
    if action not in BulkActionKind.values:
        raise InvalidPayload(f"action: must be one of {', '.join(BulkActionKind.values)}")
    require(actor, tenant, RIGHTS[action])
    reason = _require_reason(reason)
    token = _client_token_check(client_token)
    if (run_ids is None) == (filters is None):
        raise InvalidPayload("run_ids: give the selected runs (run_ids) or the filters "
                             "they match (filters), one of the two")
    if run_ids is not None:
        ids = _run_ids(run_ids)
        selection = {"run_ids": [str(i) for i in ids]}
    else:
        ids = None
        selection = {"filters": asdict(filters)}
    fingerprint = hashlib.sha256(dumps({"action": action, "reason": reason,
                                        "selection": selection}).encode()).hexdigest()
    bulk = _existing(tenant, actor, token, fingerprint)
    if bulk is not None:
        return bulk, False
    if ids is None:
        ids = selectors.run_ids_matching(user=actor, tenant=tenant, filters=filters,
                                         limit=BULK_MAX_RUNS + 1)
        if not ids:
            raise InvalidPayload("filters: no run matches them")
        if len(ids) > BULK_MAX_RUNS:
            raise InvalidPayload(f"filters: more than {BULK_MAX_RUNS} runs match; a bulk "
                                 f"action takes at most {BULK_MAX_RUNS}: narrow the filters")
    try:
        with transaction.atomic():
            bulk = BulkAction.objects.create(
                tenant=tenant, uuid=uuid.uuid4(), client_token=token, requested_by=actor,
                requested_by_name=_actor_name(actor), action=action, reason=reason,
                selection=selection, fingerprint=fingerprint, total=len(ids))
            audit_record(tenant=tenant, actor=actor, action=AuditAction.BULK_SUBMIT,
                         target_type=TargetType.BULK_ACTION, target_id=bulk.uuid,
                         reason=reason,
                         after={"action": action, "runs": len(ids), **selection})
    except IntegrityError:
        # The same token, submitted at the same moment: ours waited for theirs to commit.
        bulk = _existing(tenant, actor, token, fingerprint)
        if bulk is None:
            raise
        return bulk, False
    counts = {outcome: 0 for outcome in BulkOutcome.values}
    for position, run_id in enumerate(ids):
        counts[_act_on(bulk, actor, tenant, position, run_id)] += 1
    _finish(bulk, actor, tenant, counts)
    return bulk, True


def _act_on(bulk: BulkAction, actor, tenant: Tenant, position: int, run_id: uuid.UUID) -> str:
    """One run: its action and its result row in one transaction (so ``done`` means
    committed); a refusal rolls back that run's action only. Returns the outcome."""
    item = dict(tenant=tenant, bulk=bulk, position=position, run_uuid=run_id)
    try:
        with transaction.atomic():
            detail = ACTIONS[bulk.action](actor=actor, tenant=tenant, run_id=run_id,
                                          reason=bulk.reason, bulk_id=bulk.uuid)
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
