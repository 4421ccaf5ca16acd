"""Reads: every query filters by tenant first, then by the caller's role on the tenant.

Views and the API never call ``Model.objects`` directly. Lists read metadata columns only
(never payload ciphertext), and paginate by keyset on ``(last_write_at, id)`` so a page
costs the same at any depth.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

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
)
from django.db.models.functions import Cast
from guardian.models import GroupObjectPermission

from . import policy, roles
from .dbclock import NOW, db_now
from .exceptions import InvalidPayload, NotFound
from .models import (
    ApiToken,
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    ReconcileAttempt,
    ReconcileRequest,
    RecoveryState,
    RetryRequest,
    Run,
    Tenant,
)
from .permissions import require

RUN_LIST_FIELDS = (
    "id", "tenant_id", "uuid", "kind", "schema_version", "agent", "model", "workflow",
    "definition_version", "phase_class", "phase_label", "recovery_state", "recovery_reason",
    "state_changed_at", "last_write_at", "created_at", "lease_owner", "lease_expires_at",
    "fencing_token", "unacknowledged_conflicts", "closed_at", "closed_reason",
    "closed_by__username",
)


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
    """``{recovery_state: number of runs}`` for the inbox tabs (every state present)."""
    counts = dict(Run.objects.for_tenant(tenant).values_list("recovery_state")
                  .annotate(n=Count("id")).values_list("recovery_state", "n"))
    return {state: counts.get(state, 0) for state in RecoveryState.values}


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
    raw = json.dumps([last.isoformat() if last else None, pk])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime | None, int]:
    """Raises ``InvalidPayload`` naming ``cursor`` for anything not made by ``encode_cursor``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        last, pk = json.loads(base64.urlsafe_b64decode(padded.encode()))
        when = datetime.fromisoformat(last) if last else None
        if type(pk) is not int:
            raise ValueError
        return when, pk
    except (ValueError, TypeError, json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidPayload("cursor: not a cursor returned by this API") from None


def run_list(*, user, tenant: Tenant, filters: RunFilters, cursor: str | None = None,
             limit: int = 50) -> tuple[list[dict], str | None]:
    """One page of the tenant's runs, newest write first, and the next page's cursor.

    Returns ``(rows, next_cursor)``; rows are dicts of ``RUN_LIST_FIELDS``. Raises
    ``NotFound``/``Forbidden`` via ``permissions.require``, ``InvalidPayload`` for a bad
    filter or cursor.
    """
    require(user, tenant, roles.VIEW)
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
    if cursor:
        last, pk = decode_cursor(cursor)
        if last is None:
            qs = qs.filter(last_write_at__isnull=True, id__lt=pk)
        else:
            qs = qs.filter(Q(last_write_at__lt=last) | Q(last_write_at=last, id__lt=pk)
                           | Q(last_write_at__isnull=True))
    limit = max(1, min(limit, 200))
    # NULLs last on every backend, which is what the cursor filter above assumes.
    order = (F("last_write_at").desc(nulls_last=True), F("id").desc())
    rows = list(qs.order_by(*order).values(*RUN_LIST_FIELDS)[: limit + 1])
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
    """Everything the run page and ``GET …/runs/{run_id}`` show (metadata only)."""

    run: Run
    checkpoints: list[Checkpoint]
    revisions: dict[int, list[CheckpointRevision]]  # checkpoint pk -> revisions, oldest first
    effects: list[Effect]
    effect_history: dict[int, list[EffectRevision]]  # effect pk -> revisions
    conflicts: list[Conflict]
    retry_requests: list[RetryRequest]
    audit: list[AuditEvent]


def run_detail(*, user, tenant: Tenant, run_id) -> RunDetail:
    """Load a run with its checkpoints (and revision metadata), effects, conflicts, retry
    requests and the latest 200 audit events, in a fixed number of queries."""
    run = run_get(user=user, tenant=tenant, run_id=run_id)
    cps = list(Checkpoint.objects.for_tenant(run.tenant_id)
               .filter(run=run).defer("payload_ciphertext")
               .order_by("-received_at"))
    revisions: dict[int, list[CheckpointRevision]] = {c.pk: [] for c in cps}
    for rev in (CheckpointRevision.objects.for_tenant(run.tenant_id).filter(checkpoint__run=run)
                .defer("payload_ciphertext").select_related("written_by")
                .order_by("checkpoint_id", "revision")):
        revisions.setdefault(rev.checkpoint_id, []).append(rev)
    effects = list(Effect.objects.for_tenant(run.tenant_id)
                   .filter(run=run).order_by("created_at", "id"))
    history: dict[int, list[EffectRevision]] = {e.pk: [] for e in effects}
    for rev in (EffectRevision.objects.for_tenant(run.tenant_id)
                .filter(effect__run=run).order_by("effect_id", "revision")):
        history.setdefault(rev.effect_id, []).append(rev)
    conflicts = list(Conflict.objects.for_tenant(run.tenant_id)
                     .filter(run=run).defer("refused_ciphertext")
                     .select_related("acknowledged_by"))
    retries = list(RetryRequest.objects.for_tenant(run.tenant_id).filter(run=run)
                   .select_related("requested_by", "decided_by"))
    audit = list(AuditEvent.objects.for_tenant(tenant)
                 .filter(run_uuid=run.uuid).order_by("-seq")[:200])
    return RunDetail(run, cps, revisions, effects, history, conflicts, retries, audit)


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
    """Tenant-scoped numbers: runs per state, effects per state, open conflicts, retries."""
    require(user, tenant, roles.VIEW)
    effects = dict(Effect.objects.for_tenant(tenant).values_list("state")
                   .annotate(n=Count("id")).values_list("state", "n"))
    retries = dict(RetryRequest.objects.for_tenant(tenant).values_list("state")
                   .annotate(n=Count("id")).values_list("state", "n"))
    return {
        "runs": state_counts(tenant=tenant),
        "effects": effects,
        "retry_requests": retries,
        "open_conflicts": Conflict.objects.for_tenant(tenant).filter(
            acknowledged_at__isnull=True).count(),
    }
