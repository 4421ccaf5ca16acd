"""PostgreSQL with a connection health check that costs no round trip while the
connection is quiet (issue 22, item 3).

``CONN_HEALTH_CHECKS`` (recovery/settings.py) makes Django check a kept connection before
its first use in each request, so a database restart costs no failed request. Django's
check is ``SELECT 1``: one round trip of the eight a checkpoint PUT made. This backend
asks the connection's socket first, without waiting (``poll`` with no timeout): an idle
connection (no transaction, nothing sent) that the server closed (a restart, an idle
timeout, ``pg_terminate_backend``, a pooler's restart) has its termination message or its
end of file waiting to be read, and a healthy one has nothing. Only when something is
waiting, or the connection is not plainly idle, does Django's ``SELECT 1`` run, and it
decides as before (a failed check closes the connection; the request opens a new one).
A link cut without the server's closing reaches neither check in time; the first
statement then fails as it would after a ``SELECT 1`` that hung.

The wrapped engine is ``RECOVERY_DB_BASE_ENGINE`` (django-prometheus's PostgreSQL backend,
or Django's with ``RECOVERY_DB_METRICS=0``); everything else is that engine's.
``RECOVERY_DB_QUIET_CHECK=0`` (setting ``RECOVERY_DB_QUIET_CHECK``) gives Django's check
back.
"""

from __future__ import annotations

import select
from importlib import import_module

from django.conf import settings
from psycopg import pq

_base = import_module(f"{settings.RECOVERY_DB_BASE_ENGINE}.base")


def quiet(connection) -> bool | None:
    """``True`` when the psycopg ``connection`` is open, idle (no transaction) and has
    nothing waiting on its socket; ``False`` when something is waiting (the server wrote
    to an idle connection: usually its closing) or the socket is gone; ``None`` when it
    cannot tell (not idle, closed, no socket). Waits for nothing."""
    try:
        if connection.closed or connection.broken:
            return None
        pgconn = connection.pgconn
        if (pgconn.status != pq.ConnStatus.OK
                or pgconn.transaction_status != pq.TransactionStatus.IDLE):
            return None
        fd = pgconn.socket
    except Exception:  # noqa: BLE001 - any doubt: let Django's own check decide
        return None
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    return not poller.poll(0)


class DatabaseWrapper(_base.DatabaseWrapper):
    """The base engine's wrapper whose ``is_usable`` trusts a quiet idle connection
    (``quiet``) and runs the base engine's ``SELECT 1`` otherwise."""

    def is_usable(self):
        if (self.connection is not None and getattr(settings, "RECOVERY_DB_QUIET_CHECK", True)
                and quiet(self.connection)):
            return True
        return super().is_usable()
