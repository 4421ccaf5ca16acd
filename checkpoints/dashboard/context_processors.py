"""Template context every dashboard page gets (settings ``TEMPLATES``)."""

from __future__ import annotations

import functools
import logging

from django.db import DatabaseError

from ..jobs import workerstatus

log = logging.getLogger(__name__)


def background(request) -> dict:
    """``background_late``: for a signed-in reviewer, when the deployment's background
    worker is late (``workerstatus.worker_status``, the rule ``/readyz``'s ``worker``
    check reads too; the banner "background work is not running since ..." in
    base.html), ``{"since": datetime | None, "web_sweeps": bool, "last_any": datetime |
    None}`` (its last sweep, whether the web processes sweep meanwhile, the last sweep by
    anyone), else None. Read lazily (one query, only when a page shows it); reads only;
    None when the database cannot answer."""

    @functools.cache
    def late():
        if not getattr(request, "user", None) or not request.user.is_authenticated:
            return None
        try:
            status = workerstatus.worker_status()
        except DatabaseError:
            log.warning("background banner: heartbeats unreadable", exc_info=True)
            return None
        if not status.late:
            return None
        return {"since": status.last.at if status.last else None,
                "web_sweeps": status.web_sweeps,
                "last_any": status.last_any.at if status.last_any else None}

    return {"background_late": late}
