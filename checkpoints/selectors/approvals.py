"""The approver's queue (issue 21, item 9): every open retry request of a tenant with
what an approved retry would do folded in, and the rejections the inbox and the run
page show. Fixed queries whatever the number of requests or effects.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from django.db.models import F, OuterRef, QuerySet, Subquery

from .. import policy, roles
from ..exceptions import NotFound
from ..models import Effect, RetryRequest, Tenant
from ..permissions import require
from ..vocab import PhaseClass, RetryOutcome, RetryState

#: The most open requests the queue lists (oldest first; the page says when more wait).
QUEUE_MAX = 200

#: ``GET …/retry-requests?state=``: one state of ``RetryState``, or every state.
RETRY_STATE_ALL = "all"
RETRY_LIST_STATES = (*RetryState.values, RETRY_STATE_ALL)
#: ``GET …/retry-requests?sort=``: the ``RetryRequest.id`` direction. The id is the order
#: requests were filed in and no decision changes it, so a keyset page never skips or
#: repeats a request decided while someone pages (as ``inbox.RUN_SORTS``).
RETRY_SORTS = {"-created": "-id", "created": "id"}
DEFAULT_RETRY_SORT = "-created"


def retry_previews(tenant_id: int, run_pks: list[int]) -> dict[int, list[dict]]:
    """``{run pk: preview}``: what an approved retry of each run would do to each of its
    effects not yet authorised by an earlier retry (``policy.retry_outcome``), oldest
    effect first, as ``[{effect_id, service, operation_key, state, outcome, words}]``
    (``possible_duplicate`` rows are what an approver accepts). One query for every
    run. ``services.retry_preview`` (stored in the audit events and on the approval) is
    this for one run, so the queue, the run page and the approval show the same rows."""
    out: dict[int, list[dict]] = {pk: [] for pk in run_pks}
    if not run_pks:
        return out
    rows = (Effect.objects.for_tenant(tenant_id)
            .filter(run_id__in=run_pks, retry_authorized_by__isnull=True)
            .order_by("created_at", "id")
            .values_list("run_id", "uuid", "service", "operation_key", "state"))
    for run_pk, effect_id, service, key, state in rows:
        outcome, words = policy.retry_outcome(state)
        out[run_pk].append({"effect_id": str(effect_id), "service": service,
                            "operation_key": key, "state": state, "outcome": outcome,
                            "words": words})
    return out


def duplicates_in(preview: list[dict]) -> int:
    """How many rows of a preview an approval accepts as a possible duplicate."""
    return sum(1 for p in preview if p["outcome"] == RetryOutcome.POSSIBLE_DUPLICATE)


@dataclass
class QueueRow:
    """One retry request as the queue shows it: ``retry`` (with ``run``,
    ``requested_by`` and ``decided_by``), its ``preview``, ``duplicates`` (possible
    duplicates in it) and ``own`` (the reader asked for it: never theirs to decide).
    ``preview`` is ``None`` (and ``duplicates`` 0) for a request no longer awaiting a
    decision (``GET …/retry-requests?state=``): what an approval would do now means
    nothing for it."""

    retry: RetryRequest
    preview: list[dict] | None = field(default_factory=list)
    duplicates: int = 0
    own: bool = False


def retry_requests_in(tenant: Tenant, state: str | None) -> QuerySet:
    """The tenant's retry requests in ``state`` (``None``: every state), unordered, with
    ``run``, ``requested_by`` and ``decided_by`` loaded: the one queryset of the
    approvers' queue (``approval_queue``, the Approvals page) and of ``GET
    …/retry-requests`` (``retry_request_list``), so the two cannot list different rows.

    ``requested`` is the approvers' work: a request left open on a run that completed
    since is not (``policy.retry_applies``, stop 33; the queue agrees with the tab
    counts), so it is listed only under every state. No right is checked here: the
    callers check theirs first."""
    qs = RetryRequest.objects.for_tenant(tenant)
    if state is not None:
        qs = qs.filter(state=state)
    if state == RetryState.REQUESTED:
        # ``policy.retry_applies`` as a filter: not once the run's phase is completed.
        qs = qs.exclude(run__phase_class=PhaseClass.COMPLETED)
    return qs.select_related("run", "requested_by", "decided_by")


def queue_rows(user, tenant: Tenant, retries: list[RetryRequest]) -> list[QueueRow]:
    """``retries`` as the queue shows them (``QueueRow``): the preview of each one still
    ``requested`` (``retry_previews``, one query for all), its possible duplicates, and
    whether ``user`` asked for it. No right is checked here (the callers do)."""
    waiting = [r for r in retries if r.state == RetryState.REQUESTED]
    previews = retry_previews(tenant.pk, sorted({r.run_id for r in waiting}))
    rows = []
    for r in retries:
        preview = previews[r.run_id] if r.state == RetryState.REQUESTED else None
        rows.append(QueueRow(retry=r, preview=preview,
                             duplicates=duplicates_in(preview) if preview else 0,
                             own=r.requested_by_id == user.pk))
    return rows


@dataclass
class ApprovalQueue:
    """``rows`` (oldest request first, at most ``QUEUE_MAX``) and ``more`` (requests
    beyond them)."""

    rows: list[QueueRow]
    more: bool


def approval_queue(*, user, tenant: Tenant) -> ApprovalQueue:
    """The tenant's retry requests awaiting a decision (``requested``), oldest first,
    each with its preview: two queries whatever their number. Anyone who may approve
    reads it (``approve_retry``: approvers and admins); ``NotFound``/``Forbidden``
    otherwise."""
    require(user, tenant, roles.APPROVE)
    # A request on a run that completed since is not the approvers' work
    # (``retry_requests_in``, shared with ``GET …/retry-requests``).
    # The filing order, ``GET …/retry-requests?sort=created``'s (one order: a request's
    # ``created_at`` is its transaction's start, which two filings can cross).
    retries = list(retry_requests_in(tenant, RetryState.REQUESTED)
                   .order_by(RETRY_SORTS["created"])[:QUEUE_MAX + 1])
    more = len(retries) > QUEUE_MAX
    return ApprovalQueue(rows=queue_rows(user, tenant, retries[:QUEUE_MAX]), more=more)


def retry_request_list(*, user, tenant: Tenant, state: str | None = RetryState.REQUESTED,
                       run_id: uuid.UUID | None = None, sort: str | None = None,
                       after: int | None = None, limit: int = 50) -> list[QueueRow]:
    """``GET …/retry-requests``: the tenant's retry requests in ``state``
    (``RETRY_LIST_STATES``; ``requested``, the default, is exactly the Approvals page's
    queue, ``all`` or ``None`` every state), of the run ``run_id`` when given, in the
    order ``sort`` (``RETRY_SORTS``: newest first by default), after the request
    ``after`` in that order; at most ``limit`` rows as ``queue_rows`` makes them (the
    page's preview, possible duplicates, own). Two queries whatever the number.

    The Approvals page's right: approvers and admins (``roles.APPROVE``); ``NotFound``
    without a role in the tenant, ``Forbidden`` for another role. The caller validates
    ``state`` and ``sort`` (``api.params.RetryListParams``)."""
    require(user, tenant, roles.APPROVE)
    qs = retry_requests_in(tenant, None if state in (None, RETRY_STATE_ALL) else state)
    if run_id is not None:
        qs = qs.filter(run__uuid=run_id)
    order = RETRY_SORTS[sort or DEFAULT_RETRY_SORT]
    if after is not None:
        qs = qs.filter(id__lt=after) if order.startswith("-") else qs.filter(id__gt=after)
    retries = list(qs.order_by(order)[:max(0, limit)])
    return queue_rows(user, tenant, retries)


def retry_request_get(*, user, tenant: Tenant, retry_id: int) -> QueueRow:
    """``GET …/retry-requests/{id}``: one retry request of the tenant, in any state, as
    ``retry_request_list`` gives it. Approvers and admins (the Approvals page's right);
    ``NotFound`` for an id the tenant has no request under. Two queries at most."""
    require(user, tenant, roles.APPROVE)
    retry = retry_requests_in(tenant, None).filter(pk=retry_id).first()
    if retry is None:
        raise NotFound("no such retry request")
    return queue_rows(user, tenant, [retry])[0]


def rejected_retries(*, user, tenant: Tenant, run_pks: list[int]) -> dict[int, RetryRequest]:
    """``{run pk: its rejected retry request}`` for those of ``run_pks`` whose newest
    retry request was rejected (a newer request, or none rejected: absent), with
    ``decided_by``: the inbox row and the run page say "retry rejected by …". One
    query."""
    require(user, tenant, roles.VIEW)
    if not run_pks:
        return {}
    newest = (RetryRequest.objects.for_tenant(tenant).filter(run=OuterRef("run"))
              .order_by("-id").values("id")[:1])
    rows = (RetryRequest.objects.for_tenant(tenant)
            .filter(run_id__in=run_pks, state=RetryState.REJECTED)
            .annotate(newest=Subquery(newest)).filter(id=F("newest"))
            .select_related("decided_by"))
    return {r.run_id: r for r in rows}
