"""Every write to the store, one function per operation (DESIGN.md section 5).

Each public function takes keyword arguments ``actor`` (a user, or ``None`` for the
system) and ``tenant``, checks the actor's rights, does its conditional UPDATE, writes
history, the run's recovery state and one audit event in **one** transaction, and queues
Celery work with ``transaction.on_commit``. Views, the API, tasks and commands call these;
nothing else writes the tables.

Lock order, to stay free of deadlocks: the run row (``SELECT … FOR UPDATE``), then the
object's conditional UPDATE, then the tenant's audit chain head.

A refused compare-and-swap is not a rollback: the conflict record, the run's conflict
count and its audit event commit, and ``StaleRevision`` is raised after the commit.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q
from guardian.shortcuts import assign_perm

from . import crypto, kinds, policy, reconciliation, roles
from .audit import (  # noqa: F401 - audit_head_*/audit_verify: part of this module's interface
    audit_head_check,
    audit_head_export,
    audit_head_parse,
    audit_record,
    audit_verify,
)
from .dbclock import NOW, db_now
from .exceptions import (
    Fenced,
    Forbidden,
    IdempotencyKeyReuse,
    InvalidPayload,
    InvalidTransition,
    LeaseHeld,
    NotFound,
    OperationExists,
    OwnerLive,
    ReasonRequired,
    StaleRevision,
)
from .jsonparse import dumps, loads_any, text_problem
from .models import (
    MAX_REVISION,
    ApiToken,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    ReconcileAttempt,
    RetryRequest,
    Run,
    Tenant,
    encrypt_receipt,
)
from .permissions import forget_perms, require, tenant_perms
from .reconciliation import run_reconcile  # noqa: F401 - the reviewer's reconcile action
from .vocab import (
    AuditAction,
    ConflictReason,
    EffectClass,
    EffectSource,
    EffectState,
    PhaseClass,
    ReconcileState,
    RecoveryState,
    RetryOutcome,
    RetryState,
    TargetType,
)

User = get_user_model()

SYSTEM = "system"
U32_MAX = 2**32 - 1
HEX64_RE = re.compile(r"^[0-9a-fA-F]{64}\Z")


# --------------------------------------------------------------------------------------
# Audit log
# --------------------------------------------------------------------------------------

def _actor_name(actor) -> str:
    return actor.get_username() if actor is not None else SYSTEM


# The keyed chain, its verifier and the signed head exports are ``checkpoints.audit``
# (docs/security/audit.md), imported above; every service here calls ``audit_record``
# inside its own transaction.


def _require_reason(reason: str | None) -> str:
    if reason is not None and not isinstance(reason, str):
        raise InvalidPayload("reason: must be a string")
    reason = (reason or "").strip()
    if not reason:
        raise ReasonRequired("reason: a reason is required")
    if len(reason) > 4000:
        raise InvalidPayload("reason: at most 4000 characters")
    problem = text_problem(reason)
    if problem:
        raise InvalidPayload(f"reason: {problem}")
    return reason


# --------------------------------------------------------------------------------------
# Tenants, accounts, roles, tokens (operator commands)
# --------------------------------------------------------------------------------------

def tenant_create(*, slug: str, name: str = "", actor=None) -> Tenant:
    """Create a tenant and its audit chain.

    Raises ``InvalidPayload`` if the slug is not a slug (letters, digits, ``-``, ``_``;
    at most 64) or is taken.
    """
    if not isinstance(slug, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", slug):
        raise InvalidPayload("slug: letters, digits, '-' and '_' only, 1 to 64 characters")
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise InvalidPayload(f"slug: tenant {slug!r} already exists")
        tenant = Tenant.objects.create(slug=slug, name=name or slug)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.TENANT_CREATE, target_type=TargetType.TENANT,
                     target_id=tenant.slug, after={"slug": slug, "name": tenant.name})
    return tenant


def account_create(*, username: str, password: str | None = None, service: bool = False):
    """Create a login account (``password``) or a service account (no password, tokens only).

    Raises ``InvalidPayload`` if the username is taken, or if the password fails
    ``AUTH_PASSWORD_VALIDATORS`` (length, common, numeric, similar to the username).
    Accounts belong to no tenant, so this writes no tenant audit event; granting a role does.
    """
    with transaction.atomic():
        if User.objects.filter(username=username).exists():
            raise InvalidPayload(f"username: account {username!r} already exists")
        user = User(username=username)
        if password and not service:
            try:
                validate_password(password, user)
            except ValidationError as exc:
                raise InvalidPayload(f"password: {' '.join(exc.messages)}") from None
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
    return user


def role_grant(*, actor, tenant: Tenant, user, role: str) -> None:
    """Give ``user`` ``role`` in ``tenant`` (CONTRACT.md section 4), audited.

    ``actor`` must be an admin of the tenant, or ``None`` for the operator's command line.
    Raises ``InvalidPayload`` for an unknown role.
    """
    if role not in roles.ROLE_PERMISSIONS:
        raise InvalidPayload(f"role: must be one of {', '.join(roles.ROLES)}")
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        group, created = Group.objects.get_or_create(name=roles.group_name(tenant.slug, role))
        if created:
            for codename in roles.ROLE_PERMISSIONS[role]:
                assign_perm(f"checkpoints.{codename}", group, tenant)
        user.groups.add(group)
        forget_perms(user)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.ROLE_GRANT, target_type=TargetType.ACCOUNT,
                     target_id=user.get_username(), after={"role": role})


def role_revoke(*, actor, tenant: Tenant, user, role: str) -> None:
    """Take ``role`` in ``tenant`` away from ``user`` (CONTRACT.md 5, ``revoke``), with one
    ``role.revoke`` audit event in the tenant, in the same transaction. The account's next
    request is judged without it (rights are read per request; ``forget_perms`` clears
    this object's cache).

    ``actor`` must be an admin of the tenant, or ``None`` for the operator's command line.
    Raises ``InvalidPayload`` naming ``role`` for an unknown role or one the account does
    not hold there (nothing is written), ``NotFound``/``Forbidden`` for an actor who may
    not manage roles in the tenant.
    """
    if role not in roles.ROLE_PERMISSIONS:
        raise InvalidPayload(f"role: must be one of {', '.join(roles.ROLES)}")
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        group = Group.objects.filter(name=roles.group_name(tenant.slug, role),
                                     user=user).first()
        if group is None:
            raise InvalidPayload(
                f"role: {user.get_username()} holds no {role} role in {tenant.slug}")
        user.groups.remove(group)
        forget_perms(user)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.ROLE_REVOKE, target_type=TargetType.ACCOUNT,
                     target_id=user.get_username(), before={"role": role},
                     after={"roles": _roles_in(user, tenant)})


def _roles_in(user, tenant: Tenant) -> list[str]:
    """The roles ``user`` holds in ``tenant`` (from its groups), sorted."""
    prefix = roles.group_name(tenant.slug, "")
    names = user.groups.filter(name__startswith=prefix).values_list("name", flat=True)
    return sorted(n[len(prefix):] for n in names if n[len(prefix):] in roles.ROLE_PERMISSIONS)


def account_tenants(user) -> list[tuple[Tenant, list[str]]]:
    """``[(tenant, [roles])]`` for every tenant where ``user`` holds a role, by slug: the
    tenants an account command "concerns" (CONTRACT.md 5), where it is audited. Read from
    the role groups (``tenant:<slug>:<role>``), whether or not the account is active."""
    held: dict[str, list[str]] = {}
    for name in user.groups.filter(name__startswith="tenant:").values_list("name", flat=True):
        parts = name.split(":")
        if len(parts) == 3 and parts[2] in roles.ROLE_PERMISSIONS:
            held.setdefault(parts[1], []).append(parts[2])
    return [(t, sorted(held[t.slug])) for t in Tenant.objects.filter(slug__in=held)]


def tenant_set_ambiguity_threshold(*, actor, tenant: Tenant, seconds: int) -> Tenant:
    """Set how long an in-flight run with no lease may stay quiet before it is ambiguous
    (CONTRACT.md 1, default 300 s). ``actor`` must be an admin of the tenant, or ``None``
    for the operator's command line. Raises ``InvalidPayload`` unless 1 <= seconds <= 86400.
    Audited."""
    if type(seconds) is not int or not 1 <= seconds <= 86400:
        raise InvalidPayload("ambiguity_threshold_s: must be an integer in 1..86400")
    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        before = Tenant.objects.select_for_update().get(pk=tenant.pk).ambiguity_threshold_s
        Tenant.objects.filter(pk=tenant.pk).update(ambiguity_threshold_s=seconds)
        tenant.ambiguity_threshold_s = seconds
        audit_record(tenant=tenant, actor=actor, action=AuditAction.TENANT_THRESHOLD, target_type=TargetType.TENANT,
                     target_id=tenant.slug, before={"ambiguity_threshold_s": before},
                     after={"ambiguity_threshold_s": seconds})
    return tenant


def token_issue(*, user) -> str:
    """Create a bearer token for ``user``; returns the secret once (only its SHA-256 and
    its first 12 characters, the prefix, are kept). Raises ``InvalidPayload`` for a
    deactivated account.

    Not audited (yet): see docs/security/access.md, "Ending access".
    """
    if not user.is_active:
        raise InvalidPayload(f"username: account {user.get_username()!r} is deactivated")
    raw = "rcv_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, prefix=raw[:12],
                            key_hash=hashlib.sha256(raw.encode()).hexdigest())
    return raw


#: ``ApiToken.last_used_at`` is written at most this often per token.
TOKEN_TOUCH_INTERVAL = timedelta(seconds=60)


def token_authenticate(raw: str):
    """The active account owning bearer token ``raw``, or ``None`` (unknown, revoked, or
    its account deactivated: the API answers 401 from the next request on).

    Bookkeeping: the token's ``last_used_at`` is set to the database's time when it is
    empty or at least ``TOKEN_TOUCH_INTERVAL`` old, by a conditional UPDATE, so a token
    used many times a minute costs one small write a minute, not one per request, and
    concurrent requests write it once. It is the one write a GET may cause: it is about
    the credential, not tenant data, and is neither audited nor shown to tenants
    (docs/security/access.md).
    """
    if not isinstance(raw, str) or not raw.isascii():
        return None
    digest = hashlib.sha256(raw.encode()).hexdigest()
    token = (ApiToken.objects.select_related("user").annotate(db_now=NOW)
             .filter(key_hash=digest, revoked_at__isnull=True).first())
    if token is None or not token.user.is_active:
        return None
    last = token.last_used_at
    if last is None or token.db_now - last >= TOKEN_TOUCH_INTERVAL:
        unchanged = Q(last_used_at__isnull=True) if last is None else Q(last_used_at=last)
        ApiToken.objects.filter(unchanged, pk=token.pk).update(last_used_at=NOW)
    return token.user


def tokens_revoke(*, user, actor=None) -> list[str]:
    """Revoke every live bearer token of ``user`` (CONTRACT.md 5, ``revoke_token``): the
    API answers 401 to each from the next request on. Audited as ``token.revoke`` (the
    prefixes) in every tenant where the account holds a role, in the same transaction.
    Returns the revoked tokens' prefixes (empty, and nothing written, when none was
    live). ``actor`` is ``None`` for the operator's command line.
    """
    with transaction.atomic():
        live = ApiToken.objects.select_for_update().filter(user=user, revoked_at__isnull=True)
        prefixes = sorted(live.values_list("prefix", flat=True))
        if not prefixes:
            return []
        live.update(revoked_at=NOW)
        for tenant, held in account_tenants(user):
            audit_record(tenant=tenant, actor=actor, action=AuditAction.TOKEN_REVOKE,
                         target_type=TargetType.ACCOUNT, target_id=user.get_username(),
                         after={"revoked": prefixes, "roles": held})
    return prefixes


def account_deactivate(*, user, actor=None) -> dict:
    """Deactivate an account (CONTRACT.md 5, ``deactivate_account``): it can no longer log
    in, its sessions count as logged out and its tokens as revoked from the next request
    on (API: 401; dashboard: the login page). Every live token is revoked too, so
    reactivating the account later would not bring them back. Role grants are kept as
    the record of what it held; an inactive account holds no rights
    (``permissions.tenant_perms``).

    One ``account.deactivate`` audit event (roles held, tokens revoked) in every tenant
    where the account holds a role, in the same transaction. Returns ``{"tenants":
    [slugs], "tokens_revoked": [prefixes]}``. Raises ``InvalidTransition`` (nothing
    written) when the account is already inactive. ``actor`` is ``None`` for the
    operator's command line.
    """
    with transaction.atomic():
        locked = User.objects.select_for_update().get(pk=user.pk)
        if not locked.is_active:
            raise InvalidTransition(
                f"username: account {user.get_username()!r} is already deactivated")
        User.objects.filter(pk=user.pk).update(is_active=False)
        user.is_active = False
        forget_perms(user)
        live = ApiToken.objects.filter(user=user, revoked_at__isnull=True)
        prefixes = sorted(live.values_list("prefix", flat=True))
        live.update(revoked_at=NOW)
        concerned = account_tenants(user)
        for tenant, held in concerned:
            audit_record(tenant=tenant, actor=actor, action=AuditAction.ACCOUNT_DEACTIVATE,
                         target_type=TargetType.ACCOUNT, target_id=user.get_username(),
                         before={"is_active": True, "roles": held},
                         after={"is_active": False, "tokens_revoked": prefixes})
    return {"tenants": [t.slug for t, _ in concerned], "tokens_revoked": prefixes}


def reconciler_configure(*, actor, tenant: Tenant, service: str, plugin: str, url: str = "",
                         timeout_s: int = 5, settle_delay_s: int | None = None):
    """Choose the reconciler that answers for ``service`` in ``tenant`` (issue 5,
    ``reconcile`` module doc); ``plugin="default"`` removes the choice (the
    ``RECOVERY_RECONCILERS`` environment default applies again). ``actor`` must be an admin
    of the tenant, or ``None`` for the operator's command line. Audited.

    Raises ``InvalidPayload`` naming the field: an unknown plugin or one that cannot be
    imported, a URL that is not http(s) or longer than 2000, ``timeout_s`` outside 1..120,
    ``settle_delay_s`` outside 0..86400, a service name that is empty or over 200.
    Returns the ``ReconcilerConfig`` (``None`` after ``default``).
    """
    from .models import ReconcilerConfig
    from .reconcile import plugin_class

    if actor is not None:
        require(actor, tenant, roles.MANAGE)
    service = _str_field({"service": service}, "service", 200)
    if plugin != "default":
        plugin_class(plugin)
    if not isinstance(url, str) or len(url) > 2000 or (
            url and not re.match(r"https?://[^\s]+\Z", url)):
        raise InvalidPayload("url: must be an http:// or https:// URL of at most 2000 characters")
    if plugin in ("http_status", "replay") and not url:
        raise InvalidPayload(f"url: required for the {plugin} reconciler")
    if type(timeout_s) is not int or not 1 <= timeout_s <= 120:
        raise InvalidPayload("timeout_s: must be an integer in 1..120")
    if settle_delay_s is not None and (type(settle_delay_s) is not int
                                       or not 0 <= settle_delay_s <= 86400):
        raise InvalidPayload("settle_delay_s: must be an integer in 0..86400")
    with transaction.atomic():
        before = (ReconcilerConfig.objects.for_tenant(tenant).select_for_update()
                  .filter(service=service)
                  .values("plugin", "url", "timeout_s", "settle_delay_s").first())
        if plugin == "default":
            ReconcilerConfig.objects.for_tenant(tenant).filter(service=service).delete()
            row, after = None, None
        else:
            row, _ = ReconcilerConfig.objects.for_tenant(tenant).update_or_create(
                tenant=tenant, service=service,
                defaults={"plugin": plugin, "url": url, "timeout_s": timeout_s,
                          "settle_delay_s": settle_delay_s})
            after = {"plugin": plugin, "url": url, "timeout_s": timeout_s,
                     "settle_delay_s": settle_delay_s}
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RECONCILER_CONFIGURE,
                     target_type=TargetType.SERVICE, target_id=service[:64], before=before,
                     after=after)
    return row


# --------------------------------------------------------------------------------------
# Envelope validation (CONTRACT.md sections 2 and 6)
# --------------------------------------------------------------------------------------

def _uuid_field(body: dict, key: str) -> uuid.UUID:
    value = body.get(key)
    if not isinstance(value, str):
        raise InvalidPayload(f"{key}: must be a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidPayload(f"{key}: {value[:64]!r} is not a UUID") from None


def _int_field(body: dict, key: str, maximum: int) -> int:
    value = body.get(key)
    if type(value) is not int or not 0 <= value <= maximum:
        raise InvalidPayload(f"{key}: must be an integer in 0..{maximum}")
    return value


def _str_field(body: dict, key: str, max_len: int) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidPayload(f"{key}: must be a non-empty string")
    if len(value) > max_len:
        raise InvalidPayload(f"{key}: at most {max_len} characters")
    return value


@dataclass(frozen=True)
class Envelope:
    """A validated checkpoint envelope; ``payload_json`` is its canonical JSON text."""

    checkpoint_id: uuid.UUID
    run_id: uuid.UUID
    revision: int
    kind: str
    schema_version: int
    payload: Any
    payload_json: str
    updated_at_ms: int


def parse_envelope(body: dict, *, url_id: uuid.UUID) -> Envelope:
    """Validate a checkpoint body against CONTRACT.md sections 2 and 6.

    Raises ``InvalidPayload`` naming the first bad field.
    """
    cid = _uuid_field(body, "id")
    if cid != url_id:
        raise InvalidPayload("id: differs from the id in the URL")
    run_id = _uuid_field(body, "run_id")
    revision = _int_field(body, "revision", MAX_REVISION)
    kind = body.get("kind")
    if not isinstance(kind, str) or len(kind) > 200 or not kinds.KIND_RE.match(kind):
        raise InvalidPayload(
            "kind: must match ^[a-z][a-z0-9_]*(\\.[a-z0-9_-]+)+$ (e.g. acme.order)"
        )
    schema_version = _int_field(body, "schema_version", U32_MAX)
    if "payload" not in body:
        raise InvalidPayload("payload: required")
    # The column is a signed 64-bit integer: 2^63-1 is the most the store can hold.
    updated_at_ms = _int_field(body, "updated_at_ms", MAX_REVISION)
    unknown = set(body) - {"id", "run_id", "revision", "kind", "schema_version", "payload",
                           "updated_at_ms"}
    if unknown:
        raise InvalidPayload(f"{sorted(unknown)[0]}: unknown field")
    return Envelope(cid, run_id, revision, kind, schema_version, body["payload"],
                    dumps(body["payload"]), updated_at_ms)


# --------------------------------------------------------------------------------------
# Runs: locking, fencing, recovery state
# --------------------------------------------------------------------------------------

def _lock_run(tenant: Tenant, run_id: uuid.UUID, *, create: bool) -> Run | None:
    """The run row, locked FOR UPDATE; created (race-safe) when ``create``.

    The same query reads the database's clock into ``run.db_now`` (``dbclock``): every
    time this write stores or compares is that one, never the process's clock.
    """
    locked = Run.objects.for_tenant(tenant).select_for_update().annotate(db_now=NOW)
    run = locked.filter(uuid=run_id).first()
    if run is not None:
        run.tenant = tenant  # already loaded; saves a query in run_facts
    if run is not None or not create:
        return run
    try:
        with transaction.atomic():
            Run.objects.create(tenant=tenant, uuid=run_id, last_write_at=db_now())
    except IntegrityError:
        pass  # a concurrent writer created it first; lock theirs
    run = locked.get(uuid=run_id)
    run.tenant = tenant
    return run


def _reopen(run: Run) -> bool:
    """Clear a reviewer's ``closed`` mark: any new write by the runtime reopens the run
    (DESIGN.md 4). Returns whether it was closed. Caller holds the run's lock."""
    if run.closed_at is None:
        return False
    (Run.objects.for_tenant(run.tenant_id)
     .filter(pk=run.pk).update(closed_at=None, closed_by=None, closed_reason=""))
    run.closed_at, run.closed_by, run.closed_reason = None, None, ""
    return True


