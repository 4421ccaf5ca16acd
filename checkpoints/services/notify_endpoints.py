"""Notification endpoints (issue 21, item 1; CONTRACT.md 8 ``…/notification-endpoints``;
docs/notifications.md): a tenant admin creates, changes, rotates the secret of and
deletes where the tenant's notifications go, sends a test event and resends a message.
Every write here is audited in its transaction; an audit event names an endpoint's URL by
scheme and host only (a Slack or Teams URL's path is its secret) and an email address by
its domain, and never holds a signing secret.

A webhook endpoint's signing secret (``webhooksign.new_secret``) is made here, returned
ONCE by ``endpoint_create`` and ``endpoint_rotate_secret`` and stored encrypted with the
tenant's data key; afterwards an admin sees only its hint (``secret_hint``) and a viewer
nothing. A rotation keeps the previous secret signing for ``ROTATION_OVERLAP`` (database
clock): receivers verify either while they switch.

Lock order: the tenant's audit head, then the endpoint, then its messages (the sender
takes the endpoint before a message too: ``services.notify_delivery``). Every endpoint
lock, here, in the dispatcher and in the sender, is taken by ``hold_endpoints``: a delete
holds the endpoint ``FOR UPDATE`` before it collects the rows naming it, and every writer
of such a row holds the endpoint first, so neither fails (stop 34's attack).
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import transaction

from .. import crypto, locks, roles, safehttp, webhooksign
from ..audit import audit_record
from ..dbclock import NOW, db_now
from ..exceptions import InvalidPayload, InvalidTransition, NotFound
from ..jsonparse import check_name
from ..models import NotificationEndpoint, NotificationMessage, Tenant
from ..models.notifications import (
    ENDPOINT_EMAIL_MAX,
    ENDPOINT_NAME_MAX,
    ENDPOINT_URL_MAX,
    ENDPOINTS_PER_TENANT_MAX,
    EVENT_ID_MAX,
    FILTER_VALUES_MAX,
    GROUP_WINDOW_S_DEFAULT,
    GROUP_WINDOW_S_MAX,
    QUIET_PERIOD_S_MAX,
    filter_value_max,
)
from ..permissions import require
from ..selectors.notifications import destination
from ..vocab import (
    AuditAction,
    DeliveryState,
    NotificationChannel,
    NotificationEventType,
    TargetType,
)
from .common import _actor_name

#: How long the previous secret still signs after a rotation.
ROTATION_OVERLAP = timedelta(hours=24)
#: The fields a create or an update may carry.
FIELDS = frozenset({"name", "channel", "url", "email", "event_types", "kinds", "agents",
                    "services", "group_window_s", "quiet_period_s", "enabled"})
FILTERS = ("kinds", "agents", "services")
#: What an event id may be (``evt_``/``msg_`` + hex, at most ``EVENT_ID_MAX``): anything
#: else names no message.
EVENT_ID_RE = re.compile(rf"[A-Za-z0-9_.:-]{{1,{EVENT_ID_MAX}}}")


def operator_allows() -> dict:
    """The operator's SSRF exceptions as ``safehttp`` keyword arguments:
    ``allow_private`` (``RECOVERY_NOTIFY_ALLOW_PRIVATE``) and ``allow_cidrs``
    (``RECOVERY_NOTIFY_ALLOW_CIDRS`` as networks)."""
    return {"allow_private": settings.RECOVERY_NOTIFY_ALLOW_PRIVATE,
            "allow_cidrs": safehttp.networks(settings.RECOVERY_NOTIFY_ALLOW_CIDRS)}


def new_event_id() -> str:
    """A fresh Standard Webhooks message id: ``msg_`` + 32 hex digits (36 characters)."""
    return "msg_" + uuid.uuid4().hex


# --------------------------------------------------------------------------------------
# Validation (each error names its field; nothing is written before all pass)
# --------------------------------------------------------------------------------------

def _name(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidPayload("name: must be a non-empty string")
    value = value.strip()
    if len(value) > ENDPOINT_NAME_MAX:
        raise InvalidPayload(f"name: at most {ENDPOINT_NAME_MAX} characters")
    # Joiners, selectors, a braille blank: a name that shows nothing is as blank as "  ".
    return check_name(value, "name", blank_words="must be a non-empty string")


def check_url(value, field: str = "url") -> str:
    """An endpoint URL: an absolute ``https`` URL (``http`` only with
    ``RECOVERY_NOTIFY_ALLOW_HTTP``) of at most ``ENDPOINT_URL_MAX`` characters, with a
    host and no user name or password, no whitespace or control character; a host given
    as an address must be public unless the operator allows it
    (``safehttp.host_problem``). Names are resolved at send time
    (``safehttp``), never here. Raises ``InvalidPayload`` naming ``field`` (never echoing
    the URL: its path may be a secret)."""
    if not isinstance(value, str) or not value:
        raise InvalidPayload(f"{field}: must be a non-empty string (an https URL)")
    if len(value) > ENDPOINT_URL_MAX:
        raise InvalidPayload(f"{field}: at most {ENDPOINT_URL_MAX} characters")
    check_name(value, field)
    if any(ch.isspace() for ch in value):
        raise InvalidPayload(f"{field}: must not contain whitespace")
    try:
        scheme, host, _port, _target = safehttp.split(value)
    except safehttp.Refused as exc:
        raise InvalidPayload(f"{field}: {exc}") from None
    if scheme != "https" and not settings.RECOVERY_NOTIFY_ALLOW_HTTP:
        raise InvalidPayload(f"{field}: must be an https URL (the operator does not allow "
                             "plain http: RECOVERY_NOTIFY_ALLOW_HTTP)")
    problem = safehttp.host_problem(host, **operator_allows())
    if problem:
        raise InvalidPayload(f"{field}: {problem}")
    return value


def _email(value) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPayload("email: must be a non-empty string (an email address)")
    if len(value) > ENDPOINT_EMAIL_MAX:
        raise InvalidPayload(f"email: at most {ENDPOINT_EMAIL_MAX} characters")
    check_name(value, "email")
    try:
        EmailValidator()(value)
    except ValidationError:
        raise InvalidPayload("email: not a valid email address") from None
    return value


def _event_types(value) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidPayload("event_types: must be a non-empty list of event types ("
                             + ", ".join(NotificationEventType.SUBSCRIBABLE) + ")")
    out: list[str] = []
    for item in value:
        if not isinstance(item, str) or item not in NotificationEventType.SUBSCRIBABLE:
            shown = str(item)[:40] if isinstance(item, str) else type(item).__name__
            raise InvalidPayload(f"event_types: {shown!r} is not an event type an endpoint "
                                 "may choose (" + ", ".join(NotificationEventType.SUBSCRIBABLE)
                                 + ")")
        if item not in out:
            out.append(item)
    return out


def _filter(value, field: str) -> list[str]:
    """The filter list ``field`` (``kinds``, ``agents``, ``services``) as stored: each
    value as sent, duplicates dropped. A value is matched exactly against a run's or an
    effect's column (``notify_dispatch``), so it takes every value a write can store
    there: a name (``jsonparse.name_problem``, the rule of a run identity and a service)
    of at most the column's length (``models.notifications.filter_value_max``), spaces
    kept where they are (a run's agent may be ``"refund "``, which is not ``"refund"``:
    the inbox's ``name_filter`` keeps them too; issue 22's stop). ``""`` is refused (it
    would match a run with no agent); a value that shows nothing (``jsonparse.blank``:
    spaces, a braille blank) only in ``agents``, as a run identity may be one
    (``kinds._check_identity``), while no kind or service can be (the kind's pattern,
    ``services.common._str_field``). Raises ``InvalidPayload`` naming ``field``."""
    if not isinstance(value, list):
        raise InvalidPayload(f"{field}: must be a list of strings (empty: every {field[:-1]})")
    if len(value) > FILTER_VALUES_MAX:
        raise InvalidPayload(f"{field}: at most {FILTER_VALUES_MAX} values")
    most = filter_value_max(field)
    out: list[str] = []
    for item in value:
        if not isinstance(item, str) or not item:
            raise InvalidPayload(f"{field}: each value must be a non-empty string")
        if len(item) > most:
            raise InvalidPayload(f"{field}: each value at most {most} characters")
        check_name(item, field, blank_words=None if field == "agents"
                   else "each value must be a non-empty string")
        if item not in out:
            out.append(item)
    return out


def _seconds(value, field: str, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise InvalidPayload(f"{field}: must be an integer of 0..{most} (seconds)")
    return value


def _clean(body, *, channel: str) -> dict:
    """The validated fields of ``body`` (only those present) for an endpoint of
    ``channel``."""
    out: dict = {}
    if "name" in body:
        out["name"] = _name(body["name"])
    if "url" in body:
        if channel not in NotificationChannel.URL:
            raise InvalidPayload(f"url: a {channel} endpoint has no URL (use email)")
        out["url"] = check_url(body["url"])
    if "email" in body:
        if channel != NotificationChannel.EMAIL:
            raise InvalidPayload(f"email: a {channel} endpoint has no email address "
                                 "(use url)")
        out["email"] = _email(body["email"])
    if "event_types" in body:
        out["event_types"] = _event_types(body["event_types"])
    for field in FILTERS:
        if field in body:
            out[field] = _filter(body[field], field)
    if "group_window_s" in body:
        out["group_window_s"] = _seconds(body["group_window_s"], "group_window_s",
                                         GROUP_WINDOW_S_MAX)
    if "quiet_period_s" in body:
        out["quiet_period_s"] = _seconds(body["quiet_period_s"], "quiet_period_s",
                                         QUIET_PERIOD_S_MAX)
    if "enabled" in body:
        if not isinstance(body["enabled"], bool):
            raise InvalidPayload("enabled: must be true or false")
        out["enabled"] = body["enabled"]
    return out


def _body(body) -> dict:
    if not isinstance(body, dict):
        raise InvalidPayload("body: must be a JSON object")
    unknown = sorted(str(k)[:40] for k in body if k not in FIELDS)
    if unknown:
        raise InvalidPayload(f"{unknown[0]}: unknown field")
    return body


def _shape(endpoint: NotificationEndpoint) -> dict:
    """An endpoint as its audit events show it (no secret, no URL path, no address)."""
    return {"name": endpoint.name, "channel": endpoint.channel,
            "destination": destination(endpoint), "event_types": list(endpoint.event_types),
            "kinds": list(endpoint.kinds), "agents": list(endpoint.agents),
            "services": list(endpoint.services), "group_window_s": endpoint.group_window_s,
            "quiet_period_s": endpoint.quiet_period_s, "enabled": endpoint.enabled}


# --------------------------------------------------------------------------------------
# Writes
# --------------------------------------------------------------------------------------

#: How a transaction holds endpoints (``hold_endpoints``).
NAME = "name"      # it inserts rows naming them, changes nothing of them: FOR KEY SHARE
CHANGE = "change"  # it changes them, or must be their one writer: FOR NO KEY UPDATE
DELETE = "delete"  # it deletes them with every row naming them: FOR UPDATE
HOLDS = (NAME, CHANGE, DELETE)


def hold_endpoints(endpoints, *, hold: str = CHANGE, skip_locked: bool = False
                   ) -> list[NotificationEndpoint]:
    """The endpoints of the queryset ``endpoints`` that still exist, held to the end of
    the caller's transaction, in ascending id, as read once held. The one way anything
    locks an endpoint: a transaction that writes a row naming one (a message, an
    incident, a delivery attempt of its message) holds it first, so a delete and a
    writer never pass each other (stop 34's attack; ``locks`` module docstring: the delete's
    collected list missed a digest committed meanwhile, and its ``COMMIT`` failed).

    ``hold``: ``NAME`` (``locks.share_rows``, ``FOR KEY SHARE``: the digest, which waits
    for nothing but a delete), ``CHANGE`` (``locks.lock_rows``: an admin's change, the
    dispatcher's incidents, the sender's health), ``DELETE``
    (``locks.lock_rows_to_delete``: ``endpoint_delete``, before the ORM collects the
    endpoint's messages and incidents). ``DELETE`` conflicts with both others: a writer
    holding an endpoint makes the delete wait (which then deletes what it wrote); a
    writer asking after the delete waits for it and finds the endpoint gone, left out
    here (the caller skips it: a background round neither fails nor retries it).
    ``skip_locked``: an endpoint another transaction holds in a conflicting mode is left
    out instead of waited for. Raises ``ValueError`` for an unknown ``hold`` (a
    programming error)."""
    if hold == NAME:
        return locks.share_rows(endpoints, skip_locked=skip_locked)
    if hold == CHANGE:
        return list(locks.lock_rows(endpoints, skip_locked=skip_locked))
    if hold == DELETE:
        return list(locks.lock_rows_to_delete(endpoints))
    raise ValueError(f"hold_endpoints: hold must be one of {HOLDS}, not {hold!r}")


def _locked(tenant: Tenant, endpoint_id, *, hold: str = CHANGE) -> NotificationEndpoint:
    """The tenant's endpoint ``endpoint_id`` held (``hold_endpoints``: ``CHANGE``, or
    ``DELETE`` for its delete), after the tenant's audit head. Raises ``NotFound``
    (malformed, unknown, another tenant's, deleted meanwhile)."""
    try:
        eid = uuid.UUID(str(endpoint_id))
    except ValueError:
        raise NotFound("no such notification endpoint") from None
    locks.lock_audit_head(tenant)
    found = hold_endpoints(NotificationEndpoint.objects.for_tenant(tenant).filter(uuid=eid),
                           hold=hold)
    if not found:
        raise NotFound("no such notification endpoint")
    found[0].tenant = tenant
    return found[0]


def endpoint_create(*, actor, tenant: Tenant, body: dict) -> tuple[NotificationEndpoint, str]:
    """A tenant admin (``roles.MANAGE``) adds an endpoint from ``body``: ``channel``
    (required), ``name`` (required), ``url`` (webhook, slack, teams) or ``email``,
    ``event_types`` (required, non-empty), optional ``kinds``/``agents``/``services``
    filters, ``group_window_s`` (0..3600, default 120), ``quiet_period_s`` (0..86400),
    ``enabled``. Returns ``(endpoint, secret)``: the webhook signing secret, shown this
    once ("" for other channels). One ``notification_endpoint.create`` audit event.
    Raises ``NotFound``/``Forbidden`` (rights), ``InvalidPayload`` naming the field (also
    when the tenant has ``ENDPOINTS_PER_TENANT_MAX`` endpoints)."""
    require(actor, tenant, roles.MANAGE)
    body = _body(body)
    channel = body.get("channel")
    if channel not in NotificationChannel.values:
        raise InvalidPayload("channel: must be one of " + ", ".join(NotificationChannel.values))
    fields = _clean(body, channel=channel)
    for required in ("name", "event_types",
                     "email" if channel == NotificationChannel.EMAIL else "url"):
        if required not in fields:
            raise InvalidPayload(f"{required}: required")
    secret = webhooksign.new_secret() if channel == NotificationChannel.WEBHOOK else ""
    with transaction.atomic():
        locks.lock_audit_head(tenant)
        if NotificationEndpoint.objects.for_tenant(tenant).count() >= ENDPOINTS_PER_TENANT_MAX:
            raise InvalidPayload(f"channel: a tenant has at most {ENDPOINTS_PER_TENANT_MAX} "
                                 "notification endpoints")
        fields.setdefault("group_window_s", GROUP_WINDOW_S_DEFAULT)
        endpoint = NotificationEndpoint.objects.create(
            tenant=tenant, uuid=uuid.uuid4(), channel=channel,
            secret=crypto.encrypt_text(secret, tenant=tenant) if secret else "",
            created_by=actor, created_by_name=_actor_name(actor), **fields)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.NOTIFICATION_ENDPOINT_CREATE,
                     target_type=TargetType.NOTIFICATION_ENDPOINT, target_id=endpoint.uuid,
                     after=_shape(endpoint))
    endpoint.refresh_from_db()
    return endpoint, secret


