"""Reads about accounts: the tenants a user holds a role in, an account's API tokens.
"""

from __future__ import annotations

from django.contrib.contenttypes.models import ContentType
from django.db.models import (
    BigIntegerField,
    QuerySet,
)
from django.db.models.functions import Cast
from guardian.models import GroupObjectPermission

from .. import roles
from ..models import (
    ApiToken,
    Tenant,
)


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