def _drop_if_empty(run: Run) -> None:
    """Delete a run that owns nothing (made by a writer that then lost a create race)."""
    if not (Checkpoint.objects.for_tenant(run.tenant_id).filter(run=run).exists()
            or Effect.objects.for_tenant(run.tenant_id).filter(run=run).exists()
            or Conflict.objects.for_tenant(run.tenant_id).filter(run=run).exists()
            or RetryRequest.objects.for_tenant(run.tenant_id).filter(run=run).exists()):
        Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).delete()


def _check_fence(run: Run, token: int | None, now: datetime) -> None:
    """CONTRACT.md 3: while the run holds a live lease a write must carry its current token;
    a token other than the current one is refused whether or not the lease is live. Once
    ownership has begun (token > 0: a lease was taken or a retry consumed) a write with no
    token is refused too, so a zombie cannot slip past fencing by leaving the header out."""
    lease_live = bool(run.lease_owner) and run.lease_expires_at is not None and (
        run.lease_expires_at > now
    )
    if (token is not None and token != run.fencing_token) or (
        token is None and (lease_live or run.fencing_token > 0)
    ):
        raise Fenced(run.fencing_token, run_pk=run.pk)


def _record_fenced(exc: Fenced, *, tenant, actor, target_type: str, target_id, expected,
                   attempted: int, token: int | None, refused: str) -> None:
    """Keep a fenced write as a conflict of the leased run, in its own transaction (the
    write's transaction has rolled back), so a zombie owner shows in the inbox."""
    with transaction.atomic():
        run = (Run.objects.for_tenant(tenant).select_for_update().annotate(db_now=NOW)
               .select_related("tenant").filter(pk=exc.run_pk).first())
        if run is None:  # the run was new in the rolled-back write: nothing to attach to
            return
        model = Checkpoint if target_type == TargetType.CHECKPOINT else Effect
        actual = (model.objects.for_tenant(tenant).filter(uuid=target_id)
                  .values_list("revision", flat=True).first())
        _record_conflict(tenant=tenant, run=run, actor=actor, target_type=target_type,
                         target_id=target_id, expected=expected, actual=actual,
                         attempted=attempted, refused=refused, reason=ConflictReason.FENCED,
                         token_sent=token)


