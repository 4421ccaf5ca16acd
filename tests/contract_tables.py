"""CONTRACT.md's tables, read from the vendored copy ``docs/CONTRACT.md``, for the tests
that must follow the contract rather than a copy of it.

What it reads (the rest of CONTRACT.md is prose, tested by hand-written examples):

- ``effect_transitions()``: section 3's effect table (``from | to | by``) as
  ``{(from, to): frozenset of actors}``; ``from`` is ``NEW`` (``None``) for "(new)".
- ``effect_states()``: every state that table names, in order of appearance.
- ``roles()``: section 4's roles table, each role's rights as phrases, with "viewer + ..."
  and "all of the above" expanded.
- ``review_actions()``: section 3's review actions table (``request | who``).
- ``checkpoint_cas()``: section 3's checkpoint table (``request | meaning | answers``).
- ``api_requests()``: every request section 3 names (its three request tables and the
  ``METHOD …/path`` spans of its prose), with the status codes the contract gives each.

Parsing is strict: a table that is missing, a cell in a shape this module does not know,
or an actor or role phrase it cannot place raises ``ContractFormatError`` so that an edit
of CONTRACT.md fails the tests loudly instead of silently testing less.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

CONTRACT_PATH = Path(__file__).resolve().parents[1] / "docs" / "CONTRACT.md"
# Where the shared original lives beside the repository (not in a CI clone).
SHARED_CONTRACT_PATH = Path(__file__).resolve().parents[2] / "shared" / "CONTRACT.md"

NEW = None  # the "(new)" row of the effect table: the effect is being created

# The effect table's "by" column names actors in prose; these phrases name each actor
# class the code knows (checkpoints.policy: RUNTIME, RECONCILIATION, REVIEWER, SWEEP, RETRY).
EFFECT_ACTORS = {
    "runtime": "runtime",
    "reconciliation": "reconciliation",
    "reviewer": "reviewer",
    "stale-run sweep": "sweep",
    "approved retry": "retry",
}
METHODS = ("GET", "PUT", "POST", "PATCH", "DELETE")


class ContractFormatError(AssertionError):
    """CONTRACT.md no longer has the shape this parser reads; update the parser and the
    tests together with the contract."""


@dataclass(frozen=True)
class Table:
    """One markdown table: the ``##``/``###`` headings above it, its header row and its
    rows, each cell stripped, ``\\|`` unescaped."""

    headings: tuple[str, ...]
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    @property
    def section(self) -> str:
        """The number of the ``##`` section it is in ("3"), or ""."""
        for heading in self.headings:
            m = re.match(r"(\d+)\.", heading)
            if m:
                return m.group(1)
        return ""


def _cells(line: str) -> tuple[str, ...]:
    inner = line.strip()
    if not (inner.startswith("|") and inner.endswith("|")):
        raise ContractFormatError(f"not a table row: {line!r}")
    parts = re.split(r"(?<!\\)\|", inner[1:-1])
    return tuple(p.strip().replace("\\|", "|") for p in parts)


def parse_tables(text: str) -> list[Table]:
    """Every pipe table of ``text``, in order."""
    tables: list[Table] = []
    headings: dict[int, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"(#{1,6}) (.*)", line)
        if m:
            level = len(m.group(1))
            headings = {k: v for k, v in headings.items() if k < level}
            headings[level] = m.group(2).strip()
        if (line.lstrip().startswith("|") and i + 1 < len(lines)
                and re.fullmatch(r"\s*\|(\s*:?-+:?\s*\|)+\s*", lines[i + 1])):
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                row = _cells(lines[i])
                if len(row) != len(header):
                    raise ContractFormatError(f"row has {len(row)} cells, header "
                                              f"{len(header)}: {lines[i]!r}")
                rows.append(row)
                i += 1
            tables.append(Table(tuple(headings[k] for k in sorted(headings)), header,
                                tuple(rows)))
            continue
        i += 1
    return tables


@cache
def contract_text() -> str:
    return CONTRACT_PATH.read_text(encoding="utf-8")


@cache
def all_tables() -> tuple[Table, ...]:
    return tuple(parse_tables(contract_text()))


