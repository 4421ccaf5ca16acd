"""Reads of the data lifecycle (issue 20; docs/security/retention.md): the tenant's data
policy, its tombstones (newest first, a page at a time), its active legal holds and its
erasure requests, for the Data page and ``GET …/data-policy``; and a deleted run's
tombstone and a run's legal holds for its run page. Any role of the tenant reads them:
they hold ids, numbers, reasons and names, never a payload value (what the page shows
the API shows)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db.models import (
    BooleanField,
    Case,
    Count,
    Exists,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
    Window,
)
from django.db.models.functions import Coalesce, RowNumber

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


# --------------------------------------------------------------------------------------
# The legal-hold coverage rule (docs/security/retention.md, "Legal holds"), its one home.
# A hold covers a run when it is active (no ``released_at``) and
#   - its scope is ``tenant``: every run of its tenant, now and later (``TENANT_WIDE``);
#   - its scope is ``runs``: a ``HeldRun`` row of the hold names the run's id (``_named``);
#   - its scope is ``subject``: a ``RunSubject`` row of the run has the hold's field and
#     digest (``_indexed``).
# A tombstone is covered when its run would be, by the keys they share: the run's id
# (named by a runs hold, the run there or gone), the run's subject index while the run
# is there, and the copy of that index retention kept on the tombstone
# (``Tombstone.subjects``; an erasure's tombstone keeps none).
# ``hold_covers_q`` reads it from one run (which holds: the run page, the API's
# ``legal_holds``), ``held_q`` from the tenant's holds over a run or a tombstone (which
# runs: ``held_runs_q``, retention's candidates and ``services.runs_blockers``; which
# tombstones: ``held_tombstones_q``, the tombstone purge). Both are composed of the parts
# below and nothing else; tests/lifecycle/test_hold_coverage_agree.py and
# test_hold_rule_everywhere.py hold them to hand-written tables. (``held_runs_q`` as an
# ``EXISTS`` of ``hold_covers_q`` per
# run was measured 25-45 times slower on 20,000 runs: the set form stays.)
# --------------------------------------------------------------------------------------

ACTIVE = Q(released_at__isnull=True)
TENANT_WIDE = Q(scope=HoldScope.TENANT)


def _named(tenant: Tenant | int, **link):
    """The ``HeldRun`` rows by which a runs hold names a run (``link``: ``hold`` and/or
    ``run_uuid``, values or ``OuterRef``s)."""
    return HeldRun.objects.for_tenant(tenant).filter(**link)


def _indexed(tenant: Tenant | int, **link):
    """The ``RunSubject`` rows by which a subject hold finds a run (``link``: ``run_id``,
    ``field`` and ``digest``, values or ``OuterRef``s to the hold's ``subject_field`` and
    ``subject_digest``)."""
    return RunSubject.objects.for_tenant(tenant).filter(**link)


def hold_covers_q(tenant: Tenant | int, run: Run) -> Q:
    """A ``Q`` on ``LegalHold``: the tenant's holds that cover ``run`` (the rule above,
    read from one run). Builds no query of its own."""
    named = _named(tenant, hold=OuterRef("pk"), run_uuid=run.uuid)
    indexed = _indexed(tenant, run_id=run.pk, field=OuterRef("subject_field"),
                       digest=OuterRef("subject_digest"))
    return ACTIVE & (TENANT_WIDE | Q(Exists(named), scope=HoldScope.RUNS)
                     | Q(Exists(indexed), scope=HoldScope.SUBJECT))


@dataclass(frozen=True)
class _Keys:
    """Where a row of a model the rule reads from the holds carries the keys a run and its
    tombstone share: ``run_id`` its run's public id; ``indexed`` (the row's field, the
    ``RunSubject`` path) how its run's subject index reaches it; ``pairs`` the JSON
    ``[[field, digest]]`` copy of that index kept on the row (``None``: none)."""

    run_id: str
    indexed: tuple[str, str]
    pairs: str | None = None


#: The two models the rule is read over from the holds: a run (its index rows), and a
#: tombstone, whose run may be gone (its id and the index copied onto it by retention,
#: ``services.purge_run_payloads``; its run's index while that run is still there).
_KEYS = {Run: _Keys(run_id="uuid", indexed=("pk", "run_id")),
         Tombstone: _Keys(run_id="run_uuid", indexed=("run_uuid", "run__uuid"),
                          pairs="subjects")}


class _PairIn(Func):
    """SQL boolean: the JSON list of ``[field, digest]`` pairs ``pairs`` (a ``jsonb`` /
    JSON text column) has the pair (``field``, ``digest``), both elements compared
    exactly (PostgreSQL ``jsonb_array_elements``, SQLite ``json_each``; no containment
    operator, which would match the pair reversed)."""

    arity = 3
    output_field = BooleanField()

    def as_sql(self, compiler, connection, **extra):
        (pairs, p_pairs), (field, p_field), (digest, p_digest) = (
            compiler.compile(e) for e in self.get_source_expressions())
        # Anything but a list of pairs (a null, an object, a scalar element) holds none.
        params = [*p_pairs, *p_pairs, *p_field, *p_digest]
        if connection.vendor == "postgresql":
            return (f"EXISTS (SELECT 1 FROM jsonb_array_elements(CASE WHEN "
                    f"jsonb_typeof({pairs}) = 'array' THEN {pairs} END) AS pair "
                    f"WHERE pair.value ->> 0 = {field} AND pair.value ->> 1 = {digest})",
                    params)
        return (f"EXISTS (SELECT 1 FROM json_each(CASE WHEN json_type({pairs}) = 'array' "
                f"THEN {pairs} ELSE '[]' END) AS pair WHERE "
                f"CASE WHEN pair.type = 'array' THEN json_extract(pair.value, '$[0]') END "
                f"= {field} AND CASE WHEN pair.type = 'array' THEN "
                f"json_extract(pair.value, '$[1]') END = {digest})", params)


def held_q(tenant: Tenant | int, model=Run) -> Q | None:
    """A ``Q`` on ``model`` (``Run`` or ``Tombstone``) matching the rows an active legal
    hold of ``tenant`` covers (the rule above, read from the holds, over the keys a run
    and its tombstone share, ``_KEYS``): the run id a runs hold names (``_named``, its
    run there or gone), or a run the subject index finds for a subject hold
    (``_indexed``), or, for a tombstone, a pair of the index retention copied onto it
    (``Tombstone.subjects``). ``None`` when a hold covers the whole tenant (nothing may
    be deleted, not even what only a tombstone is left of). One query (the tenant-wide
    check); the ``Q`` holds uncorrelated subqueries, and for a tombstone one ``EXISTS``
    over the tenant's active subject holds (issue 20; DESIGN.md 3a: "a legal hold stops
    all of them"; RUNIFOLD.md 5: a purge needs "no active legal hold")."""
    keys = _KEYS[model]
    holds = LegalHold.objects.for_tenant(tenant).filter(ACTIVE)
    if holds.filter(TENANT_WIDE).exists():
        return None
    named = _named(tenant, hold__in=holds.filter(scope=HoldScope.RUNS))
    subject_holds = holds.filter(scope=HoldScope.SUBJECT)
    indexed = _indexed(tenant).filter(Exists(subject_holds.filter(
        subject_field=OuterRef("field"), subject_digest=OuterRef("digest"))))
    own, via = keys.indexed
    q = (Q(**{f"{keys.run_id}__in": named.values("run_uuid")})
         | Q(**{f"{own}__in": indexed.values(via)}))
    if keys.pairs is not None:
        q |= Q(Exists(subject_holds.filter(_PairIn(OuterRef(keys.pairs), F("subject_field"),
                                                   F("subject_digest")))))
    return q


