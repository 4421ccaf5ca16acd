"""Presentation-only filters for the dashboard templates (no domain logic, no queries)."""

from __future__ import annotations

import json
from datetime import datetime
from urllib.parse import urlencode

from django import template
from django.utils import timezone

from ..vocab import (
    BulkOutcome,
    BulkState,
    EffectState,
    PhaseClass,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    RetryState,
)

register = template.Library()

_R, _E, _T, _Q, _A, _P = (RecoveryState, EffectState, RetryState, ReconcileState,
                          ReconcileAnswer, PhaseClass)
#: CSS modifier per state word; states of runs, effects and retry requests share colours
#: (a word in two enums, e.g. ``failed``, has one colour).
BADGE_CLASSES = {
    _R.AMBIGUOUS: "amber", _R.CONFLICTED: "orange", _R.SCHEMA_MISMATCH: "purple",
    _R.UNKNOWN_OUTCOME: "red", _R.AWAITING_APPROVAL: "blue", _R.RETRY_APPROVED: "teal",
    _R.HEALTHY: "green", _R.COMPLETED: "grey", _R.CLOSED: "grey",
    _E.PLANNED: "grey", _E.SUBMITTED: "amber", _E.UNRESOLVED: "amber", _E.CONFIRMED: "green",
    _E.FAILED: "red", _E.NOT_EXECUTED: "teal", _E.UNKNOWN: "red",
    _T.REQUESTED: "blue", _T.APPROVED: "teal", _T.REJECTED: "grey", _T.EXPIRED: "grey",
    _T.CONSUMED: "green",
    # reconcile requests and what their look-ups answered
    _Q.QUEUED: "blue", _Q.RUNNING: "amber", _Q.DONE: "green", _Q.GAVE_UP: "red",
    _Q.CANCELLED: "grey", _A.FOUND: "green", _A.CANNOT_TELL: "orange", _A.NO_LOOKUP: "red",
    _A.OWNER_LIVE: "amber", _A.SETTLING: "amber", _A.MOVED_ON: "grey",
    _P.STABLE: "green", _P.IN_FLIGHT: "amber", _P.UNSUPPORTED: "purple",
    # bulk actions: a run's outcome (done/failed share the words above), the bulk's state
    BulkOutcome.REFUSED: "orange", BulkState.FINISHED: "green",
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
