"""Presentation-only filters for the dashboard templates (no domain logic, no queries)."""

from __future__ import annotations

import json
from datetime import datetime
from urllib.parse import urlencode

from django import template
from django.utils import timezone

register = template.Library()

#: CSS modifier per state word; states of runs, effects and retry requests share colours.
BADGE_CLASSES = {
    "ambiguous": "amber", "conflicted": "orange", "schema_mismatch": "purple",
    "unknown_outcome": "red", "awaiting_approval": "blue", "retry_approved": "teal",
    "healthy": "green", "completed": "grey", "closed": "grey",
    # effects
    "planned": "grey", "submitted": "amber", "unresolved": "amber", "confirmed": "green",
    "failed": "red", "not_executed": "teal", "unknown": "red",
    # retry requests
    "requested": "blue", "approved": "teal", "rejected": "grey", "expired": "grey",
    "consumed": "green",
    # reconcile requests and what their look-ups answered
    "queued": "blue", "running": "amber", "done": "green", "gave_up": "red",
    "cancelled": "grey", "found": "green", "cannot_tell": "orange", "no_lookup": "red",
    "owner_live": "amber", "settling": "amber", "moved_on": "grey",
    # phase classes
    "stable": "green", "in_flight": "amber", "unsupported": "purple",
}


@register.filter
def badge_class(state: str) -> str:
    """``"amber"`` etc. for a state word; ``"grey"`` for anything unknown."""
    return BADGE_CLASSES.get(str(state or ""), "grey")


@register.filter
def label(word: str) -> str:
    """``"unknown_outcome"`` -> ``"unknown outcome"``."""
    return str(word or "").replace("_", " ")


@register.filter
def shortid(value) -> str:
    """The first 8 characters of a UUID (the full id goes in a ``title``)."""
    return str(value or "")[:8]


@register.filter
def ago(when: datetime | None) -> str:
    """Compact relative time: ``"12 s ago"``, ``"4 min ago"``, ``"3 h ago"``, ``"2 d ago"``;
    ``"in 5 min"`` for the future; ``"—"`` for none."""
    if not when:
        return "—"
    seconds = int((timezone.now() - when).total_seconds())
    future = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size or unit == "s":
            text = f"{seconds // size} {unit}"
            break
    return f"in {text}" if future else f"{text} ago"


@register.filter
def compact_json(value) -> str:
    """JSON on one line with sorted keys, for receipts and before/after columns."""
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


@register.filter
def is_future(when: datetime | None) -> bool:
    """True when ``when`` is later than now (a live lease; a sweep run with a future clock)."""
    return bool(when) and when > timezone.now()


@register.simple_tag
def query(params: dict, **changes) -> str:
    """``?a=1&b=2`` from ``params`` with ``changes`` applied (empty values dropped)."""
    merged = {**(params or {}), **changes}
    clean = {k: v for k, v in merged.items() if v not in (None, "")}
    return "?" + urlencode(clean) if clean else "?"
