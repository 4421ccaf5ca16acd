"""The notification round (issue 21, items 4-5; docs/notifications.md "Delivery"):
dispatch the outbox into messages (``services.notify_dispatch``), then send the due
messages, within a time budget. Run by Celery beat (``tasks.notify``, every
``RECOVERY_NOTIFY_INTERVAL_S``), by the in-process worker without a broker, and by the
web process's watchdog when beat is down (``inprocess``): "background work is stored,
retried, visible when it fails, and survives a broker outage". Safe on many processes
at once (claims skip what another sender holds).

A message is sent OUTSIDE any transaction: claimed and committed first
(``notify_delivery.claim_due``), posted (a webhook signed, Standard Webhooks; Slack or
Teams as ``{"text"}``; an email through Django's mail backend), then its attempt and
outcome recorded in one transaction (``notify_delivery.record_attempt``). Sends of one
batch run in a few threads, so one slow endpoint does not hold the others.
"""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.mail import send_mail

from .. import heartbeat, safehttp, webhooksign
from ..services import notify_delivery, notify_dispatch
from ..services.notify_endpoints import operator_allows
from ..vocab import NotificationChannel

log = logging.getLogger(__name__)

HEARTBEAT = heartbeat.NOTIFY
#: Messages claimed at once, and threads posting them.
BATCH = 20
THREADS = 8
USER_AGENT = "recovery-notify/1 (+https://www.standardwebhooks.com/)"


def body_of(claim: notify_delivery.Claimed) -> bytes:
    """The exact bytes a webhook receives (and its signature covers): the message's
    payload as compact JSON, UTF-8."""
    return json.dumps(claim.payload, separators=(",", ":"), ensure_ascii=False).encode()


def slack_escaped(text: str) -> str:
    """``text`` as Slack must receive it: ``&``, ``<`` and ``>`` escaped (Slack's
    "Formatting text" rule), so a name a run's writer chose can neither mention
    ``<!channel>`` nor show a link under other words (``<https://x|Run page>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


#: What Teams' markdown would read as a link, an image, emphasis or code: escaped with a
#: backslash. Our own links are bare URLs, which hold none of these.
TEAMS_MARKUP = re.compile(r"([\\`*\[\]<>!])")


def teams_escaped(text: str) -> str:
    """``text`` as a Teams incoming webhook must receive it: markdown's ``\\ ` * [ ] < > !``
    escaped, so a name a run's writer chose cannot show a link under other words
    (``[Run page](https://x)``), an image, or emphasis; bare URLs stay links."""
    return TEAMS_MARKUP.sub(r"\\\1", text)


def _without_local_part(text: str, address: str) -> str:
    """``text`` (a mail failure, which every role of the tenant reads in the delivery
    log) with the address's local part cut out, whatever its case: a mail server quotes
    the recipient, and only the admin sees more than ``@domain`` (docs/notifications.md)."""
    local = address.rsplit("@", 1)[0]
    return re.sub(re.escape(local), "…", text, flags=re.IGNORECASE) if local else text


def send(claim: notify_delivery.Claimed) -> dict:
    """Deliver one claimed message once; never raises. Returns ``record_attempt``'s
    keyword arguments: ``ok``, ``status``, ``latency_ms``, ``head``, ``error``."""
    if claim.channel == NotificationChannel.EMAIL:
        started = time.monotonic()
        try:
            send_mail(claim.subject or "[recovery] notification", claim.text,
                      settings.DEFAULT_FROM_EMAIL, [claim.email])
        except Exception as exc:  # noqa: BLE001 - a mail failure is an attempt's outcome
            return {"ok": False, "status": None,
                    "error": f"{type(exc).__name__}: {_without_local_part(str(exc), claim.email)}",
                    "latency_ms": int((time.monotonic() - started) * 1000)}
        return {"ok": True, "status": None,
                "latency_ms": int((time.monotonic() - started) * 1000)}
    if claim.channel == NotificationChannel.WEBHOOK:
        body = body_of(claim)
        headers = webhooksign.headers(claim.secrets, claim.event_id,
                                      int(claim.db_now.timestamp()), body)
    else:  # Slack, Teams: the URL's secret path authenticates; unsigned
        text = claim.text
        if claim.channel == NotificationChannel.SLACK:
            text = slack_escaped(text)
        elif claim.channel == NotificationChannel.TEAMS:
            text = teams_escaped(text)
        body = json.dumps({"text": text}, ensure_ascii=False).encode()
        headers = {}
    headers.update({"Content-Type": "application/json", "User-Agent": USER_AGENT})
    result = safehttp.post(claim.url, body=body, headers=headers,
                           timeout_s=settings.RECOVERY_NOTIFY_TIMEOUT_S, **operator_allows())
    return {"ok": result.ok, "status": result.status, "latency_ms": result.latency_ms,
            "head": result.head, "error": result.error}


def send_due(budget_s: float | None = None) -> dict:
    """Send due messages, batch after batch, until none is due or ``budget_s`` (default
    ``RECOVERY_NOTIFY_ROUND_BUDGET_S``) has passed (a batch started is finished). Then
    disable the endpoints failing for days. Returns counts: ``sent`` (attempts),
    ``delivered``, ``retrying``, ``failed``, ``disabled``."""
    budget = settings.RECOVERY_NOTIFY_ROUND_BUDGET_S if budget_s is None else budget_s
    started = time.monotonic()
    counts = {"sent": 0, "delivered": 0, "retrying": 0, "failed": 0}
    with ThreadPoolExecutor(THREADS, thread_name_prefix="recovery-notify") as pool:
        while time.monotonic() - started < budget:
            claims = notify_delivery.claim_due(BATCH)
            if not claims:
                break
            for claim, outcome in zip(claims, pool.map(send, claims), strict=True):
                state = notify_delivery.record_attempt(claim, **outcome)
                counts["sent"] += 1
                key = {"delivered": "delivered", "pending": "retrying",
                       "failed": "failed"}.get(state)
                if key:
                    counts[key] += 1
    counts["disabled"] = notify_delivery.disable_failing()
    return counts


def notify_round(budget_s: float | None = None) -> dict:
    """One round: ``notify_dispatch.dispatch_round()``, then ``send_due``; records the
    ``notify`` heartbeat (database clock) when both finished. Returns
    ``{"dispatch": ..., "send": ...}``."""
    dispatched = notify_dispatch.dispatch_round()
    sent = send_due(budget_s)
    heartbeat.beat(HEARTBEAT)
    if sent["sent"]:
        log.info("notifications: %s attempt(s), %s delivered, %s retrying, %s failed",
                 sent["sent"], sent["delivered"], sent["retrying"], sent["failed"])
    return {"dispatch": dispatched, "send": sent}
