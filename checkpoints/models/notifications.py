"""Notifications (issue 21; CONTRACT.md 8 ``…/notification-endpoints``;
docs/notifications.md): who is told, what is waiting to be told, and every attempt.

The path of one event, each step durable:

1. ``NotificationOutbox``: a row written in the SAME transaction as the change it
   reports. A run's change into or out of a state a person must act on
   (``RecoveryState.NEEDS_PERSON``) is recorded by a trigger on the run table (migration
   0031; whichever code changes the state, like ``RunTransition``); events that are not a
   run state change (``reconcile.gave_up``) are written by their service. A crash after
   the commit loses nothing: the row waits.
2. The dispatcher (``services.notify_dispatch``) drains the outbox in id order: for each
   enabled endpoint of the tenant whose subscription matches, grouped events join an open
   ``NotificationIncident`` (same endpoint, event type, state and cause, within the
   endpoint's window) or open one; other events become a ``NotificationMessage`` at once.
   An incident whose window has closed becomes one message listing its runs (after the
   endpoint's quiet period); ``run.resolved`` of every run of a sent incident closes it.
3. The sender (``jobs.notify_send``) claims due messages (``next_attempt_at`` on the
   database clock, a claim that passes if the sender dies, so a message is sent again
   with the same ``event_id`` and receivers deduplicate), posts them, records each
   ``NotificationAttempt`` and schedules the next try on the fixed schedule.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..vocab import DeliveryState, NotificationChannel
from .effects import Effect
from .runs import Run
from .tenancy import Tenant, TenantOwned

#: Bounds (a value must fit its column and mean something).
ENDPOINT_NAME_MAX = 100
ENDPOINT_URL_MAX = 2048
ENDPOINT_EMAIL_MAX = 254
#: The most values one filter list (kinds, agents/workflows, services) may hold.
FILTER_VALUES_MAX = 50
#: The columns each filter list is matched against (``notify_dispatch``): a value is at
#: most the longest of them (``filter_value_max``), read from the model, never copied.
FILTER_COLUMNS = {"kinds": (Run, ("kind",)), "agents": (Run, ("agent", "workflow")),
                  "services": (Effect, ("service",))}
GROUP_WINDOW_S_DEFAULT = 120
GROUP_WINDOW_S_MAX = 3600
QUIET_PERIOD_S_MAX = 86_400
#: The most endpoints one tenant may have.
ENDPOINTS_PER_TENANT_MAX = 50
#: The response's first bytes a delivery attempt keeps (characters once decoded).
RESPONSE_HEAD_MAX = 512
ERROR_MAX = 300
EVENT_ID_MAX = 40
#: The most runs one grouped message lists by id (the count is always whole).
MESSAGE_RUNS_MAX = 100


def filter_value_max(field: str) -> int:
    """The most characters a value of the filter list ``field`` (``kinds``, ``agents``,
    ``services``) may have: the longest column it is matched against (``FILTER_COLUMNS``;
    ``Run.kind`` 200, ``Run.agent``/``Run.workflow`` 256, ``Effect.service`` 200), so every
    value a write can store there can be filtered on (issue 22's stop: one copied 200 for
    all three refused an agent of 201..256 characters). Raises ``KeyError`` for another
    field."""
    model, columns = FILTER_COLUMNS[field]
    return max(model._meta.get_field(column).max_length for column in columns)


class NotificationEndpoint(TenantOwned):
    """Where a tenant's notifications go (issue 21, item 1): a webhook, an email address,
    or a Slack/Teams incoming-webhook URL; which event types it takes and, optionally,
    only runs of some kinds, agents/workflows or services. Managed by the tenant's admin
    (audited); a viewer sees it without its secret.

    ``secret`` is the Standard Webhooks signing secret (``whsec_`` + base64 of 24 random
    bytes), encrypted at rest with the tenant's data key (``crypto.encrypt_text``); during
    a rotation ``previous_secret`` still signs until ``previous_secret_until`` (database
    clock), so a receiver that has not switched yet keeps verifying. ``enabled`` goes off
    by an admin or when the endpoint has failed for days (``disabled_reason`` says which).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    uuid = models.UUIDField(help_text="the endpoint's public id")
    name = models.CharField(max_length=ENDPOINT_NAME_MAX)
    channel = models.CharField(max_length=8, choices=NotificationChannel.choices)
    url = models.CharField(max_length=ENDPOINT_URL_MAX, blank=True)
    email = models.CharField(max_length=ENDPOINT_EMAIL_MAX, blank=True)
    secret = models.TextField(blank=True)
    previous_secret = models.TextField(blank=True)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    event_types = models.JSONField(default=list)
    kinds = models.JSONField(default=list, blank=True)
    agents = models.JSONField(default=list, blank=True)
    services = models.JSONField(default=list, blank=True)
    group_window_s = models.PositiveIntegerField(default=GROUP_WINDOW_S_DEFAULT)
    quiet_period_s = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=ERROR_MAX, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    failing_since = models.DateTimeField(null=True, blank=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                   related_name="+")
    created_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "uuid"], name="notify_endpoint_unique"),
            models.CheckConstraint(condition=Q(channel__in=NotificationChannel.values),
                                   name="notify_endpoint_channel_valid"),
            models.CheckConstraint(condition=Q(group_window_s__lte=GROUP_WINDOW_S_MAX),
                                   name="notify_endpoint_window_bounded"),
            models.CheckConstraint(condition=Q(quiet_period_s__lte=QUIET_PERIOD_S_MAX),
                                   name="notify_endpoint_quiet_bounded"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} endpoint {self.name!r} of tenant {self.tenant_id}"


