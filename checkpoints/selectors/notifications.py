"""Reading notification endpoints and their delivery log (issue 21, items 1 and 5;
CONTRACT.md 8 ``…/notification-endpoints``). Every role of the tenant reads; only an
admin (``roles.MANAGE``) gets an endpoint's full URL or address and its secret's hint
(``is_admin`` on each row: the API and the pages show the rest to everyone)."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

from django.db.models import Prefetch

from .. import crypto, roles, webhooksign
from ..exceptions import NotFound
from ..models import NotificationAttempt, NotificationEndpoint, NotificationMessage, Tenant
from ..permissions import require, tenant_perms
from ..vocab import NotificationChannel


def destination(endpoint: NotificationEndpoint) -> str:
    """Where an endpoint sends, safe to show and to audit: a URL's scheme and host
    (``https://hooks.example.com``), an email address's domain (``@example.com``)."""
    if endpoint.channel == NotificationChannel.EMAIL:
        return "@" + endpoint.email.rsplit("@", 1)[-1]
    try:
        parts = urlsplit(endpoint.url)
        return f"{parts.scheme}://{parts.hostname}" if parts.hostname else ""
    except ValueError:
        return ""


#: The most messages one delivery log answer lists (newest first).
DELIVERIES_MAX = 100


def _admin(user, tenant: Tenant) -> bool:
    return roles.MANAGE in tenant_perms(user, tenant)


def _dress(endpoint: NotificationEndpoint, admin: bool) -> NotificationEndpoint:
    """Set ``is_admin``, ``destination`` and ``secret_hint`` (admins only; "" otherwise,
    or when the data key is destroyed) on ``endpoint``, and blank its ``url`` and
    ``email`` below the admin: the one place the API and the pages learn what a caller
    may see. The row is never saved from here."""
    endpoint.is_admin = admin
    endpoint.destination = destination(endpoint)
    endpoint.secret_hint = ""
    if not admin:  # a Slack or Teams URL's path is its secret; an address, a person's
        endpoint.url = endpoint.email = ""
    if admin and endpoint.secret:
        try:
            endpoint.secret_hint = webhooksign.secret_hint(
                crypto.decrypt_text(endpoint.secret, tenant=endpoint.tenant_id))
        except crypto.DataKeyGone:
            pass
    return endpoint


def endpoint_list(*, user, tenant: Tenant) -> list[NotificationEndpoint]:
    """The tenant's endpoints by name (at most ``ENDPOINTS_PER_TENANT_MAX``, 50), each
    dressed for ``user`` (``is_admin``, ``secret_hint``). One query (and the rights)."""
    require(user, tenant, roles.VIEW)
    admin = _admin(user, tenant)
    return [_dress(e, admin) for e in NotificationEndpoint.objects.for_tenant(tenant)
            .order_by("name", "id")[:50]]


def endpoint_get(*, user, tenant: Tenant, endpoint_id) -> NotificationEndpoint:
    """One endpoint of the tenant by its UUID, dressed for ``user``; a malformed, unknown
    or other tenant's id is ``NotFound``."""
    require(user, tenant, roles.VIEW)
    try:
        eid = uuid.UUID(str(endpoint_id))
    except ValueError:
        raise NotFound("no such notification endpoint") from None
    found = NotificationEndpoint.objects.for_tenant(tenant).filter(uuid=eid).first()
    if found is None:
        raise NotFound("no such notification endpoint")
    return _dress(found, _admin(user, tenant))


def deliveries(*, user, tenant: Tenant, endpoint_id, limit: int = DELIVERIES_MAX
               ) -> tuple[NotificationEndpoint, list[NotificationMessage]]:
    """An endpoint's delivery log: its newest ``limit`` (at most 100) messages, newest
    first, each with its attempts (``message.attempt_list``, by number). Three queries.
    Raises ``NotFound`` like ``endpoint_get``."""
    endpoint = endpoint_get(user=user, tenant=tenant, endpoint_id=endpoint_id)
    attempts = Prefetch("attempt_rows", to_attr="attempt_list",
                        queryset=NotificationAttempt.objects.for_tenant(tenant)
                        .order_by("number"))
    rows = list(NotificationMessage.objects.for_tenant(tenant).filter(endpoint=endpoint)
                .order_by("-id").prefetch_related(attempts)[:min(limit, DELIVERIES_MAX)])
    return endpoint, rows
