"""Access helpers: scope by tenant first (outside -> 404), then by role (lacking -> 403).

Every view, API endpoint and service asks here; django-guardian is called only here and
in ``selectors``. A tenant the account has no role in, and everything in it, is answered
exactly as if it did not exist (CONTRACT.md section 3).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from guardian.core import ObjectPermissionChecker

from . import roles
from .exceptions import Forbidden, NotFound
from .models import Tenant


def tenant_perms(user: AbstractBaseUser | AnonymousUser | None, tenant: Tenant) -> set[str]:
    """The codenames ``user`` holds on ``tenant`` through its role groups (no globals).

    Superuser status grants nothing here: rights come only from tenant roles.
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return set()
    # Cached on the user object, which lives for one request (or one command): the view
    # and the service it calls ask the same question. ``services.role_grant`` clears it.
    cache = user.__dict__.setdefault("_tenant_perms_cache", {})
    if tenant.pk not in cache:
        checker = ObjectPermissionChecker(user)
        cache[tenant.pk] = frozenset(
            p for p in checker.get_perms(tenant) if p in roles.ROLE_PERMISSIONS["admin"])
    return set(cache[tenant.pk])


def has_perm(user, tenant: Tenant, codename: str) -> bool:
    return codename in tenant_perms(user, tenant)


def access_tenant(user, slug: str, codename: str = roles.VIEW) -> Tenant:
    """The tenant ``slug`` if ``user`` has a role in it and holds ``codename``.

    Raises ``NotFound`` when the tenant does not exist or the user has no role there,
    ``Forbidden`` when a role is held but lacks ``codename``.
    """
    if len(slug) > Tenant._meta.get_field("slug").max_length:  # checked before any query
        raise NotFound("no such tenant")
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise NotFound(f"no tenant {slug!r}")
    perms = tenant_perms(user, tenant)
    if roles.VIEW not in perms:
        raise NotFound(f"no tenant {slug!r}")
    if codename not in perms:
        raise Forbidden(f"your role in {slug} does not allow this")
    return tenant


def require(user, tenant: Tenant, codename: str) -> None:
    """Raise ``NotFound`` (no role) or ``Forbidden`` (role lacks ``codename``)."""
    perms = tenant_perms(user, tenant)
    if roles.VIEW not in perms:
        raise NotFound("not found")
    if codename not in perms:
        raise Forbidden(f"your role in {tenant.slug} does not allow this")


def role_names(user, tenant: Tenant) -> list[str]:
    """Names of the roles ``user`` holds in ``tenant``, from its group memberships."""
    if user is None or not user.is_authenticated:
        return []
    prefix = roles.group_name(tenant.slug, "")
    return sorted(
        g[len(prefix):] for g in user.groups.filter(name__startswith=prefix)
        .values_list("name", flat=True)
    )
