"""Notification dispatch (issue 21, items 2-3; docs/notifications.md, "Events and
incidents"): the outbox (``NotificationOutbox``) turned into incidents and messages.

Interface the sender and the scheduler use:

- ``dispatch_round() -> dict``: emit ``outcome.unknown_aging`` events, drain the outbox,
  turn ended incident windows into messages, emit the daily ``digest``; returns counts.
  Safe to run anywhere at any time, by several workers at once; writes only through this
  module. It writes no audit event: it records what already happened (each change it
  reports has its own), and its messages and attempts are the delivery log.
- ``notify_emit(*, tenant, event_type, run=None, detail=None)``: write one outbox row for an
  event that is not a run state change (``reconcile.gave_up``), inside the caller's
  transaction.

The steps of a round:

1. Aging (one worker at a time: a session advisory lock, ``locks.try_session_lock``): a
   run still ``unknown_outcome`` ``RECOVERY_NOTIFY_UNKNOWN_AGING_S`` after its
   ``state_changed_at`` (database clock) gets a ``NotificationAgingMark`` (unique per run
   and ``since``) and an outbox row, in one transaction: once per stay in the state.
2. Drain: first the rows of tenants with no endpoint, deleted unread in one statement
   (``_drop_unconfigured``: a tenant that configured nothing costs a round one query);
   then batches of ``BATCH`` outbox rows in id order, each batch one transaction that
   claims its rows ``FOR NO KEY UPDATE SKIP LOCKED`` (several workers take different
   rows; SQLite serialises), locks the batch's tenants' endpoints (ascending id: the
   incidents of one endpoint are changed by one transaction at a time), classifies each
   row (``classify``: the rule, in one place), routes each event to the matching
   endpoints (``matches``), and deletes the rows. Two workers may finish batches out of
   order, so a run's ``run.resolved`` can be seen before its ``run.needs_review`` (it is
   then a plain message and the incident lists the run as open); one worker keeps the
   order.
3. Incidents whose window ended (database clock) become one message each, once the
   endpoint's quiet period has passed since its last grouped message (the
   ``created_at`` of its latest message of a ``GROUPED`` type; incidents due together go
   together). An incident whose every run resolved, or moved on to another state,
   before its window ended closes with no message (``_Batch.moved_on``).
4. The digest (under the aging step's lock): at or after ``RECOVERY_NOTIFY_DIGEST_HOUR``
   (UTC, database clock), one per endpoint and day, its ``event_id`` derived from both.
   The endpoints it writes to are held ``FOR KEY SHARE`` first (ascending id).

Every step that writes a row naming an endpoint (a message, an incident) holds the
endpoint first, through ``notify_endpoints.hold_endpoints``: an endpoint an admin is
deleting is waited for and then skipped (gone), never written to (stop 34's attack: a digest
written while the endpoint was deleted made the delete fail).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, Subquery

from .. import locks
from ..dbclock import db_now
from ..models import (
    Effect,
    NotificationAgingMark,
    NotificationEndpoint,
    NotificationIncident,
    NotificationIncidentRun,
    NotificationMessage,
    NotificationOutbox,
    RetryRequest,
    Run,
    Tenant,
)
from ..models.notifications import MESSAGE_RUNS_MAX
from ..selectors.nextstep import state_reason
from ..vocab import EffectState, RecoveryState, RetryState
from ..vocab import NotificationEventType as E
from .notify_endpoints import CHANGE, NAME, hold_endpoints
from .notify_render import (
    Event,
    RunFacts,
    new_event_id,
    render_digest,
    render_event,
    render_incident,
    stable_event_id,
)
from .runs import effect_label

S = RecoveryState
#: Outbox rows per transaction, and batches per round (a round stays bounded; the next
#: round takes the rest).
BATCH = 500
ROUND_BATCHES = 40
#: A state nobody has to act on: a run that reaches one from ``NEEDS_PERSON`` is resolved.
RESOLVED_STATES = frozenset({S.HEALTHY, S.COMPLETED, S.CLOSED})
#: What ``notify_emit`` writes, with the keys its ``detail`` may hold (never a payload
#: value, a receipt, an operation key or evidence).
EMITTED = {E.RECONCILE_GAVE_UP: frozenset({"effect", "service", "attempts", "failures"}),
           E.OUTCOME_UNKNOWN_AGING: frozenset({"since"})}
DETAIL_VALUE_MAX = 200
#: One worker at a time emits aging events and digests (``locks.try_session_lock``).
PERIODIC_LOCK = 0x6E6F_7469_6679  # "notify"
_WHY = "the notification dispatcher drains every tenant's outbox (each event is then " \
       "routed to its own tenant's endpoints)"


def classify(from_state: str, to_state: str) -> tuple[str, str] | None:
    """The event a run's state change is (issue 21, item 2): ``(event_type, decision)``,
    ``decision`` a ``RetryState`` for ``retry.decided`` else ``""``; ``None`` when the
    change is none of them. ``from_state`` is blank for a run created in its state.

    - into ``retry_approved``: ``retry.decided`` (approved);
    - from ``awaiting_approval`` into a ``NEEDS_REVIEW`` state: ``retry.decided``
      (rejected; the request says whether rejected, expired or withdrawn);
    - into a ``NEEDS_REVIEW`` state otherwise: ``run.needs_review``;
    - into ``awaiting_approval``: ``retry.awaiting_approval``;
    - from a ``NEEDS_PERSON`` state into healthy, completed or closed: ``run.resolved``.
    """
    if from_state == to_state:
        return None
    if to_state == S.RETRY_APPROVED:
        return E.RETRY_DECIDED, RetryState.APPROVED
    if from_state == S.AWAITING_APPROVAL and to_state in S.NEEDS_REVIEW:
        return E.RETRY_DECIDED, RetryState.REJECTED
    if to_state in S.NEEDS_REVIEW:
        return E.RUN_NEEDS_REVIEW, ""
    if to_state == S.AWAITING_APPROVAL:
        return E.RETRY_AWAITING_APPROVAL, ""
    if from_state in S.NEEDS_PERSON and to_state in RESOLVED_STATES:
        return E.RUN_RESOLVED, ""
    return None


def matches(endpoint: NotificationEndpoint, event: Event) -> bool:
    """Whether ``endpoint`` takes ``event`` (issue 21, item 1): enabled, subscribed to its
    type, and each non-empty filter matched: ``kinds`` the run's kind, ``agents`` its agent
    or workflow, ``services`` one of the event's services."""
    run = event.run
    return (endpoint.enabled and event.type in endpoint.event_types and run is not None
            and (not endpoint.kinds or run.kind in endpoint.kinds)
            and (not endpoint.agents or run.agent in endpoint.agents
                 or run.workflow in endpoint.agents)
            and (not endpoint.services or bool(set(event.services) & set(endpoint.services))))


