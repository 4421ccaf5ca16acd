"""One run: its detail page, summary, the history pages of its checkpoints and effects, its
reconcile requests and attempts, and whether its owner is live.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    F,
    Prefetch,
    Q,
    QuerySet,
)

from .. import kinds, policy, roles
from ..dbclock import NOW, db_now, seed_page_now
from ..exceptions import InvalidPayload, NotFound
from ..models import (
    MAX_REVISION,
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    GraphCheckpoint,
    ReconcileAttempt,
    ReconcileRequest,
    RetryRequest,
    RetryState,
    Run,
    Tenant,
)
from ..permissions import require
from .common import LEASE_LIVE, _uuid_or_404, lease_state_of
from .search import uuid_prefix_range

#: Revisions per page of a checkpoint's or an effect's history (run page, history pages).
HISTORY_PAGE = 50
#: Conflicts the run page lists (the newest; the open ones are counted).
CONFLICT_PAGE = 50
#: The fewest hex digits of a run id that a run page URL resolves as a prefix: the
#: inbox, the audit log and the Data page show run ids as their first 8 (``shortid``).
RUN_PREFIX_MIN = 8
#: The most runs the page of an ambiguous prefix lists (``run_prefix_matches``).
RUN_PREFIX_SHOWN = 20


def run_get(*, user, tenant: Tenant, run_id: uuid.UUID | str) -> Run:
    """The run, or ``NotFound`` (also for a malformed id). Annotated, in the same query,
    with ``db_now`` (the database's time) and ``lease_live`` (``LEASE_LIVE``), for what a
    page says of its lease and state times; ``lease_state`` set (``lease_state_of``:
    live, expired, ended or "")."""
    require(user, tenant, roles.VIEW)
    rid = _uuid_or_404(run_id, "run")
    run = (Run.objects.for_tenant(tenant).filter(uuid=rid)
           .annotate(db_now=NOW, lease_live=LEASE_LIVE)
           .select_related("latest_checkpoint", "closed_by").first())
    if run is None:
        raise NotFound("no such run")
    run.lease_state = lease_state_of(run)
    seed_page_now(run.db_now)  # the page's relative times, with no query of their own
    return run


def run_prefix_digits(text: str) -> int | None:
    """How many hex digits ``text`` holds when it can start a run id
    (``search.uuid_prefix_range``: hex digits, dashes only where a UUID has them), else
    ``None`` (not a prefix of any UUID). No query."""
    if uuid_prefix_range(text) is None:
        return None
    return len(text.replace("-", ""))


def run_prefix_matches(*, user, tenant: Tenant, prefix: str,
                       limit: int = RUN_PREFIX_SHOWN) -> list[Run]:
    """The runs of ``tenant`` whose id starts with ``prefix`` (at least
    ``RUN_PREFIX_MIN`` hex digits), lowest id first, at most ``limit + 1`` of them (one
    more than a page shows, to say there are more). Only ``tenant``'s runs: another
    tenant's run is never found, whoever asks. One query, a range of the ``(tenant,
    uuid)`` unique index (as the search's id prefix branch). Raises ``NotFound`` for a
    ``prefix`` that is no UUID prefix or is shorter than ``RUN_PREFIX_MIN`` digits, and
    what ``permissions.require`` raises. The run page's short URLs
    (``dashboard.run.run_detail``); the API takes full ids only."""
    require(user, tenant, roles.VIEW)
    digits = run_prefix_digits(prefix)
    if digits is None or digits < RUN_PREFIX_MIN:
        raise NotFound("no such run")
    return list(Run.objects.for_tenant(tenant).filter(uuid__range=uuid_prefix_range(prefix))
                .order_by("uuid").select_related("latest_checkpoint")[:limit + 1])


@dataclass
class RunDetail:
    """Everything the run page shows (metadata only), each list bounded.

    ``revisions``: checkpoint pk -> its newest ``HISTORY_PAGE`` revisions, newest first;
    ``revisions_older``: checkpoint pk -> the ``before`` of the next older page, or
    ``None`` when the page reaches revision 0. ``effect_history``/``effect_history_older``
    likewise per effect. ``conflicts``: the newest ``CONFLICT_PAGE``; ``open_conflicts``
    counts every unacknowledged one, ``more_conflicts`` says older ones are not listed.
    ``audit``: the newest 200 events.
    """

    run: Run
    checkpoints: list[Checkpoint]
    revisions: dict[int, list[CheckpointRevision]]
    revisions_older: dict[int, int | None]
    effects: list[Effect]
    effect_history: dict[int, list[EffectRevision]]
    effect_history_older: dict[int, int | None]
    conflicts: list[Conflict]
    open_conflicts: int
    more_conflicts: bool
    retry_requests: list[RetryRequest]
    audit: list[AuditEvent]


def _older(latest: int) -> int | None:
    """The ``before`` of the page older than the newest page of a history whose latest
    revision is ``latest`` (revisions are numbered 0, 1, ... without gaps: CAS accepts
    only N+1), or ``None`` when the newest page holds them all."""
    first = latest - HISTORY_PAGE + 1
    return first if first > 0 else None


def _run_checkpoints(run: Run) -> list[Checkpoint]:
    return list(Checkpoint.objects.for_tenant(run.tenant_id)
                .filter(run=run).defer("payload_ciphertext").select_related("written_by")
                .order_by("-received_at", "-id"))


def _run_effects(run: Run) -> list[Effect]:
    effects = list(Effect.objects.for_tenant(run.tenant_id)
                   .filter(run=run).order_by("created_at", "id"))
    for effect in effects:
        effect.run = run  # no lazy query per effect for what the caller already holds
    return effects


def run_detail(*, user, tenant: Tenant, run_id) -> RunDetail:
    """Load a run for its page: its checkpoints with their newest page of revision
    metadata, its effects with their newest page of revisions, its newest conflicts (and
    the number open), its retry requests and its latest 200 audit events.

    Nine queries whatever the run's history: the newest page of every checkpoint is one
    index range on ``(checkpoint, revision)`` per checkpoint (revisions above its latest
    minus ``HISTORY_PAGE``), the same for effects. Older pages: ``checkpoint_history``,
    ``effect_history``. Raises ``NotFound`` (also for a malformed id) and what
    ``permissions.require`` raises.
    """
    run = run_get(user=user, tenant=tenant, run_id=run_id)
    cps = _run_checkpoints(run)
    revisions: dict[int, list[CheckpointRevision]] = {c.pk: [] for c in cps}
    for rev in (CheckpointRevision.objects.for_tenant(run.tenant_id)
                .filter(checkpoint__run=run,
                        revision__gt=F("checkpoint__revision") - HISTORY_PAGE)
                .defer("payload_ciphertext").select_related("written_by")
                .order_by("checkpoint_id", "-revision")):
        revisions.setdefault(rev.checkpoint_id, []).append(rev)
    effects = _run_effects(run)
    history: dict[int, list[EffectRevision]] = {e.pk: [] for e in effects}
    for rev in (EffectRevision.objects.for_tenant(run.tenant_id)
                .filter(effect__run=run, revision__gt=F("effect__revision") - HISTORY_PAGE)
                .defer("receipt_ciphertext").order_by("effect_id", "-revision")):
        history.setdefault(rev.effect_id, []).append(rev)
    conflicts = list(Conflict.objects.for_tenant(run.tenant_id)
                     .filter(run=run).defer("refused_ciphertext")
                     .select_related("acknowledged_by")
                     .order_by("-created_at", "-id")[: CONFLICT_PAGE + 1])
    open_conflicts = (Conflict.objects.for_tenant(run.tenant_id)
                      .filter(run=run, acknowledged_at__isnull=True).count())
    retries = list(RetryRequest.objects.for_tenant(run.tenant_id).filter(run=run)
                   .select_related("requested_by", "decided_by"))
    audit = list(AuditEvent.objects.for_tenant(tenant)
                 .filter(run_uuid=run.uuid).order_by("-seq")[:200])
    return RunDetail(
        run, cps, revisions, {c.pk: _older(c.revision) for c in cps},
        effects, history, {e.pk: _older(e.revision) for e in effects},
        conflicts[:CONFLICT_PAGE], open_conflicts, len(conflicts) > CONFLICT_PAGE,
        retries, audit)


@dataclass
class RunSummary:
    """What ``GET …/runs/{run_id}`` answers (CONTRACT.md 3: the run, its latest
    checkpoints, effects and open review items): no history, no audit."""

    run: Run
    checkpoints: list[Checkpoint]
    effects: list[Effect]
    open_retry: RetryRequest | None
    open_conflicts: list[Conflict]


def run_summary(*, user, tenant: Tenant, run_id) -> RunSummary:
    """The run with its checkpoints' latest revision (metadata), its effects, its open
    retry request and its unacknowledged conflicts, in five queries; nothing it does not
    answer is read (no revision, effect revision or audit event). Raises ``NotFound``
    (also for a malformed id) and what ``permissions.require`` raises."""
    run = run_get(user=user, tenant=tenant, run_id=run_id)
    open_retry = (RetryRequest.objects.for_tenant(run.tenant_id)
                  .filter(run=run, state__in=list(RetryState.OPEN))
                  .select_related("requested_by", "decided_by").first())
    conflicts = list(Conflict.objects.for_tenant(run.tenant_id)
                     .filter(run=run, acknowledged_at__isnull=True)
                     .defer("refused_ciphertext").order_by("-created_at", "-id"))
    return RunSummary(run, _run_checkpoints(run), _run_effects(run), open_retry, conflicts)


def _before(value, what: str) -> int | None:
    """A history page's ``before``: ``None`` (the newest page) or a revision number
    1..2^63-1; else ``InvalidPayload`` naming ``before``."""
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_REVISION:
        raise InvalidPayload(f"before: must be a {what} revision number from 1 to 2^63-1")
    return value


@dataclass
class HistoryPage:
    """One page of a checkpoint's or an effect's history: ``rows`` newest first (at most
    ``HISTORY_PAGE``), ``older`` the ``before`` of the next older page (``None``: this
    page reaches the first revision)."""

    rows: list
    older: int | None


def _history_page(qs: QuerySet, before: int | None) -> HistoryPage:
    if before is not None:
        qs = qs.filter(revision__lt=before)
    rows = list(qs.order_by("-revision")[: HISTORY_PAGE + 1])
    older = rows[HISTORY_PAGE - 1].revision if len(rows) > HISTORY_PAGE else None
    return HistoryPage(rows[:HISTORY_PAGE], older)


def checkpoint_history(*, user, tenant: Tenant, checkpoint: Checkpoint,
                       before: int | None = None) -> HistoryPage:
    """The checkpoint's revisions below ``before`` (``None``: from the latest), newest
    first, one page (metadata, no payload): one index range scan on
    ``(checkpoint, revision)`` read backwards and stopped after ``HISTORY_PAGE + 1``
    rows, at any depth. Raises ``InvalidPayload`` naming ``before`` for a value that is
    not a revision number, and what ``permissions.require`` raises."""
    require(user, tenant, roles.VIEW)
    before = _before(before, "checkpoint")
    return _history_page(CheckpointRevision.objects.for_tenant(tenant)
                         .filter(checkpoint=checkpoint).defer("payload_ciphertext")
                         .select_related("written_by"), before)


def effect_history(*, user, tenant: Tenant, effect: Effect,
                   before: int | None = None) -> HistoryPage:
    """The effect's revisions below ``before``, newest first, one page (metadata: the
    receipt ciphertext is not read); as ``checkpoint_history``."""
    require(user, tenant, roles.VIEW)
    before = _before(before, "effect")
    return _history_page(EffectRevision.objects.for_tenant(tenant).filter(effect=effect)
                         .defer("receipt_ciphertext"), before)


def _attempts_without_evidence(tenant: Tenant) -> QuerySet[ReconcileAttempt]:
    """The tenant's attempts as metadata: the evidence ciphertext stays in the database,
    and ``has_evidence`` says whether there is any to reveal."""
    return (ReconcileAttempt.objects.for_tenant(tenant).defer("evidence_ciphertext")
            .annotate(has_evidence=ExpressionWrapper(~Q(evidence_ciphertext=""),
                                                     output_field=BooleanField()))
            .order_by("number", "id"))


def reconcile_requests(*, user, tenant: Tenant, run: Run,
                       limit: int = 50) -> list[ReconcileRequest]:
    """The run's reconcile requests, newest first, each with its ``effect`` and its
    ``attempt_log`` (oldest look-up first, evidence left out: ``has_evidence`` instead),
    in two queries whatever their number. Like ``reconciliation.requests_for_run`` but
    never reads evidence ciphertext for a page that only lists it."""
    require(user, tenant, roles.VIEW)
    return list(ReconcileRequest.objects.for_tenant(tenant).filter(run=run)
                .select_related("effect").annotate(db_now=NOW)
                .prefetch_related(Prefetch("attempt_log",
                                           queryset=_attempts_without_evidence(tenant)))
                .order_by("-created_at", "-id")[: max(1, min(limit, 200))])


def reconcile_attempt_get(*, user, tenant: Tenant, attempt_id) -> ReconcileAttempt:
    """One look-up of a reconcile request (metadata, with its request, effect and run),
    or ``NotFound``."""
    require(user, tenant, roles.VIEW)
    try:
        pk = int(attempt_id)
    except (TypeError, ValueError):
        raise NotFound("no such reconcile attempt") from None
    attempt = (_attempts_without_evidence(tenant).filter(pk=pk)
               .select_related("request__effect", "request__run").first())
    if attempt is None:
        raise NotFound("no such reconcile attempt")
    return attempt


@dataclass(frozen=True)
class OwnerStatus:
    """Whether the run's owner counts as alive, on the database's clock, by the rule the
    sweep and reconciliation use (``policy.RunFacts.owner_gone``). ``owner`` is the lease
    owner ("" without a lease: then the owner is live while the run wrote recently);
    ``gone_at`` is when it counts as gone (``None``: it already does)."""

    live: bool
    owner: str
    gone_at: datetime | None


def run_owner_status(*, user, tenant: Tenant, run: Run) -> OwnerStatus:
    """Is the run's owner live now? (One query: the database's clock.)"""
    require(user, tenant, roles.VIEW)
    facts = policy.RunFacts.of(run, now=db_now(),
                               ambiguity_threshold_s=tenant.ambiguity_threshold_s)
    return OwnerStatus(live=not facts.owner_gone, owner=run.lease_owner,
                       gone_at=facts.owner_gone_at if not facts.owner_gone else None)


def run_thread_id(*, user, tenant: Tenant, run: Run, checkpoints: list[Checkpoint]) -> str:
    """The LangGraph thread id of a run the LangGraph saver wrote (kind
    ``kinds.LANGGRAPH_KIND``; docs/langgraph.md), from the graph checkpoints kept beside
    its envelopes ``checkpoints``; ``""`` for any other run (no query) or none found. One
    query on the envelope's index whatever the thread's length."""
    require(user, tenant, roles.VIEW)
    if run.kind != kinds.LANGGRAPH_KIND or not checkpoints:
        return ""
    return (GraphCheckpoint.objects.for_tenant(tenant)
            .filter(envelope_id__in=[c.pk for c in checkpoints])
            .values_list("thread_id", flat=True).first()) or ""
