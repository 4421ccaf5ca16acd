"""Reads: every query filters by tenant first, then by the caller's role on the tenant.

Views and the API never call ``Model.objects`` directly. Lists read metadata columns only
(never payload ciphertext), and paginate by keyset on ``(last_write_at, id)`` so a page
costs the same at any depth.

Nothing here grows with the tenant or the run (issue 8): every list is one index scan in
the order of an index (``models.Run.Meta.indexes`` and the others) stopped by its LIMIT,
every count an index-only GROUP BY, and a run's history (checkpoint revisions, effect
revisions) is read one page of ``HISTORY_PAGE`` at a time, newest first, by keyset on the
revision number (``?before=N``). Each function costs a fixed number of queries whatever
the number of rows behind it (``tests/views/test_query_budget.py``).
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib.contenttypes.models import ContentType
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Count,
    ExpressionWrapper,
    F,
    Prefetch,
    Q,
    QuerySet,
    Sum,
)
from django.db.models.functions import Cast
from guardian.models import GroupObjectPermission

from . import policy, roles
from .dbclock import NOW, db_now
from .exceptions import InvalidPayload, NotFound
from .models import (
    MAX_REVISION,
    ApiToken,
    AuditEvent,
    BulkAction,
    BulkActionItem,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    EffectStateCount,
    ReconcileAttempt,
    ReconcileRequest,
    RecoveryState,
    RetryRequest,
    RetryState,
    Run,
    RunStateCount,
    Tenant,
)
from .permissions import require
from .vocab import BulkOutcome, EffectState

RUN_LIST_FIELDS = (
    "id", "tenant_id", "uuid", "kind", "schema_version", "agent", "model", "workflow",
    "definition_version", "phase_class", "phase_label", "recovery_state", "recovery_reason",
    "state_changed_at", "last_write_at", "created_at", "lease_owner", "lease_expires_at",
    "fencing_token", "unacknowledged_conflicts", "closed_at", "closed_reason",
    "closed_by__username",
)


#: Revisions per page of a checkpoint's or an effect's history (run page, history pages).
HISTORY_PAGE = 50
#: Conflicts the run page lists (the newest; the open ones are counted).
CONFLICT_PAGE = 50


def _uuid_or_404(value, what: str) -> uuid.UUID:
    """``value`` as a UUID; a malformed id is answered like a missing object."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotFound(f"no such {what}") from None


