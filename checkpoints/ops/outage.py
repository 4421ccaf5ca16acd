"""One answer to "is this exception an outage of a service we depend on?" (issue 17,
item 12), for the API's 503 ``{"error": "unavailable"}`` (``checkpoints.api.errors``)
and the dashboard's 503 page alike, so the two cannot drift.

An outage is the database refusing or losing the connection, shutting down, or a
retryable transaction failure (``OperationalError``, ``InterfaceError``: Django's, which
wrap the driver's, and psycopg's and sqlite3's own where one escapes Django's wrapper),
or the Celery broker (kombu's ``OperationalError``). Retrying helps: the answer is 503
with ``Retry-After: RETRY_AFTER_S``; anything else is a 500 (a defect, not an outage).
"""

from __future__ import annotations

import sqlite3

from django.db import InterfaceError, OperationalError
from kombu.exceptions import OperationalError as BrokerError

try:
    import psycopg
except ImportError:  # pragma: no cover - psycopg is a dependency; SQLite-only installs
    _PSYCOPG: tuple[type[BaseException], ...] = ()
else:
    _PSYCOPG = (psycopg.OperationalError, psycopg.InterfaceError)

#: Seconds a client is asked to wait before retrying a 503.
RETRY_AFTER_S = 5
#: The database is down or the connection to it lost.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError, InterfaceError, sqlite3.OperationalError, sqlite3.InterfaceError,
    *_PSYCOPG)
#: The task broker is down.
BROKER_ERRORS: tuple[type[BaseException], ...] = (BrokerError,)
#: Every exception that means "a service we depend on is down", not "this request is
#: wrong".
UNAVAILABLE = DATABASE_ERRORS + BROKER_ERRORS


def unavailable_service(exc: BaseException | None) -> str | None:
    """``"database"`` or ``"broker"`` when ``exc`` (or the exception it was raised from,
    ``raise ... from``, a few levels deep) is an outage of that service, else ``None``."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, BROKER_ERRORS):
            return "broker"
        if isinstance(exc, DATABASE_ERRORS):
            return "database"
        exc = exc.__cause__
        seen += 1
    return None
