"""The report's range: ``24h``, ``7d``, ``30d`` or ``custom`` (``ReportRangeForm``), its
window on the database clock and its buckets (``window``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from django import forms
from django.utils.dateparse import parse_date, parse_datetime

from ..exceptions import InvalidPayload
from ..querystring import refusal_words, single_values

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
#: Every figure a CSV can be asked for (``?figure=``), in the page's order.
FIGURES = ("runs_entering", "schema_mismatches", "conflicts", "reconcile_outcomes",
           "reconcile_answers", "time_to_resolve_s", "resume_age_ms",
           "checkpoint_size_bytes", "approvals", "recovery_cost")


#: The columns of a percentile summary.
STATS = ("n", "p50", "p95", "max")
CUSTOM = "custom"
DEFAULT_RANGE = "7d"
MAX_CUSTOM_DAYS = 366
MIN_CUSTOM = timedelta(hours=1)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
#: A custom range ends at the latest at this instant (``to=8999-12-31`` is the last day),
#: far from the end of Python's calendar (9999-12-31): no range, bucket or zone change
#: can overflow ``datetime``.
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
#: Ranges up to this long are drawn in hours, longer ones in days.
HOURLY_UP_TO = timedelta(days=3)
HOUR, DAY = "hour", "day"
BUCKET_SIZE = {HOUR: timedelta(hours=1), DAY: timedelta(days=1)}


@dataclass(frozen=True)
class ReportRange:
    """A report's range: ``name`` (``RANGES`` key or ``custom``), ``[start, end)`` as
    aware UTC datetimes, the bucket size (``hour``/``day``) and ``as_of``, the database
    time the report was read at."""

    name: str
    start: datetime
    end: datetime
    bucket: str
    as_of: datetime

    def buckets(self) -> list[datetime]:
        """The start of every bucket, first one holding ``start``, in order."""
        step = BUCKET_SIZE[self.bucket]
        first = _truncate(self.start, self.bucket)
        out = []
        while first < self.end:
            out.append(first)
            first += step
        return out


def _truncate(value: datetime, bucket: str) -> datetime:
    value = value.astimezone(UTC)
    if bucket == HOUR:
        return value.replace(minute=0, second=0, microsecond=0)
    return value.replace(hour=0, minute=0, second=0, microsecond=0)


def _when(text: str, field: str, *, end: bool) -> datetime:
    """``text`` (ISO 8601 date or date-time) as an aware UTC datetime; a date alone is
    its midnight (the day after for ``to``, so ``to=2026-11-30`` includes that day).
    Raises ``InvalidPayload`` naming ``field``: not a date, or outside
    ``[EARLIEST, LATEST]`` once in UTC.

    The one reading of ``from``/``to`` for the report page and ``GET …/report`` alike
    (both reach it through ``window`` with the text as given: ``ReportRangeForm`` strips
    nothing, as the API's ``ReportParams``): a character outside ASCII (``２０２６``,
    ``٢٠٢٦``: Django's parsers read any Unicode digit) or whitespace around the text
    (``parse_date``'s ``$`` even takes a trailing newline) is refused, not read (stop 34's attack: the
    page took ``2026-01-01T00:00Z `` that the API refused).

    The year is checked as written, before any arithmetic or change of zone: Python's
    ``datetime`` ends at the years 1 and 9999, and ``9999-12-31`` as a ``to`` (the
    midnight after it) or ``0001-01-01T00:00+01:00`` in UTC would raise ``OverflowError``
    (a 500) instead of this 400."""
    if not text.isascii() or text != text.strip():
        raise InvalidPayload(f"{field}: not an ISO 8601 date or date-time (2026-11-30 or "
                             "2026-11-30T12:00Z: ASCII digits 0-9, nothing around it)")
    try:  # a date alone first: Python's ``fromisoformat`` would read it as a midnight
        day = parse_date(text)
        moment = None if day else parse_datetime(text)
    except (ValueError, OverflowError):
        moment = day = None
    if moment is None and day is None:
        raise InvalidPayload(f"{field}: not an ISO 8601 date or date-time "
                             f"(2026-11-30 or 2026-11-30T12:00Z)")
    year = (moment or day).year
    if year < EARLIEST.year:
        raise InvalidPayload(f"{field}: must be in the year {EARLIEST.year} or later")
    if year >= LATEST.year:
        raise InvalidPayload(f"{field}: must be before the year {LATEST.year}")
    if moment is None:
        moment = datetime.combine(day + timedelta(days=1) if end else day, time(),
                                  tzinfo=UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)   # within a day of years 2000..8999: no overflow
    if moment < EARLIEST:
        raise InvalidPayload(f"{field}: must be in the year {EARLIEST.year} or later")
    if moment > LATEST:
        raise InvalidPayload(f"{field}: must be before the year {LATEST.year}")
    return moment


def window(range_name: str | None, start: str | None, end: str | None,
           as_of: datetime) -> ReportRange:
    """The ``ReportRange`` of the query parameters ``range``/``from``/``to`` (already checked
    for type and length by ``ReportRangeForm`` or the API's ``ReportParams``), ending at
    ``as_of`` (the database's now) for a named range. ``from``/``to`` alone mean
    ``range=custom``. Raises ``InvalidPayload`` naming the field: an unknown range,
    ``from``/``to`` with a named range, a custom range without both, a bad date or one
    before the year 2000 or from the year 9000 on (``_when``), ``to``
    not after ``from``, shorter than an hour or longer than ``MAX_CUSTOM_DAYS`` days."""
    name = range_name or (CUSTOM if (start or end) else DEFAULT_RANGE)
    if name in RANGES:
        if start or end:
            raise InvalidPayload(f"{'from' if start else 'to'}: only with range=custom")
        lo, hi = as_of - RANGES[name], as_of
    elif name == CUSTOM:
        if not start:
            raise InvalidPayload("from: required with range=custom")
        if not end:
            raise InvalidPayload("to: required with range=custom")
        lo, hi = _when(start, "from", end=False), _when(end, "to", end=True)
        if hi <= lo:
            raise InvalidPayload("to: must be after from")
        if hi - lo < MIN_CUSTOM:
            raise InvalidPayload("to: the range must be at least one hour long")
        if hi - lo > timedelta(days=MAX_CUSTOM_DAYS):
            raise InvalidPayload(f"to: the range must be at most {MAX_CUSTOM_DAYS} days long")
    else:
        raise InvalidPayload(f"range: must be one of {', '.join([*RANGES, CUSTOM])}")
    bucket = HOUR if hi - lo <= HOURLY_UP_TO else DAY
    return ReportRange(name=name, start=lo, end=hi, bucket=bucket, as_of=as_of)


class ReportRangeForm(forms.Form):
    """The report page's query string: ``range`` (``24h``/``7d``/``30d``/``custom``),
    ``from``/``to`` (ISO 8601, at most 32 characters, as given: ``_when`` reads them for
    the page and the API alike), ``format`` (``html``/``csv``) and ``figure`` (one of
    ``FIGURES``, required with ``format=csv``). Cross-field rules are ``window``'s. A
    repeated parameter is refused (400 naming it)."""

    range = forms.ChoiceField(required=False, choices=[(k, k) for k in [*RANGES, CUSTOM]])
    start = forms.CharField(required=False, max_length=32, strip=False)
    end = forms.CharField(required=False, max_length=32, strip=False)
    format = forms.ChoiceField(required=False, choices=[("html", "html"), ("csv", "csv")])
    figure = forms.ChoiceField(required=False, choices=[(f, f) for f in FIGURES])

    #: query parameter -> form field (``from`` is a Python keyword)
    NAMES = {"range": "range", "from": "start", "to": "end", "format": "format",
             "figure": "figure"}

    @classmethod
    def parse(cls, query, query_string: str = "") -> dict:
        """``query`` (a ``QueryDict``) of the raw ``query_string`` checked: ``{range, start,
        end, format, figure}``. Raises ``InvalidPayload`` naming the parameter (not UTF-8,
        unknown, repeated or invalid; ``querystring.single_values``, as every dashboard
        page and the API)."""
        values = single_values(query_string, query, known=cls.NAMES)
        form = cls({cls.NAMES[k]: v for k, v in values.items()})
        if not form.is_valid():
            field, errors = next(iter(form.errors.as_data().items()))
            name = {v: k for k, v in cls.NAMES.items()}.get(field, field)
            raise InvalidPayload(f"{name}: {refusal_words(form.fields.get(field), errors[0])}")
        data = form.cleaned_data
        if data["format"] == "csv" and not data["figure"]:
            raise InvalidPayload(f"figure: required with format=csv (one of "
                                 f"{', '.join(FIGURES)})")
        return data