def table(header: tuple[str, ...], section: str, heading_contains: str = "") -> Table:
    """The one table of ``section`` with exactly this header (and, if given, a heading
    containing ``heading_contains``); ``ContractFormatError`` unless there is exactly one."""
    found = [t for t in all_tables() if t.header == header and t.section == section
             and (not heading_contains or any(heading_contains in h for h in t.headings))]
    if len(found) != 1:
        raise ContractFormatError(f"expected one table {header} in section {section} "
                                  f"({heading_contains!r}), found {len(found)}")
    return found[0]


def _code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def _without_code(cell: str) -> str:
    return re.sub(r"`[^`]*`", " ", cell)


def _status_codes(text: str) -> frozenset[int]:
    return frozenset(int(c) for c in re.findall(r"(?<![\w.])([1-5]\d\d)(?![\w.])",
                                                _without_code(text)))


# --- section 3: the effect table ----------------------------------------------------------

def _states(cell: str) -> list[str | None]:
    """``(new)`` -> ``NEW``; otherwise every backticked state; notes in parentheses go."""
    if cell.strip() == "(new)":
        return [NEW]
    states = _code_spans(cell)
    rest = re.sub(r"\([^)]*\)", "", _without_code(cell))
    if not states or re.sub(r"[\s,/]", "", rest):
        raise ContractFormatError(f"cannot read the states in {cell!r}")
    return list(states)


def _actors(cell: str) -> frozenset[str]:
    text = re.sub(r"\([^)]*\)", "", cell).lower()
    found = {actor for phrase, actor in EFFECT_ACTORS.items()
             if re.search(rf"(?<![\w-]){re.escape(phrase)}(?![\w-])", text)}
    if not found:
        raise ContractFormatError(f"no known actor in {cell!r} (known: {list(EFFECT_ACTORS)})")
    return frozenset(found)


@cache
def effect_transitions() -> dict[tuple[str | None, str], frozenset[str]]:
    """Section 3's effect table: ``(from, to) -> actors`` (``runtime``,
    ``reconciliation``, ``reviewer``, ``sweep``, ``retry``); a pair named by two rows
    gets the union. Pairs not in the result are "any other move": 422."""
    moves: dict[tuple[str | None, str], frozenset[str]] = {}
    for src_cell, dst_cell, by_cell in table(("from", "to", "by"), "3").rows:
        actors = _actors(by_cell)
        for src in _states(src_cell):
            for dst in _states(dst_cell):
                moves[(src, dst)] = moves.get((src, dst), frozenset()) | actors
    return moves


@cache
def effect_states() -> tuple[str, ...]:
    """Every effect state the table names, in order of first appearance."""
    seen: list[str] = []
    for src, dst in effect_transitions():
        for s in (src, dst):
            if s is not NEW and s not in seen:
                seen.append(s)
    return tuple(seen)


# --- section 4: roles ---------------------------------------------------------------------

@dataclass(frozen=True)
class Role:
    """A role of section 4: ``rights`` are the phrases of its "may" cell with inherited
    roles expanded ("see runs", "reveal payloads", "take leases", ...), ``denied`` the
    phrases it says "not" to ("payloads"), ``qualifiers`` the "API only:" kind of prefix."""

    name: str
    rights: frozenset[str]
    denied: frozenset[str] = frozenset()
    qualifiers: frozenset[str] = frozenset()


def _phrases(text: str) -> list[str]:
    out = []
    for part in re.split(r"[,;]", text):
        part = re.sub(r"^and\s+", "", part.strip())
        if part:
            out.append(part)
    return out