def _now_for(run: Run) -> datetime:
    """The database time read with the run's row (``_lock_run``), else a fresh one."""
    return getattr(run, "db_now", None) or db_now()


def run_facts(run: Run, now: datetime | None = None) -> policy.RunFacts:
    """Read the facts the policy needs for ``run`` (call under the run's lock to act on
    them). ``now`` defaults to the database time read with the run (``dbclock``)."""
    now = now or _now_for(run)
    counts = dict(
        Effect.objects.for_tenant(run.tenant_id).filter(run=run)
        .exclude(state__in=EffectState.NEEDS_RETRY, retry_authorized_by__isnull=False)
        .values_list("state").annotate(n=Count("pk")).values_list("state", "n")
    )
    labels: dict[str, list[str]] = {}
    if any(counts.get(state) for state in EffectState.DOUBTFUL):
        for state, service, key in (
            Effect.objects.for_tenant(run.tenant_id).filter(run=run, state__in=EffectState.DOUBTFUL,
                                  retry_authorized_by__isnull=True)
            .order_by("created_at", "id").values_list("state", "service", "operation_key")[:20]
        ):
            group = labels.setdefault(state, [])
            if len(group) < 3:
                group.append(f"{service} {key if len(key) <= 80 else key[:79] + '…'}")
    open_retry = (RetryRequest.objects.for_tenant(run.tenant_id)
                  .filter(run=run, state__in=RetryState.OPEN)
                  .values_list("state", flat=True).first())
    schema_error = ""
    if run.phase_class == PhaseClass.UNSUPPORTED:
        schema_error = run.phase_label
    return policy.RunFacts(
        now=now,
        phase_class=run.phase_class,
        schema_error=schema_error,
        last_write_at=run.last_write_at,
        lease_owner=run.lease_owner,
        lease_expires_at=run.lease_expires_at,
        ambiguity_threshold_s=run.tenant.ambiguity_threshold_s,
        effect_states=counts,
        open_retry_state=open_retry or "",
        unacknowledged_conflicts=run.unacknowledged_conflicts,
        identity={"agent": run.agent, "model": run.model, "workflow": run.workflow,
                  "definition_version": run.definition_version},
        effect_labels=labels,
        closed=run.closed_at is not None,
    )


def require_owner_gone(run: Run, facts: policy.RunFacts, doing: str) -> None:
    """Refuse ``doing`` while the run's owner is live (CONTRACT.md 3 ``owner_live``): the
    sweep's rule (``RunFacts.owner_gone``) on the database clock, under the run's lock.
    Reconciling, declaring an outcome unknown or retrying over a live owner could call a
    call still on the wire "not executed", or fence a worker in the middle of it.
    Raises ``OwnerLive`` (409) with when the owner will count as gone."""
    if facts.owner_gone:
        return
    gone_at = facts.owner_gone_at
    owner = run.lease_owner or "(no lease; it wrote recently)"
    raise OwnerLive(
        f"run: its owner {owner} is live until "
        f"{gone_at.isoformat() if gone_at else 'now'}; {doing} only after it is gone",
        gone_at.isoformat() if gone_at else None)


def run_refresh_state(run: Run, now: datetime | None = None) -> str:
    """Recompute and save the run's recovery state (caller holds the run's lock); ``now``
    defaults to the database time read with the run."""
    now = now or _now_for(run)
    state, reason = policy.recovery_state(run_facts(run, now))
    fields = {"recovery_state": state, "recovery_reason": reason[:256]}
    if state != run.recovery_state:
        fields["state_changed_at"] = now
    for key, value in fields.items():
        setattr(run, key, value)
    Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(**fields)
    return state


def _record_conflict(*, tenant, run: Run, actor, target_type: str, target_id, expected,
                     actual: int | None, attempted: int | None, refused: str,
                     reason: str | None = None, token_sent: int | None = None) -> None:
    if reason is None:
        reason = ConflictReason.ID_EXISTS if expected is None else ConflictReason.STALE_REVISION
    Conflict.objects.create(
        tenant=tenant, run=run, target_type=target_type, target_uuid=target_id, reason=reason,
        expected_revision=expected, actual_revision=actual, attempted_revision=attempted,
        fencing_token_sent=token_sent,
        fencing_token_current=run.fencing_token if reason == ConflictReason.FENCED else None,
        writer=actor, writer_name=_actor_name(actor),
        refused_ciphertext=crypto.encrypt_text(refused) if refused else "",
    )
    (Run.objects.for_tenant(run.tenant_id)
     .filter(pk=run.pk).update(unacknowledged_conflicts=F("unacknowledged_conflicts") + 1))
    run.refresh_from_db(fields=["unacknowledged_conflicts"])
    run_refresh_state(run)
    audit_record(tenant=tenant, actor=actor, action=AuditAction.CONFLICT[target_type],
                 target_type=target_type, target_id=target_id, run_id=run.uuid,
                 before={"current_revision": actual},
                 after={"reason": reason, "expected_revision": expected,
                        "attempted_revision": attempted, "fencing_token": token_sent})


# --------------------------------------------------------------------------------------
# Checkpoints: compare-and-swap
# --------------------------------------------------------------------------------------