# Declared before every other model naming a run (incident runs, messages, aging marks):
# a run's delete cascades to them in declaration order, and deleting its outbox rows first
# is what keeps it apart from the dispatcher's drain (``locks`` module docstring, "Rows
# naming a run").
class NotificationOutbox(TenantOwned):
    """One event waiting for the dispatcher, written in the transaction of the change it
    reports (see the module's docstring). ``event_type`` is blank for a run's state change
    (the trigger's rows: ``from_state`` -> ``to_state``; the dispatcher classifies them,
    ``services.notify_dispatch``), else the event's type with its ``detail`` (never a
    payload value). ``at`` is the database clock. Deleted once dispatched."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="+", db_index=False)
    event_type = models.CharField(max_length=32, blank=True)
    from_state = models.CharField(max_length=24, blank=True)
    to_state = models.CharField(max_length=24, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"outbox {self.pk}: {self.event_type or 'transition'} of run {self.run_id}"


class NotificationIncident(TenantOwned):
    """Runs of one endpoint that went into the same state (``event_type``, ``state``)
    within ``group_window_s`` of the first and share a cause (``cause``: kind, service,
    agent, as ``cause_key`` for matching) (issue 21, item 3). Becomes one message when the
    window ends (``message_at`` set); closed (``closed_at``) when every run of it resolved
    (one ``run.resolved`` message for the incident)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    uuid = models.UUIDField(help_text="the incident's public id")
    endpoint = models.ForeignKey(NotificationEndpoint, on_delete=models.CASCADE,
                                 related_name="incidents")
    event_type = models.CharField(max_length=32)
    state = models.CharField(max_length=24, blank=True)
    cause_key = models.CharField(max_length=64)
    cause = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField()
    window_ends_at = models.DateTimeField()
    message_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    run_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "uuid"],
                                               name="notify_incident_unique")]
        indexes = [
            # An open incident to join: the endpoint's, by type, state and cause.
            models.Index(fields=["endpoint", "event_type", "state", "cause_key"],
                         name="notify_incident_open_idx", condition=Q(message_at__isnull=True)),
            # Windows that have ended and wait for their message.
            models.Index(fields=["window_ends_at"], name="notify_incident_due_idx",
                         condition=Q(message_at__isnull=True)),
        ]


