"""Deleting a notification endpoint while something writes a row naming it (stop 34's attack,
found by an attack), on real PostgreSQL: the delete never fails, the writer never fails,
and nothing of the endpoint is left behind.

The defect: ``endpoint_delete`` held the endpoint ``FOR NO KEY UPDATE``, which does not
conflict with the ``FOR KEY SHARE`` an insert's foreign-key check takes, and the digest
step read its endpoints unlocked: a digest committed between the delete's collecting the
endpoint's messages and its ``COMMIT`` made the delete fail at ``COMMIT`` (``IntegrityError``
on ``checkpoints_notificationmessage``; the API answered 500).

Both orders are forced, none by sleeping: a step waits until the other connection is
blocked on a lock (``pg_blocking_pids``, read live even inside a transaction) or has
finished, whichever comes first.

- The delete first: while it runs (its ``pre_delete`` signal: the endpoint's messages
  collected, the endpoint not gone yet), each writer of a row naming an endpoint runs on
  another connection. It waits for the delete (or skips a held endpoint), then finds the
  endpoint gone and skips it (the dispatcher, the sender) or answers "not found" (an
  admin's test send or resend); the delete commits.
- The writer first: while it holds the endpoint (before its insert), the delete is asked
  on another connection; it waits for the writer to commit, then deletes the endpoint with
  what the writer wrote.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.db.models.signals import pre_delete

from checkpoints import services
from checkpoints.exceptions import NotFound
from checkpoints.models import (
    NotificationAttempt,
    NotificationEndpoint,
    NotificationIncident,
    NotificationMessage,
)
from checkpoints.services import notify_delivery
from checkpoints.services import notify_dispatch as nd
from checkpoints.vocab import DeliveryState
from checkpoints.vocab import NotificationEventType as E
from tests.helpers import age_world, sweep_later
from tests.services.test_notify_dispatch import WINDOW, endpoint, in_flight
from tests.transactional.test_lock_order import _in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _blocked_or_done(box: dict, timeout_s: float = 20) -> str:
    """``"blocked"`` once the thread's connection waits for a lock another holds,
    ``"done"`` once the thread finished (whichever is seen first)."""
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            if "result" in box or "error" in box:
                return "done"
            pid = box.get("pid")
            if pid is not None:
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [pid])
                if cursor.fetchone()[0]:
                    return "blocked"
            time.sleep(0.01)
    raise AssertionError("the other connection neither finished nor waited for a lock")


def _nothing_left(ep) -> None:
    assert not NotificationEndpoint.objects.filter(pk=ep.pk).exists()
    assert not NotificationMessage.objects.filter(endpoint_id=ep.pk).exists()
    assert not NotificationIncident.objects.filter(endpoint_id=ep.pk).exists()
    assert not NotificationAttempt.objects.exists()


# --- the writers, each with its world (returns the endpoint, the write, what it answers
# once the endpoint is gone) -----------------------------------------------------------

def _digest(acme, wendy, adam, settings):
    settings.RECOVERY_NOTIFY_DIGEST_HOUR = 0
    ep = endpoint(acme, adam, name="mail", channel="email", url="",
                  email="ops@example.com", event_types=[E.DIGEST])
    in_flight(wendy, acme)
    sweep_later()
    return ep, nd._emit_digests, 0


def _per_event(acme, wendy, adam, settings):
    ep = endpoint(acme, adam, group_window_s=0)
    in_flight(wendy, acme)
    sweep_later()
    return ep, nd._drain_batch, (1, 0)  # the row drained, no message


def _incident_page(acme, wendy, adam, settings):
    ep = endpoint(acme, adam)
    in_flight(wendy, acme)
    sweep_later()
    assert nd._drain_batch() == (1, 0)  # the run joined an incident
    age_world(WINDOW + 1)
    return ep, nd._flush_incidents, (0, 0)


def _attempt(acme, wendy, adam, settings):
    ep = endpoint(acme, adam)
    services.notification_test(actor=adam, tenant=acme, endpoint_id=ep.uuid)
    (claim,) = notify_delivery.claim_due()
    return ep, lambda: notify_delivery.record_attempt(claim, ok=True, status=200,
                                                      latency_ms=5), "gone"


def _test_send(acme, wendy, adam, settings):
    ep = endpoint(acme, adam)
    return ep, lambda: services.notification_test(actor=adam, tenant=acme,
                                                  endpoint_id=ep.uuid), NotFound


def _resend(acme, wendy, adam, settings):
    ep = endpoint(acme, adam)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=ep.uuid)
    NotificationMessage.objects.filter(pk=message.pk).update(state=DeliveryState.FAILED)
    return ep, lambda: services.notification_resend(
        actor=adam, tenant=acme, endpoint_id=ep.uuid, event_id=message.event_id), NotFound


WRITERS = {"digest": _digest, "per-event message": _per_event,
           "incident page": _incident_page, "delivery attempt": _attempt,
           "test send": _test_send, "resend": _resend}
#: Each writer waits for the delete, but the incident flush, which skips an endpoint
#: another transaction holds (``SKIP LOCKED``: the next round looks again).
SKIPS = {"incident page"}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_writer_during_the_delete_waits_then_skips_the_endpoint(acme, wendy, adam,
                                                                  settings, writer):
    ep, write, gone = WRITERS[writer](acme, wendy, adam, settings)
    seen: dict = {}

    def meanwhile(sender, instance, **kwargs):
        if instance.pk != ep.pk or "thread" in seen:
            return
        seen["thread"], seen["box"] = _in_thread(write)
        seen["state"] = _blocked_or_done(seen["box"])

    pre_delete.connect(meanwhile, sender=NotificationEndpoint, dispatch_uid="d4-race")
    try:
        services.endpoint_delete(actor=adam, tenant=acme, endpoint_id=ep.uuid)
    finally:
        pre_delete.disconnect(sender=NotificationEndpoint, dispatch_uid="d4-race")
        if "thread" in seen:
            seen["thread"].join(timeout=30)
    assert not seen["thread"].is_alive(), "the writer is stuck"
    assert seen["state"] == ("done" if writer in SKIPS else "blocked"), seen
    box = seen["box"]
    if isinstance(gone, type):
        assert isinstance(box.get("error"), gone), box
    else:
        assert "error" not in box, box
        assert box["result"] == gone, box
    _nothing_left(ep)


def _hook(monkeypatch, owner, name, acme, adam, ep) -> dict:
    """Replace ``owner.name`` so that its first call (the writer holds the endpoint and
    has not inserted yet) asks for the endpoint's delete on another connection and waits
    until that delete waits for a lock (or finished)."""
    original = getattr(owner, name)
    seen: dict = {}

    def hooked(*args, **kwargs):
        if "thread" not in seen:
            seen["thread"], seen["box"] = _in_thread(lambda: services.endpoint_delete(
                actor=adam, tenant=acme, endpoint_id=ep.uuid))
            seen["state"] = _blocked_or_done(seen["box"])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, hooked)
    return seen


@pytest.mark.parametrize("writer", ["digest", "per-event message"])
def test_a_delete_during_a_write_waits_and_takes_what_was_written(acme, wendy, adam,
                                                                  settings, monkeypatch,
                                                                  writer):
    ep, write, _ = WRITERS[writer](acme, wendy, adam, settings)
    if writer == "digest":
        seen = _hook(monkeypatch, nd, "_digest", acme, adam, ep)
        wrote = 1
    else:
        seen = _hook(monkeypatch, nd._Batch, "write", acme, adam, ep)
        wrote = (1, 1)
    try:
        result = write()
    finally:
        if "thread" in seen:
            seen["thread"].join(timeout=30)
    assert result == wrote
    assert not seen["thread"].is_alive(), "the delete is stuck"
    assert seen["state"] == "blocked", "the delete did not wait for the writer"
    assert seen["box"] == {"pid": seen["box"]["pid"], "result": None}, seen["box"]
    _nothing_left(ep)