def checkpoint_put(
    *,
    actor,
    tenant: Tenant,
    envelope: Envelope,
    expected_revision: int | None,
    fencing_token: int | None = None,
) -> tuple[Checkpoint, bool]:
    """Compare-and-swap one checkpoint (CONTRACT.md 3, RUNIFOLD.md 1).

    ``expected_revision=None`` creates (the envelope's revision must be 0); an integer N
    updates from N to N+1. Returns ``(checkpoint, created)``.

    Raises ``InvalidPayload`` (400: revision not 0 / N+1, run_id or kind changed),
    ``NotFound`` (404: update of a missing checkpoint), ``Fenced`` (409),
    ``StaleRevision`` (412, after committing the conflict record).
    """
    require(actor, tenant, roles.WRITE)
    if expected_revision is None and envelope.revision != 0:
        raise InvalidPayload("revision: must be 0 when creating (If-None-Match: *)")
    if expected_revision is not None and (
        expected_revision >= MAX_REVISION or envelope.revision != expected_revision + 1
    ):
        raise InvalidPayload(f"revision: must be {expected_revision + 1} (If-Match + 1)")
    cls = kinds.classify(envelope.kind, envelope.schema_version, envelope.payload)
    phase_label = (cls.error if not cls.supported else cls.phase.label)[:256]
    ciphertext = crypto.encrypt_text(envelope.payload_json)
    size = len(envelope.payload_json.encode("utf-8"))

    try:
        checkpoint = _checkpoint_cas(actor, tenant, envelope, expected_revision, fencing_token,
                                     cls, phase_label, ciphertext, size)
    except Fenced as exc:
        _record_fenced(exc, tenant=tenant, actor=actor, target_type=TargetType.CHECKPOINT,
                       target_id=envelope.checkpoint_id, expected=expected_revision,
                       attempted=envelope.revision, token=fencing_token,
                       refused=dumps(_envelope_json(envelope)))
        raise
    if isinstance(checkpoint, StaleRevision):
        raise checkpoint
    return checkpoint, expected_revision is None


def _checkpoint_cas(actor, tenant, envelope, expected_revision, fencing_token, cls,
                    phase_label, ciphertext, size):
    """The transaction of ``checkpoint_put``; returns the checkpoint, or the
    ``StaleRevision`` to raise once the conflict record has committed."""
    conflict_at: int | None = None
    with transaction.atomic():
        existing = (Checkpoint.objects.for_tenant(tenant).filter(uuid=envelope.checkpoint_id)
                    .values("run_id", "run__uuid", "kind").first())
        if expected_revision is not None and existing is None:
            raise NotFound("no such checkpoint")
        if existing is not None and expected_revision is not None:
            if existing["run__uuid"] != envelope.run_id:
                raise InvalidPayload("run_id: a checkpoint's run_id never changes")
            if existing["kind"] != envelope.kind:
                raise InvalidPayload("kind: a checkpoint's kind never changes")
        # A create that finds the id taken is a conflict of the run that owns the id.
        run_id = existing["run__uuid"] if existing is not None else envelope.run_id
        run = _lock_run(tenant, run_id, create=existing is None)
        now = run.db_now
        _check_fence(run, fencing_token, now)
        fields = dict(
            kind=envelope.kind, schema_version=envelope.schema_version,
            payload_ciphertext=ciphertext, payload_size=size, phase_class=cls.phase.phase_class,
            phase_label=phase_label, updated_at_ms=envelope.updated_at_ms, received_at=now,
            written_by=actor,
        )
        if expected_revision is None:
            if existing is not None:
                conflict_at = Checkpoint.objects.for_tenant(tenant).get(
                    uuid=envelope.checkpoint_id).revision
            else:
                try:
                    with transaction.atomic():
                        checkpoint = Checkpoint.objects.create(
                            tenant=tenant, run=run, uuid=envelope.checkpoint_id,
                            revision=0, **fields)
                except IntegrityError:
                    # Lost a create race: the conflict belongs to the winner's run, and the
                    # run this call just made for itself is dropped if nothing else uses it.
                    winner = Checkpoint.objects.for_tenant(tenant).select_related("run").get(
                        uuid=envelope.checkpoint_id)
                    conflict_at = winner.revision
                    if winner.run_id != run.pk:
                        _drop_if_empty(run)
                        run = _lock_run(tenant, winner.run.uuid, create=False)
                        # Judged like a create that finds the id taken: by the owning run.
                        _check_fence(run, fencing_token, run.db_now)
        else:
            # The compare-and-swap: one conditional UPDATE; 0 rows means a stale revision.
            updated = Checkpoint.objects.for_tenant(tenant).filter(
                uuid=envelope.checkpoint_id, revision=expected_revision
            ).update(revision=envelope.revision, **fields)
            if updated != 1:
                conflict_at = Checkpoint.objects.for_tenant(tenant).get(
                    uuid=envelope.checkpoint_id).revision
            else:
                checkpoint = Checkpoint.objects.for_tenant(tenant).get(
                    uuid=envelope.checkpoint_id)

        if conflict_at is not None:
            _record_conflict(
                tenant=tenant, run=run, actor=actor, target_type=TargetType.CHECKPOINT,
                target_id=envelope.checkpoint_id, expected=expected_revision, actual=conflict_at,
                attempted=envelope.revision, refused=dumps(_envelope_json(envelope)),
            )
        else:
            CheckpointRevision.objects.create(
                tenant=tenant, checkpoint=checkpoint, revision=envelope.revision, **fields)
            ident = cls.identity
            run_fields = dict(
                latest_checkpoint=checkpoint, kind=envelope.kind,
                schema_version=envelope.schema_version, phase_class=cls.phase.phase_class,
                phase_label=phase_label, last_write_at=now,
            )
            if cls.supported:
                run_fields.update(agent=ident.agent, model=ident.model, workflow=ident.workflow,
                                  definition_version=ident.definition_version)
            for key, value in run_fields.items():
                setattr(run, key, value)
            run.save(update_fields=[*run_fields, "updated_at"])
            reopened = _reopen(run)
            run_refresh_state(run, now)
            after = {"revision": envelope.revision, "phase": phase_label,
                     "phase_class": cls.phase.phase_class}
            if reopened:
                after["reopened"] = True
            audit_record(
                tenant=tenant, actor=actor, action=AuditAction.CHECKPOINT_WRITE, target_type=TargetType.CHECKPOINT,
                target_id=envelope.checkpoint_id, run_id=run.uuid,
                before=None if expected_revision is None else {"revision": expected_revision},
                after=after,
            )
    if conflict_at is not None:
        return StaleRevision(conflict_at)
    return checkpoint


def _envelope_json(env: Envelope) -> dict:
    return {"id": str(env.checkpoint_id), "run_id": str(env.run_id), "revision": env.revision,
            "kind": env.kind, "schema_version": env.schema_version, "payload": env.payload,
            "updated_at_ms": env.updated_at_ms}


def checkpoint_envelope(checkpoint: Checkpoint | CheckpointRevision, *, run_id=None,
                        checkpoint_id=None) -> dict:
    """The runifold-core JSON envelope of a checkpoint or one of its revisions (decrypts)."""
    if isinstance(checkpoint, Checkpoint):
        run_id = run_id or checkpoint.run.uuid
        checkpoint_id = checkpoint.uuid
    return {
        "id": str(checkpoint_id),
        "run_id": str(run_id),
        "revision": checkpoint.revision,
        "kind": checkpoint.kind,
        "schema_version": checkpoint.schema_version,
        "payload": loads_any(crypto.decrypt_text(checkpoint.payload_ciphertext)),
        "updated_at_ms": checkpoint.updated_at_ms,
    }


def _require_own(tenant: Tenant, checkpoint: Checkpoint) -> None:
    """``NotFound`` unless ``checkpoint`` is ``tenant``'s: a checkpoint object handed in
    by the caller is checked like an id in a URL, so a caller that looked it up in the
    wrong tenant cannot have the twin's payload revealed and audited here (CONTRACT.md 3:
    an object of another tenant is answered as if it did not exist)."""
    if checkpoint.tenant_id != tenant.pk:
        raise NotFound("no such checkpoint")


def payload_reveal(*, actor, tenant: Tenant, checkpoint: Checkpoint, revision: int | None = None,
                   reason: str = "", action: str = AuditAction.PAYLOAD_REVEAL) -> dict:
    """Decrypt one revision's envelope for ``actor``; audited in the same transaction.

    Needs ``reveal_payload`` (reviewer, approver, admin) or, for the runtime's own
    ``GET`` of a checkpoint, ``write_runs`` (``action=AuditAction.PAYLOAD_READ``).
    Raises ``Forbidden``/``NotFound`` as ``permissions.require``; ``NotFound`` for a
    revision that does not exist, or a checkpoint that is not ``tenant``'s.
    """
    require(actor, tenant, roles.WRITE if action == AuditAction.PAYLOAD_READ else roles.REVEAL)
    _require_own(tenant, checkpoint)
    with transaction.atomic():
        if revision is None or revision == checkpoint.revision:
            source = Checkpoint.objects.for_tenant(tenant).select_related("run").get(
                pk=checkpoint.pk)
            envelope = checkpoint_envelope(source)
        else:
            rev = (CheckpointRevision.objects.for_tenant(checkpoint.tenant_id)
                   .filter(checkpoint=checkpoint, revision=revision).first())
            if rev is None:
                raise NotFound(f"revision {revision} does not exist")
            envelope = checkpoint_envelope(rev, run_id=checkpoint.run.uuid,
                                           checkpoint_id=checkpoint.uuid)
        audit_record(tenant=tenant, actor=actor, action=action, target_type=TargetType.CHECKPOINT,
                     target_id=checkpoint.uuid, run_id=checkpoint.run.uuid,
                     reason=reason, after={"revision": envelope["revision"]})
    return envelope