class NotificationIncidentRun(TenantOwned):
    """One run of an incident; ``resolved_at`` once its ``run.resolved`` arrived."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    incident = models.ForeignKey(NotificationIncident, on_delete=models.CASCADE,
                                 related_name="runs")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["incident", "run"],
                                               name="notify_incident_run_unique")]


class NotificationMessage(TenantOwned):
    """One message to one endpoint (issue 21, items 4-5), the unit of delivery and of the
    delivery log. ``event_id`` is the Standard Webhooks ``webhook-id``: the same on every
    retry and resend, so receivers deduplicate. ``payload`` is the JSON body a webhook
    receives (``{"type", "timestamp", "data"}``), ``subject``/``text`` what an email, Slack
    or Teams receives; neither holds a payload value or a receipt. ``next_attempt_at`` and
    ``claimed_until`` are database times; ``attempts`` counts tries so far."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    endpoint = models.ForeignKey(NotificationEndpoint, on_delete=models.CASCADE,
                                 related_name="messages", db_index=False)
    event_id = models.CharField(max_length=EVENT_ID_MAX)
    event_type = models.CharField(max_length=32)
    incident = models.ForeignKey(NotificationIncident, null=True, blank=True,
                                 on_delete=models.SET_NULL, related_name="messages")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+", db_index=False)
    payload = models.JSONField(default=dict)
    subject = models.CharField(max_length=200, blank=True)
    text = models.TextField(blank=True)
    state = models.CharField(max_length=12, choices=DeliveryState.choices,
                             default=DeliveryState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=ERROR_MAX, blank=True)

    #: The runs of a grouped message the delivery log names (``listed_runs``): the first.
    RUNS_LISTED = 10

    def _data(self) -> dict:
        data = self.payload.get("data") if isinstance(self.payload, dict) else None
        return data if isinstance(data, dict) else {}

    @property
    def run_count(self) -> int | None:
        """How many runs a grouped message (an incident's, a digest's) is about, from its
        payload; ``None`` for a message of one run. The delivery log's page and API alike
        (stop 34: the page showed it, the API did not)."""
        count = self._data().get("run_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    @property
    def listed_runs(self) -> list[str]:
        """The ids of a grouped message's first ``RUNS_LISTED`` runs (ids only, from its
        payload); [] for a message of one run."""
        return [r.get("id") for r in (self._data().get("runs") or [])[:self.RUNS_LISTED]
                if isinstance(r, dict) and isinstance(r.get("id"), str)]

    @property
    def in_incident(self) -> bool:
        """Whether the message is an incident's (grouped runs of one outage)."""
        return self.incident_id is not None

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "event_id"], name="notify_message_unique"),
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values),
                                   name="notify_message_state_valid"),
        ]
        indexes = [
            # The sender's due messages.
            models.Index(fields=["next_attempt_at"], name="notify_message_due_idx",
                         condition=Q(state=DeliveryState.PENDING)),
            # The delivery log: an endpoint's messages, newest first.
            models.Index(fields=["endpoint", "-id"], name="notify_message_log_idx"),
        ]


class NotificationAttempt(TenantOwned):
    """One try to deliver a message: when (database clock), how long (``latency_ms``),
    the HTTP status (``None`` when no response came) or the error, and the response's
    first bytes (``RESPONSE_HEAD_MAX`` characters, decoded leniently)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    message = models.ForeignKey(NotificationMessage, on_delete=models.CASCADE,
                                related_name="attempt_rows")
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=ERROR_MAX, blank=True)
    response_head = models.CharField(max_length=RESPONSE_HEAD_MAX, blank=True)

    class Meta:
        ordering = ["message_id", "number"]
        constraints = [models.UniqueConstraint(fields=["message", "number"],
                                               name="notify_attempt_unique")]


class NotificationAgingMark(TenantOwned):
    """A run told as ``outcome.unknown_aging`` (issue 21, item 2) for one stay in
    ``unknown_outcome``: ``since`` is the run's ``state_changed_at`` when it entered the
    state, so the event is written once per stay however many dispatch rounds see the run
    (the unique pair), and again if the run leaves and comes back. Deleted with the run
    (retention's purge deletes the run through the ORM). ``at`` is the database clock."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    since = models.DateTimeField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "since"],
                                               name="notify_aging_mark_unique")]
