"""Single objects by id, tenant first: a checkpoint, an effect (also by service and
operation key), a retry request, a bulk action; and the list of the tenant's bulk actions.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db.models import Case, Count, F, IntegerField, OuterRef, Subquery, When
from django.db.models.fields.json import KT, KeyTransform
from django.db.models.functions import Coalesce

from .. import roles
from ..exceptions import InvalidPayload, NotFound
from ..models import (
    BulkAction,
    BulkActionItem,
    Checkpoint,
    Effect,
    RetryRequest,
    Tenant,
)
from ..permissions import require
from ..vocab import BulkOutcome, BulkState
from .common import _uuid_or_404


def checkpoint_get(*, user, tenant: Tenant, checkpoint_id) -> Checkpoint:
    """The latest row of a checkpoint, or ``NotFound``."""
    require(user, tenant, roles.VIEW)
    cid = _uuid_or_404(checkpoint_id, "checkpoint")
    cp = Checkpoint.objects.for_tenant(tenant).filter(uuid=cid).select_related("run").first()
    if cp is None:
        raise NotFound("no such checkpoint")
    return cp


def effect_get(*, user, tenant: Tenant, effect_id) -> Effect:
    """The effect ``effect_id`` of the tenant, or ``NotFound`` (also for a malformed id)."""
    require(user, tenant, roles.VIEW)
    eid = _uuid_or_404(effect_id, "effect")
    effect = Effect.objects.for_tenant(tenant).filter(uuid=eid).select_related("run").first()
    if effect is None:
        raise NotFound("no such effect")
    return effect


def effect_find(*, user, tenant: Tenant, service: str | None, operation_key: str | None,
                run_id=None, limit: int = 100) -> list[Effect]:
    """Effects of the tenant filtered by service, operation key and/or run."""
    require(user, tenant, roles.VIEW)
    qs = Effect.objects.for_tenant(tenant).select_related("run")
    if service:
        qs = qs.filter(service=service)
    if operation_key:
        qs = qs.filter(operation_key=operation_key)
    if run_id:
        try:
            qs = qs.filter(run__uuid=uuid.UUID(str(run_id)))
        except ValueError:
            raise InvalidPayload("run: not a UUID") from None
    return list(qs.order_by("-created_at", "-id")[: max(1, min(limit, 500))])


def retry_get(*, user, tenant: Tenant, retry_id) -> RetryRequest:
    """The retry request ``retry_id`` of the tenant, or ``NotFound``."""
    require(user, tenant, roles.VIEW)
    try:
        pk = int(retry_id)
    except (TypeError, ValueError):
        raise NotFound("no such retry request") from None
    retry = (RetryRequest.objects.for_tenant(tenant).filter(pk=pk)
             .select_related("run", "requested_by", "decided_by").first())
    if retry is None:
        raise NotFound("no such retry request")
    return retry


@dataclass
class BulkResult:
    """A bulk action and its per-run results (``bulk_get``): ``bulk`` the row,
    ``items`` its ``BulkActionItem`` rows in selection order, the counts of each outcome
    among them (right while it still runs, when the row's counts are not written yet),
    ``pending`` how many selected runs have no result yet, ``filters`` the inbox filters
    it was asked for (a dict) or ``None`` for runs selected by id, ``client_token`` the
    requester's idempotency key when the reader is the requester, else ``None`` (the key
    is the requester's to resubmit with; the dashboard shows it to nobody, so the API
    shows it only to its owner)."""

    bulk: BulkAction
    items: list[BulkActionItem]
    done: int
    refused: int
    failed: int
    pending: int
    filters: dict | None
    client_token: uuid.UUID | None = None
    unlisted: int = 0
    lease_owner: str | None = None  # end_lease's owner (services.bulk.PARAMETERS)


#: The most result rows a bulk action's page and API answer list (a stored job may have
#: 50,000): the refused and failed ones first, then the done ones, each in selection
#: order; every result is counted (issue 22, item 6).
BULK_RESULTS_LISTED = 500


def bulk_get(*, user, tenant: Tenant, bulk_id) -> BulkResult:
    """One bulk action of the tenant with its per-run results (issue 9, item 3): two
    queries whatever the number of runs. Any role that sees the audit log sees it
    (``view_runs``); a malformed or unknown id, or one of another tenant, is
    ``NotFound``.

    A stored job (``bulk.background``; issue 22, item 6): the counts are the row's (moved
    on with each run's result, in its transaction), and ``items`` lists at most
    ``BULK_RESULTS_LISTED`` results, refusals and failures first (``unlisted`` says how
    many more have a result). Its run list (``targets``, up to 50,000 ids) is not read."""
    require(user, tenant, roles.VIEW)
    bid = _uuid_or_404(bulk_id, "bulk action")
    # The selection is read for its filters and the action's owner only (a job's may
    # list 50,000 run ids).
    bulk = (BulkAction.objects.for_tenant(tenant).defer("targets", "selection")
            .annotate(selected_filters=KeyTransform("filters", "selection"),
                      # As text: SQLite's KeyTransform parses the value as JSON
                      # ("1e3" came back 1000.0; the stop-38 attack).
                      selected_lease_owner=KT("selection__lease_owner"))
            .filter(uuid=bid).first())
    if bulk is None:
        raise NotFound("no such bulk action")
    rows = BulkActionItem.objects.for_tenant(tenant).filter(bulk=bulk)
    filters = bulk.selected_filters
    owner = bulk.selected_lease_owner
    token = bulk.client_token if bulk.requested_by_id == user.pk else None
    if bulk.background:
        done = Case(When(outcome=BulkOutcome.DONE, then=1), default=0)
        items = list(rows.order_by(done, "position")[:BULK_RESULTS_LISTED])
        results = bulk.done + bulk.refused + bulk.failed
        return BulkResult(bulk=bulk, items=items, done=bulk.done, refused=bulk.refused,
                          failed=bulk.failed, pending=max(0, bulk.total - results),
                          filters=filters, client_token=token,
                          unlisted=max(0, results - len(items)), lease_owner=owner)
    items = list(rows.order_by("position"))
    counts = {outcome: 0 for outcome in BulkOutcome.values}
    for item in items:
        counts[item.outcome] += 1
    return BulkResult(bulk=bulk, items=items, done=counts[BulkOutcome.DONE],
                      refused=counts[BulkOutcome.REFUSED], failed=counts[BulkOutcome.FAILED],
                      pending=max(0, bulk.total - len(items)), filters=filters,
                      client_token=token, lease_owner=owner)


#: ``GET …/bulk-actions?limit=`` and the dashboard's list: the page size and its bound.
BULK_LIST_PAGE = 50
BULK_LIST_MAX = 200


def _item_count(tenant: Tenant, outcome: str) -> Subquery:
    """How many results of ``outcome`` the outer bulk action has (a correlated count on
    ``bulk_item_once_per_run`` ``(bulk, run_uuid)``)."""
    rows = (BulkActionItem.objects.for_tenant(tenant).filter(bulk=OuterRef("pk"), outcome=outcome).order_by()
            .values("bulk").annotate(n=Count("id")).values("n"))
    return Subquery(rows, output_field=IntegerField())


def _count(tenant: Tenant, outcome: str, column: str) -> Case:
    """One count of a listed bulk action: the row's ``column`` (a stored job moves it on
    with each result; an inline one writes it when its last run has its result), or,
    for an inline one still ``running``, its results counted (at most ``BULK_MAX_RUNS``
    rows), as ``bulk_get`` counts them."""
    return Case(When(background=False, state=BulkState.RUNNING,
                     then=Coalesce(_item_count(tenant, outcome), 0)),
                default=F(column), output_field=IntegerField())


def bulk_list(*, user, tenant: Tenant, action: str | None = None, state: str | None = None,
              requested_by: str | None = None, before: int | None = None,
              limit: int = BULK_LIST_PAGE) -> list[BulkAction]:
    """The tenant's bulk actions, newest first (``GET …/bulk-actions``, the dashboard's
    Bulk actions page; a newcomer's finding: one submitted from a script, or from a tab
    since closed, could be found again by its id only). Filters, each exact and
    optional: ``action`` (``BulkActionKind``), ``state`` (``BulkState``),
    ``requested_by`` (the requester's username). Keyset pages on the row's id, which
    grows with each submission: ``before`` is the previous page's last id; at most
    ``limit`` rows (1..``BULK_LIST_MAX`` + 1: a caller asks one more than its page to
    tell whether another follows).

    Each row has the counts ``bulk_get`` gives (``n_done``, ``n_refused``, ``n_failed``;
    ``pending`` is ``total`` minus them) and ``selected_lease_owner`` (``end_lease``'s
    owner, else ``None``); never its per-run results, its run list (``targets``) nor the
    ``client_token``. One query whatever the page's size. Any role of the tenant
    (``view_runs``, as ``bulk_get``); ``NotFound`` without one. The caller validates the
    filters (``api.params.BulkListParams``, ``dashboard.forms.BulkListForm``)."""
    require(user, tenant, roles.VIEW)
    rows = BulkAction.objects.for_tenant(tenant).defer("targets", "selection", "client_token")
    if action:
        rows = rows.filter(action=action)
    if state:
        rows = rows.filter(state=state)
    if requested_by:
        rows = rows.filter(requested_by_name=requested_by)
    if before is not None:
        rows = rows.filter(id__lt=before)
    rows = rows.annotate(
        selected_lease_owner=KT("selection__lease_owner"),
        n_done=_count(tenant, BulkOutcome.DONE, "done"),
        n_refused=_count(tenant, BulkOutcome.REFUSED, "refused"),
        n_failed=_count(tenant, BulkOutcome.FAILED, "failed"))
    listed = list(rows.order_by("-id")[:max(1, min(limit, BULK_LIST_MAX + 1))])
    for bulk in listed:
        bulk.pending = max(0, bulk.total - bulk.n_done - bulk.n_refused - bulk.n_failed)
    return listed