def revisions_export(*, actor, tenant: Tenant, checkpoint: Checkpoint, after: int | None = None,
                     limit: int = 20, max_bytes: int | None = None) -> tuple[list[dict], bool]:
    """One page of a checkpoint's accepted revisions, oldest first, decrypted; one audit
    event per page (CONTRACT.md 3 "every accepted revision, oldest first", paged by issue 6
    fault 6 so that one answer stays bounded).

    The page holds the revisions after ``after`` (``None``: from the first), at most
    ``limit`` of them and no more payload bytes than ``max_bytes`` (default four times
    ``RECOVERY_MAX_BODY_BYTES``; always at least one revision). Returns
    ``(envelopes, more)``; ``more`` says whether revisions follow the page. Raises
    ``Forbidden`` for a role that may not read payloads (viewer), ``NotFound`` for a
    checkpoint that is not ``tenant``'s, and what ``permissions.require`` raises.
    """
    require(actor, tenant, roles.VIEW)
    perms = tenant_perms(actor, tenant)
    if not perms & {roles.WRITE, roles.REVEAL}:
        raise Forbidden("your role may not read payloads")
    _require_own(tenant, checkpoint)
    if max_bytes is None:
        max_bytes = 4 * settings.RECOVERY_MAX_BODY_BYTES
    revs = (CheckpointRevision.objects.for_tenant(checkpoint.tenant_id)
            .filter(checkpoint=checkpoint).order_by("revision"))
    if after is not None:
        revs = revs.filter(revision__gt=after)
    # Choose the page from the sizes first, so no ciphertext beyond it is read.
    sizes = list(revs.values_list("revision", "payload_size")[: max(1, limit) + 1])
    page, total = [], 0
    for revision, size in sizes[:limit]:
        if page and total + size > max_bytes:
            break
        page.append(revision)
        total += size
    more = len(sizes) > len(page)
    with transaction.atomic():
        rows = list(revs.filter(revision__in=page)) if page else []
        out = [checkpoint_envelope(r, run_id=checkpoint.run.uuid,
                                   checkpoint_id=checkpoint.uuid) for r in rows]
        audit_record(tenant=tenant, actor=actor, action=AuditAction.PAYLOAD_EXPORT,
                     target_type=TargetType.CHECKPOINT, target_id=checkpoint.uuid,
                     run_id=checkpoint.run.uuid,
                     after={"revisions": len(out),
                            "from": page[0] if page else None,
                            "to": page[-1] if page else None})
    return out, more


def receipt_reveal(*, actor, tenant: Tenant, effect_id, reason: str) -> dict:
    """Decrypt an effect's current receipt for a role that may reveal payloads
    (reviewer, approver, admin), with one ``receipt.reveal`` audit event carrying the
    reason, in the same transaction (CONTRACT.md 4: receipts are treated like payloads;
    issue 6, fault 3). Runtimes read receipts in the effect answers instead
    (``permissions.receipts_in_answers``).

    Returns ``{"id": effect UUID str, "run_id": str, "revision": int, "receipt": dict or
    None}``; ``None`` (and nothing audited: nothing was revealed) when the effect has no
    receipt. Raises ``NotFound`` (no role in the tenant, or no such effect, also a
    malformed id), ``Forbidden`` (the role may not reveal), ``ReasonRequired`` /
    ``InvalidPayload`` for a missing or bad reason.
    """
    require(actor, tenant, roles.REVEAL)
    reason = _require_reason(reason)
    try:
        eid = uuid.UUID(str(effect_id))
    except ValueError:
        raise NotFound("no such effect") from None
    with transaction.atomic():
        effect = (Effect.objects.for_tenant(tenant).filter(uuid=eid)
                  .select_related("run").first())
        if effect is None:
            raise NotFound("no such effect")
        answer = {"id": str(effect.uuid), "run_id": str(effect.run.uuid),
                  "revision": effect.revision, "receipt": effect.receipt}
        if effect.has_receipt:
            audit_record(tenant=tenant, actor=actor, action=AuditAction.RECEIPT_REVEAL,
                         target_type=TargetType.EFFECT, target_id=effect.uuid,
                         run_id=effect.run.uuid, reason=reason,
                         after={"revision": effect.revision})
    return answer


# --------------------------------------------------------------------------------------
# Effects: write-ahead side-effect records
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EffectBody:
    effect_id: uuid.UUID
    run_id: uuid.UUID
    revision: int
    operation_key: str
    service: str
    effect_class: str
    request_fingerprint: str
    state: str
    receipt: Any
    request_json: str = ""  # canonical JSON of the optional ``request`` (fingerprint checked)


def parse_effect(body: dict, *, url_id: uuid.UUID) -> EffectBody:
    """Validate an effect body (CONTRACT.md 3 "Effects"); raises ``InvalidPayload``."""
    eid = _uuid_field(body, "id")
    if eid != url_id:
        raise InvalidPayload("id: differs from the id in the URL")
    run_id = _uuid_field(body, "run_id")
    revision = _int_field(body, "revision", MAX_REVISION)
    operation_key = _str_field(body, "operation_key", 512)
    service = _str_field(body, "service", 200)
    effect_class = body.get("effect_class")
    if effect_class not in EffectClass.values:
        raise InvalidPayload("effect_class: must be read_only, idempotent or non_idempotent")
    fp = body.get("request_fingerprint")
    if not isinstance(fp, str) or not HEX64_RE.match(fp):
        raise InvalidPayload("request_fingerprint: must be 64 hex digits (SHA-256)")
    state = body.get("state")
    if state not in EffectState.values:
        raise InvalidPayload(f"state: must be one of {', '.join(EffectState.values)}")
    receipt = body.get("receipt")
    if receipt is not None and not isinstance(receipt, dict):
        raise InvalidPayload("receipt: must be an object or null")
    request_json = ""
    if body.get("request") is not None:
        # Optional: the canonical request itself, so that the replay reconciler can send it
        # again with the same key. It must be the request the fingerprint names.
        if not isinstance(body["request"], dict):
            raise InvalidPayload("request: must be an object or null")
        request_json = dumps(body["request"])
        if hashlib.sha256(request_json.encode("utf-8")).hexdigest() != fp.lower():
            raise InvalidPayload("request: its SHA-256 (canonical JSON: sorted keys, no "
                                 "spaces, UTF-8) is not request_fingerprint")
    unknown = set(body) - {"id", "run_id", "revision", "operation_key", "service",
                           "effect_class", "request_fingerprint", "state", "receipt", "request"}
    if unknown:
        raise InvalidPayload(f"{sorted(unknown)[0]}: unknown field")
    return EffectBody(eid, run_id, revision, operation_key, service, effect_class, fp.lower(),
                      state, receipt, request_json)


def _effect_history(effect: Effect, *, actor, source: str) -> None:
    EffectRevision.objects.create(
        tenant_id=effect.tenant_id, effect=effect, revision=effect.revision, state=effect.state,
        receipt_ciphertext=effect.receipt_ciphertext, attempt=effect.attempt,
        actor_name=_actor_name(actor), source=source,
    )


def effect_put(
    *,
    actor,
    tenant: Tenant,
    body: EffectBody,
    expected_revision: int | None,
    fencing_token: int | None = None,
) -> tuple[Effect, bool]:
    """Compare-and-swap one effect record, walking the effect state machine.

    Create (``expected_revision=None``): revision 0, state ``planned``; a used
    (service, operation_key) answers ``OperationExists`` (409, same fingerprint) or
    ``IdempotencyKeyReuse`` (422). Update: revision N+1, identity fields unchanged, a move
    the runtime may make (``policy.EFFECT_TRANSITIONS``), ``confirmed`` with a receipt;
    ``unknown``/``not_executed`` -> ``planned`` only after an approved retry was consumed
    (attempt + 1). Raises ``InvalidPayload``, ``InvalidTransition`` (422), ``NotFound``,
    ``Fenced``, ``StaleRevision`` (412, conflict kept).
    """
    require(actor, tenant, roles.WRITE)
    if expected_revision is None and body.revision != 0:
        raise InvalidPayload("revision: must be 0 when creating (If-None-Match: *)")
    if expected_revision is not None and (
        expected_revision >= MAX_REVISION or body.revision != expected_revision + 1
    ):
        raise InvalidPayload(f"revision: must be {expected_revision + 1} (If-Match + 1)")
    if body.state == EffectState.CONFIRMED and body.receipt is None:
        raise InvalidPayload("receipt: required when state is confirmed")
    refused = dumps({"id": str(body.effect_id), "revision": body.revision, "state": body.state,
                     "operation_key": body.operation_key, "service": body.service})
    try:
        effect = _effect_cas(actor, tenant, body, expected_revision, fencing_token, refused)
    except Fenced as exc:
        _record_fenced(exc, tenant=tenant, actor=actor, target_type=TargetType.EFFECT,
                       target_id=body.effect_id, expected=expected_revision,
                       attempted=body.revision, token=fencing_token, refused=refused)
        raise
    if isinstance(effect, StaleRevision):
        raise effect
    return effect, expected_revision is None