def tenants_for_user(user) -> QuerySet[Tenant]:
    """Tenants where ``user`` holds a role, ordered by slug; none for ``None``, anonymous
    and inactive accounts.

    Like ``permissions.tenant_perms``, only the role groups' object permission
    ``view_runs`` counts: never a global permission, a permission given to the account
    itself, or the superuser/staff flags (CONTRACT.md 4; issue 6, fault 1).
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    tenant_type = ContentType.objects.get_for_model(Tenant)
    granted = (GroupObjectPermission.objects
               .filter(group__user=user, content_type=tenant_type,
                       permission__content_type=tenant_type,
                       permission__codename=roles.VIEW)
               .annotate(tenant_pk=Cast("object_pk", BigIntegerField()))
               .values("tenant_pk"))
    return Tenant.objects.filter(pk__in=granted).order_by("slug")


def tokens_of_account(*, user) -> list[ApiToken]:
    """Every bearer token of ``user`` (live and revoked), newest first, for the operator's
    ``list_tokens``: prefix, created, last used, revoked; the secret is never stored."""
    return list(ApiToken.objects.filter(user=user).order_by("-created_at", "-id"))


def state_counts(*, tenant: Tenant) -> dict[str, int]:
    """``{recovery_state: number of runs}`` for the inbox tabs (every state present).

    One query over the tenant's ``RunStateCount`` rows (at most ``COUNT_SHARDS`` per
    state, kept by triggers in the same transaction as every run change), so it costs
    the same for ten runs and for a million (issue 8)."""
    return _counted(RunStateCount, tenant, RecoveryState.values)


def _counted(model, tenant: Tenant, states) -> dict[str, int]:
    """``{state: n}`` summed over the shards of a state counter table, every one of
    ``states`` present (0 when absent)."""
    counts = dict(model.objects.for_tenant(tenant).order_by().values_list("state")
                  .annotate(total=Sum("n")).values_list("state", "total"))
    return {state: counts.get(state, 0) for state in states}


@dataclass(frozen=True)
class RunFilters:
    """Inbox filters. ``age_s_min``: only runs whose last write is at least this old."""

    recovery_state: str | None = None
    kind: str | None = None
    subject: str | None = None  # agent or workflow name, substring, case-insensitive
    age_s_min: int | None = None


def encode_cursor(run: Run | dict) -> str:
    """Opaque keyset cursor for the row after which the next page starts."""
    last = run["last_write_at"] if isinstance(run, dict) else run.last_write_at
    pk = run["id"] if isinstance(run, dict) else run.pk
    raw = json.dumps([last.isoformat(), pk])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """``(last_write_at, id)`` of the row the page continues after. Raises
    ``InvalidPayload`` naming ``cursor`` for anything not made by ``encode_cursor``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        last, pk = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(last, str) or type(pk) is not int:
            raise ValueError
        when = datetime.fromisoformat(last)
        if when.tzinfo is None:
            raise ValueError
        # In UTC, as encode_cursor writes it; a far date in a far zone does not fit
        # (OverflowError), and would otherwise overflow in the database driver.
        return when.astimezone(UTC), pk
    except (ValueError, TypeError, OverflowError, json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidPayload("cursor: not a cursor returned by this API") from None


def _filtered_runs(tenant: Tenant, filters: RunFilters) -> QuerySet[Run]:
    """The tenant's runs that ``filters`` select (the inbox's and ``GET …/runs``'s one
    definition, shared by ``run_list`` and ``run_ids_matching``). Raises
    ``InvalidPayload`` for an unknown recovery state."""
    if filters.recovery_state and filters.recovery_state not in RecoveryState.values:
        raise InvalidPayload(
            f"recovery_state: must be one of {', '.join(RecoveryState.values)}")
    qs = Run.objects.for_tenant(tenant)
    if filters.recovery_state:
        qs = qs.filter(recovery_state=filters.recovery_state)
    if filters.kind:
        qs = qs.filter(kind=filters.kind)
    if filters.subject:
        qs = qs.filter(Q(agent__icontains=filters.subject) | Q(workflow__icontains=filters.subject))
    if filters.age_s_min:
        qs = qs.filter(last_write_at__lte=NOW - timedelta(seconds=filters.age_s_min))
    return qs


def run_ids_matching(*, user, tenant: Tenant, filters: RunFilters, limit: int) -> list[uuid.UUID]:
    """The public ids of at most ``limit`` runs that ``filters`` select, in the inbox's
    order (newest write first): what "all matching" means for a bulk action
    (``services.bulk``, which asks for one more than its maximum to tell "too many").
    One query, the same index scan as ``run_list``. Raises ``NotFound``/``Forbidden``,
    ``InvalidPayload`` for a bad filter."""
    require(user, tenant, roles.VIEW)
    return list(_filtered_runs(tenant, filters).order_by("-last_write_at", "-id")
                .values_list("uuid", flat=True)[:max(0, limit)])


def run_list(*, user, tenant: Tenant, filters: RunFilters, cursor: str | None = None,
             limit: int = 50) -> tuple[list[dict], str | None]:
    """One page of the tenant's runs, newest write first, and the next page's cursor.

    Returns ``(rows, next_cursor)``; rows are dicts of ``RUN_LIST_FIELDS``. Raises
    ``NotFound``/``Forbidden`` via ``permissions.require``, ``InvalidPayload`` for a bad
    filter or cursor.

    One query, in the order ``-last_write_at, -id`` of ``run_inbox_idx`` (a state) or
    ``run_all_idx`` (every state): PostgreSQL reads the index from the cursor on and stops
    after ``limit + 1`` rows (``kind``, ``subject`` filter the rows it reads; ``age_s_min``
    moves where it starts), whatever the tenant's size or the page's depth.
    """
    require(user, tenant, roles.VIEW)
    qs = _filtered_runs(tenant, filters)
    if cursor:
        last, pk = decode_cursor(cursor)
        # (last_write_at, id) < (last, pk), spelt as a range the index scan starts from
        # (last_write_at <= last) plus a check of the rows that share ``last``.
        qs = qs.filter(Q(last_write_at__lt=last) | Q(id__lt=pk), last_write_at__lte=last)
    limit = max(1, min(limit, 200))
    # last_write_at is never null, so this is the indexes' order on every backend.
    rows = list(qs.order_by("-last_write_at", "-id").values(*RUN_LIST_FIELDS)[: limit + 1])
    next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], next_cursor