def notify_emit(*, tenant, event_type: str, run=None, detail: dict | None = None) -> None:
    """Record one event in the outbox, in the caller's transaction (so it commits with the
    change it reports, or not at all). ``event_type``: a key of ``EMITTED``; ``detail``:
    only that type's keys, strings (at most ``DETAIL_VALUE_MAX`` characters) or integers.
    Raises ``ValueError`` otherwise (a programming error: nothing is written)."""
    detail = dict(detail or {})
    allowed = EMITTED.get(event_type)
    if allowed is None:
        raise ValueError(f"notify_emit: {event_type!r} is not an emitted event type")
    for key, value in detail.items():
        if key not in allowed or not (
                isinstance(value, int) and not isinstance(value, bool)
                or isinstance(value, str) and len(value) <= DETAIL_VALUE_MAX):
            raise ValueError(f"notify_emit: detail {key!r} is not allowed for {event_type}")
    NotificationOutbox.objects.create(tenant=tenant, run=run, event_type=event_type,
                                      detail=detail)


def dispatch_round() -> dict:
    """One round of the dispatcher (module docstring, steps 1-4). Returns counts:
    ``aging`` (events emitted), ``dispatched`` (outbox rows drained, ``dropped`` ones
    included), ``dropped`` (rows of tenants with no endpoint, deleted unread), ``messages``
    (messages written, incidents' and digests' included), ``incidents`` (incidents that
    became a message), ``digests``."""
    counts = {"aging": 0, "dispatched": 0, "dropped": 0, "messages": 0, "incidents": 0,
              "digests": 0}
    with locks.try_session_lock(PERIODIC_LOCK) as mine:
        if mine:
            counts["aging"] = _emit_aging()
    counts["dropped"] = counts["dispatched"] = _drop_unconfigured()
    for _ in range(ROUND_BATCHES):
        drained, written = _drain_batch()
        counts["dispatched"] += drained
        counts["messages"] += written
        if drained < BATCH:
            break
    sent, written = _flush_incidents()
    counts["incidents"] = sent
    counts["messages"] += written
    with locks.try_session_lock(PERIODIC_LOCK) as mine:
        if mine:
            counts["digests"] = _emit_digests()
    counts["messages"] += counts["digests"]
    return counts