def _effect_cas(actor, tenant, body, expected_revision, fencing_token, refused):
    """The transaction of ``effect_put``; returns the effect, or the ``StaleRevision`` to
    raise once the conflict record has committed."""
    conflict_at: int | None = None
    with transaction.atomic():
        existing = Effect.objects.for_tenant(tenant).filter(uuid=body.effect_id).select_related(
            "run").first()
        if expected_revision is not None and existing is None:
            raise NotFound("no such effect")
        if existing is None:
            if body.state != EffectState.PLANNED:
                raise InvalidTransition("state: a new effect starts as planned")
            _check_operation_key(tenant, body)
            run = _lock_run(tenant, body.run_id, create=True)
            now = run.db_now
            _check_fence(run, fencing_token, now)
            try:
                with transaction.atomic():
                    effect = Effect.objects.create(
                        tenant=tenant, run=run, uuid=body.effect_id, revision=0,
                        operation_key=body.operation_key, service=body.service,
                        effect_class=body.effect_class,
                        request_fingerprint=body.request_fingerprint, state=EffectState.PLANNED,
                        receipt=body.receipt, state_changed_at=now,
                        request_ciphertext=(crypto.encrypt_text(body.request_json)
                                            if body.request_json else ""),
                    )
            except IntegrityError:
                # Lost a race: either the effect id or the operation key is now taken.
                other = (Effect.objects.for_tenant(tenant).filter(uuid=body.effect_id)
                         .select_related("run").first())
                if other is None:
                    _check_operation_key(tenant, body)
                    raise
                conflict_at = other.revision
                if other.run_id != run.pk:
                    # As for checkpoints: the conflict belongs to the winner's run (the run
                    # that owns the id), and the run this call just made for itself is
                    # dropped if nothing else uses it; the winner's run fences the writer.
                    _drop_if_empty(run)
                    run = _lock_run(tenant, other.run.uuid, create=False)
                    _check_fence(run, fencing_token, run.db_now)
        elif expected_revision is None:
            # A create that finds the id taken is a conflict of the run that owns the id.
            run = _lock_run(tenant, existing.run.uuid, create=False)
            _check_fence(run, fencing_token, run.db_now)
            conflict_at = existing.revision
        else:
            for key in ("operation_key", "service", "effect_class", "request_fingerprint"):
                if getattr(existing, key) != getattr(body, key):
                    raise InvalidPayload(f"{key}: never changes across revisions")
            if existing.run.uuid != body.run_id:
                raise InvalidPayload("run_id: never changes across revisions")
            run = _lock_run(tenant, body.run_id, create=False)
            now = run.db_now
            _check_fence(run, fencing_token, now)
            existing.refresh_from_db()
            if existing.revision != expected_revision:
                conflict_at = existing.revision
            else:
                effect = _effect_transition(
                    existing, expected_revision=expected_revision, to_state=body.state,
                    receipt=body.receipt, by=EffectSource.RUNTIME, actor=actor, now=now)
                if effect is None:
                    conflict_at = Effect.objects.for_tenant(tenant).get(pk=existing.pk).revision
        if conflict_at is not None:
            _record_conflict(tenant=tenant, run=run, actor=actor, target_type=TargetType.EFFECT,
                             target_id=body.effect_id, expected=expected_revision,
                             actual=conflict_at, attempted=body.revision, refused=refused)
        else:
            if expected_revision is None:
                _effect_history(effect, actor=actor, source=EffectSource.RUNTIME)
            Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(last_write_at=now)
            run.last_write_at = now
            reopened = _reopen(run)
            run_refresh_state(run, now)
            after = {"revision": effect.revision, "state": effect.state,
                     "operation_key": effect.operation_key, "service": effect.service}
            if reopened:
                after["reopened"] = True
            audit_record(
                tenant=tenant, actor=actor, action=AuditAction.EFFECT_WRITE, target_type=TargetType.EFFECT,
                target_id=body.effect_id, run_id=run.uuid,
                before=None if expected_revision is None else {"revision": expected_revision},
                after=after,
            )
    if conflict_at is not None:
        return StaleRevision(conflict_at)
    return effect


def _check_operation_key(tenant: Tenant, body: EffectBody) -> None:
    other = Effect.objects.for_tenant(tenant).filter(service=body.service,
                                  operation_key=body.operation_key).first()
    if other is None or other.uuid == body.effect_id:
        return
    if other.request_fingerprint == body.request_fingerprint:
        raise OperationExists(str(other.uuid))
    raise IdempotencyKeyReuse(
        "operation_key: already used in this service with another request_fingerprint")


def _effect_transition(effect: Effect, *, expected_revision: int, to_state: str, receipt: Any,
                       by: str, actor, now: datetime) -> Effect | None:
    """Move ``effect`` one state by compare-and-swap; ``None`` if its revision moved on.

    Raises ``InvalidTransition`` for a move ``by`` may not make, ``InvalidPayload`` for
    ``confirmed`` without a receipt.
    """
    from_state = effect.state
    attempt = effect.attempt
    retry_clear = False
    if from_state in EffectState.NEEDS_RETRY and to_state == EffectState.PLANNED:
        if effect.retry_authorized_by_id is None:
            raise InvalidTransition(
                f"state: {from_state} -> planned needs an approved, consumed retry")
        by, attempt, retry_clear = EffectSource.RETRY, attempt + 1, True
    if not policy.transition_allowed(from_state, to_state, by):
        raise InvalidTransition(f"state: {from_state} -> {to_state} is not allowed ({by})")
    if to_state == EffectState.CONFIRMED and receipt is None:
        raise InvalidPayload("receipt: required when state is confirmed")
    fields = dict(revision=expected_revision + 1, state=to_state,
                  receipt_ciphertext=encrypt_receipt(receipt), attempt=attempt,
                  state_changed_at=now, updated_at=now)
    if to_state == EffectState.SUBMITTED:
        fields["submitted_at"] = now
    if retry_clear:
        fields["retry_authorized_by"] = None
    updated = (Effect.objects.for_tenant(effect.tenant_id)
               .filter(pk=effect.pk, revision=expected_revision).update(**fields))
    if updated != 1:
        return None
    for key, value in fields.items():
        setattr(effect, key, value)
    # The consumed retry re-plans on the runtime's resume: its history says runtime.
    source = EffectSource.RUNTIME if by == EffectSource.RETRY else by
    _effect_history(effect, actor=actor, source=source)
    return effect


# --------------------------------------------------------------------------------------
# Leases and resume decisions
# --------------------------------------------------------------------------------------

def lease_acquire(*, actor, tenant: Tenant, run_id: uuid.UUID, owner: str, ttl_s: int) -> Run:
    """Take or renew the run's lease (CONTRACT.md 3).

    A new owner (none before, or the previous lease expired) bumps the fencing token; the
    same owner renewing keeps it. Raises ``NotFound`` for an unknown run, ``LeaseHeld``
    (409) while another owner's lease is live, ``InvalidPayload`` for a bad owner or ttl.
    """
    require(actor, tenant, roles.WRITE)
    if not isinstance(owner, str) or not owner or len(owner) > 256:
        raise InvalidPayload("owner: must be a non-empty string of at most 256 characters")
    if type(ttl_s) is not int or not 1 <= ttl_s <= 86400:
        raise InvalidPayload("ttl_s: must be an integer in 1..86400")
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("no such run")
        now = run.db_now
        live = bool(run.lease_owner) and run.lease_expires_at and run.lease_expires_at > now
        if live and run.lease_owner != owner:
            raise LeaseHeld(f"owner: the run is leased by another owner until "
                            f"{run.lease_expires_at.isoformat()}")
        before = {"owner": run.lease_owner, "fencing_token": run.fencing_token}
        if not (live and run.lease_owner == owner):
            run.fencing_token += 1
        run.lease_owner = owner
        run.lease_expires_at = now + timedelta(seconds=ttl_s)
        run.last_write_at = now
        run.save(update_fields=["fencing_token", "lease_owner", "lease_expires_at",
                                "last_write_at", "updated_at"])
        reopened = _reopen(run)
        run_refresh_state(run, now)
        after = {"owner": owner, "fencing_token": run.fencing_token,
                 "expires_at": run.lease_expires_at.isoformat()}
        if reopened:
            after["reopened"] = True
        audit_record(tenant=tenant, actor=actor, action=AuditAction.LEASE_ACQUIRE, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid, before=before, after=after)
    return run


def _resume_answer(run: Run, decision: policy.Decision) -> dict:
    checkpoint = run.latest_checkpoint
    return {
        "action": decision.action,
        "reason": decision.reason,
        "checkpoint_id": str(checkpoint.uuid) if checkpoint else None,
        "revision": checkpoint.revision if checkpoint else None,
        "fencing_token": run.fencing_token,
    }


def resume_preview(*, actor, tenant: Tenant, run_id: uuid.UUID, asked: dict[str, str]) -> dict:
    """What a restarting runtime would be told (CONTRACT.md 3, ``GET …/resume``): a
    preview that changes nothing: it consumes no approval, bumps no token, takes no lock
    and writes no audit event. An approved retry shows as ``retry``/``retry_approved``;
    only ``resume_claim`` consumes it.

    Returns ``{action, reason, checkpoint_id, revision, fencing_token}`` (the run's
    current token). Raises ``NotFound`` for an unknown run, ``Forbidden`` without
    ``write_runs``.
    """
    require(actor, tenant, roles.WRITE)
    run = (Run.objects.for_tenant(tenant).annotate(db_now=NOW)
           .select_related("latest_checkpoint").filter(uuid=run_id).first())
    if run is None:
        raise NotFound("no such run")
    run.tenant = tenant
    return _resume_answer(run, policy.resume_decision(run_facts(run), asked))


