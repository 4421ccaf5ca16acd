"""Reads of the data lifecycle (issue 20; docs/security/retention.md): the tenant's data
policy, its tombstones (newest first, a page at a time), its active legal holds and its
erasure requests, for the Data page and ``GET …/data-policy``; and a deleted run's
tombstone and a run's legal holds for its run page. Any role of the tenant reads them:
they hold ids, numbers, reasons and names, never a payload value (what the page shows
the API shows)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Q

from .. import roles
from ..models import DataPolicy, HeldRun, LegalHold, Run, RunSubject, Tenant, Tombstone
from ..permissions import require
from ..vocab import HoldScope

#: Tombstones per page of the Data page (newest first, keyset on the id).
TOMBSTONE_PAGE = 50
#: The most active holds and erasure requests the page lists (the newest).
HOLDS_SHOWN = 100
ERASURES_SHOWN = 50


def data_policy_get(*, user, tenant: Tenant) -> DataPolicy:
    """The tenant's ``DataPolicy`` row, or an unsaved one with the defaults (nothing
    deleted, secrets warned about) when its admin never set one. One query."""
    require(user, tenant, roles.VIEW)
    row = DataPolicy.objects.for_tenant(tenant).first()
    return row if row is not None else DataPolicy(tenant=tenant)


@dataclass
class TombstonePage:
    """One page of tombstones, newest first; ``older``: the ``before`` of the next page
    (None: this is the last)."""

    rows: list[Tombstone]
    older: int | None
    total: int


def tombstone_page(*, user, tenant: Tenant, before: int | None = None,
                   limit: int = TOMBSTONE_PAGE) -> TombstonePage:
    """The tenant's tombstones with an id below ``before`` (all when None), newest first,
    ``limit`` of them, and how many the tenant has. Two queries (the index
    ``tombstone_cursor_idx``)."""
    require(user, tenant, roles.VIEW)
    stones = Tombstone.objects.for_tenant(tenant)
    page = stones.order_by("-id")
    if before is not None:
        page = page.filter(id__lt=before)
    rows = list(page[:limit + 1])
    older = rows[limit - 1].pk if len(rows) > limit else None
    return TombstonePage(rows=rows[:limit], older=older, total=stones.count())


def run_tombstone(*, user, tenant: Tenant, run: Run) -> Tombstone | None:
    """The tombstone of ``run`` (a run of ``tenant``) when its payloads were deleted (the
    newest, should there be several), else None without a query."""
    require(user, tenant, roles.VIEW)
    if run.payloads_deleted_at is None:
        return None
    return (Tombstone.objects.for_tenant(tenant).filter(run_uuid=run.uuid)
            .order_by("-id").first())


#: The branch of the coverage rule that names no run: a tenant hold covers every run of
#: its tenant, now and later (``hold_covers_q``; ``services.held_runs_q`` reads it alone
#: to say "nothing may be deleted").
TENANT_WIDE = Q(scope=HoldScope.TENANT)


def hold_covers_q(tenant: Tenant | int, run: Run | None = None) -> Q:
    """The legal-hold coverage rule, its one home (docs/security/retention.md, "Legal
    holds"): a ``Q`` on ``LegalHold`` matching the tenant's active holds (no
    ``released_at``) that cover ``run``: the whole tenant's (``TENANT_WIDE``), a runs
    hold naming its id (``HeldRun``), and a subject hold of a field and digest one of its
    payloads was indexed under (``RunSubject``).

    ``run``: a ``Run`` (its ``pk`` and ``uuid`` as values: ``covering_holds``), or
    ``None`` for the ``Run`` row of the enclosing query, for a ``Q(Exists(...))`` on
    ``Run`` (``services.held_runs_q``: the same rule seen from the tenant's runs). Builds
    no query of its own; ``tenant`` scopes the subqueries (an id or a ``Tenant``)."""
    if run is None:  # two levels out: HeldRun/RunSubject -> LegalHold -> Run
        run_pk, run_uuid = OuterRef(OuterRef("pk")), OuterRef(OuterRef("uuid"))
    else:
        run_pk, run_uuid = run.pk, run.uuid
    named = HeldRun.objects.for_tenant(tenant).filter(hold=OuterRef("pk"), run_uuid=run_uuid)
    indexed = RunSubject.objects.for_tenant(tenant).filter(
        run_id=run_pk, field=OuterRef("subject_field"), digest=OuterRef("subject_digest"))
    return Q(released_at__isnull=True) & (
        TENANT_WIDE | Q(Exists(named), scope=HoldScope.RUNS)
        | Q(Exists(indexed), scope=HoldScope.SUBJECT))


def covering_holds(run: Run):
    """The active legal holds that cover ``run`` (a queryset of ``LegalHold``, newest
    first), by ``hold_covers_q``, the rule ``services.held_runs_q`` and
    ``services.run_blockers`` also read. One query."""
    tenant = run.tenant_id
    return LegalHold.objects.for_tenant(tenant).filter(hold_covers_q(tenant, run))


def run_legal_holds(*, user, tenant: Tenant, run: Run) -> list[LegalHold]:
    """The active legal holds on ``run`` (a run of ``tenant``), newest first, for its page
    and ``GET …/runs/{run_id}`` (``legal_holds``): any role of the tenant, as the holds'
    own list. A subject hold is shown by its field, never its value. One query."""
    require(user, tenant, roles.VIEW)
    return list(covering_holds(run))