# --- facts ---------------------------------------------------------------------------------

def _facts(run_pks) -> dict[int, RunFacts]:
    """What a message may say of each run (``RunFacts``), with the services of its effects
    still in doubt (``EffectState.DOUBTFUL``), in two queries. The reason is the
    dashboard's with every operation key taken out (``_without_keys``): a key may name an
    order or an account, and a message leaves the service."""
    runs = (Run.objects.for_all_tenants(reason=_WHY).filter(pk__in=run_pks)
            .values_list("pk", "uuid", "recovery_state", "recovery_reason", "kind", "agent",
                         "workflow", "schema_version"))
    services, keys = defaultdict(set), defaultdict(set)
    for run_id, service, key, state in (Effect.objects.for_all_tenants(reason=_WHY)
                                        .filter(run_id__in=run_pks)
                                        .values_list("run_id", "service", "operation_key",
                                                     "state")):
        keys[run_id].add((service, key))
        if state in EffectState.DOUBTFUL:
            services[run_id].add(service)
    # The reason as the dashboard and the API say it (``nextstep.state_reason``).
    return {pk: RunFacts(pk, u, state,
                         _without_keys(state_reason(state, reason, kind, version), keys[pk]),
                         kind, agent, workflow, tuple(sorted(services[pk])))
            for pk, u, state, reason, kind, agent, workflow, version in runs}


def _without_keys(reason: str, keys) -> str:
    """``reason`` with each effect's label (``runs.effect_label``: ``"service
    operation_key"``, a long key cut with ``…``) said as its service, also a label the
    reason's column (256 characters) cut short at its end, and any other mention of a key
    as ``…``."""
    for service, key in sorted(keys, key=lambda pair: -len(pair[1])):
        if not key:
            continue
        label = effect_label(service, key)
        reason = reason.replace(label, service)
        reason = reason.replace(f"{service} {key}", service).replace(key, "…")
        for n in range(len(label) - 1, len(service), -1):
            if reason.endswith(label[:n]):
                reason = reason[:-n] + service
                break
    return reason


def _decisions(run_pks) -> dict[int, dict]:
    """The latest retry request of each run: its state, its decider's name and reason."""
    found = {}
    for run_id, state, who, why in (
            RetryRequest.objects.for_all_tenants(reason=_WHY).filter(run_id__in=run_pks)
            .order_by("run_id", "-id")
            .values_list("run_id", "state", "decided_by__username", "decision_reason")):
        found.setdefault(run_id, {"state": state, "decided_by": who or "",
                                  "decision_reason": (why or "")[:300]})
    return found


def _events(rows: list[NotificationOutbox]) -> list[Event]:
    """The outbox rows as typed events, in id order (a change that is no event, or of a
    run deleted since, is dropped)."""
    typed = []
    for row in rows:
        kind = (row.event_type, "") if row.event_type else classify(row.from_state,
                                                                    row.to_state)
        if kind is not None and row.run_id is not None:
            typed.append((row, *kind))
    run_pks = {row.run_id for row, _, _ in typed}
    facts = _facts(run_pks)
    decided = _decisions({row.run_id for row, t, _ in typed if t == E.RETRY_DECIDED})
    slugs = dict(Tenant.objects.filter(pk__in={row.tenant_id for row, _, _ in typed})
                 .values_list("pk", "slug"))
    events = []
    for row, event_type, decision in typed:
        run = facts.get(row.run_id)
        if run is None:
            continue
        detail = dict(row.detail)
        if event_type == E.RETRY_DECIDED:
            request = decided.get(row.run_id, {})
            if decision != RetryState.APPROVED and request.get("state") in (
                    RetryState.REJECTED, RetryState.EXPIRED, RetryState.WITHDRAWN):
                decision = request["state"]
            detail = {"decision": decision, "decided_by": request.get("decided_by", ""),
                      "decision_reason": request.get("decision_reason", "")}
        events.append(Event(type=event_type, tenant_id=row.tenant_id, slug=slugs[row.tenant_id],
                            at=row.at, run=run, state=row.to_state or run.state,
                            from_state=row.from_state, detail=detail))
    return events