def resume_claim(*, actor, tenant: Tenant, run_id: uuid.UUID, asked: dict[str, str]) -> dict:
    """The resume decision, claimed (CONTRACT.md 3, ``POST …/resume``, writer only).

    When the answer is ``retry`` the approved retry is consumed in the same transaction:
    the request becomes ``consumed``, the fencing token is bumped and the lease dropped
    (so the old owner is fenced), the run is reopened if a reviewer had closed it, its
    ``unknown``/``not_executed`` effects are authorised to go back to ``planned``, and one
    audit event is written. Any other answer changes nothing. Returns ``{action, reason,
    checkpoint_id, revision, fencing_token}``. Raises ``NotFound`` for an unknown run.
    """
    require(actor, tenant, roles.WRITE)
    with transaction.atomic():
        run = _lock_run(tenant, run_id, create=False)
        if run is None:
            raise NotFound("no such run")
        now = run.db_now
        decision = policy.resume_decision(run_facts(run, now), asked)
        if decision.consume_retry:
            retry = RetryRequest.objects.for_tenant(run.tenant_id).select_for_update().get(run=run,
                                                                 state=RetryState.APPROVED)
            run.fencing_token += 1
            run.lease_owner = ""
            run.lease_expires_at = None
            # The retrying runtime gets a fresh ambiguity window to lease and write in,
            # so the sweep does not call the run abandoned the moment it is handed over.
            run.last_write_at = now
            run.save(update_fields=["fencing_token", "lease_owner", "lease_expires_at",
                                    "last_write_at", "updated_at"])
            RetryRequest.objects.for_tenant(retry.tenant_id).filter(pk=retry.pk).update(
                state=RetryState.CONSUMED, consumed_at=now, consumed_fencing_token=run.fencing_token)
            # Only what the approver accepted: the effects its preview showed as sent again.
            # One that became unknown/not_executed after the approval (a zombie owner sent
            # it meanwhile) waits for a new retry whose preview names it: no duplicate that
            # nobody accepted. (An approval recorded without a preview authorises all.)
            again = (Effect.objects.for_tenant(run.tenant_id)
                     .filter(run=run, state__in=EffectState.NEEDS_RETRY))
            if retry.approved_preview is not None:
                again = again.filter(uuid__in=[
                    row["effect_id"] for row in retry.approved_preview
                    if row.get("outcome") in RetryOutcome.SENT_AGAIN])
            again.update(retry_authorized_by=retry)
            run_refresh_state(run, now)
            audit_record(tenant=tenant, actor=actor, action=AuditAction.RETRY_CONSUME,
                         target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                         before={"state": RetryState.APPROVED},
                         after={"state": RetryState.CONSUMED, "fencing_token": run.fencing_token})
        return _resume_answer(run, decision)


# --------------------------------------------------------------------------------------
# Review actions (CONTRACT.md 3 "Review actions"; the dashboard's buttons call these too)
# --------------------------------------------------------------------------------------

def _get_run(tenant: Tenant, run_id) -> Run:
    run = _lock_run(tenant, run_id, create=False)
    if run is None:
        raise NotFound("no such run")
    return run




def retry_request(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str) -> RetryRequest:
    """A reviewer asks for a retry of an in-doubt run; a different approver must decide.

    Raises ``InvalidTransition`` (422) unless the run is ``ambiguous`` or
    ``unknown_outcome`` with no effect ``submitted``/``unresolved`` and no open request;
    ``ReasonRequired`` (400), ``NotFound``/``Forbidden``.
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        # Judge the run as it is now (database clock), not as the last sweep left it: an
        # owner that went quiet since is gone, whether or not a sweeper ran.
        run_refresh_state(run)
        if (RetryRequest.objects.for_tenant(run.tenant_id)
            .filter(run=run, state__in=RetryState.OPEN).exists()):
            raise InvalidTransition("run: a retry request is already open")
        # A retry fences the current owner, so it is offered only for runs a human must
        # decide; and never over an effect still in doubt, which reconciliation (or
        # "mark unknown") must settle first, or the approval would be spent on it.
        if run.recovery_state not in RecoveryState.RETRYABLE:
            raise InvalidTransition(
                f"run: a retry is for ambiguous or unknown-outcome runs; this run is "
                f"{run.recovery_state}")
        # A retry fences the owner: never over one that is alive (it may come back).
        require_owner_gone(run, run_facts(run), "request a retry")
        if (Effect.objects.for_tenant(run.tenant_id)
            .filter(run=run, state__in=EffectState.IN_DOUBT).exists()):
            raise InvalidTransition(
                "run: an effect is still in doubt; reconcile it or mark it unknown first")
        retry = RetryRequest.objects.create(tenant=tenant, run=run, requested_by=actor,
                                            reason=reason)
        before = run.recovery_state
        run_refresh_state(run)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RETRY_REQUEST,
                     target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                     reason=reason, before={"recovery_state": before},
                     after={"state": RetryState.REQUESTED, "recovery_state": run.recovery_state,
                            "preview": retry_preview(run)})
    return retry


def retry_preview(run: Run) -> list[dict]:
    """What an approved retry of ``run`` would do to each of its effects
    (``policy.retry_outcome``): ``[{effect_id, service, operation_key, state, outcome,
    words}]``, oldest effect first. ``possible_duplicate`` rows are what the approver
    accepts. Shown before the request and the approval, and stored in both audit events.
    """
    rows = (Effect.objects.for_tenant(run.tenant_id)
            .filter(run=run, retry_authorized_by__isnull=True)
            .order_by("created_at", "id")
            .values_list("uuid", "service", "operation_key", "state"))
    out = []
    for effect_id, service, key, state in rows:
        outcome, words = policy.retry_outcome(state)
        out.append({"effect_id": str(effect_id), "service": service, "operation_key": key,
                    "state": state, "outcome": outcome, "words": words})
    return out


def _retry_decide(*, actor, tenant: Tenant, retry_id: int, reason: str, approve: bool):
    require(actor, tenant, roles.APPROVE)
    reason = _require_reason(reason)
    with transaction.atomic():
        retry = RetryRequest.objects.for_tenant(tenant).filter(pk=retry_id).first()
        if retry is None:
            raise NotFound("no such retry request")
        run = _get_run(tenant, retry.run.uuid)
        retry = (RetryRequest.objects.for_tenant(retry.tenant_id)
                 .select_for_update().get(pk=retry.pk))
        if retry.requested_by_id == actor.pk:
            raise Forbidden("approver: the requester may not decide their own retry request")
        if retry.state != RetryState.REQUESTED:
            raise InvalidTransition(f"state: the request is already {retry.state}")
        new_state = RetryState.APPROVED if approve else RetryState.REJECTED
        retry.state = new_state
        retry.decided_by = actor
        retry.decision_reason = reason
        retry.decided_at = run.db_now
        if approve:
            retry.approved_preview = retry_preview(run)
        retry.save(update_fields=["state", "decided_by", "decision_reason", "decided_at",
                                  "approved_preview", "updated_at"])
        run_refresh_state(run)
        after = {"state": new_state, "recovery_state": run.recovery_state}
        if approve:
            after["preview"] = retry.approved_preview
        audit_record(tenant=tenant, actor=actor,
                     action=AuditAction.RETRY_APPROVE if approve else AuditAction.RETRY_REJECT,
                     target_type=TargetType.RETRY_REQUEST, target_id=retry.pk, run_id=run.uuid,
                     reason=reason, before={"state": RetryState.REQUESTED}, after=after)
    return retry


def retry_approve(*, actor, tenant: Tenant, retry_id: int, reason: str) -> RetryRequest:
    """Approve someone else's retry request (approver role; four eyes). The runtime's next
    resume call consumes it. Raises ``Forbidden`` for the requester, ``InvalidTransition``
    unless the request is ``requested``."""
    return _retry_decide(actor=actor, tenant=tenant, retry_id=retry_id, reason=reason,
                         approve=True)


def retry_reject(*, actor, tenant: Tenant, retry_id: int, reason: str) -> RetryRequest:
    """Reject someone else's retry request; same rules as ``retry_approve``."""
    return _retry_decide(actor=actor, tenant=tenant, retry_id=retry_id, reason=reason,
                         approve=False)


