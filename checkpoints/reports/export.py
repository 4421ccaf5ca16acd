"""The report as CSV (``to_csv``): one row per figure, bucket and word, with formula cells
quoted.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

from .ranges import STATS

#: A cell starting with one of these is read as a formula by spreadsheets (OWASP, "CSV
#: injection"): such a cell is written with a leading ``'``.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    """``value`` as a CSV cell safe to open in a spreadsheet: ``None`` is empty, a
    datetime ISO 8601 UTC, a float with at most 3 decimals, text starting with a
    ``FORMULA_STARTS`` character prefixed with ``'`` (OWASP "CSV injection")."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    text = str(value)
    if text.startswith(FORMULA_STARTS):
        return "'" + text
    return text


#: The columns every row of a CSV ends with: the range and the database time the figures
#: were read at (a plain table, one header row: spreadsheets and ``pandas.read_csv`` read
#: it as it is).
CSV_CONTEXT = ("from", "to", "as_of")


def csv_rows(data: dict, figure: str) -> list[list]:
    """The rows (header first, every row as long as the header) of one figure of
    ``figures``' answer: a series as ``bucket, <one column per name>``; a percentile
    summary as ``<key>, n, p50, p95, max``; approvals as ``approver, approved,
    rejected``; the recovery cost as ``kind, counter, total``; ``time_to_resolve_s`` as one row of ``n, p50, p95, max``. Every row ends
    with the ``CSV_CONTEXT`` columns: the range's ``from``/``to`` and ``as_of``."""
    value = data[figure]
    if figure == "schema_mismatches":
        value = {"schema_mismatch": value}
    if figure in ("runs_entering", "schema_mismatches", "conflicts", "reconcile_outcomes",
                  "reconcile_answers"):
        names = list(value)
        rows = [["bucket", *names]]
        rows += [[b, *(value[n][i] for n in names)] for i, b in enumerate(data["buckets"])]
    elif figure == "time_to_resolve_s":
        rows = [list(STATS), [value[s] for s in STATS]]
    elif figure == "approvals":
        rows = [["approver", "approved", "rejected"]]
        rows += [[who, v["approved"], v["rejected"]] for who, v in value.items()]
    elif figure == "recovery_cost":
        rows = [["kind", "counter", "total"]]
        rows += [[kind, c, n] for kind, v in value.items() for c, n in v.items()]
    else:
        key = "action" if figure == "resume_age_ms" else "kind"
        rows = [[key, *STATS]] + [[k, *(v[s] for s in STATS)] for k, v in value.items()]
    context = [data["range"]["from"], data["range"]["to"], data["as_of"]]
    return [[*rows[0], *CSV_CONTEXT]] + [[*row, *context] for row in rows[1:]]


def csv_filename(data: dict, tenant_slug: str, figure: str) -> str:
    """The download's file name: ``<tenant>-<figure>-<range>-as-of-<UTC time>.csv``, e.g.
    ``acme-approvals-7d-as-of-20261201T003000Z.csv`` (the time ``figures`` read at)."""
    as_of = data["as_of"].astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{tenant_slug}-{figure}-{data['range']['name']}-as-of-{as_of}.csv"


def to_csv(data: dict, figure: str) -> str:
    """One figure as CSV text (``csv_rows``, every cell through ``csv_cell``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    for row in csv_rows(data, figure):
        writer.writerow([csv_cell(c) for c in row])
    return out.getvalue()