# --- the drain ---------------------------------------------------------------------------

class _Batch:
    """What one drained batch writes: incidents opened or joined (cached by endpoint,
    type, state and cause), their runs and the messages, written in bulk."""

    def __init__(self, endpoints: dict[int, list[NotificationEndpoint]]):
        self.endpoints = endpoints
        self.incidents: dict[tuple, NotificationIncident] = {}
        self.incident_runs: dict[tuple[int, int], NotificationIncidentRun] = {}
        self.messages: list[NotificationMessage] = []

    def message(self, endpoint, event: Event, *, incident=None, event_id=None) -> None:
        payload, subject, text = render_event(
            event, incident=None if incident is None else
            {"id": str(incident.uuid), "run_count": incident.run_count})
        self.messages.append(NotificationMessage(
            tenant_id=event.tenant_id, endpoint=endpoint, event_id=event_id or new_event_id(),
            event_type=event.type, incident=incident, run_id=event.run.pk, payload=payload,
            subject=subject, text=text))

    def join(self, endpoint, event: Event) -> None:
        """Add the event's run to the endpoint's open incident of its type, state and cause
        whose window has not ended at the event's time, or open one."""
        key = (endpoint.pk, event.type, event.state, event.cause_key)
        incident = self.incidents.get(key)
        if incident is None or not event.at < incident.window_ends_at:
            incident = (NotificationIncident.objects.for_tenant(event.tenant_id)
                        .filter(endpoint=endpoint, event_type=event.type, state=event.state,
                                cause_key=event.cause_key, message_at__isnull=True,
                                closed_at__isnull=True, window_ends_at__gt=event.at)
                        .order_by("-opened_at").first())
        if incident is None:
            incident = NotificationIncident.objects.create(
                tenant_id=event.tenant_id, uuid=uuid.uuid4(), endpoint=endpoint,
                event_type=event.type, state=event.state, cause_key=event.cause_key,
                cause=event.cause, opened_at=event.at,
                window_ends_at=event.at + timedelta(seconds=endpoint.group_window_s))
        self.incidents[key] = incident
        self.incident_runs.setdefault((incident.pk, event.run.pk), NotificationIncidentRun(
            tenant_id=event.tenant_id, incident=incident, run_id=event.run.pk, at=event.at))

    def write_runs(self) -> None:
        """Store the incidents' new runs and recount them (``run_count``)."""
        if not self.incident_runs:
            return
        NotificationIncidentRun.objects.bulk_create(self.incident_runs.values(),
                                                    ignore_conflicts=True)
        touched = {pk for pk, _ in self.incident_runs}
        self.incident_runs = {}
        counted = (NotificationIncidentRun.objects.for_all_tenants(reason=_WHY)
                   .filter(incident=OuterRef("pk")).order_by().values("incident")
                   .annotate(n=Count("pk")).values("n"))
        (NotificationIncident.objects.for_all_tenants(reason=_WHY).filter(pk__in=touched)
         .update(run_count=Subquery(counted)))
        for incident in self.incidents.values():
            if incident.pk in touched:
                incident.refresh_from_db(fields=["run_count"])

    def resolve(self, event: Event) -> None:
        """``run.resolved``: mark the run resolved in every open incident of the tenant's
        endpoints; an incident already messaged whose runs are now all resolved closes
        with one ``run.resolved`` message naming it (to an endpoint subscribed to the
        type); an endpoint with the run in no open incident gets a plain message."""
        self.write_runs()
        endpoints = self.endpoints.get(event.tenant_id, [])
        rows = (NotificationIncidentRun.objects.for_tenant(event.tenant_id)
                .filter(run_id=event.run.pk, incident__endpoint__in=endpoints,
                        incident__closed_at__isnull=True))
        pairs = list(rows.values_list("incident__endpoint_id", "incident_id"))
        told = {endpoint_pk for endpoint_pk, _ in pairs}
        rows.filter(resolved_at__isnull=True).update(resolved_at=event.at)
        open_runs = (NotificationIncidentRun.objects.for_tenant(event.tenant_id)
                     .filter(incident=OuterRef("pk"), resolved_at__isnull=True))
        closing = list(NotificationIncident.objects.for_tenant(event.tenant_id)
                       .filter(pk__in={pk for _, pk in pairs}, message_at__isnull=False,
                               closed_at__isnull=True)
                       .exclude(Exists(open_runs)).order_by("pk"))
        by_pk = {endpoint.pk: endpoint for endpoint in endpoints}
        for incident in closing:
            incident.closed_at = event.at
            incident.save(update_fields=["closed_at"])
            endpoint = by_pk[incident.endpoint_id]
            if endpoint.enabled and E.RUN_RESOLVED in endpoint.event_types:
                self.message(endpoint, event, incident=incident,
                             event_id=stable_event_id("resolved", incident.uuid))
        for endpoint in endpoints:
            if endpoint.pk not in told and matches(endpoint, event):
                self.message(endpoint, event)

    def moved_on(self, event: Event) -> None:
        """The run left a state a person acts on for another (a retry asked for, decided):
        in the incidents of another state not sent yet it counts as resolved, so a page
        says what still waits (an incident whose runs all moved on is not sent)."""
        self.write_runs()
        (NotificationIncidentRun.objects.for_tenant(event.tenant_id)
         .filter(run_id=event.run.pk, resolved_at__isnull=True,
                 incident__message_at__isnull=True, incident__closed_at__isnull=True)
         .exclude(incident__state=event.state).update(resolved_at=event.at))

    def route(self, event: Event) -> None:
        """Send ``event`` where it belongs: grouped types into incidents (an endpoint with a
        window), everything else one message per matching endpoint."""
        if event.type == E.RUN_RESOLVED:
            self.resolve(event)
            return
        if event.from_state in S.NEEDS_PERSON:
            self.moved_on(event)
        for endpoint in self.endpoints.get(event.tenant_id, []):
            if not matches(endpoint, event):
                continue
            if event.type in E.GROUPED and endpoint.group_window_s > 0:
                self.join(endpoint, event)
            else:
                self.message(endpoint, event)

    def write(self) -> int:
        self.write_runs()
        NotificationMessage.objects.bulk_create(self.messages, ignore_conflicts=True)
        return len(self.messages)


