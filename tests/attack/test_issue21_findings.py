"""Hostile tests of issue 21 (notification endpoints, dispatch, delivery, live polls,
the approver's queue, back links, incident references, next steps).

Each test states the behaviour the contract or the module's own docstring promises; each
was written failing and passes since its defect was fixed. One test per defect.
"""

from __future__ import annotations

import json
import smtplib
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from checkpoints import safehttp, selectors, services
from checkpoints.jobs import notify
from checkpoints.selectors import nextstep
from checkpoints.services import notify_delivery
from checkpoints.vocab import EffectState, ReconcileState

pytestmark = pytest.mark.django_db


def test_a_failed_emails_error_never_shows_a_viewer_the_address_local_part(
        acme, adam, vic, monkeypatch):
    """docs/notifications.md: a viewer never sees "an address's local part". A mail
    server refusing the recipient answers with the address (SMTPRecipientsRefused's text
    is ``{'ops.secret@example.com': (550, ...)}``); the delivery log a viewer reads must
    not carry it (jobs/notify.py ``send``)."""
    address = "Ops.Secret-Pager@example.com"
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "ops mail", "channel": "email", "email": address,
        "event_types": ["digest"]})
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)

    def refuse(*args, **kwargs):
        raise smtplib.SMTPRecipientsRefused(
            {address.lower(): (550, f"5.1.1 <{address}>: user unknown".encode())})

    monkeypatch.setattr(notify, "send_mail", refuse)
    assert notify.send_due()["retrying"] == 1
    _ep, [message] = selectors.notification_deliveries(user=vic, tenant=acme,
                                                       endpoint_id=endpoint.uuid)
    shown = message.last_error + " ".join(a.error for a in message.attempt_list)
    assert "SMTPRecipientsRefused" in shown
    assert "ops.secret" not in shown.lower()


def _claim(channel: str, text: str):
    return notify_delivery.Claimed(
        pk=1, tenant_id=1, event_id="evt_x", channel=channel, url="https://hooks.example.com/x",
        email="", payload={}, subject="s", text=text, secrets=[], db_now=datetime.now(UTC),
        claimed_until=datetime.now(UTC))


def test_a_slack_text_cannot_ping_the_channel_or_disguise_a_link(monkeypatch):
    """Attack (issue 21, item 5): a message's text carries what a run's writer chose (its
    agent, workflow, kind, the services of its effects, a reviewer's reason). Slack reads
    ``<!channel>`` as a mention of everyone and ``<https://evil|Run page>`` as a link
    labelled "Run page"; Slack's rule is to escape ``&``, ``<`` and ``>`` in text."""
    sent = {}

    def post(url, *, body, headers, **kwargs):
        sent["body"] = body
        return safehttp.Result(200, 1)

    monkeypatch.setattr(notify.safehttp, "post", post)
    notify.send(_claim("slack", "agent <!channel> & <https://evil.example/|Run page>"))
    text = json.loads(sent["body"])["text"]
    assert text == ("agent &lt;!channel&gt; &amp; "
                    "&lt;https://evil.example/|Run page&gt;")


def test_a_teams_text_cannot_disguise_a_link_and_keeps_our_links(monkeypatch):
    """Teams renders markdown: ``[Run page](https://evil)`` in an agent's name would be a
    link labelled "Run page". Its markup is escaped; our own bare URLs stay as they are
    (attack finding, left open by the attack and fixed after)."""
    sent = {}

    def post(url, *, body, headers, **kwargs):
        sent["body"] = body
        return safehttp.Result(200, 1)

    monkeypatch.setattr(notify.safehttp, "post", post)
    link = "https://recovery.example/t/acme/?state=unknown_outcome&kind=acme.order"
    notify.send(_claim("teams", f"agent [Run page](https://evil.example/) *now* {link}"))
    text = json.loads(sent["body"])["text"]
    assert text == rf"agent \[Run page\](https://evil.example/) \*now\* {link}"


def test_a_reconcile_due_by_the_database_clock_is_due_now_whatever_the_web_clock(
        monkeypatch):
    """Attack (issue 21, item 7): the next step says a queued reconciliation's look-up is
    "due in 1 h" or "due now" by comparing its stored ``next_attempt_at`` with the web
    process's clock; a web server an hour behind the database told the reviewer to wait
    for a look-up that was already due. The request is read with the database's time
    (``db_now``); that is the clock to compare with."""
    db = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    monkeypatch.setattr("django.utils.timezone.now", lambda: db - timedelta(hours=1))
    effect = SimpleNamespace(state=EffectState.SUBMITTED, service="payments",
                             operation_key="k")
    req = SimpleNamespace(state=ReconcileState.QUEUED, next_attempt_at=db - timedelta(seconds=5),
                          waiting_for_worker_since=None, db_now=db)
    rows = [{"req": req, "effect": effect, "broker_down": False, "waits_for_human": False}]
    step = nextstep._reconcile_step([effect], rows, None)
    assert "due now" in step.text, step.text
    req.next_attempt_at = db + timedelta(minutes=4)
    assert "due in 4 min" in nextstep._reconcile_step([effect], rows, None).text
