"""The inbox's search (``q``): run and checkpoint id prefixes, the exact LangGraph thread
id, and substrings of the run's text and of operation keys, each bounded in cost
(docs/search.md).
"""

from __future__ import annotations

import re
import uuid

from django.db.models import (
    BooleanField,
    F,
    Func,
    Lookup,
    Q,
    QuerySet,
    TextField,
)

from recovery_client.protocol import thread_run_id

from ..exceptions import InvalidPayload
from ..models import (
    Checkpoint,
    Effect,
    Run,
    Tenant,
)

#: ``q`` longest accepted: the longest column a search reads (``Effect.operation_key``).
SEARCH_MAX = 512
#: The run-side text a search reads, joined by U+001F (which a ``q`` may not hold, so a
#: match never spans two columns): agent, workflow, phase label, lease owner. On
#: PostgreSQL ``run_search_trgm`` (migration 0012) is a trigram GIN index on exactly this
#: expression, so ``ILIKE '%q%'`` over it is an index scan.
SEARCH_COLUMNS = ("agent", "workflow", "phase_label", "lease_owner")
_UUID_TEXT = re.compile(r"^[0-9a-f-]{1,36}\Z")
#: The substring branches of a search (run text, operation keys) need a ``q`` holding at
#: least this many letters or digits in a row. pg_trgm makes its trigrams of letters and
#: digits only, so ``ILIKE '%-%'`` (or ``%ab%``, ``%...%``) extracts none: the trigram
#: indexes cannot narrow it and every run and effect of the tenant is read, once per
#: query of the page (issue 17, item 7: ``?q=-`` took over a second at 6,100 runs).
#: Shorter terms still search the prefix branches (run and checkpoint id: index ranges)
#: and the exact LangGraph thread id (docs/search.md).
SEARCH_SUBSTRING_MIN = 3
_SUBSTRING_TERM = re.compile(rf"[^\W_]{{{SEARCH_SUBSTRING_MIN},}}")


class RunText(Func):
    """``agent || U+001F || workflow || U+001F || phase_label || U+001F || lease_owner``:
    the expression of the ``run_search_trgm`` index (PostgreSQL). Text, never null (the
    columns are ``NOT NULL``, blank as "")."""

    template = "(%(expressions)s)"
    arg_joiner = " || char(31) || "
    output_field = TextField()

    def __init__(self):
        super().__init__(*SEARCH_COLUMNS)

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, arg_joiner=" || chr(31) || ", **extra)


class Contains(Lookup):
    r"""``lhs`` holds the text ``rhs`` anywhere, case-insensitively: ``ILIKE '%rhs%'`` on
    PostgreSQL (a trigram GIN index serves it), ``LIKE`` on SQLite (case-insensitive for
    ASCII letters only). ``%``, ``_`` and ``\`` in ``rhs`` are matched literally. Used as
    an expression in ``filter()``; never registered on a field."""

    lookup_name = "search_contains"
    prepare_rhs = False

    def get_db_prep_lookup(self, value, connection):
        escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return "%s", [f"%{escaped}%"]

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        operator = "ILIKE" if connection.vendor == "postgresql" else "LIKE"
        return f"{lhs} {operator} {rhs} ESCAPE '\\'", [*lhs_params, *rhs_params]