def _claim():
    """The next ``BATCH`` outbox rows in id order that no other transaction holds."""
    rows = NotificationOutbox.objects.for_all_tenants(reason=_WHY).order_by("id")
    return list(locks.lock_rows(rows, skip_locked=True)[:BATCH])


def _endpoints_of(tenant_ids) -> dict[int, list[NotificationEndpoint]]:
    """The tenants' endpoints, held in ascending id (``hold_endpoints``, ``CHANGE``: the
    incidents of one endpoint are changed by one transaction at a time); one being
    deleted is waited for and then left out."""
    found = defaultdict(list)
    for endpoint in hold_endpoints(NotificationEndpoint.objects.for_all_tenants(reason=_WHY)
                                   .filter(tenant_id__in=tenant_ids), hold=CHANGE):
        found[endpoint.tenant_id].append(endpoint)
    return found


def _drop_unconfigured() -> int:
    """Delete, in one statement, the outbox rows of tenants with no endpoint (nobody is
    told of them, and an endpoint made later starts from its creation): a tenant that
    configured nothing costs a round one query however many of its runs changed state.
    Rows another worker holds are left to it (``SKIP LOCKED``). Returns the rows
    deleted."""
    configured = (NotificationEndpoint.objects.for_all_tenants(reason=_WHY)
                  .filter(tenant_id=OuterRef("tenant_id")))
    unread = locks.lock_rows(NotificationOutbox.objects.for_all_tenants(reason=_WHY)
                             .exclude(Exists(configured)), skip_locked=True)
    with transaction.atomic():
        deleted, _ = (NotificationOutbox.objects.for_all_tenants(reason=_WHY)
                      .filter(pk__in=unread.values("pk")).delete())
    return deleted


