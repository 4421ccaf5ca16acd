"""Delivering notification messages (issue 21, items 4-5; docs/notifications.md
"Delivery"): the sender's writes. ``jobs.notify`` claims due messages here, posts them
outside any transaction, and records each attempt here.

- ``claim_due``: pending messages that are due (``next_attempt_at`` passed, database
  clock) of enabled endpoints, not claimed by a live sender, ``FOR UPDATE SKIP LOCKED``
  on PostgreSQL (SQLite serialises writers), get ``claimed_until`` (the send's timeout
  plus a margin) and are committed before any request goes out. A sender that dies
  mid-send leaves the claim to pass; the message is then sent again, with the same
  ``event_id`` (receivers deduplicate).
- ``record_attempt``: one transaction: the ``NotificationAttempt``, the message's
  outcome (``delivered``; else the next try on ``RETRY_SCHEDULE_S``, or ``failed`` when
  it ran out) and the endpoint's health (``failing_since`` set at the first failure,
  cleared by a success).
- ``disable_failing``: an endpoint failing for ``RECOVERY_NOTIFY_DISABLE_AFTER_S`` (five
  days) is disabled with a visible reason (audited, by the system) and its pending
  messages fail with that reason.

Lock order: the tenant's audit head (only to disable), the endpoint, then its message.
The endpoint is held through ``notify_endpoints.hold_endpoints`` (``CHANGE``): an attempt
of a message whose endpoint an admin is deleting waits for the delete, then finds both
gone (``record_attempt`` answers ``gone``; stop 34's attack).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.db.models.functions import Coalesce

from .. import crypto, locks
from ..audit import audit_record
from ..dbclock import LOCKED_NOW, NOW
from ..exceptions import DomainError
from ..jsonparse import shown
from ..models import (
    NotificationAttempt,
    NotificationEndpoint,
    NotificationMessage,
    NotificationOutbox,
)
from ..models.notifications import ERROR_MAX, RESPONSE_HEAD_MAX
from ..vocab import AuditAction, DeliveryState, NotificationChannel, TargetType
from .notify_endpoints import CHANGE, hold_endpoints

#: Seconds to wait after failed attempt n (index n-1): about a day in all; after the
#: last one the message fails (issue 21, item 4).
RETRY_SCHEDULE_S = (5, 300, 1800, 7200, 18000, 36000, 36000)
#: A claim lasts the send's timeout plus this margin.
CLAIM_MARGIN_S = 60

_ALL = "the notification sender claims and records every tenant's due messages"


@dataclass
class Claimed:
    """One message claimed for sending: what the sender needs, read in the claim's
    transaction. ``secrets``: the webhook signing secrets in force (the current one
    first, the previous one during a rotation), decrypted; ``db_now``: the database
    time of the claim (the Standard Webhooks timestamp); ``claimed_until``: this claim's
    token (``record_attempt`` compares it)."""

    pk: int
    tenant_id: int
    event_id: str
    channel: str
    url: str
    email: str
    payload: dict
    subject: str
    text: str
    secrets: list[str]
    db_now: datetime
    claimed_until: datetime


def _secrets(endpoint: NotificationEndpoint, db_now: datetime) -> list[str]:
    if endpoint.channel != NotificationChannel.WEBHOOK or not endpoint.secret:
        return []
    out = [crypto.decrypt_text(endpoint.secret, tenant=endpoint.tenant_id)]
    if endpoint.previous_secret and endpoint.previous_secret_until \
            and endpoint.previous_secret_until > db_now:
        out.append(crypto.decrypt_text(endpoint.previous_secret, tenant=endpoint.tenant_id))
    return out


def due_filter() -> Q:
    """A message the sender may take now: pending, due on the database clock, its
    endpoint enabled, no live claim."""
    return (Q(state=DeliveryState.PENDING, next_attempt_at__lte=NOW, endpoint__enabled=True)
            & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=NOW)))


def claim_due(limit: int = 20) -> list[Claimed]:
    """Claim up to ``limit`` due messages (oldest due first), skipping those another
    sender holds, in one committed transaction; returns them (empty: nothing due). A
    message whose endpoint's secret cannot be decrypted (its data key destroyed) fails
    at once instead."""
    hold = timedelta(seconds=settings.RECOVERY_NOTIFY_TIMEOUT_S + CLAIM_MARGIN_S)
    every = NotificationMessage.objects.for_all_tenants(reason=_ALL)
    claimed: list[Claimed] = []
    with transaction.atomic():
        pks = list(locks.lock_rows(every.filter(due_filter())
                                   .order_by("next_attempt_at", "pk"), skip_locked=True)
                   .values_list("pk", flat=True)[:limit])
        if not pks:
            return []
        every.filter(pk__in=pks).update(claimed_until=NOW + hold)
        rows = every.filter(pk__in=pks).select_related("endpoint").annotate(db_now=NOW)
        for m in rows.order_by("next_attempt_at", "pk"):
            ep = m.endpoint
            try:
                secrets_ = _secrets(ep, m.db_now)
            except crypto.DataKeyGone:
                every.filter(pk=m.pk).update(state=DeliveryState.FAILED, claimed_until=None,
                                             last_error="the tenant's data key is destroyed")
                continue
            claimed.append(Claimed(m.pk, m.tenant_id, m.event_id, ep.channel, ep.url,
                                   ep.email, m.payload, m.subject, m.text, secrets_,
                                   m.db_now, m.claimed_until))
    return claimed


def _clip(text: str, most: int) -> str:
    """A receiver's answer or an error as stored and shown on the endpoint page: one
    printable line of at most ``most`` characters (``jsonparse.shown``: a control or
    bidirectional character escaped; the second attack's finding, stop 33)."""
    return shown(str(text or ""), most)


def record_attempt(claim: Claimed, *, ok: bool, status: int | None, latency_ms: int,
                   head: str = "", error: str = "") -> str:
    """Record one delivery attempt of ``claim`` and its outcome, in one transaction
    (endpoint row, then message row). Returns the message's state afterwards
    (``delivered``, ``pending`` with the next try scheduled, ``failed``), or ``gone``
    (deleted meanwhile, or its endpoint: held first, ``hold_endpoints``, so an endpoint's
    delete and an attempt of its message never pass each other). The attempt is recorded
    even when the claim was lost (another sender took the message after this claim
    passed: both sent it, with the same id); the outcome only applies to a message still
    pending."""
    every = NotificationMessage.objects.for_all_tenants(reason=_ALL)
    with transaction.atomic():
        endpoint_pk = every.filter(pk=claim.pk).values_list("endpoint_id", flat=True).first()
        if endpoint_pk is None:
            return "gone"
        endpoints = NotificationEndpoint.objects.for_all_tenants(reason=_ALL)
        if not hold_endpoints(endpoints.filter(pk=endpoint_pk), hold=CHANGE):
            return "gone"
        message = locks.lock_rows(every.filter(pk=claim.pk)).annotate(db_now=LOCKED_NOW).first()
        if message is None:
            return "gone"
        number = (NotificationAttempt.objects.for_tenant(message.tenant_id)
                  .filter(message_id=message.pk).aggregate(n=Max("number"))["n"] or 0) + 1
        NotificationAttempt.objects.create(
            tenant_id=message.tenant_id, message=message, number=number,
            started_at=claim.db_now, latency_ms=max(0, int(latency_ms)), status_code=status,
            error=_clip(error, ERROR_MAX), response_head=_clip(head, RESPONSE_HEAD_MAX))
        if message.state != DeliveryState.PENDING:
            return message.state
        mine = every.filter(pk=message.pk)
        if ok:
            mine.update(state=DeliveryState.DELIVERED, delivered_at=NOW, claimed_until=None,
                        attempts=message.attempts + 1, last_error="")
            endpoints.filter(pk=endpoint_pk).update(failing_since=None, last_sent_at=NOW)
            return DeliveryState.DELIVERED
        tries = message.attempts + 1
        why = _clip(error or (f"HTTP {status}" if status else "failed"), 200)
        endpoints.filter(pk=endpoint_pk).update(failing_since=Coalesce("failing_since", NOW))
        if tries > len(RETRY_SCHEDULE_S):
            mine.update(state=DeliveryState.FAILED, attempts=tries, claimed_until=None,
                        last_error=_clip(f"gave up after {tries} attempts: {why}", ERROR_MAX))
            return DeliveryState.FAILED
        mine.update(attempts=tries, claimed_until=None, last_error=why,
                    next_attempt_at=NOW + timedelta(seconds=RETRY_SCHEDULE_S[tries - 1]))
        return DeliveryState.PENDING


def disable_failing() -> int:
    """Disable every enabled endpoint that has failed without a success for
    ``RECOVERY_NOTIFY_DISABLE_AFTER_S`` (database clock): ``enabled`` off, the reason
    and time stored, one ``notification_endpoint.disable`` audit event by the system,
    and its pending messages failed with that reason; one transaction per endpoint.
    Returns how many were disabled."""
    after = timedelta(seconds=settings.RECOVERY_NOTIFY_DISABLE_AFTER_S)
    endpoints = NotificationEndpoint.objects.for_all_tenants(
        reason="the notification sender disables endpoints failing for days, any tenant")
    failing = Q(enabled=True, failing_since__isnull=False, failing_since__lte=NOW - after)
    done = 0
    for pk, tenant_id in list(endpoints.filter(failing).values_list("pk", "tenant_id")[:100]):
        with transaction.atomic():
            locks.lock_audit_head(tenant_id)
            held = hold_endpoints(endpoints.filter(failing, pk=pk).select_related("tenant"),
                                  hold=CHANGE)
            if not held:
                continue
            endpoint = held[0]
            days = settings.RECOVERY_NOTIFY_DISABLE_AFTER_S / 86_400
            reason = (f"disabled by the system: every delivery failed for more than "
                      f"{days:g} day(s) (since {endpoint.failing_since:%Y-%m-%d %H:%M} UTC)")
            endpoints.filter(pk=pk).update(enabled=False, disabled_reason=reason[:ERROR_MAX],
                                           disabled_at=NOW, updated_at=NOW)
            failed = (NotificationMessage.objects.for_tenant(tenant_id)
                      .filter(endpoint_id=pk, state=DeliveryState.PENDING)
                      .update(state=DeliveryState.FAILED, claimed_until=None,
                              last_error=reason[:ERROR_MAX]))
            audit_record(tenant=endpoint.tenant, actor=None,
                         action=AuditAction.NOTIFICATION_ENDPOINT_DISABLE,
                         target_type=TargetType.NOTIFICATION_ENDPOINT, target_id=endpoint.uuid,
                         reason=reason, before={"enabled": True},
                         after={"enabled": False, "failed_messages": failed})
            done += 1
    return done


class NotificationsLate(DomainError, status=503, error="notifications_late"):
    """``/readyz``'s ``notifications`` check: events or due messages wait too long."""


def notify_health() -> str | None:
    """The ``notifications`` check of ``/readyz``: ``"not configured"`` while no tenant
    has an enabled endpoint (nobody to tell: the outbox's rows are then dropped by the
    dispatcher whenever it runs); else None (ok) unless an outbox row waited for the
    dispatcher, or a due message (pending, its endpoint enabled) waited for the sender,
    longer than ``RECOVERY_NOTIFY_STALE_S`` (database clock); then raises
    ``NotificationsLate`` saying which. At most three queries."""
    stale = timedelta(seconds=settings.RECOVERY_NOTIFY_STALE_S)
    if not (NotificationEndpoint.objects.for_all_tenants(
            reason="/readyz asks whether any tenant has an enabled endpoint (a yes or no)")
            .filter(enabled=True).exists()):
        return "not configured"
    outbox = (NotificationOutbox.objects.for_all_tenants(
        reason="/readyz asks whether any event waits too long (a yes or no)")
        .filter(at__lt=NOW - stale).exists())
    if outbox:
        raise NotificationsLate(f"an event waited more than {int(stale.total_seconds())} s in the outbox "
                                "(is the notification round running?)")
    waiting = (NotificationMessage.objects.for_all_tenants(
        reason="/readyz asks whether any due message waits too long (a yes or no)")
        .filter(state=DeliveryState.PENDING, endpoint__enabled=True,
                next_attempt_at__lt=NOW - stale).exists())
    if waiting:
        raise NotificationsLate(f"a due message waited more than {int(stale.total_seconds())} s for the "
                                "sender (is the notification round running?)")
    return None
