"""Presentation-only filters for the dashboard templates (no domain logic, no queries)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from urllib.parse import urlencode

from django import template
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import ngettext

from .. import auditwords
from ..kinds import USAGE_COUNTERS
from ..selectors import nextstep
from ..vocab import BADGE_CLASSES, ErasureState, words

register = template.Library()

@register.filter
def badge_class(state: str) -> str:
    """``"amber"`` etc. for a state word; ``"grey"`` for anything unknown."""
    return BADGE_CLASSES.get(str(state or ""), "grey")


@register.filter
def label(word: str) -> str:
    """``"unknown_outcome"`` -> ``"unknown outcome"`` (``vocab.words``)."""
    return words(word)


@register.filter
def usage_text(usage) -> str:
    """Usage counters for people: ``{"turns": 1, "tokens": 702}`` -> ``"tokens 702 ·
    turns 1"``: runifold's counters in runifold's order (``kinds.USAGE_COUNTERS``), then
    any other by name, whatever order the database kept them in (PostgreSQL's ``jsonb``
    orders keys by length); ``""`` when there are none (or not a mapping)."""
    if not isinstance(usage, dict):
        return ""
    order = {name: i for i, name in enumerate(USAGE_COUNTERS)}
    names = sorted(usage, key=lambda name: (order.get(name, len(order)), name))
    return " · ".join(f"{words(name)} {usage[name]}" for name in names)


@register.filter
def shortid(value) -> str:
    """The first 8 characters of a UUID (the full id goes in a ``title``)."""
    return str(value or "")[:8]


@register.filter
def ago(when: datetime | None) -> str:
    """Compact relative time: ``"12 s ago"``, ``"4 min ago"``, ``"3 h ago"``, ``"2 d ago"``;
    ``"in 5 min"`` for the future; ``"—"`` for none (``selectors.nextstep.ago``, whose
    next-step sentences say it the same way)."""
    return nextstep.ago(when)


@register.filter
def duration(seconds) -> str:
    """A duration for people (issue 21, item 10): seconds as its two largest units,
    ``287`` -> ``"4 min 47 s"``, ``3600`` -> ``"1 h"``, ``93784`` -> ``"1 d 2 h"``,
    ``0`` -> ``"0 s"``; a ``timedelta`` too. What is no number shows as it is; ``None``
    as ``"—"``."""
    if seconds is None or seconds == "":
        return "—"
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    try:
        left = abs(int(seconds))
    except (TypeError, ValueError, OverflowError):
        return str(seconds)
    parts = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
        if len(parts) == 2 or (parts and left == 0):
            break
    return " ".join(parts[:2]) or "0 s"


def _utc(when: datetime) -> datetime:
    return when.astimezone(UTC) if timezone.is_aware(when) else when.replace(tzinfo=UTC)


@register.filter
def when(value: datetime | None) -> SafeString | str:
    """A time for people (issue 9, item 5): ``<time datetime="2026-12-01T00:27:46.000Z"
    title="2026-12-01 00:27:46 UTC" data-now="2026-12-01T00:30:46.120Z">3 min ago</time>``;
    ``"—"`` for none. The relative words are ``ago``'s, against the request's database
    time (``nextstep.words_now``), which ``data-now`` carries; the ``title`` is the absolute
    UTC time (what a page without JavaScript shows on hover). ``static/js/app.js`` adds
    the time in the browser's zone beside the words and in the title, and keeps the words
    true while the page stays open: it counts the time since the page showed them onto
    ``data-now`` (so a browser whose clock is off still says what the server would). The
    words are measured between the two values as written (both to the millisecond),
    which the script's first tick reads back: a lease live for another 0.4 s is "in 0 s"
    on the page and in the script alike (the stop-37 attack's finding)."""
    if not value:
        return "—"
    utc, now = _to_ms(_utc(value)), _to_ms(_utc(nextstep.words_now()))
    return format_html('<time datetime="{}" title="{} UTC" data-now="{}">{}</time>',
                       _iso_ms(utc), utc.strftime("%Y-%m-%d %H:%M:%S"), _iso_ms(now),
                       nextstep.ago(utc, now))


def _to_ms(when: datetime) -> datetime:
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


def _iso_ms(when: datetime) -> str:
    """``2026-12-01T00:27:46.120Z``: a UTC time to the millisecond, as ``<time>`` and the
    script (``Date.parse``) read it."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _from_ms(ms) -> datetime | None:
    """An aware UTC datetime for epoch milliseconds, or ``None`` for what is not one
    (not an integer, or outside the years 1..9999)."""
    if isinstance(ms, bool) or not isinstance(ms, int | str):
        return None
    try:
        return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


@register.filter
def ms_time(ms) -> SafeString | str:
    """Epoch milliseconds (an envelope's ``updated_at_ms``, a receipt's ``*_ms``) as the
    raw number followed by ``when``'s ``<time>``: ``1764549000000 (<time …>3 min ago</time>)``.
    A value that is no time shows as it is; ``None`` as ``"—"``."""
    if ms is None or ms == "":
        return "—"
    at = _from_ms(ms)
    if at is None:
        return str(ms)
    return format_html('<span class="mono">{}</span> <span class="ms-time">({})</span>',
                       ms, when(at))


#: A pretty-printed JSON line whose key ends in ``_ms`` and whose value is an integer.
_MS_LINE = re.compile(r'^(\s*"[^"\n]*_ms": )(-?\d{1,19})(,?)$')


@register.filter
def json_times(text: str | None) -> SafeString | str:
    """Revealed JSON (``json.dumps(..., indent=2)``) with every ``"…_ms": <integer>``
    line followed by its time (``when``) in a ``<span class="ms-note">`` that copying
    the JSON leaves out (``user-select: none``). Everything else is escaped as usual."""
    if text is None:
        return ""
    out = []
    for line in str(text).split("\n"):
        match = _MS_LINE.match(line)
        at = _from_ms(match.group(2)) if match else None
        if at is None:
            out.append(conditional_escape(line))
        else:
            out.append(format_html('{}<span class="ms-note"> ⏱ {}</span>',
                                   line, when(at)))
    return mark_safe("\n".join(out))  # noqa: S308 - every part is escaped above


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@register.filter
def copyable(value, what: str = "") -> SafeString | str:
    """A long value (an id, a key, a reason, a lease owner) that fits its box: the text
    clipped with an ellipsis by CSS (``.long``; a UUID shows its first 8 characters),
    the full value in the ``title``, and a copy button (``data-copy``, handled by
    ``static/js/app.js``) labelled ``what`` (``"run id"``). ``"—"`` for an empty value."""
    text = "" if value is None else str(value)
    if not text:
        return "—"
    shown = text[:8] if _UUID.match(text) else text
    return format_html('<span class="copyable"><span class="long mono" title="{}">{}</span>{}'
                       '</span>', text, shown, copy_button(text, what))


@register.filter
def copy_button(value, what: str = "") -> SafeString | str:
    """Only ``copyable``'s copy button, for a value already shown in full."""
    text = "" if value is None else str(value)
    if not text:
        return ""
    label = f"Copy {what}".strip() if what else "Copy"
    return format_html('<button type="button" class="copy-btn" data-copy="{}" title="{}" '
                       'aria-label="{}">copy</button>', text, label, label)


@register.filter
def audit_sentence(event, names=None) -> str:
    """``auditwords.sentence``: the event as one readable sentence (``names``: readable
    names by target ref, e.g. ``{effect uuid: "charge:A-7 at payments"}``)."""
    return auditwords.sentence(event, names)


@register.simple_tag(takes_context=True)
def audit_names(context, events) -> dict[str, str]:
    """``{% audit_names events as names %}``: readable names by target ref for
    ``audit_sentence``: those named by the effect writes among ``events``
    (``auditwords.names_from_events``), then the run page's ``effects`` (items with an
    ``effect``) when the context has them."""
    names = auditwords.names_from_events(events or [])
    for item in context.get("effects") or []:
        effect = getattr(item, "effect", None) or (item.get("effect") if isinstance(item, dict)
                                                   else item)
        key, service = getattr(effect, "operation_key", ""), getattr(effect, "service", "")
        if key and service:
            names[str(effect.uuid)] = f"{key} at {service}"
    return names


@register.filter
def pretty_json(value) -> str:
    """JSON indented by 2 with sorted keys (the audit trail's before/after toggle)."""
    if value is None:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def compact_json(value) -> str:
    """JSON on one line with sorted keys, for receipts and before/after columns."""
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


@register.filter
def is_future(when: datetime | None, now: datetime) -> bool:
    """True when ``when`` is later than ``now``, the database's time the page's row was
    read with (``selectors.run_get``'s ``db_now``), never this process's clock
    (CONTRACT.md 3). Raises ``TypeError`` when ``now`` is not a time (a template that
    did not pass one)."""
    if not isinstance(now, datetime):
        raise TypeError(f"is_future needs the database time, got {now!r}")
    return bool(when) and when > now


@register.simple_tag
def query(params: dict, **changes) -> str:
    """``?a=1&b=2`` from ``params`` with ``changes`` applied (empty values dropped)."""
    merged = {**(params or {}), **changes}
    clean = {k: v for k, v in merged.items() if v not in (None, "")}
    return "?" + urlencode(clean) if clean else "?"


def _blocked_words(counts: dict) -> str:
    """How many runs each blocker stopped: ``"1 under legal hold, 2 not ended"``."""
    return ", ".join(f"{counts[k]} {label}" for k, label in (
        ("legal_hold", "under legal hold"), ("not_ended", "not ended"),
        ("effect_in_doubt", "with an effect in doubt"), ("already_deleted", "already deleted"))
        if counts.get(k))


def erasure_counts_words(counts: dict) -> str:
    """An executed erasure request's ``counts`` (``services.erasure``) in words, the one
    wording of the requests page, the Data page and the approval's notice:
    ``"2 runs erased; 1 not erased (1 under legal hold): a new request is needed once
    that changes"``; a request that matched no run (``runs`` 0: no run of the tenant
    was named or found for the subject) ``"it matched no run (0): nothing to erase"``,
    not "0 runs erased", which read as if something had stopped it; one whose every run
    was blocked ``"nothing erased: 1 run not erased (1 under legal hold): ..."``
    (``ErasureOutcome.NOTHING_ERASED``, the recon newcomer's finding)."""
    if not counts.get("runs"):
        return "it matched no run (0): nothing to erase"
    erased = counts.get("erased", 0)
    blocked = counts.get("blocked", 0)
    if not erased and blocked:
        return (ngettext("nothing erased: %d run not erased", "nothing erased: all %d runs "
                         "not erased", blocked) % blocked
                + f" ({_blocked_words(counts)}): a new request is needed once that changes")
    out = ngettext("%d run erased", "%d runs erased", erased) % erased
    if blocked:
        out += f"; {blocked} not erased ({_blocked_words(counts)}): a new request " \
               "is needed once that changes"
    return out


def erasure_preview_words(preview: dict) -> str:
    """A waiting request's preview (``services.erasure_preview``) in words, for the
    approver before approving: ``"if approved now: 2 runs would be erased; 1 would not
    (1 under legal hold)"``, ``"if approved now: nothing would be erased (1 run: 1 under
    legal hold)"``, ``"if approved now: it matches no run: nothing to erase"``."""
    if not preview.get("runs"):
        return "if approved now: it matches no run: nothing to erase"
    erased, blocked = preview.get("erased", 0), preview.get("blocked", 0)
    if not erased:
        runs = ngettext("%d run", "%d runs", blocked) % blocked
        return f"if approved now: nothing would be erased ({runs}: {_blocked_words(preview)})"
    out = "if approved now: " + ngettext("%d run would be erased", "%d runs would be erased",
                                         erased) % erased
    if blocked:
        out += f"; {blocked} would not ({_blocked_words(preview)})"
    return out


@register.filter
def erasure_outcome(request) -> str:
    """An ``ErasureRequest``'s counts column: ``erasure_counts_words`` once executed;
    before, why there is no count, as the API's ``counts`` is null then: ``"not counted
    yet: counted when approved"`` (waiting for a decision; with its ``preview`` set,
    ``erasure_preview_words``: what approving it now would do), ``"never counted:
    rejected, nothing erased"``. Counts of the tenant's own runs only, never a subject
    value."""
    if request.state == ErasureState.EXECUTED and request.counts:
        return erasure_counts_words(request.counts)
    if request.state == ErasureState.REJECTED:
        return "never counted: rejected, nothing erased"
    if request.preview is not None:  # what approving it now would do (the approver's view)
        return erasure_preview_words(request.preview)
    return "not counted yet: counted when approved"