def effect_mark_unknown(*, actor, tenant: Tenant, effect_id: uuid.UUID, reason: str) -> Effect:
    """A reviewer declares that nobody can tell whether the effect happened.

    Allowed from ``submitted`` and ``unresolved`` only (422 otherwise), and only once the
    run's owner is gone (``OwnerLive``, 409, like reconciliation). The run becomes
    ``unknown_outcome`` until a retry is approved or the run is closed.
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        effect = Effect.objects.for_tenant(tenant).filter(uuid=effect_id).select_related(
            "run").first()
        if effect is None:
            raise NotFound("no such effect")
        run = _get_run(tenant, effect.run.uuid)
        if run.closed_at is not None:
            raise InvalidTransition("run: the run is closed; a new write reopens it")
        require_owner_gone(run, run_facts(run), "mark an outcome unknown")
        effect.refresh_from_db()
        before = {"state": effect.state, "revision": effect.revision}
        moved = _effect_transition(effect, expected_revision=effect.revision, to_state=EffectState.UNKNOWN,
                                   receipt=effect.receipt, by=EffectSource.REVIEWER, actor=actor,
                                   now=run.db_now)
        if moved is None:  # cannot happen under the run lock; kept as a guard
            raise StaleRevision(Effect.objects.for_tenant(effect.tenant_id)
                                .get(pk=effect.pk).revision)
        run_refresh_state(run)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.EFFECT_MARK_UNKNOWN,
                     target_type=TargetType.EFFECT, target_id=effect.uuid, run_id=run.uuid,
                     reason=reason, before=before,
                     after={"state": EffectState.UNKNOWN, "revision": moved.revision})
    return moved


def run_close(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str) -> Run:
    """A reviewer closes a run that was handled outside the system (DESIGN.md 4).

    The run shows as ``closed`` (its own tab) until the runtime's next write reopens it;
    an open retry request is expired and open reconcile requests are cancelled, so
    nothing acts on a closed run. Raises ``InvalidTransition`` (422) if it is already
    closed, ``ReasonRequired`` (400), ``NotFound``/``Forbidden``. Audited.
    """
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        if run.closed_at is not None:
            raise InvalidTransition("run: already closed")
        if run.recovery_state == RecoveryState.COMPLETED:
            raise InvalidTransition("run: it completed; there is nothing to close")
        now = run.db_now
        before = run.recovery_state
        expired = RetryRequest.objects.for_tenant(tenant).filter(
            run=run, state__in=RetryState.OPEN).update(
            state=RetryState.EXPIRED, decided_at=now)
        from .models import ReconcileRequest

        cancelled = ReconcileRequest.objects.for_tenant(tenant).filter(
            run=run, state__in=ReconcileState.OPEN).update(
            state=ReconcileState.CANCELLED, finished_at=now, last_error="the run was closed")
        Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(
            closed_at=now, closed_by=actor, closed_reason=reason)
        run.closed_at, run.closed_by, run.closed_reason = now, actor, reason
        run_refresh_state(run, now)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RUN_CLOSE, target_type=TargetType.RUN,
                     target_id=run.uuid, run_id=run.uuid, reason=reason,
                     before={"recovery_state": before},
                     after={"recovery_state": run.recovery_state,
                            "retry_requests_expired": expired,
                            "reconcile_requests_cancelled": cancelled})
    return run


def conflicts_acknowledge(*, actor, tenant: Tenant, run_id: uuid.UUID, reason: str) -> int:
    """Acknowledge every open conflict of the run; returns how many. Audited."""
    require(actor, tenant, roles.REVIEW)
    reason = _require_reason(reason)
    with transaction.atomic():
        run = _get_run(tenant, run_id)
        now = run.db_now
        n = Conflict.objects.for_tenant(run.tenant_id).filter(
            run=run, acknowledged_at__isnull=True).update(
            acknowledged_at=now, acknowledged_by=actor)
        Run.objects.for_tenant(run.tenant_id).filter(pk=run.pk).update(unacknowledged_conflicts=0)
        run.unacknowledged_conflicts = 0
        before = run.recovery_state
        run_refresh_state(run, now)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.CONFLICTS_ACKNOWLEDGE,
                     target_type=TargetType.RUN, target_id=run.uuid, run_id=run.uuid, reason=reason,
                     before={"recovery_state": before, "open_conflicts": n},
                     after={"recovery_state": run.recovery_state, "open_conflicts": 0})
    return n


# --------------------------------------------------------------------------------------
# System work: reconciliation results and the stale-run sweep
# --------------------------------------------------------------------------------------

def sweep_stale_runs() -> dict[str, int]:
    """Move runs whose owner went quiet into ``ambiguous`` (DESIGN.md 4), on the
    database's clock, then re-drive reconcile requests whose worker vanished or whose
    message was lost (``reconciliation.redrive``).

    Candidates: open runs with a ``submitted`` effect or an in-flight latest checkpoint
    whose lease is expired or absent. Under each run's lock the rule is judged again
    (``RunFacts.owner_gone``): ``submitted`` effects become ``unresolved`` (audited, actor
    system), then the state is recomputed. Idempotent and safe on many workers at once.
    Returns counts: ``examined``, ``effects_unresolved``, ``runs_ambiguous`` and the
    re-drive's ``reconcile_redriven``.
    """
    every_run = Run.objects.for_all_tenants(
        reason="the stale-run sweep looks at every tenant's runs; each is then locked and "
               "changed within its own tenant")
    candidates = (
        every_run.filter(Q(effects__state=EffectState.SUBMITTED)
                         | Q(phase_class=PhaseClass.IN_FLIGHT))
        .exclude(recovery_state=RecoveryState.SCHEMA_MISMATCH)
        .filter(closed_at__isnull=True)
        .filter(Q(lease_expires_at__lte=NOW) | Q(lease_owner="")
                | Q(lease_expires_at__isnull=True))
        .values_list("pk", flat=True).distinct()
    )
    stats = {"examined": 0, "effects_unresolved": 0, "runs_ambiguous": 0}
    for pk in list(candidates):
        stats["examined"] += 1
        with transaction.atomic():
            run = (every_run.select_for_update().annotate(db_now=NOW)
                   .select_related("tenant").filter(pk=pk).first())
            if run is None:
                continue
            now = run.db_now
            facts = run_facts(run, now)
            if not facts.owner_gone or facts.closed:
                continue
            for effect in Effect.objects.for_tenant(run.tenant_id).filter(
                    run=run, state=EffectState.SUBMITTED):
                moved = _effect_transition(effect, expected_revision=effect.revision,
                                           to_state=EffectState.UNRESOLVED, receipt=effect.receipt,
                                           by=EffectSource.SWEEP, actor=None, now=now)
                if moved is not None:
                    stats["effects_unresolved"] += 1
                    audit_record(tenant=run.tenant, actor=None, action=AuditAction.EFFECT_UNRESOLVED,
                                 target_type=TargetType.EFFECT, target_id=effect.uuid,
                                 run_id=run.uuid, reason="owner gone (stale-run sweep)",
                                 before={"state": EffectState.SUBMITTED},
                                 after={"state": EffectState.UNRESOLVED})
            before = run.recovery_state
            ambiguous = RecoveryState.AMBIGUOUS
            if run_refresh_state(run, now) == ambiguous and before != ambiguous:
                stats["runs_ambiguous"] += 1
                audit_record(tenant=run.tenant, actor=None, action=AuditAction.RUN_AMBIGUOUS,
                             target_type=TargetType.RUN, target_id=run.uuid, run_id=run.uuid,
                             reason=run.recovery_reason, before={"recovery_state": before},
                             after={"recovery_state": ambiguous})
    stats["reconcile_redriven"] = reconciliation.redrive()
    return stats


# --------------------------------------------------------------------------------------
# Encryption keys
# --------------------------------------------------------------------------------------

# Every encrypted column. One left out here would become unreadable once the old key is
# dropped.
_CIPHER_COLUMNS = (
    (Checkpoint, "payload_ciphertext"),
    (CheckpointRevision, "payload_ciphertext"),
    (Conflict, "refused_ciphertext"),
    (Effect, "receipt_ciphertext"),
    (Effect, "request_ciphertext"),
    (EffectRevision, "receipt_ciphertext"),
    (ReconcileAttempt, "evidence_ciphertext"),
)


_ROTATION = "key rotation re-encrypts every tenant's ciphertext columns"


def payloads_rotate_keys(*, batch_size: int = 500) -> dict[str, int]:
    """Re-encrypt every stored payload, receipt, stored request and reconcile evidence
    (``_cipher_columns``) under the newest key of
    ``RECOVERY_ENCRYPTION_KEYS``, so older keys can then be removed (DESIGN.md 5).

    Works in batches of ``batch_size`` rows, each batch one transaction; a row is rewritten
    only if its ciphertext is unchanged since it was read (compare-and-swap), so running
    beside live writers is safe and running twice is harmless. Writes one audit event per
    tenant with the counts (actor: system). Returns ``{"rows": n, "tenants": m}``.
    Raises ``cryptography.fernet.InvalidToken`` if a row fits none of the keys.
    """
    per_tenant: dict[int, int] = {}
    for model, column in _CIPHER_COLUMNS:
        last_pk = 0
        while True:
            rows = list(model.objects.for_all_tenants(reason=_ROTATION)
                        .filter(pk__gt=last_pk).exclude(**{column: ""})
                        .order_by("pk").values_list("pk", "tenant_id", column)[:batch_size])
            if not rows:
                break
            with transaction.atomic():
                for pk, tenant_id, token in rows:
                    if crypto.is_current(token):
                        continue
                    rotated = crypto.rotate_token(token)
                    if model.objects.for_tenant(tenant_id).filter(
                            pk=pk, **{column: token}).update(**{column: rotated}):
                        per_tenant[tenant_id] = per_tenant.get(tenant_id, 0) + 1
            last_pk = rows[-1][0]
    with transaction.atomic():
        for tenant in Tenant.objects.filter(pk__in=per_tenant):
            audit_record(tenant=tenant, actor=None, action=AuditAction.PAYLOAD_ROTATE_KEYS,
                         target_type=TargetType.TENANT, target_id=tenant.slug,
                         after={"rows": per_tenant[tenant.pk]})
    return {"rows": sum(per_tenant.values()), "tenants": len(per_tenant)}