#: No stored value (``endpoint_update``: a field the endpoint does not have).
_UNSET = object()


def endpoint_update(*, actor, tenant: Tenant, endpoint_id, body: dict) -> NotificationEndpoint:
    """A tenant admin changes the fields ``body`` carries (those of ``endpoint_create``
    but ``channel``, which cannot change); a field sent with its stored value is kept as
    stored, not judged again (the edit form sends every field). ``enabled: true`` on a disabled endpoint
    clears its disabled reason and failure clock. One ``notification_endpoint.update``
    audit event (before and after; nothing when nothing changed). Raises ``NotFound``,
    ``Forbidden``, ``InvalidPayload`` naming the field."""
    require(actor, tenant, roles.MANAGE)
    body = _body(body)
    with transaction.atomic():
        endpoint = _locked(tenant, endpoint_id)
        if "channel" in body and body["channel"] != endpoint.channel:
            raise InvalidPayload("channel: cannot be changed (create another endpoint)")
        # A field sent back as stored is kept, not judged again: a value stored before a
        # rule (an invisible character in a filter, a URL's port 0; stop 34) would
        # otherwise lock the edit form, which sends every field, out of every change.
        fields = _clean({k: v for k, v in body.items()
                         if k != "channel" and getattr(endpoint, k, _UNSET) != v},
                        channel=endpoint.channel)
        before = _shape(endpoint)
        for key, value in fields.items():
            setattr(endpoint, key, value)
        if fields.get("enabled") is True and not before["enabled"]:
            endpoint.disabled_reason, endpoint.disabled_at = "", None
            endpoint.failing_since = None
        after = _shape(endpoint)
        if after == before:
            return endpoint
        endpoint.updated_at = NOW
        endpoint.save()
        audit_record(tenant=tenant, actor=actor, action=AuditAction.NOTIFICATION_ENDPOINT_UPDATE,
                     target_type=TargetType.NOTIFICATION_ENDPOINT, target_id=endpoint.uuid,
                     before={k: v for k, v in before.items() if after[k] != v},
                     after={k: v for k, v in after.items() if before[k] != v})
    endpoint.refresh_from_db()
    return endpoint