@cache
def roles() -> dict[str, Role]:
    """Section 4's roles table, in order. ``viewer + X`` inherits the viewer's rights;
    ``all of the above ...`` inherits every role above it."""
    result: dict[str, Role] = {}
    for role_cell, may in table(("role", "may"), "4").rows:
        spans = _code_spans(role_cell)
        if len(spans) != 1:
            raise ContractFormatError(f"cannot read the role in {role_cell!r}")
        name = spans[0]
        rights: set[str] = set()
        denied: set[str] = set()
        qualifiers: set[str] = set()
        for part in (p.strip() for p in may.split("+")):
            if part in result:
                rights |= result[part].rights
                continue
            m = re.match(r"all of the above\b[^,]*,?(.*)", part)
            if m:
                for above in result.values():
                    rights |= above.rights
                part = m.group(1)
            m = re.match(r"([A-Za-z ]+):\s*(.*)", part)
            if m:
                qualifiers.add(m.group(1).strip())
                part = m.group(2)
            for phrase in _phrases(part):
                if phrase.startswith("not "):
                    denied.add(phrase[4:])
                else:
                    rights.add(phrase)
        result[name] = Role(name, frozenset(rights), frozenset(denied), frozenset(qualifiers))
    return result


# --- section 3: requests ------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """A request the contract names: ``method``, ``path`` below ``/api/v1/tenants/{tenant}/``
    with every path parameter written ``{}`` (``None``: "every PUT of this table"),
    the query parameters it names, and the status codes the contract gives it."""

    method: str
    path: str | None
    query: tuple[str, ...] = ()
    statuses: frozenset[int] = frozenset()
    text: str = ""  # the whole row, for messages
    extra: dict = field(default_factory=dict, compare=False, hash=False)


def normalise_path(path: str) -> tuple[str, tuple[str, ...]]:
    """``…/runs/{run_id}/resume?agent=&model=`` -> ``("runs/{}/resume", ("agent", "model"))``;
    also accepts ``/api/v1/tenants/{tenant}/...`` and ``...``-prefixed paths."""
    path = path.strip()
    path = re.sub(r"^/api/v1/tenants/\{[^}]*\}/", "", path)
    path = re.sub(r"^(…|\.\.\.)/", "", path)
    path, _, query = path.partition("?")
    params = tuple(p.split("=")[0] for p in query.split("&") if p)
    return re.sub(r"\{[^}]*\}", "{}", path), params


def _requests_in(cell: str) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """``METHOD path`` code spans of a cell; ``.../x`` after one is its sibling path."""
    found: list[tuple[str, str | None, tuple[str, ...]]] = []
    for span in _code_spans(cell):
        m = re.fullmatch(rf"({'|'.join(METHODS)})(?:\s+(\S+))?", span.strip())
        if m:
            if m.group(2) is None:
                found.append((m.group(1), None, ()))
            else:
                found.append((m.group(1), *normalise_path(m.group(2))))
            continue
        m = re.fullmatch(r"(?:…|\.\.\.)/([\w-]+)", span.strip())
        if m and found and found[-1][1]:
            method, path, _ = found[-1]
            found.append((method, path.rsplit("/", 1)[0] + "/" + m.group(1), ()))
    return found


@cache
def review_actions() -> tuple[Request, ...]:
    """Section 3's review actions table: one ``Request`` per request, ``extra["who"]``
    the role named first in the "who" cell, ``extra["roles"]`` every role the cell lists
    before anything else ("reviewer, approver, admin"), ``extra["and_up"]`` for "viewer
    and up" and ``extra["requester_only"]`` for "reviewer who requested it"."""
    out = []
    for req_cell, who in table(("request", "who"), "3", "Review actions").rows:
        m = re.match(r"(\w+)( and up)?", who)
        if not m or m.group(1) not in roles():
            raise ContractFormatError(f"cannot read who may in {who!r}")
        listed = [m.group(1)]
        for word in re.findall(r",\s*(\w+)", who):
            if word not in roles():
                break
            listed.append(word)
        for method, path, query in _requests_in(req_cell):
            out.append(Request(method, path, query, _status_codes(who), f"{req_cell} | {who}",
                               {"who": m.group(1), "roles": tuple(listed),
                                "and_up": bool(m.group(2)),
                                "requester_only": "who requested it" in who}))
    if not out:
        raise ContractFormatError("the review actions table names no request")
    return tuple(out)


@dataclass(frozen=True)
class Answer:
    """One answer of the checkpoint table: ``status`` and the rest of its clause
    (``'+ `ETag: "0"`'``, ``"if the id exists"``)."""

    status: int
    clause: str


