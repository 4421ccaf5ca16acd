"""A notification sender SIGKILLed between its claim's commit and the receiver's answer
(issue 21, "Tests": "a crash of the sender between commit and send (SIGKILL) delivers
once later, duplicates carry the same id"). ``manage.py notify_send`` runs as a real
process on the test database; the loopback receiver holds the request open; the test
kills the sender there. The claim it committed keeps other senders off until it passes
(aged here, never slept); the next round sends the message again with the SAME
``webhook-id`` and it is delivered."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest
from standardwebhooks import Webhook

from checkpoints import services
from checkpoints.jobs import notify
from checkpoints.models import NotificationAttempt, NotificationMessage
from checkpoints.services.notify_delivery import CLAIM_MARGIN_S
from checkpoints.vocab import DeliveryState
from tests.helpers import age_world
from tests.notifications.receiver import Receiver

from .conftest import ROOT
from .test_migration_death import database_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_a_sender_killed_mid_send_delivers_later_with_the_same_id(acme, adam, receiver,
                                                                  settings):
    settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = settings.RECOVERY_NOTIFY_ALLOW_HTTP = True
    endpoint, secret = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "hook", "channel": "webhook", "url": receiver.url,
        "event_types": ["run.needs_review"]})
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    receiver.block = threading.Event()  # the first request hangs: the sender waits
    env = {**database_env(), "RECOVERY_NOTIFY_ALLOW_PRIVATE": "1",
           "RECOVERY_NOTIFY_ALLOW_HTTP": "1"}
    proc = subprocess.Popen([sys.executable, "manage.py", "notify_send"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert receiver.arrived.wait(60), proc.stderr.read() if proc.poll() else "no request"
        proc.kill()  # SIGKILL, mid-send: the claim is committed, no outcome recorded
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    receiver.block.set()
    receiver.block = None
    message.refresh_from_db()
    assert message.state == DeliveryState.PENDING and message.claimed_until is not None
    assert not NotificationAttempt.objects.for_tenant(acme).exists()
    assert notify.send_due()["sent"] == 0  # the dead sender's claim still holds
    age_world(settings.RECOVERY_NOTIFY_TIMEOUT_S + CLAIM_MARGIN_S + 1)
    assert notify.send_due()["delivered"] == 1
    message = NotificationMessage.objects.for_tenant(acme).get(pk=message.pk)
    assert message.state == DeliveryState.DELIVERED
    assert [h["webhook-id"] for h, _ in receiver.seen] == [message.event_id] * 2
    assert receiver.ids == [message.event_id]  # a deduplicating receiver acts once
    for headers, body in receiver.seen:
        Webhook(secret).verify(body, headers)