def endpoint_delete(*, actor, tenant: Tenant, endpoint_id) -> None:
    """A tenant admin deletes an endpoint, with its messages, incidents and their
    delivery log (a message still pending is never sent). One
    ``notification_endpoint.delete`` audit event. The endpoint is held ``FOR UPDATE``
    (``hold_endpoints``, ``DELETE``) before its rows are collected: a dispatcher round or
    sender writing for it meanwhile either finishes first (its rows are deleted too) or
    waits and skips the endpoint (stop 34's attack: a digest written at that moment made the
    delete fail, a 500). Raises ``NotFound``, ``Forbidden``."""
    require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        endpoint = _locked(tenant, endpoint_id, hold=DELETE)
        before = _shape(endpoint)
        eid = endpoint.uuid
        endpoint.delete()
        audit_record(tenant=tenant, actor=actor, action=AuditAction.NOTIFICATION_ENDPOINT_DELETE,
                     target_type=TargetType.NOTIFICATION_ENDPOINT, target_id=eid,
                     before=before)


def endpoint_rotate_secret(*, actor, tenant: Tenant, endpoint_id
                           ) -> tuple[NotificationEndpoint, str]:
    """A tenant admin replaces a webhook endpoint's signing secret; the previous one
    keeps signing for ``ROTATION_OVERLAP`` (24 h, database clock; a secret rotated twice
    within it drops the oldest). Returns ``(endpoint, new secret)``, the secret shown this
    once. One ``notification_endpoint.rotate_secret`` audit event (when the previous
    secret stops; never a secret). Raises ``NotFound``, ``Forbidden``,
    ``InvalidTransition`` (not a webhook endpoint: nothing is signed)."""
    require(actor, tenant, roles.MANAGE)
    secret = webhooksign.new_secret()
    with transaction.atomic():
        endpoint = _locked(tenant, endpoint_id)
        if endpoint.channel != NotificationChannel.WEBHOOK:
            raise InvalidTransition(f"channel: a {endpoint.channel} endpoint is not signed; "
                                    "only a webhook endpoint has a secret")
        until = db_now() + ROTATION_OVERLAP
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_until = until
        endpoint.secret = crypto.encrypt_text(secret, tenant=tenant)
        endpoint.updated_at = NOW
        endpoint.save()
        audit_record(tenant=tenant, actor=actor, action=AuditAction.NOTIFICATION_ENDPOINT_ROTATE,
                     target_type=TargetType.NOTIFICATION_ENDPOINT, target_id=endpoint.uuid,
                     after={"previous_valid_until": until.isoformat()})
    endpoint.refresh_from_db()
    return endpoint, secret


