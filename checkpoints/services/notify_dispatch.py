"""Notification dispatch (issue 21, items 2-3; docs/notifications.md): the outbox
(``NotificationOutbox``) turned into incidents and messages.

SKELETON: the events helper fills this in. Interface the sender and the scheduler use:

- ``dispatch_round() -> dict``: drain the outbox (id order, batches, each in its own
  transaction, ``SKIP LOCKED`` so several workers may run it), open/extend incidents, turn
  ended windows into messages, emit ``outcome.unknown_aging`` and the daily ``digest``;
  returns counts. Safe to run anywhere at any time; writes only through this module.
- ``notify_emit(*, tenant, event_type, run=None, detail=None)``: write one outbox row for an
  event that is not a run state change (``reconcile.gave_up``), inside the caller's
  transaction.
"""

from __future__ import annotations

from ..models import NotificationOutbox


def notify_emit(*, tenant, event_type: str, run=None, detail: dict | None = None) -> None:
    """Record one event in the outbox, in the caller's transaction (so it commits with the
    change it reports, or not at all)."""
    NotificationOutbox.objects.create(tenant=tenant, run=run, event_type=event_type,
                                      detail=detail or {})


def dispatch_round() -> dict:
    """Drain the outbox into incidents and messages (SKELETON: does nothing yet)."""
    return {"dispatched": 0}