def _drain_batch() -> tuple[int, int]:
    """One batch in one transaction (module docstring, step 2): ``(rows, messages)``.
    Rows of a tenant with no endpoint (its last one deleted since ``_drop_unconfigured``)
    are deleted without being read."""
    with transaction.atomic():
        rows = _claim()
        if not rows:
            return 0, 0
        endpoints = _endpoints_of({row.tenant_id for row in rows})
        events = _events([row for row in rows if row.tenant_id in endpoints])
        batch = _Batch(endpoints)
        for event in events:
            batch.route(event)
        written = batch.write()
        (NotificationOutbox.objects.for_all_tenants(reason=_WHY)
         .filter(pk__in=[row.pk for row in rows]).delete())
    return len(rows), written


# --- incidents whose window ended ----------------------------------------------------------

def _flush_incidents() -> tuple[int, int]:
    """Step 3 of the module docstring, in one transaction: ``(incidents, messages)``."""
    sent = written = 0
    with transaction.atomic():
        now = db_now()
        due = (NotificationIncident.objects.for_all_tenants(reason=_WHY)
               .filter(message_at__isnull=True, closed_at__isnull=True, window_ends_at__lte=now))
        endpoint_pks = set(due.values_list("endpoint_id", flat=True).distinct()[:BATCH])
        endpoints = hold_endpoints(NotificationEndpoint.objects.for_all_tenants(reason=_WHY)
                                   .filter(pk__in=endpoint_pks, enabled=True),
                                   hold=CHANGE, skip_locked=True)
        for endpoint in endpoints:
            if _quiet(endpoint, now):
                continue
            slug = Tenant.objects.values_list("slug", flat=True).get(pk=endpoint.tenant_id)
            for incident in due.filter(endpoint=endpoint).order_by("opened_at", "pk"):
                sent_one = _incident_message(endpoint, incident, slug, now)
                sent += sent_one
                written += sent_one
    return sent, written


def _quiet(endpoint: NotificationEndpoint, now) -> bool:
    """Whether the endpoint's quiet period since its last grouped message still runs."""
    if not endpoint.quiet_period_s:
        return False
    last = (NotificationMessage.objects.for_tenant(endpoint.tenant_id)
            .filter(endpoint=endpoint, event_type__in=E.GROUPED)
            .aggregate(last=Max("created_at"))["last"])
    return last is not None and last + timedelta(seconds=endpoint.quiet_period_s) > now


def _incident_message(endpoint, incident: NotificationIncident, slug: str, now) -> int:
    """The incident's one message, or none when every run of it resolved already (then it
    closes). Sets ``message_at``. Returns the messages written (0 or 1)."""
    members = list(NotificationIncidentRun.objects.for_tenant(incident.tenant_id)
                   .filter(incident=incident).order_by("at", "pk")
                   .values_list("run_id", "resolved_at"))
    incident.message_at = now
    if all(resolved is not None for _, resolved in members):
        incident.closed_at = now
        incident.save(update_fields=["message_at", "closed_at"])
        return 0
    facts = _facts([pk for pk, _ in members[:MESSAGE_RUNS_MAX]])
    runs = [(facts[pk], resolved is not None) for pk, resolved in members if pk in facts]
    payload, subject, text = render_incident(
        event_type=incident.event_type, slug=slug, state=incident.state, cause=incident.cause,
        incident={"id": str(incident.uuid), "opened_at": incident.opened_at,
                  "window_ends_at": incident.window_ends_at},
        runs=runs, run_count=len(members), at=now)
    NotificationMessage.objects.bulk_create([NotificationMessage(
        tenant_id=incident.tenant_id, endpoint=endpoint,
        event_id=stable_event_id("incident", incident.uuid), event_type=incident.event_type,
        incident=incident, payload=payload, subject=subject, text=text)],
        ignore_conflicts=True)
    incident.save(update_fields=["message_at"])
    return 1


# --- aging and the digest ------------------------------------------------------------------

def _subscribed(event_type: str, *, held: bool = False) -> list[NotificationEndpoint]:
    """The enabled endpoints subscribed to ``event_type``, in ascending id. ``held``: held
    ``FOR KEY SHARE`` too (``hold_endpoints``, ``NAME``), for a caller that writes
    messages to them; one deleted meanwhile (waited for) is left out, and so is one
    disabled or unsubscribed meanwhile (their values are read again once held)."""
    every = NotificationEndpoint.objects.for_all_tenants(reason=_WHY).filter(enabled=True)
    found = [endpoint for endpoint in every.order_by("pk")
             if event_type in endpoint.event_types]
    if held and found:
        found = [endpoint for endpoint in hold_endpoints(
            every.filter(pk__in=[endpoint.pk for endpoint in found]), hold=NAME)
            if event_type in endpoint.event_types]
    return found


