"""The report's charts as inline SVG (``bar_chart``, ``stat_chart``), in the dashboard's
badge colours.
"""

from __future__ import annotations

from datetime import datetime

from ..vocab import (
    BADGE_CLASSES,
    ConflictReason,
    EffectState,
    ReconcileAnswer,
    ReconcileState,
    RecoveryState,
    words,
)
from .ranges import HOUR

#: The dashboard's colours per badge family (``BADGE_CLASSES``), as ``static/css/app.css``
#: writes them: the family's colour (``--amber``, the state bars of the page's top), its
#: ink (``--amber-ink``, the badge's text) and its badge border. A chart's fill must be a
#: colour the page already uses for that word's badge (``tests/services/test_reports.py``
#: reads app.css to hold the two together).
SHADES = {
    "amber": ("#e0a100", "#8a5a00", "#f5d88a"),
    "orange": ("#ea6a12", "#9a3d00", "#f7bf98"),
    "purple": ("#8649e0", "#5b2aa8", "#d3bdf7"),
    "red": ("#d93636", "#a31d1d", "#f4b9b9"),
    "blue": ("#2f6fe0", "#1e4fb3", "#bcd3fb"),
    "teal": ("#18a595", "#0d6b60", "#a5e0d7"),
    "green": ("#2f9e55", "#1d6b34", "#b9e4c4"),
    "grey": ("#9aa2b1", "#4b5567", "#d7dbe3"),
}


#: Families of the charted words no badge colours: a refused write is a conflict (orange).
FAMILY_OF = {ConflictReason.STALE_REVISION: "orange", ConflictReason.ID_EXISTS: "orange",
             ConflictReason.FENCED: "orange"}


#: The shade (index into ``SHADES``) of the words whose family meets itself in one chart;
#: every other word takes its family's colour (0). Runs: completed/closed; outcomes:
#: submitted/unresolved/running, failed/gave_up/unknown, moved_on/cancelled/planned,
#: confirmed/done; answers: owner_live/settling, failed/no_lookup; conflicts: all three.
SHADE_OF = {
    RecoveryState.CLOSED: 1,
    EffectState.UNRESOLVED: 1, ReconcileState.RUNNING: 2,
    ReconcileState.GAVE_UP: 1, EffectState.UNKNOWN: 2,
    ReconcileState.CANCELLED: 1, EffectState.PLANNED: 2,
    ReconcileState.DONE: 1,
    ReconcileAnswer.SETTLING: 1, ReconcileAnswer.NO_LOOKUP: 1,
    ConflictReason.ID_EXISTS: 1, ConflictReason.FENCED: 2,
}


#: Every word a series chart can draw: what runs enter, what reconcile requests ended
#: with (an effect state, ``moved_on`` or the request's state), what look-ups answered,
#: why writes were refused.
CHARTED = (*RecoveryState.values, *EffectState.values, *ReconcileState.values,
           *ReconcileAnswer.values, *ConflictReason.values)


#: THE colour of each charted word, the same in every chart and the same family as its
#: badge (``not_executed`` is teal in "Reconciliation outcomes" and "Look-up answers"
#: alike). ``bar_chart`` takes no other colours.
FILL: dict[str, str] = {
    word: SHADES[FAMILY_OF.get(word) or BADGE_CLASSES[word]][SHADE_OF.get(word, 0)]
    for word in CHARTED}


#: A word outside the vocabulary (a value written before an enum changed): neutral.
OTHER_FILL = "#6b7385"
#: A percentile summary's bars: ``max`` lightest, ``p95``, ``p50`` darkest (blue family).
STAT_FILL = (("max", "#cbd5e1"), ("p95", "#60a5fa"), ("p50", "#1d4ed8"))
CHART_W, CHART_H, LEFT, BOTTOM, TOP = 720, 200, 44, 22, 8


def _label(moment: datetime, bucket: str) -> str:
    return moment.strftime("%H:00" if bucket == HOUR else "%m-%d")


def bar_chart(series: dict[str, list[int]], buckets: list[datetime], bucket: str) -> dict:
    """Stacked bars, one per bucket: ``{width, height, bars: [{x, y, w, h, fill, title}],
    ticks: [{x, label}], grid: [{y, label}], legend: [{name, fill, total}], total}``
    in the SVG's user units (``viewBox 0 0 width height``). Each series is drawn in its
    word's ``FILL`` (``OTHER_FILL`` for a word outside it), whatever the chart. Series
    with no count are left out of the bars but kept in the legend with 0."""
    names = list(series)
    colour = {n: FILL.get(n, OTHER_FILL) for n in names}
    totals = [sum(series[n][i] for n in names) for i in range(len(buckets))]
    top = max(totals, default=0) or 1
    plot_w, plot_h = CHART_W - LEFT - 4, CHART_H - BOTTOM - TOP
    step = plot_w / max(1, len(buckets))
    width = max(1.0, step * 0.8)
    bars = []
    for i, moment in enumerate(buckets):
        y = TOP + plot_h
        for n in names:
            count = series[n][i]
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            bars.append({"x": round(LEFT + i * step + (step - width) / 2, 2), "y": round(y, 2),
                         "w": round(width, 2), "h": round(h, 2), "fill": colour[n],
                         "title": f"{_label(moment, bucket)} {moment:%Y-%m-%d}: "
                                  f"{words(n)} {count}"})
    every = max(1, len(buckets) // 8)
    ticks = [{"x": round(LEFT + i * step + step / 2, 2), "label": _label(m, bucket)}
             for i, m in enumerate(buckets) if i % every == 0]
    grid = [{"y": round(TOP + plot_h - plot_h * f, 2), "label": _tick(top * f)}
            for f in (0, 0.5, 1)]
    return {"width": CHART_W, "height": CHART_H, "bars": bars, "ticks": ticks, "grid": grid,
            "left": LEFT, "right": CHART_W - 4, "baseline": TOP + plot_h,
            "legend": [{"name": n, "fill": colour[n], "total": sum(series[n])} for n in names],
            "total": sum(totals)}


def _tick(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def stat_chart(stats: dict[str, dict], unit: str) -> dict:
    """Horizontal bars, one row per key, its ``max``, ``p95`` and ``p50`` drawn over each
    other (lightest to darkest): ``{width, height, rows: [{y, label, bars: [{w, fill,
    title}]}]}``; ``unit`` is added to the titles."""
    top = max((s["max"] or 0 for s in stats.values()), default=0) or 1
    label_w, row_h = 180, 22
    plot_w = CHART_W - label_w - 8
    rows = []
    for i, (key, s) in enumerate(stats.items()):
        bars = []
        for name, fill in STAT_FILL:
            value = s[name] or 0
            bars.append({"x": label_w, "w": round(max(1.0, plot_w * value / top), 2),
                         "fill": fill, "title": f"{key} {name} {_tick(value)} {unit}"})
        rows.append({"y": i * row_h + 4, "label": key if len(key) <= 28 else key[:27] + "…",
                     "bars": bars, "text_y": i * row_h + 16})
    return {"width": CHART_W, "height": max(row_h, len(rows) * row_h + 8), "rows": rows,
            "label_w": label_w - 6}
