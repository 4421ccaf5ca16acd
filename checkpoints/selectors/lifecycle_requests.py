"""Legal holds and erasure requests, as people read them (issue 20, items 2 and 4;
``GET …/legal-holds``, ``GET …/erasure-requests``, the dashboard's approval queue). Any
role of the tenant reads them (``view_runs``): they name runs, reasons, people and counts,
never a payload value nor a subject's value (a subject is its field's name; its digest is
not shown)."""

from __future__ import annotations

from django.db.models import Case, F, IntegerField, QuerySet, Value, When

from .. import roles
from ..exceptions import NotFound
from ..models import ErasureRequest, LegalHold, Tenant
from ..permissions import require
from ..vocab import ErasureState
from .common import _uuid_or_404
from .lifecycle import holds_runs_now, subject_runs_count

#: The most holds or requests one list returns (the newest; active or waiting ones first).
LIFECYCLE_LIST_MAX = 200
#: The most runs a hold's answer names (``LegalHold.runs_now``; ``runs_held`` counts them).
HOLD_RUNS_SHOWN = 50


def _with_runs_now(tenant: Tenant, holds: list[LegalHold]) -> list[LegalHold]:
    """``holds`` (in place and returned), each given ``runs_now``: the ids of the first
    ``HOLD_RUNS_SHOWN`` runs it covers now (``lifecycle.holds_runs_now``, the coverage
    rule's home), or ``None`` for a tenant hold (every run). At most two queries for the
    whole list, never one per hold."""
    listed = holds_runs_now(tenant, holds, HOLD_RUNS_SHOWN)
    for hold in holds:
        hold.runs_now = listed.get(hold.pk)
    return holds


def _holds(tenant: Tenant) -> QuerySet:
    """The tenant's holds, each a subject hold annotated with ``subject_runs``: how many
    runs it covers now (``lifecycle.subject_runs_count``, the coverage rule's count, in
    the same query; 0 once released). ``None`` for the other scopes
    (``LegalHold.runs_held`` answers them)."""
    return LegalHold.objects.for_tenant(tenant).annotate(
        subject_runs=subject_runs_count(tenant))


def legal_hold_list(*, user, tenant: Tenant, limit: int = LIFECYCLE_LIST_MAX,
                    active_only: bool = False) -> list[LegalHold]:
    """The tenant's legal holds, active ones first, then newest first; at most ``limit``
    (``LIFECYCLE_LIST_MAX``); ``active_only``: those not released (the Data page). One
    query, each subject hold counting the runs it holds (``_holds``), then at most two
    naming them (``runs_now``, ``_with_runs_now``)."""
    require(user, tenant, roles.VIEW)
    rows = _holds(tenant)
    if active_only:
        rows = rows.filter(released_at__isnull=True)
    return _with_runs_now(tenant, list(
        rows.order_by(F("released_at").asc(nulls_first=True), "-placed_at", "-id")
        [:min(limit, LIFECYCLE_LIST_MAX)]))


def legal_hold_get(*, user, tenant: Tenant, hold_id) -> LegalHold:
    """One legal hold of the tenant by its UUID; a malformed, unknown or other tenant's
    id is ``NotFound``. One query, a subject hold counting the runs it holds
    (``_holds``), and one naming them (``runs_now``, ``_with_runs_now``)."""
    require(user, tenant, roles.VIEW)
    hid = _uuid_or_404(hold_id, "legal hold")
    hold = _holds(tenant).filter(uuid=hid).first()
    if hold is None:
        raise NotFound("no such legal hold")
    return _with_runs_now(tenant, [hold])[0]


def erasure_request_list(*, user, tenant: Tenant, limit: int = LIFECYCLE_LIST_MAX,
                         waiting_only: bool = False) -> list[ErasureRequest]:
    """The tenant's erasure requests, those waiting for a decision first, then newest
    first; at most ``limit``; ``waiting_only``: the approval queue. One query."""
    require(user, tenant, roles.VIEW)
    rows = ErasureRequest.objects.for_tenant(tenant)
    if waiting_only:
        rows = rows.filter(state=ErasureState.REQUESTED)
    waiting = Case(When(state=ErasureState.REQUESTED, then=Value(0)), default=Value(1),
                   output_field=IntegerField())
    return list(rows.order_by(waiting, "-requested_at", "-id")[:min(limit, LIFECYCLE_LIST_MAX)])


def erasure_request_get(*, user, tenant: Tenant, request_id) -> ErasureRequest:
    """One erasure request of the tenant by its UUID (``NotFound`` otherwise). One query."""
    require(user, tenant, roles.VIEW)
    rid = _uuid_or_404(request_id, "erasure request")
    request = ErasureRequest.objects.for_tenant(tenant).filter(uuid=rid).first()
    if request is None:
        raise NotFound("no such erasure request")
    return request