def secret_hint(endpoint: NotificationEndpoint) -> str:
    """The hint of an endpoint's current secret (``whsec_…XyZ1``) for an admin; "" for
    an unsigned channel or a secret whose data key was destroyed."""
    if not endpoint.secret:
        return ""
    try:
        return webhooksign.secret_hint(crypto.decrypt_text(endpoint.secret,
                                                           tenant=endpoint.tenant_id))
    except crypto.DataKeyGone:
        return ""


def _message_payload(tenant: Tenant, endpoint: NotificationEndpoint, event_id: str,
                     actor) -> tuple[dict, str, str]:
    at = db_now().isoformat().replace("+00:00", "Z")
    text = (f"Test event for notification endpoint {endpoint.name!r} of tenant "
            f"{tenant.slug}, sent by {_actor_name(actor)}. Nothing needs doing.")
    payload = {"type": NotificationEventType.TEST, "timestamp": at,
               "data": {"tenant": tenant.slug, "endpoint": str(endpoint.uuid),
                        "event_id": event_id, "text": text}}
    return payload, f"[recovery] test event ({tenant.slug})", text


def notification_test(*, actor, tenant: Tenant, endpoint_id) -> NotificationMessage:
    """A tenant admin asks for a test event to an enabled endpoint: one
    ``NotificationMessage`` of type ``test``, due now (the sender posts it like any
    other), and one ``notification.test`` audit event. Raises ``NotFound``,
    ``Forbidden``, ``InvalidTransition`` (the endpoint is disabled)."""
    require(actor, tenant, roles.MANAGE)
    with transaction.atomic():
        endpoint = _locked(tenant, endpoint_id)
        if not endpoint.enabled:
            raise InvalidTransition("enabled: the endpoint is disabled; enable it first")
        event_id = new_event_id()
        payload, subject, text = _message_payload(tenant, endpoint, event_id, actor)
        message = NotificationMessage.objects.create(
            tenant=tenant, endpoint=endpoint, event_id=event_id,
            event_type=NotificationEventType.TEST, payload=payload, subject=subject, text=text)
        audit_record(tenant=tenant, actor=actor, action=AuditAction.NOTIFICATION_TEST,
                     target_type=TargetType.NOTIFICATION_ENDPOINT, target_id=endpoint.uuid,
                     after={"event_id": event_id})
    message.refresh_from_db()
    return message


