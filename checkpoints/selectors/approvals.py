"""The approver's queue (issue 21, item 9): every open retry request of a tenant with
what an approved retry would do folded in, and the rejections the inbox and the run
page show. Fixed queries whatever the number of requests or effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import F, OuterRef, Subquery

from .. import policy, roles
from ..models import Effect, RetryRequest, Tenant
from ..permissions import require
from ..vocab import PhaseClass, RetryOutcome, RetryState

#: The most open requests the queue lists (oldest first; the page says when more wait).
QUEUE_MAX = 200


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
    """One open retry request in the queue: ``retry`` (with ``run`` and
    ``requested_by``), its ``preview``, ``duplicates`` (possible duplicates in it) and
    ``own`` (the reader asked for it: never theirs to decide)."""

    retry: RetryRequest
    preview: list[dict] = field(default_factory=list)
    duplicates: int = 0
    own: bool = False


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
    # A request on a run that completed since (``policy.retry_applies``: it is not
    # approved) is not the approvers' work: the queue agrees with the tab counts.
    retries = list(RetryRequest.objects.for_tenant(tenant)
                   .filter(state=RetryState.REQUESTED)
                   .exclude(run__phase_class=PhaseClass.COMPLETED)
                   .select_related("run", "requested_by")
                   .order_by("created_at", "id")[:QUEUE_MAX + 1])
    more = len(retries) > QUEUE_MAX
    retries = retries[:QUEUE_MAX]
    previews = retry_previews(tenant.pk, [r.run_id for r in retries])
    rows = []
    for r in retries:
        preview = previews[r.run_id]
        rows.append(QueueRow(retry=r, preview=preview, duplicates=duplicates_in(preview),
                             own=r.requested_by_id == user.pk))
    return ApprovalQueue(rows=rows, more=more)


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
