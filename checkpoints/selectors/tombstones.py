"""Reads of tombstone governance (issue 20, item 5): the tenant's tombstones by cursor,
its tombstone purges. Tenant first, then the caller's role; metadata only (a tombstone
holds no payload value)."""

from __future__ import annotations

import uuid

from .. import roles
from ..exceptions import NotFound
from ..models import Tenant, Tombstone, TombstonePurge
from ..permissions import require


def tombstone_list(*, user, tenant: Tenant, after: int | None = None,
                   limit: int = 100) -> list[Tombstone]:
    """The tenant's tombstones in ascending id (the cursor exports and purges count by),
    after id ``after``; at most ``limit`` (1..500). One index scan on
    ``tombstone_cursor_idx`` (viewer and up)."""
    require(user, tenant, roles.VIEW)
    qs = Tombstone.objects.for_tenant(tenant).select_related("erasure")
    if after is not None:
        qs = qs.filter(id__gt=after)
    return list(qs.order_by("id")[: max(1, min(limit, 500))])


def tombstone_purge_list(*, user, tenant: Tenant, limit: int = 50) -> list[TombstonePurge]:
    """The tenant's tombstone purges, newest first (at most ``limit``; viewer and up)."""
    require(user, tenant, roles.VIEW)
    return list(TombstonePurge.objects.for_tenant(tenant)
                .select_related("prepared_by", "approved_by", "executed_by")
                .order_by("-prepared_at", "-id")[: max(1, min(limit, 200))])


def tombstone_purge_get(*, user, tenant: Tenant, purge_id: uuid.UUID) -> TombstonePurge:
    """One purge of the tenant by its public id; ``NotFound`` otherwise (viewer and up)."""
    require(user, tenant, roles.VIEW)
    purge = (TombstonePurge.objects.for_tenant(tenant)
             .select_related("prepared_by", "approved_by", "executed_by")
             .filter(uuid=purge_id).first())
    if purge is None:
        raise NotFound("no such tombstone purge")
    return purge