def notification_resend(*, actor, tenant: Tenant, endpoint_id, event_id
                        ) -> NotificationMessage:
    """A tenant admin sends a delivered or failed message again, with the SAME event id
    (receivers deduplicate): it becomes pending, due now, on a fresh retry schedule
    (``attempts`` restarts at 0; the delivery log keeps every earlier attempt). One
    ``notification.resend`` audit event. Raises ``NotFound`` (endpoint or message),
    ``Forbidden``, ``InvalidTransition`` (still pending, or the endpoint disabled)."""
    require(actor, tenant, roles.MANAGE)
    # Checked before any query: a NUL (or any character no event id has) would reach
    # PostgreSQL, which refuses it in a text column (a 500, not "not found").
    if not isinstance(event_id, str) or not EVENT_ID_RE.fullmatch(event_id):
        raise NotFound("no such notification message")
    with transaction.atomic():
        endpoint = _locked(tenant, endpoint_id)
        message = locks.lock_rows(NotificationMessage.objects.for_tenant(tenant)
                                  .filter(endpoint=endpoint, event_id=event_id)).first()
        if message is None:
            raise NotFound("no such notification message")
        if not endpoint.enabled:
            raise InvalidTransition("enabled: the endpoint is disabled; enable it first")
        if message.state == DeliveryState.PENDING:
            raise InvalidTransition("state: the message is pending; it will be sent (or "
                                    "retried) anyway")
        before = {"state": message.state, "attempts": message.attempts}
        (NotificationMessage.objects.for_tenant(tenant).filter(pk=message.pk)
         .update(state=DeliveryState.PENDING, attempts=0, next_attempt_at=NOW,
                 claimed_until=None, last_error=""))
        audit_record(tenant=tenant, actor=actor, action=AuditAction.NOTIFICATION_RESEND,
                     target_type=TargetType.NOTIFICATION_MESSAGE, target_id=event_id,
                     before=before, after={"state": DeliveryState.PENDING,
                                           "endpoint": str(endpoint.uuid)})
    message.refresh_from_db()
    return message
