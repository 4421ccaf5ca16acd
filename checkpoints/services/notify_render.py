"""What a notification says (issue 21, items 2, 3 and 5; docs/notifications.md, "Events and
incidents"): the facts of one event, and the three bodies of a message built from them:
``payload`` (the Standard Webhooks JSON a webhook receives: ``{"type", "timestamp",
"data"}``), ``subject`` (one line) and ``text`` (a few lines with the links, for email,
Slack and Teams).

What goes in is chosen here and only here: the tenant's slug, run ids, states, the run's
recovery reason (the dashboard's words), kind, agent/workflow, the services of its
in-doubt effects, a retry decision's decider and reason, and absolute links
(``settings.RECOVERY_PUBLIC_URL``). Never a checkpoint payload, a receipt, an operation
key or reconcile evidence: nothing here reads them (tests/services/test_notify_dispatch.py
plants a secret in each and looks for it in every message).

Pure functions: no query, no write (``notify_dispatch`` gathers the facts).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlencode

from django.conf import settings
from django.urls import reverse

from ..models.notifications import EVENT_ID_MAX, MESSAGE_RUNS_MAX
from ..vocab import NotificationEventType as E

#: A subject line's length (``NotificationMessage.subject``).
SUBJECT_MAX = 200
#: A retry decision's reason, as far as a message quotes it.
DECISION_REASON_MAX = 300
#: Runs a message's text names one by one (the payload lists up to ``MESSAGE_RUNS_MAX``).
TEXT_RUNS_MAX = 10


@dataclass(frozen=True)
class RunFacts:
    """What a message may say about one run: no payload, no receipt, no operation key."""

    pk: int
    uuid: uuid.UUID
    state: str
    reason: str
    kind: str
    agent: str
    workflow: str
    services: tuple[str, ...] = ()


@dataclass
class Event:
    """One typed event (issue 21, item 2) of one tenant, at ``at`` (the database time of
    the change: the outbox row's ``at``). ``state`` is the run's state the event is about
    (the state it went into; ``gave_up`` for a reconcile that gave up), ``from_state`` the
    one it left (blank when not a state change). ``detail``: a retry decision
    (``decision``, ``decided_by``, ``decision_reason``) or the effect a reconcile gave up on
    (``effect``, ``service``, ``attempts``, ``failures``)."""

    type: str
    tenant_id: int
    slug: str
    at: datetime
    run: RunFacts | None
    state: str
    from_state: str = ""
    detail: dict = field(default_factory=dict)

    @property
    def services(self) -> tuple[str, ...]:
        """The services the event is about: the effect's (a reconcile that gave up), else
        the run's in-doubt effects'."""
        if self.detail.get("service"):
            return (self.detail["service"],)
        return self.run.services if self.run else ()

    @property
    def cause(self) -> dict:
        """What groups events into one incident (issue 21, item 3): kind, service(s) and
        agent (the workflow when the run names no agent)."""
        run = self.run
        return {"kind": run.kind if run else "", "service": ", ".join(self.services),
                "agent": (run.agent or run.workflow) if run else ""}

    @property
    def cause_key(self) -> str:
        """A short digest of ``cause`` (``NotificationIncident.cause_key``, 64 characters)."""
        return cause_key(self.cause)


def cause_key(cause: dict) -> str:
    """SHA-256 hex of a cause's kind, service and agent (unambiguous: NUL-separated)."""
    raw = "\0".join((cause.get("kind", ""), cause.get("service", ""), cause.get("agent", "")))
    return hashlib.sha256(raw.encode()).hexdigest()


def new_event_id() -> str:
    """A message's Standard Webhooks id: ``evt_`` + 32 hex (random; created once per
    message, kept on every retry and resend)."""
    return "evt_" + uuid.uuid4().hex


def stable_event_id(*parts: object) -> str:
    """``evt_`` + 32 hex derived from ``parts``: the same message written twice (two
    workers, two rounds) gets one id, and the unique ``(tenant, event_id)`` keeps one."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()
    result = "evt_" + digest[:32]
    assert len(result) <= EVENT_ID_MAX
    return result


# --- links --------------------------------------------------------------------------------

def _absolute(path: str) -> str:
    return settings.RECOVERY_PUBLIC_URL + path


@functools.lru_cache(maxsize=256)
def _run_templates(slug: str, base: str) -> tuple[str, str]:
    """The run page's and the run API's absolute URL with ``{run}`` for the id: one
    ``reverse`` per tenant, not per message (a batch of 5,000 messages spent a third of
    its time there)."""
    return (base + reverse("run_detail", kwargs={"slug": slug, "run_id": "RUN"}),
            base + reverse("api:run", kwargs={"tenant": slug, "run_id": "RUN"}))


def run_links(slug: str, run_id: uuid.UUID) -> dict:
    """``{"url", "api_url"}``: the run's page and its API resource, absolute."""
    page, api = _run_templates(slug, settings.RECOVERY_PUBLIC_URL)
    return {"url": page.replace("/RUN", f"/{run_id}", 1),
            "api_url": api.replace("/RUN", f"/{run_id}", 1)}


def inbox_url(slug: str, *, state: str = "", kind: str = "") -> str:
    """The tenant's inbox filtered as the dashboard's filter form takes it (``state`` tab,
    ``kind``; ``dashboard.forms.InboxFilterForm``), absolute."""
    query = urlencode([(k, v) for k, v in (("state", state), ("kind", kind)) if v])
    return _absolute(reverse("run_list", kwargs={"slug": slug})) + (f"?{query}" if query else "")


# --- bodies -------------------------------------------------------------------------------

def _iso(when: datetime | None) -> str | None:
    return when.isoformat().replace("+00:00", "Z") if when else None


def _run_json(slug: str, run: RunFacts, *, resolved: bool | None = None) -> dict:
    body = {"id": str(run.uuid), "state": run.state, "reason": run.reason, "kind": run.kind,
            "agent": run.agent, "workflow": run.workflow, "services": list(run.services),
            **run_links(slug, run.uuid)}
    if resolved is not None:
        body["resolved"] = resolved
    return body


def _subject(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SUBJECT_MAX else text[:SUBJECT_MAX - 1] + "…"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _causes(cause: dict) -> str:
    words = (cause.get("kind"), cause.get("service"), cause.get("agent"))
    return ", ".join(dict.fromkeys(w for w in words if w)) or "no kind"


def _short(run_id: uuid.UUID) -> str:
    return str(run_id)[:8]


#: What each event type says of one run / of n runs (subject lines).
_ONE = {
    E.RUN_NEEDS_REVIEW: "run {run} needs review ({state})",
    E.RETRY_AWAITING_APPROVAL: "a retry of run {run} awaits approval",
    E.RETRY_DECIDED: "retry of run {run} {decision}",
    E.RECONCILE_GAVE_UP: "reconciliation gave up on run {run}",
    E.OUTCOME_UNKNOWN_AGING: "run {run} still has an unknown outcome",
    E.RUN_RESOLVED: "run {run} resolved ({state})",
}
_MANY = {
    E.RUN_NEEDS_REVIEW: ("{n} needs review ({state})", "{n} need review ({state})"),
    E.RETRY_AWAITING_APPROVAL: ("{n} has a retry awaiting approval",
                                "{n} have a retry awaiting approval"),
    E.RECONCILE_GAVE_UP: ("reconciliation gave up on {n}", "reconciliation gave up on {n}"),
    E.OUTCOME_UNKNOWN_AGING: ("{n} still has an unknown outcome",
                              "{n} still have an unknown outcome"),
}


def _body(event_type: str, at: datetime, data: dict) -> dict:
    return {"type": event_type, "timestamp": _iso(at), "data": data}


def render_event(event: Event, *, incident: dict | None = None) -> tuple[dict, str, str]:
    """One event about one run as ``(payload, subject, text)``. ``incident``: the
    incident a closing ``run.resolved`` names (``{"id", "run_count", ...}``), else
    ``None``. Raises ``KeyError`` for a type that is not about one run (``digest``)."""
    run, slug = event.run, event.slug
    data = {"tenant": slug, "state": event.state, "previous_state": event.from_state,
            "reason": run.reason if run else "", "cause": event.cause,
            "run_count": 1 if run else 0,
            "runs": [_run_json(slug, run)] if run else [], "runs_listed": 1 if run else 0,
            "incident": incident, "inbox_url": inbox_url(slug, state=event.state)}
    if event.type == E.RETRY_DECIDED:
        data["decision"] = {k: event.detail.get(k, "") for k in
                            ("decision", "decided_by", "decision_reason")}
    if event.type == E.RECONCILE_GAVE_UP:
        data["effect"] = {k: event.detail.get(k) for k in
                          ("effect", "service", "attempts", "failures")}
    words = {"run": _short(run.uuid) if run else "?", "state": event.state,
             "decision": event.detail.get("decision", "decided")}
    if event.type == E.RETRY_DECIDED and event.detail.get("decided_by"):
        words["decision"] += f" by {event.detail['decided_by']}"
    subject = _subject(f"[{slug}] {_ONE[event.type].format(**words)}: {_causes(event.cause)}")
    lines = [subject, ""]
    if run:
        lines += [f"Run {run.uuid}: {run.state}" + (f" ({run.reason})" if run.reason else ""),
                  f"Kind: {run.kind or '-'} · agent: {run.agent or run.workflow or '-'}"
                  f" · services: {', '.join(event.services) or '-'}"]
    if "decision" in data and data["decision"]["decision_reason"]:
        lines.append(f"Reason given: {data['decision']['decision_reason']}")
    if "effect" in data:
        lines.append(f"Look-ups: {data['effect']['attempts']}, "
                     f"{data['effect']['failures']} could not tell; a person decides now.")
    if incident:
        lines.append(f"All {_plural(incident['run_count'], 'run', 'runs')} of incident "
                     f"{incident['id']} are resolved.")
    if run:
        links = run_links(slug, run.uuid)
        lines += ["", f"Run page: {links['url']}", f"API: {links['api_url']}"]
    return _body(event.type, event.at, data), subject, "\n".join(lines)


def render_incident(*, event_type: str, slug: str, state: str, cause: dict, incident: dict,
                    runs: list[tuple[RunFacts, bool]], run_count: int,
                    at: datetime) -> tuple[dict, str, str]:
    """An incident's one message (issue 21, item 3): ``runs`` is ``(facts, resolved)`` of at
    most ``MESSAGE_RUNS_MAX`` runs, ``run_count`` all of them (the count is always whole);
    ``incident`` its public fields (``id``, ``opened_at``, ``window_ends_at``). Returns
    ``(payload, subject, text)``."""
    listed = runs[:MESSAGE_RUNS_MAX]
    still_open = sum(1 for _, resolved in runs if not resolved)
    inbox = inbox_url(slug, state=state, kind=cause.get("kind", ""))
    data = {"tenant": slug, "state": state, "previous_state": "",
            "reason": listed[0][0].reason if listed else "", "cause": cause,
            "run_count": run_count, "open_count": still_open,
            "runs": [_run_json(slug, r, resolved=res) for r, res in listed],
            "runs_listed": len(listed), "incident": incident, "inbox_url": inbox}
    what = _MANY[event_type][run_count != 1].format(n=_plural(run_count, "run", "runs"),
                                                    state=state)
    subject = _subject(f"[{slug}] {what}: {_causes(cause)}")
    lines = [subject, "", f"Incident {incident['id']}: {_plural(run_count, 'run', 'runs')} "
             f"between {_iso(incident['opened_at'])} and {_iso(incident['window_ends_at'])}"
             + (f", {still_open} still open" if still_open != run_count else "") + "."]
    if listed and listed[0][0].reason:
        lines.append(f"Reason: {listed[0][0].reason}")
    for facts, _ in listed[:TEXT_RUNS_MAX]:
        lines.append(f"- {facts.uuid} ({facts.state})")
    if run_count > TEXT_RUNS_MAX:
        lines.append(f"… and {run_count - min(len(listed), TEXT_RUNS_MAX)} more")
    lines += ["", f"Inbox: {inbox}"]
    data["incident"] = {**incident, "opened_at": _iso(incident["opened_at"]),
                        "window_ends_at": _iso(incident["window_ends_at"])}
    return _body(event_type, at, data), subject, "\n".join(lines)


def render_digest(*, slug: str, day: str, counts: dict[str, int],
                  oldest: RunFacts | None, oldest_since: datetime | None,
                  at: datetime) -> tuple[dict, str, str]:
    """The daily ``digest`` of one endpoint: runs needing a person per state (``counts``,
    every state of ``RecoveryState.NEEDS_PERSON``) and the one waiting longest. Returns
    ``(payload, subject, text)``."""
    total = sum(counts.values())
    data = {"tenant": slug, "day": day, "counts": counts, "run_count": total,
            "oldest": ({**_run_json(slug, oldest), "since": _iso(oldest_since)}
                       if oldest else None),
            "inbox_url": inbox_url(slug)}
    subject = _subject(f"[{slug}] daily digest {day}: "
                       f"{_plural(total, 'run needs', 'runs need')} a person")
    lines = [subject, ""] + [f"- {state}: {n}" for state, n in counts.items() if n]
    if oldest:
        lines.append(f"Waiting longest: {oldest.uuid} ({oldest.state} since "
                     f"{_iso(oldest_since)})")
    lines += ["", f"Inbox: {data['inbox_url']}"]
    return _body(E.DIGEST, at, data), subject, "\n".join(lines)