def uuid_prefix_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """``(lowest, highest)`` UUID starting with ``text`` (hex digits, case-insensitive,
    dashes only where a UUID has them, or none at all), or ``None`` when ``text`` cannot
    start a UUID. A prefix search is then a range of the ``(tenant, uuid)`` unique index,
    on PostgreSQL (``uuid`` type) and SQLite (32 hex digits) alike."""
    text = text.lower()
    if not _UUID_TEXT.match(text):
        return None
    if "-" in text and any((ch == "-") != (i in (8, 13, 18, 23)) for i, ch in enumerate(text)):
        return None
    digits = text.replace("-", "")
    if not digits or len(digits) > 32:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def search_terms(q: str | None) -> str:
    """``q`` as a search reads it: stripped of surrounding white space ("" = no search).
    Raises ``InvalidPayload`` naming ``q`` for a value no column can hold: longer than
    ``SEARCH_MAX``, or holding a control character (U+0000-U+001F, U+007F; the U+001F
    of ``RunText`` among them) or an unpaired surrogate."""
    text = (q or "").strip()
    if len(text) > SEARCH_MAX:
        raise InvalidPayload(f"q: at most {SEARCH_MAX} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 or 0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise InvalidPayload("q: control characters cannot be searched for")
    return text


def search_substring(text: str) -> bool:
    """Whether a search for ``text`` (as ``search_terms`` returns it) reads the substring
    branches: only when it holds ``SEARCH_SUBSTRING_MIN`` letters or digits in a row,
    which gives pg_trgm at least one trigram to look up (``SEARCH_SUBSTRING_MIN``)."""
    return bool(_SUBSTRING_TERM.search(text))


def _search_run_ids(tenant: Tenant, text: str) -> QuerySet:
    """Ids of the tenant's runs a search for ``text`` finds, as one ``UNION ALL``
    subquery (a run may come twice; ``IN`` does not mind):

    - runs whose agent, workflow, phase label or lease owner holds ``text``
      (substring; ``run_search_trgm``), or whose run id starts with it (prefix, the
      ``(tenant, uuid)`` index);
    - runs with an effect whose operation key holds ``text`` (substring;
      ``effect_opkey_trgm``), so an order id is found through ``charge:A-1003``;
    - runs with a checkpoint whose id starts with ``text`` (prefix, ``(tenant, uuid)``);
    - the run of the LangGraph thread whose id is exactly ``text``
      (``recovery_client.protocol.thread_run_id``, issue 10: the run id is derived from it).

    The two substring branches are left out for a ``text`` without
    ``SEARCH_SUBSTRING_MIN`` letters or digits in a row (``search_substring``): no
    trigram index could serve them. Every branch left is then an index lookup or range.

    Payloads are encrypted at rest and never searched: an order id that only a payload
    holds is found through an operation key or not at all (docs/search.md).

    The one builder of the search: the inbox (its rows, tab counts and page position),
    the API's run list, the audit log's ``q`` and a bulk action's "all matching" all
    filter with it (``_filtered_runs``, ``audit_list``), so they find the same runs.
    """
    by_uuid = uuid_prefix_range(text)
    substring = search_substring(text)
    run_match = Q(uuid=thread_run_id(text))
    if substring:
        run_match |= Q(Contains(RunText(), text))
    if by_uuid:
        run_match |= Q(uuid__range=by_uuid)
    ids = Run.objects.for_tenant(tenant).filter(run_match).values("id")
    parts = []
    if substring:
        parts.append(Effect.objects.for_tenant(tenant)
                     .filter(Contains(F("operation_key"), text)).values("run_id"))
    if by_uuid:
        parts.append(Checkpoint.objects.for_tenant(tenant)
                     .filter(uuid__range=by_uuid).values("run_id"))
    return ids.union(*parts, all=True) if parts else ids


class _IdAmong(Func):
    """``id = ANY(ARRAY(subquery))`` on PostgreSQL, ``id IN (subquery)`` elsewhere: the
    subquery runs once (an InitPlan) and its array is an index condition, so the
    planner can combine it with the trigram and uuid conditions in one ``BitmapOr`` (a
    narrow search) or check it row by row while reading an index in the list's order
    (a broad one). An ``IN (subquery)`` inside an ``OR`` is a per-row hashed subplan,
    which no bitmap can use. ``column``: another column than ``id`` (the audit log's
    ``run_uuid``)."""

    output_field = BooleanField()

    def __init__(self, subquery: QuerySet, column: str = "id"):
        super().__init__(F(column), subquery)

    def as_sql(self, compiler, connection, **extra):
        column, column_params = compiler.compile(self.source_expressions[0])
        inner, inner_params = compiler.compile(self.source_expressions[1])
        inner = inner if inner.startswith("(") else f"({inner})"
        if connection.vendor == "postgresql":
            return f"{column} = ANY(ARRAY{inner})", [*column_params, *inner_params]
        return f"{column} IN {inner}", [*column_params, *inner_params]


def search_match(tenant: Tenant, text: str) -> Q:
    """The runs a search for ``text`` finds (``_search_run_ids``' branches, the same
    runs) as a condition on the run row itself, for the inbox and the API's run list
    (issue 22: a broad word took 377 ms p50 at 100,000 runs).

    ``_search_run_ids`` as ``id IN (subquery)`` makes PostgreSQL build the whole set of
    matching runs first (it cannot estimate the distinct ids of a ``UNION``, guesses 200,
    and hashes 32,000 ids for a word in a third of the runs) before the list's ``LIMIT``
    or the counts' cap apply. Here the run's own columns are matched in place (the
    trigram and uuid conditions, which the planner estimates from the expression index's
    statistics) and the effect and checkpoint branches are one array of run ids
    (``_IdAmong``): for a broad word the planner reads the tab's index in order and stops
    after a page, for a narrow one it combines the indexes in a bitmap as before."""
    by_uuid = uuid_prefix_range(text)
    substring = search_substring(text)
    match = Q(uuid=thread_run_id(text))
    if substring:
        match |= Q(Contains(RunText(), text))
    if by_uuid:
        match |= Q(uuid__range=by_uuid)
    parts = []
    if substring:
        parts.append(Effect.objects.for_tenant(tenant)
                     .filter(Contains(F("operation_key"), text)).values("run_id"))
    if by_uuid:
        parts.append(Checkpoint.objects.for_tenant(tenant)
                     .filter(uuid__range=by_uuid).values("run_id"))
    if parts:
        match |= Q(_IdAmong(parts[0].union(*parts[1:], all=True) if len(parts) > 1
                            else parts[0]))
    return match


def incident_match(text: str) -> Q:
    """The audit events a search for ``text`` (as ``search_terms`` returns it) finds by
    their incident reference (``AuditEvent.incident_ref``, the ``INC-2041`` a reviewer
    typed, shown on the audit log's rows): a case-insensitive prefix, as the run and
    checkpoint ids are matched (``INC-2041`` finds ``inc-2041`` and ``INC-2041-b``;
    ``INC-20`` every incident it starts). On PostgreSQL ``UPPER(incident_ref::text) LIKE
    UPPER('INC-20%')`` is a range of the partial index ``audit_incident_idx``
    ``(tenant, UPPER(incident_ref) text_pattern_ops, seq DESC) WHERE incident_ref IS NOT
    NULL`` (migration 0043). The audit log's one rule for it: its page and
    ``GET …/audit-events?q=`` both filter through ``audit_list``."""
    return Q(incident_ref__istartswith=text)