@cache
def checkpoint_cas() -> tuple[tuple[Request, str, tuple[Answer, ...]], ...]:
    """Section 3's checkpoint table: ``(request, meaning, answers)`` per row;
    ``request.extra["header"]`` is the precondition (``If-None-Match: *``, ``If-Match: "N"``
    or "" for "without either header")."""
    out = []
    for req_cell, meaning, answers_cell in table(("request", "meaning", "answers"), "3").rows:
        requests = _requests_in(req_cell)
        if len(requests) != 1:
            raise ContractFormatError(f"cannot read the request in {req_cell!r}")
        method, path, query = requests[0]
        header = next((s for s in _code_spans(req_cell) if s.startswith("If-")), "")
        answers = []
        for clause in (c.strip() for c in answers_cell.split(";")):
            m = re.match(r"([1-5]\d\d)\b\s*(.*)", clause)
            if not m:
                raise ContractFormatError(f"cannot read the answer {clause!r}")
            answers.append(Answer(int(m.group(1)), m.group(2)))
        statuses = frozenset(a.status for a in answers)
        out.append((Request(method, path, query, statuses, f"{req_cell} | {answers_cell}",
                            {"header": header}), meaning, tuple(answers)))
    return tuple(out)


@cache
def api_requests() -> tuple[Request, ...]:
    """Every request section 3 names: the rows of its request tables (the checkpoint
    table, the runs table and the review actions table, with their status codes) and
    each ``METHOD …/path`` span of its prose (no status codes: the prose gives them for
    whole groups). A path-less row (``PUT`` without either header) is left out here:
    ``checkpoint_cas`` has it."""
    out: list[Request] = []
    for t in all_tables():
        if t.section != "3" or t.header[0] != "request":
            continue
        for row in t.rows:
            codes = _status_codes(" ".join(row[1:]))
            for method, path, query in _requests_in(row[0]):
                if path is not None:
                    out.append(Request(method, path, query, codes, " | ".join(row)))
    section = re.search(r"^## 3\..*?(?=^## )", contract_text(), re.S | re.M)
    if section is None:
        raise ContractFormatError("no section 3")
    prose = "\n".join(line for line in section.group(0).splitlines()
                      if not line.lstrip().startswith("|"))
    for method, path, query in _requests_in(prose):
        if path is not None:
            out.append(Request(method, path, query, frozenset(), f"(prose) {method} {path}"))
    return tuple(out)


# --- where the code deliberately differs from the tables ----------------------------------

# (from, to, actor) moves that the code allows beyond section 3's effect table, each with
# its reason. The tests take the table plus exactly these; anything else the code allows
# beyond the table, or anything the table allows that the code refuses, fails them. Report
# a new entry to the team: it is a deviation from the outside contract.
CODE_BEYOND_CONTRACT: dict[tuple[str, str, str], str] = {
    # Reconciliation settles "the service never saw the key" on a *submitted* effect in two
    # recorded steps, submitted -> unresolved -> not_executed (the table has no
    # submitted -> not_executed), so the history says who made each step (policy.py,
    # reconciliation.py, docs/reconciliation.md).
    ("submitted", "unresolved", "reconciliation"):
        "reconciliation's first step when the service never saw the key",
    # A runtime that reconciles by itself (runifold's execute_reconciled, RUNIFOLD.md 4:
    # "started -> reconciler first") settles its own unresolved effect with a PUT; the
    # table says reconciliation only (policy.py's comment on EFFECT_TRANSITIONS).
    ("unresolved", "confirmed", "runtime"): "a runtime reconciling by itself",
    ("unresolved", "failed", "runtime"): "a runtime reconciling by itself",
    ("unresolved", "not_executed", "runtime"): "a runtime reconciling by itself",
}


def allowed_by_code(src: str | None, dst: str, actor: str) -> bool:
    """Whether the code should let ``actor`` move an effect ``src -> dst``: section 3's
    effect table plus ``CODE_BEYOND_CONTRACT``."""
    return (actor in effect_transitions().get((src, dst), frozenset())
            or (src, dst, actor) in CODE_BEYOND_CONTRACT)
