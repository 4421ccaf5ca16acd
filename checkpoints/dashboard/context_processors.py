"""Template context every dashboard page gets (settings ``TEMPLATES``)."""

from __future__ import annotations

import functools
import logging

from django.conf import settings
from django.db import DatabaseError

from .. import heartbeat
from ..jobs import inprocess

log = logging.getLogger(__name__)


def background(request) -> dict:
    """``background_late``: for a signed-in reviewer, ``{"since": datetime | None, "web_sweeps": bool}`` when
    the deployment's background worker has not swept for two intervals
    (``heartbeat.background_late``; the banner "background work is not running since
    ..." in base.html), else None. Read lazily (one query, only when a page shows it);
    reads only; None when the database cannot answer."""

    @functools.cache
    def late():
        if not getattr(request, "user", None) or not request.user.is_authenticated:
            return None
        try:
            is_late, since = heartbeat.background_late()
        except DatabaseError:
            log.warning("background banner: heartbeats unreadable", exc_info=True)
            return None
        if not is_late or (heartbeat.background_source() == "sweep.inprocess"
                           and inprocess.first_round_pending()):
            return None  # the in-process worker's first round may not have come yet
        return {"since": since,
                "web_sweeps": heartbeat.broker_configured() and settings.RECOVERY_SWEEP_WATCHDOG}

    return {"background_late": late}
