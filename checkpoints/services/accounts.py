"""Tenants, accounts, role grants, API tokens and reconciler configuration: the
operator commands of CONTRACT.md section 5 and the admin's writes.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import timedelta

from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from guardian.shortcuts import assign_perm

from .. import crypto, locks, roles
from ..audit import (
    audit_record,
    tenant_register,
)
from ..dbclock import NOW
from ..exceptions import (
    InvalidPayload,
    InvalidTransition,
)
from ..jsonparse import check_name
from ..models import (
    ApiToken,
    ReconcilerConfig,
    Tenant,
)
from ..permissions import forget_perms, require
from ..reconcile import plugin_class
from ..vocab import (
    AuditAction,
    TargetType,
)
from .common import User, _str_field

# --------------------------------------------------------------------------------------
# Tenants, accounts, roles, tokens (operator commands)
# --------------------------------------------------------------------------------------

def tenant_create(*, slug: str, name: str = "", actor=None) -> Tenant:
    """Create a tenant, its audit chain and its first data key (``crypto``).

    Raises ``InvalidPayload`` if the slug is not a slug (letters, digits, ``-``, ``_``;
    at most 64) or is taken, or the display name is longer than its column, no name
    (``jsonparse.name_problem``: it is shown on every page of the tenant) or blank
    (``jsonparse.blank``: only spaces, joiners and other characters that show nothing; a
    tenant nobody could pick out; ``""`` takes the slug).
    """
    if not isinstance(slug, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", slug):
        raise InvalidPayload("slug: letters, digits, '-' and '_' only, 1 to 64 characters")
    limit = Tenant._meta.get_field("name").max_length
    if not isinstance(name, str) or len(name) > limit:
        raise InvalidPayload(f"name: must be text of at most {limit} characters")
    check_name(name, "name", blank_words=(
        "must not be blank (leave it out to show the slug)" if name else None))
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise InvalidPayload(f"slug: tenant {slug!r} already exists")
        tenant = Tenant.objects.create(slug=slug, name=name or slug)
        tenant_register(tenant)  # the verifier must find it, always (issue 17, item 13)
        locks.lock_audit_head(tenant)  # its write gate (and old chain's end) row, made here
        crypto.data_key_create(tenant, with_tenant=True)  # its first data key (issue 20)
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
        before = locks.lock_tenant(tenant).ambiguity_threshold_s
        Tenant.objects.filter(pk=tenant.pk).update(ambiguity_threshold_s=seconds)
        tenant.ambiguity_threshold_s = seconds
        audit_record(tenant=tenant, actor=actor, action=AuditAction.TENANT_THRESHOLD, target_type=TargetType.TENANT,
                     target_id=tenant.slug, before={"ambiguity_threshold_s": before},
                     after={"ambiguity_threshold_s": seconds})
    return tenant


def token_issue(*, user, actor=None) -> str:
    """Create a bearer token for ``user``; returns the secret once (only its SHA-256 and
    its first 12 characters, the prefix, are kept). Raises ``InvalidPayload`` for a
    deactivated account (nothing written).

    Audited as ``token.issue`` (the prefix and the roles held, never the token) in every
    tenant where the account holds a role, in the same transaction (CONTRACT.md 5, issue
    17 item 13), as ``revoke_token`` and ``deactivate_account`` are: an account with no
    role yet concerns no tenant, so its token is audited nowhere, and ``list_tokens``
    shows it. ``actor`` is ``None`` for the operator's command line.
    """
    if not user.is_active:
        raise InvalidPayload(f"username: account {user.get_username()!r} is deactivated")
    raw = "rcv_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, prefix=raw[:12],
                                        key_hash=hashlib.sha256(raw.encode()).hexdigest())
        for tenant, held in account_tenants(user):
            audit_record(tenant=tenant, actor=actor, action=AuditAction.TOKEN_ISSUE,
                         target_type=TargetType.ACCOUNT, target_id=user.get_username(),
                         after={"prefix": token.prefix, "roles": held})
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
        live = ApiToken.objects.filter(user=user, revoked_at__isnull=True)
        prefixes = sorted(locks.lock_rows(live).values_list("prefix", flat=True))
        if not prefixes:
            return []
        live.update(revoked_at=NOW)
        concerned = account_tenants(user)
        locks.lock_audit_heads(t for t, _ in concerned)
        for tenant, held in concerned:
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
        locked = locks.lock_rows(User.objects.all()).get(pk=user.pk)
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
        locks.lock_audit_heads(t for t, _ in concerned)
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
        locks.lock_audit_head(tenant)
        before = (locks.lock_rows(ReconcilerConfig.objects.for_tenant(tenant))
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


