"""Hostile tests of issue 21 (notification endpoints, dispatch, delivery, live polls,
the approver's queue, back links, incident references, next steps).

Each test states the behaviour the contract or the module's own docstring promises; each
was written failing and passes since its defect was fixed. One test per defect.
"""

from __future__ import annotations

import smtplib

import pytest

from checkpoints import selectors, services
from checkpoints.jobs import notify

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