def _emit_aging() -> int:
    """Step 1 of the module docstring, in one transaction: the events emitted."""
    with transaction.atomic():
        tenants = {endpoint.tenant_id for endpoint in _subscribed(E.OUTCOME_UNKNOWN_AGING)}
        if not tenants:
            return 0
        since = db_now() - timedelta(seconds=settings.RECOVERY_NOTIFY_UNKNOWN_AGING_S)
        marked = (NotificationAgingMark.objects.for_all_tenants(reason=_WHY)
                  .filter(run=OuterRef("pk"), since=OuterRef("state_changed_at")))
        runs = list(Run.objects.for_all_tenants(reason=_WHY)
                    .filter(tenant_id__in=tenants, recovery_state=S.UNKNOWN_OUTCOME,
                            state_changed_at__lte=since)
                    .exclude(Exists(marked)).order_by("state_changed_at", "pk")
                    .values_list("pk", "tenant_id", "state_changed_at")[:BATCH])
        NotificationAgingMark.objects.bulk_create(
            [NotificationAgingMark(tenant_id=t, run_id=pk, since=at) for pk, t, at in runs],
            ignore_conflicts=True)
        NotificationOutbox.objects.bulk_create([NotificationOutbox(
            tenant_id=t, run_id=pk, event_type=E.OUTCOME_UNKNOWN_AGING,
            to_state=S.UNKNOWN_OUTCOME, detail={"since": at.isoformat()})
            for pk, t, at in runs])
    return len(runs)


def _emit_digests() -> int:
    """Step 4 of the module docstring, in one transaction: the digests written. The
    endpoints are held (``_subscribed``, ``held``) before their digests are read and
    written: one being deleted gets none (stop 34's attack)."""
    with transaction.atomic():
        now = db_now()
        if now.hour < settings.RECOVERY_NOTIFY_DIGEST_HOUR:
            return 0
        day = now.date().isoformat()
        written = []
        for endpoint in _subscribed(E.DIGEST, held=True):
            event_id = stable_event_id("digest", endpoint.uuid, day)
            if (NotificationMessage.objects.for_tenant(endpoint.tenant_id)
                    .filter(event_id=event_id).exists()):
                continue
            written.append(_digest(endpoint, event_id, day, now))
        NotificationMessage.objects.bulk_create(written, ignore_conflicts=True)
    return len(written)


def _digest(endpoint: NotificationEndpoint, event_id: str, day: str, now) -> NotificationMessage:
    """One endpoint's digest (its filters applied): runs needing a person per state, and
    the one waiting longest."""
    runs = Run.objects.for_tenant(endpoint.tenant_id).filter(
        recovery_state__in=S.NEEDS_PERSON)
    if endpoint.kinds:
        runs = runs.filter(kind__in=endpoint.kinds)
    if endpoint.agents:
        runs = runs.filter(Q(agent__in=endpoint.agents) | Q(workflow__in=endpoint.agents))
    if endpoint.services:
        runs = runs.filter(Exists(Effect.objects.for_tenant(endpoint.tenant_id).filter(
            run=OuterRef("pk"), service__in=endpoint.services,
            state__in=EffectState.DOUBTFUL)))
    found = dict(runs.order_by().values_list("recovery_state").annotate(n=Count("pk")))
    counts = {state: found.get(state, 0) for state in S.INBOX_TABS if state in S.NEEDS_PERSON}
    oldest = runs.order_by("state_changed_at", "pk").values_list("pk", "state_changed_at").first()
    slug = Tenant.objects.values_list("slug", flat=True).get(pk=endpoint.tenant_id)
    payload, subject, text = render_digest(
        slug=slug, day=day, counts=counts,
        oldest=_facts([oldest[0]])[oldest[0]] if oldest else None,
        oldest_since=oldest[1] if oldest else None, at=now)
    return NotificationMessage(tenant_id=endpoint.tenant_id, endpoint=endpoint,
                               event_id=event_id, event_type=E.DIGEST, payload=payload,
                               subject=subject, text=text)