def held_runs_q(tenant: Tenant | int) -> Q | None:
    """A ``Q`` on ``Run`` matching the runs an active legal hold of ``tenant`` covers
    (``held_q`` over runs: retention's candidates), or ``None`` when a hold covers the
    whole tenant. One query (the tenant-wide check)."""
    return held_q(tenant, Run)


def held_tombstones_q(tenant: Tenant | int) -> Q | None:
    """A ``Q`` on ``Tombstone`` matching the tombstones an active legal hold of ``tenant``
    covers (``held_q`` over tombstones: the tombstone purge), or ``None`` when a hold
    covers the whole tenant. One query (the tenant-wide check)."""
    return held_q(tenant, Tombstone)


def holds_runs_now(tenant: Tenant | int, holds: list[LegalHold],
                   limit: int) -> dict[int, list[uuid.UUID]]:
    """hold pk -> the ids of the runs each of ``holds`` (holds of ``tenant``) covers now,
    by the rule above, lowest id first, at most ``limit`` per hold: a runs hold the runs
    its ``HeldRun`` rows name (``_named``), a subject hold the runs the subject index
    finds for its field and digest (``_indexed``). A released hold covers none (``[]``);
    a tenant hold is every run of the tenant, now and later, and is not listed (absent).
    At most two queries whatever the number of holds (one per scope present), each list
    bounded in the database (``ROW_NUMBER()`` over the hold, or over the subject)."""
    active = [h for h in holds if h.released_at is None]
    out: dict[int, list[uuid.UUID]] = {h.pk: [] for h in holds
                                       if h.scope != HoldScope.TENANT}
    named = [h.pk for h in active if h.scope == HoldScope.RUNS]
    if named:
        rows = (_named(tenant, hold__in=named)
                .annotate(n=Window(RowNumber(), partition_by=[F("hold_id")],
                                   order_by=F("run_uuid").asc()))
                .filter(n__lte=limit).order_by("hold_id", "run_uuid")
                .values_list("hold_id", "run_uuid"))
        for hold_id, run_uuid in rows:
            out[hold_id].append(run_uuid)
    subjects: dict[tuple[str, str], list[int]] = {}
    for h in active:
        if h.scope == HoldScope.SUBJECT:
            subjects.setdefault((h.subject_field, h.subject_digest), []).append(h.pk)
    if subjects:
        which = Q()
        for field, digest in subjects:
            which |= Q(field=field, digest=digest)
        rows = (_indexed(tenant).filter(which)
                .annotate(n=Window(RowNumber(), partition_by=[F("field"), F("digest")],
                                   order_by=F("run__uuid").asc()))
                .filter(n__lte=limit).order_by("field", "digest", "run__uuid")
                .values_list("field", "digest", "run__uuid"))
        for field, digest, run_uuid in rows:
            for hold_id in subjects[(field, digest)]:
                out[hold_id].append(run_uuid)
    return out


