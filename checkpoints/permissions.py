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
from .vocab import Role

_CACHE = "_tenant_perms_cache"


def tenant_perms(user: AbstractBaseUser | AnonymousUser | None, tenant: Tenant) -> set[str]:
    """The codenames (``roles.VIEW`` ...) ``user`` holds on ``tenant`` through its role
    groups, as a new set; empty for ``None``, anonymous and inactive accounts.

    Rights come only from the tenant's role groups (CONTRACT.md 4): the superuser and
    staff flags, global permissions and object permissions given to the account itself
    all count for nothing. (guardian's ``ObjectPermissionChecker.get_perms`` hands a
    superuser every permission, so only ``get_group_perms`` is asked; issue 6, fault 1.)
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return set()
    # Cached on the user object, which lives for one request (or one command): the view
    # and the service it calls ask the same question. ``forget_perms`` clears it (the
    # services granting and revoking roles call it).
    cache = user.__dict__.setdefault(_CACHE, {})
    if tenant.pk not in cache:
        checker = ObjectPermissionChecker(user)
        cache[tenant.pk] = frozenset(
            p for p in checker.get_group_perms(tenant) if p in roles.ROLE_PERMISSIONS[Role.ADMIN])
    return set(cache[tenant.pk])


def forget_perms(user) -> None:
    """Drop the per-request cache of ``tenant_perms`` on this user object, so the next
    question is answered from the database (after a grant, a revocation or a
    deactivation made through this same object)."""
    if user is not None:
        user.__dict__.pop(_CACHE, None)


def receipts_in_answers(user, tenant: Tenant) -> bool:
    """Whether API answers about effects may carry their receipts to ``user`` unaudited.

    Only for a runtime: a role that writes (``write_runs``) and may not reveal. A runtime
    needs the receipt of a ``confirmed`` effect to replay it instead of calling the
    service again. Viewers never see a receipt; reviewers, approvers and admins see one
    only through an audited reveal with a reason (``services.receipt_reveal``), as for
    payloads (CONTRACT.md 4: "effect receipts are treated like payloads"; issue 6,
    fault 3). So an admin, who may reveal, is answered like a reviewer.
    """
    perms = tenant_perms(user, tenant)
    return roles.WRITE in perms and roles.REVEAL not in perms


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
