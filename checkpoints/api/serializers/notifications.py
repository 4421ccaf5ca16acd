"""Shapes of ``…/notification-endpoints`` (CONTRACT.md 8; issue 21; docs/notifications.md):
the request bodies (described; ``services.notify_endpoints`` validates them), an endpoint
as every role sees it (``url``, ``email`` and ``secret_hint`` only for an admin), the
one-time secret of a create or a rotation, and the delivery log."""

from __future__ import annotations

from rest_framework import serializers

from ...models.notifications import (
    ENDPOINT_EMAIL_MAX,
    ENDPOINT_NAME_MAX,
    ENDPOINT_URL_MAX,
    FILTER_VALUES_MAX,
    GROUP_WINDOW_S_MAX,
    QUIET_PERIOD_S_MAX,
    filter_value_max,
)
from ...selectors.notifications import destination
from ...vocab import DeliveryState, NotificationChannel, NotificationEventType
from .common import Answer, IsoDateTimeField


def _filter(field: str, help_text: str, **kwargs):
    """The schema of filter list ``field``: its values as long as the column they match
    (``filter_value_max``), spaces kept (the service, ``notify_endpoints._filter``, is
    the rule)."""
    return serializers.ListField(
        child=serializers.CharField(max_length=filter_value_max(field), trim_whitespace=False),
        max_length=FILTER_VALUES_MAX, required=False,
        help_text=help_text + "; each value matched exactly, as sent: leading or trailing "
                              "spaces are kept (a run's agent may be \"refund \", which "
                              "is not \"refund\")", **kwargs)


class NotificationEndpointInputSerializer(serializers.Serializer):
    """``POST …/notification-endpoints`` (all required but the filters and numbers) and
    ``PATCH …/{id}`` (any subset; ``channel`` cannot change)."""

    name = serializers.CharField(max_length=ENDPOINT_NAME_MAX)
    channel = serializers.ChoiceField(choices=NotificationChannel.values)
    url = serializers.CharField(required=False, max_length=ENDPOINT_URL_MAX,
                                help_text="webhook, slack, teams: an https URL")
    email = serializers.CharField(required=False, max_length=ENDPOINT_EMAIL_MAX,
                                  help_text="email: the address")
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=list(NotificationEventType.SUBSCRIBABLE)),
        min_length=1)
    kinds = _filter("kinds", help_text="only runs of these kinds (empty: every kind)")
    agents = _filter("agents",
                     help_text="only runs of these agents/workflows (empty: every one)")
    services = _filter("services", help_text="only effects at these services (empty: every one)")
    group_window_s = serializers.IntegerField(required=False, min_value=0,
                                              max_value=GROUP_WINDOW_S_MAX)
    quiet_period_s = serializers.IntegerField(required=False, min_value=0,
                                              max_value=QUIET_PERIOD_S_MAX)
    enabled = serializers.BooleanField(required=False)


class NotificationEndpointSerializer(Answer):
    """An endpoint. ``url``, ``email`` and ``secret_hint`` are null unless the caller is
    the tenant's admin (a Slack or Teams URL's path is its secret); ``destination`` (a
    URL's scheme and host, an address's domain) is for everyone. The secret itself is
    only ever in the answer of a create or a rotation."""

    id = serializers.UUIDField(source="uuid")
    name = serializers.CharField()
    channel = serializers.ChoiceField(choices=NotificationChannel.values)
    destination = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    email = serializers.SerializerMethodField()
    secret_hint = serializers.SerializerMethodField(
        help_text="admins: whsec_… and the secret's last 4 characters (webhook only)")
    event_types = serializers.ListField(child=serializers.CharField())
    kinds = serializers.ListField(child=serializers.CharField())
    agents = serializers.ListField(child=serializers.CharField())
    services = serializers.ListField(child=serializers.CharField())
    group_window_s = serializers.IntegerField()
    quiet_period_s = serializers.IntegerField()
    enabled = serializers.BooleanField()
    disabled_reason = serializers.CharField(allow_null=True)
    disabled_at = IsoDateTimeField(allow_null=True)
    failing_since = IsoDateTimeField(allow_null=True)
    last_sent_at = IsoDateTimeField(allow_null=True)
    previous_secret_until = IsoDateTimeField(allow_null=True)
    created_by = serializers.CharField(source="created_by_name")
    created_at = IsoDateTimeField()

    def get_destination(self, obj) -> str:
        return getattr(obj, "destination", None) or destination(obj)

    def get_url(self, obj) -> str | None:
        return obj.url if getattr(obj, "is_admin", False) and obj.url else None

    def get_email(self, obj) -> str | None:
        return obj.email if getattr(obj, "is_admin", False) and obj.email else None

    def get_secret_hint(self, obj) -> str | None:
        return getattr(obj, "secret_hint", "") or None

    def to_representation(self, instance):
        out = super().to_representation(instance)
        out["disabled_reason"] = out["disabled_reason"] or None
        return out


class NotificationEndpointListSerializer(Answer):
    results = NotificationEndpointSerializer(many=True)


class NotificationEndpointSecretSerializer(Answer):
    """A create's or a rotation's answer: the endpoint and its signing secret, shown
    this once (null for an unsigned channel)."""

    endpoint = NotificationEndpointSerializer()
    secret = serializers.CharField(allow_null=True,
                                   help_text="whsec_…: store it now, it is never shown again")


class NotificationAttemptSerializer(Answer):
    number = serializers.IntegerField()
    started_at = IsoDateTimeField()
    latency_ms = serializers.IntegerField(allow_null=True)
    status_code = serializers.IntegerField(allow_null=True,
                                           help_text="null: no HTTP answer (or an email)")
    error = serializers.CharField(allow_null=True)
    response_head = serializers.CharField(help_text="the answer's first 512 characters")

    def to_representation(self, instance):
        out = super().to_representation(instance)
        out["error"] = out["error"] or None
        return out


class NotificationMessageSerializer(Answer):
    """One message of the delivery log with its attempts."""

    event_id = serializers.CharField()
    event_type = serializers.CharField()
    subject = serializers.CharField()
    state = serializers.ChoiceField(choices=DeliveryState.values)
    attempts = serializers.IntegerField(help_text="tries in the current schedule")
    next_attempt_at = IsoDateTimeField(allow_null=True)
    created_at = IsoDateTimeField()
    delivered_at = IsoDateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)
    attempt_log = NotificationAttemptSerializer(many=True, source="attempt_list")
    run_count = serializers.IntegerField(
        allow_null=True, help_text="a grouped message's (an incident's, a digest's) number of "
                                   "runs; null for a message of one run")
    runs = serializers.ListField(
        child=serializers.CharField(), source="listed_runs",
        help_text="a grouped message's first ten run ids, as the delivery log page links them")
    incident = serializers.BooleanField(source="in_incident",
                                        help_text="whether the message is an incident's")

    def to_representation(self, instance):
        out = super().to_representation(instance)
        out["last_error"] = out["last_error"] or None
        if instance.state != DeliveryState.PENDING:
            out["next_attempt_at"] = None
        return out


class NotificationDeliveriesSerializer(Answer):
    results = NotificationMessageSerializer(many=True)