def subject_runs_count(tenant: Tenant | int) -> Case:
    """An expression on ``LegalHold`` (the tenant's holds): how many runs a subject hold
    covers now by the rule above, the length of its ``holds_runs_now`` list uncut: the
    runs the subject index finds for its field and digest (``_indexed``; a correlated
    count on ``run_subject_unique``), 0 once released (``ACTIVE``); ``None`` for the other
    scopes (``LegalHold.runs_held`` answers them). Adds no query: it goes in the holds'
    own (``selectors.lifecycle_requests``: the legal holds page, the Data page, the API's
    ``runs_held``)."""
    indexed = (_indexed(tenant, field=OuterRef("subject_field"),
                        digest=OuterRef("subject_digest"))
               .order_by().values("field").annotate(n=Count("run_id")).values("n"))
    subject = Coalesce(Subquery(indexed, output_field=IntegerField()), Value(0))
    return Case(When(ACTIVE, scope=HoldScope.SUBJECT, then=subject),
                When(scope=HoldScope.SUBJECT, then=Value(0)), default=Value(None),
                output_field=IntegerField())


def covering_holds(run: Run):
    """The active legal holds that cover ``run`` (a queryset of ``LegalHold``, newest
    first), by ``hold_covers_q``. One query."""
    tenant = run.tenant_id
    return LegalHold.objects.for_tenant(tenant).filter(hold_covers_q(tenant, run))


def run_legal_holds(*, user, tenant: Tenant, run: Run) -> list[LegalHold]:
    """The active legal holds on ``run`` (a run of ``tenant``), newest first, for its page
    and ``GET …/runs/{run_id}`` (``legal_holds``): any role of the tenant, as the holds'
    own list. A subject hold is shown by its field, never its value. One query."""
    require(user, tenant, roles.VIEW)
    return list(covering_holds(run))
