"""Publishing stored background work to the task queue, one message per row: the one
send loop of reconcile requests (``reconcile_requests.dispatch``), stored migration jobs
(``migration_jobs.migration_job_dispatch``) and stored bulk jobs
(``bulk_jobs.bulk_job_dispatch``, both through ``migration_jobs.stored_jobs_send``).

A row is the truth and a message only a nudge (a claim makes a second delivery harmless),
so what a send records must say, row by row, what happened: a row whose message the broker
took is marked ``dispatched_at``; a row whose message was not published keeps its queued
state with ``last_error`` saying the broker was unavailable, and the sweep's re-drive sends
it later. A broker that fails after some messages were published must not mark those
(they are on their way) as failed, nor leave them looking undispatched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery import current_app
from django.db import transaction
from django.db.models import Case, F, TextField, Value, When

from ..dbclock import NOW
from ..heartbeat import BROKER_DOWN

log = logging.getLogger(__name__)

#: The words of a send the task queue took whole, and of one it refused from the first
#: message (``Published.detail``).
ALL_SENT = "queued for a worker"
NONE_SENT = ("queued; the task queue is unavailable, so it will run when the worker is "
             "back (nothing is lost)")


@dataclass(frozen=True)
class Published:
    """What ``send_stored`` did: ``sent`` (primary keys whose message the broker took, in
    the order given), ``unsent`` (the rest, in order: not published, left for the sweep)
    and ``error`` (the publish error that stopped the loop, None when all were sent)."""

    sent: list[int]
    unsent: list[int]
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        """Whether every row was handed to the task queue."""
        return not self.unsent

    @property
    def detail(self) -> str:
        """The same in words for people: all sent, none sent (the task queue unavailable),
        or how many of how many were sent and that the rest wait for the worker (nothing
        is lost either way)."""
        if self.ok:
            return ALL_SENT
        if not self.sent:
            return NONE_SENT
        total = len(self.sent) + len(self.unsent)
        return (f"{len(self.sent)} of {total} queued for a worker; the task queue then "
                f"became unavailable, so the other {len(self.unsent)} will run when the "
                "worker is back (nothing is lost)")


def send_stored(every, pks: list[int], *, task: str, queued: str,
                countdown: float | None = None) -> Published:
    """Publish one Celery ``task`` message (by name, ``args=[pk]``, ``countdown`` seconds
    or None) for each of ``pks`` in order, and record per row what happened. ``every``:
    the rows' model, all tenants (the caller's ``for_all_tenants`` with its reason);
    ``queued``: that model's queued state.

    The loop stops at the first publish error (any exception: the broker is down or
    refusing; trying the rest would only wait on it again, inside the caller's answer).
    Then, in one transaction on the database clock: the rows sent before it get
    ``dispatched_at = NOW`` (whatever their state: a worker may have claimed one already);
    the rows not sent that are still ``queued`` get ``last_error`` naming
    ``heartbeat.BROKER_DOWN`` and the exception's type (what ``selectors.nextstep`` reads
    as "waits for the task queue"), and keep no ``dispatched_at``. Their
    ``next_attempt_at`` is unchanged, so the sweep's re-drive sends them again once due
    (``reconcile_requests.redrive``, ``migration_jobs_redrive``, ``bulk_jobs_redrive``).
    Raises nothing for a broker failure (it is reported in ``Published``); a database
    error propagates. Callers check that a broker is configured first."""
    sent: list[int] = []
    error: Exception | None = None
    for pk in pks:
        try:
            current_app.send_task(task, args=[pk], countdown=countdown)
        except Exception as exc:  # noqa: BLE001 - any broker failure: keep the rows, say so
            error = exc
            break
        sent.append(pk)
    unsent = list(pks[len(sent):])
    with transaction.atomic():
        if sent:
            # An earlier send's "broker unavailable" is no longer true of a row on its way
            # (the helper's finding: a job re-sent after an outage showed it until it
            # ended); any other error (a look-up's, a batch's) stays. One statement.
            every.filter(pk__in=sent).update(dispatched_at=NOW, last_error=Case(
                When(last_error__startswith=BROKER_DOWN, then=Value("")),
                default=F("last_error"), output_field=TextField()))
        if unsent:
            why = (f"{BROKER_DOWN} ({type(error).__name__}); queued, will run when the "
                   "worker is back")
            every.filter(pk__in=unsent, state=queued).update(last_error=why[:500])
    if error is not None:
        log.warning("sending %s stopped: %s sent, %s stay queued: %s", task, sent, unsent,
                    error)
    return Published(sent, unsent, error)