def run_get(*, user, tenant: Tenant, run_id: uuid.UUID | str) -> Run:
    """The run, or ``NotFound`` (also for a malformed id)."""
    require(user, tenant, roles.VIEW)
    rid = _uuid_or_404(run_id, "run")
    run = Run.objects.for_tenant(tenant).filter(uuid=rid).select_related(
        "latest_checkpoint", "closed_by").first()
    if run is None:
        raise NotFound("no such run")
    return run


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
                .select_related("effect")
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
    facts = policy.RunFacts(
        now=db_now(), phase_class=run.phase_class, last_write_at=run.last_write_at,
        lease_owner=run.lease_owner, lease_expires_at=run.lease_expires_at,
        ambiguity_threshold_s=tenant.ambiguity_threshold_s)
    return OwnerStatus(live=not facts.owner_gone, owner=run.lease_owner,
                       gone_at=facts.owner_gone_at if not facts.owner_gone else None)


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


def audit_list(*, user, tenant: Tenant, run_id=None, actor: str | None = None,
               action: str | None = None, before_seq: int | None = None,
               limit: int = 100) -> list[AuditEvent]:
    """Audit events of the tenant, newest first, filtered; ``before_seq`` pages backwards."""
    require(user, tenant, roles.VIEW)
    qs = AuditEvent.objects.for_tenant(tenant)
    if run_id:
        try:
            qs = qs.filter(run_uuid=uuid.UUID(str(run_id)))
        except ValueError:
            raise InvalidPayload("run: not a UUID") from None
    if actor:
        qs = qs.filter(actor_name=actor)
    if action:
        qs = qs.filter(action=action)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return list(qs.order_by("-seq")[: max(1, min(limit, 500))])


def report(*, user, tenant: Tenant) -> dict:
    """Tenant-scoped numbers: runs per state, effects per state, open conflicts, retries.

    Four queries: runs and effects per state from their counter tables (``RunStateCount``,
    ``EffectStateCount``: a few rows per state whatever the tenant's size); retry
    requests with an index-only count of their ``(tenant, state)`` index (a tenant has
    few); open conflicts from the partial ``conflict_open_idx``, which holds only the
    open ones. Effect states with no effect are left out."""
    require(user, tenant, roles.VIEW)
    effects = {state: n for state, n in _counted(EffectStateCount, tenant,
                                                 EffectState.values).items() if n}
    retries = dict(RetryRequest.objects.for_tenant(tenant).values_list("state")
                   .annotate(n=Count("*")).values_list("state", "n"))
    return {
        "runs": state_counts(tenant=tenant),
        "effects": effects,
        "retry_requests": retries,
        "open_conflicts": Conflict.objects.for_tenant(tenant).filter(
            acknowledged_at__isnull=True).count(),
    }


@dataclass
class BulkResult:
    """A bulk action and its per-run results (``bulk_get``): ``bulk`` the row,
    ``items`` its ``BulkActionItem`` rows in selection order, the counts of each outcome
    among them (right while it still runs, when the row's counts are not written yet),
    ``pending`` how many selected runs have no result yet, ``filters`` the inbox filters
    it was asked for (a dict) or ``None`` for runs selected by id."""

    bulk: BulkAction
    items: list[BulkActionItem]
    done: int
    refused: int
    failed: int
    pending: int
    filters: dict | None


def bulk_get(*, user, tenant: Tenant, bulk_id) -> BulkResult:
    """One bulk action of the tenant with its per-run results (issue 9, item 3): two
    queries whatever the number of runs. Any role that sees the audit log sees it
    (``view_runs``); a malformed or unknown id, or one of another tenant, is
    ``NotFound``."""
    require(user, tenant, roles.VIEW)
    bid = _uuid_or_404(bulk_id, "bulk action")
    bulk = BulkAction.objects.for_tenant(tenant).filter(uuid=bid).first()
    if bulk is None:
        raise NotFound("no such bulk action")
    items = list(BulkActionItem.objects.for_tenant(tenant).filter(bulk=bulk)
                 .order_by("position"))
    counts = {outcome: 0 for outcome in BulkOutcome.values}
    for item in items:
        counts[item.outcome] += 1
    return BulkResult(bulk=bulk, items=items, done=counts[BulkOutcome.DONE],
                      refused=counts[BulkOutcome.REFUSED], failed=counts[BulkOutcome.FAILED],
                      pending=max(0, bulk.total - len(items)),
                      filters=(bulk.selection or {}).get("filters"))
