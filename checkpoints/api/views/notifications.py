"""Notification endpoints (CONTRACT.md 8 ``…/notification-endpoints``; issue 21, items 1
and 5; docs/notifications.md): every role reads (no secret, and a URL or an address only
for the admin); the tenant's admin creates, changes, deletes, rotates the secret, sends
a test event and resends a message of the delivery log."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import roles, selectors, services
from ...services.notify_endpoints import FIELDS
from .. import serializers as s
from .common import TENANT, TenantApi, _errors, _only_fields, _path, read_object

ENDPOINT = _path("endpoint_id")
EVENT = _path("event_id", OpenApiTypes.STR, "the message's event id (webhook-id)")


def _secret_answer(request, tenant, endpoint, secret: str) -> dict:
    endpoint = selectors.notification_endpoint_get(user=request.user, tenant=tenant,
                                                   endpoint_id=endpoint.uuid)
    return s.NotificationEndpointSecretSerializer.render(
        {"endpoint": endpoint, "secret": secret or None})


def _exists(request, tenant, endpoint_id) -> None:
    """404 for an unknown endpoint before the body is judged (a bad id is not found,
    whatever the body)."""
    selectors.notification_endpoint_get(user=request.user, tenant=tenant,
                                        endpoint_id=endpoint_id)


class NotificationEndpointListApi(TenantApi):
    @extend_schema(operation_id="notification_endpoint_list",
                   summary="The tenant's notification endpoints (no secret; URLs and "
                           "addresses for the admin only)",
                   parameters=[TENANT],
                   responses={200: s.NotificationEndpointListSerializer, **_errors()})
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        rows = selectors.notification_endpoint_list(user=request.user, tenant=t)
        return Response(s.NotificationEndpointListSerializer.render({"results": rows}))

    @extend_schema(operation_id="notification_endpoint_create",
                   summary="Tenant admin: add a webhook, email, Slack or Teams endpoint; "
                           "the answer carries the webhook signing secret, shown this once",
                   parameters=[TENANT], request=s.NotificationEndpointInputSerializer,
                   responses={201: s.NotificationEndpointSecretSerializer,
                              **_errors(400, 413)})
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.MANAGE)
        body = read_object(request)
        _only_fields(body, set(FIELDS))
        endpoint, secret = services.endpoint_create(actor=request.user, tenant=t, body=body)
        return Response(_secret_answer(request, t, endpoint, secret),
                        status=status.HTTP_201_CREATED)


class NotificationEndpointApi(TenantApi):
    @extend_schema(operation_id="notification_endpoint_get", summary="One endpoint",
                   parameters=[TENANT, ENDPOINT],
                   responses={200: s.NotificationEndpointSerializer, **_errors()})
    def get(self, request, tenant, endpoint_id):
        t = self.tenant(request, tenant, roles.VIEW)
        row = selectors.notification_endpoint_get(user=request.user, tenant=t,
                                                  endpoint_id=endpoint_id)
        return Response(s.NotificationEndpointSerializer.render(row))

    @extend_schema(operation_id="notification_endpoint_update",
                   summary="Tenant admin: change any subset of an endpoint's fields (not "
                           "its channel); enabled: true re-enables a disabled one",
                   parameters=[TENANT, ENDPOINT],
                   request=s.NotificationEndpointInputSerializer(partial=True),
                   responses={200: s.NotificationEndpointSerializer, **_errors(400, 413)})
    def patch(self, request, tenant, endpoint_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        _exists(request, t, endpoint_id)
        body = read_object(request)
        _only_fields(body, set(FIELDS))
        services.endpoint_update(actor=request.user, tenant=t, endpoint_id=endpoint_id,
                                 body=body)
        row = selectors.notification_endpoint_get(user=request.user, tenant=t,
                                                  endpoint_id=endpoint_id)
        return Response(s.NotificationEndpointSerializer.render(row))

    @extend_schema(operation_id="notification_endpoint_delete",
                   summary="Tenant admin: delete an endpoint with its delivery log",
                   parameters=[TENANT, ENDPOINT], responses={204: None, **_errors()})
    def delete(self, request, tenant, endpoint_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        services.endpoint_delete(actor=request.user, tenant=t, endpoint_id=endpoint_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class NotificationRotateApi(TenantApi):
    @extend_schema(operation_id="notification_endpoint_rotate_secret",
                   summary="Tenant admin: a new signing secret (shown this once); the "
                           "previous one keeps signing for 24 h",
                   parameters=[TENANT, ENDPOINT], request=None,
                   responses={200: s.NotificationEndpointSecretSerializer, **_errors(422)})
    def post(self, request, tenant, endpoint_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        _exists(request, t, endpoint_id)
        _only_fields(read_object(request, empty_ok=True), set())
        endpoint, secret = services.endpoint_rotate_secret(actor=request.user, tenant=t,
                                                           endpoint_id=endpoint_id)
        return Response(_secret_answer(request, t, endpoint, secret))


class NotificationTestApi(TenantApi):
    @extend_schema(operation_id="notification_endpoint_test",
                   summary="Tenant admin: send a test event (a message of type test, due "
                           "now)",
                   parameters=[TENANT, ENDPOINT], request=None,
                   responses={202: s.NotificationMessageSerializer, **_errors(422)})
    def post(self, request, tenant, endpoint_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        _exists(request, t, endpoint_id)
        _only_fields(read_object(request, empty_ok=True), set())
        message = services.notification_test(actor=request.user, tenant=t,
                                             endpoint_id=endpoint_id)
        message.attempt_list = []
        return Response(s.NotificationMessageSerializer.render(message),
                        status=status.HTTP_202_ACCEPTED)


class NotificationDeliveriesApi(TenantApi):
    @extend_schema(operation_id="notification_endpoint_deliveries",
                   summary="An endpoint's delivery log: its newest 100 messages, each with "
                           "its attempts (status, latency, the answer's first bytes)",
                   parameters=[TENANT, ENDPOINT],
                   responses={200: s.NotificationDeliveriesSerializer, **_errors()})
    def get(self, request, tenant, endpoint_id):
        t = self.tenant(request, tenant, roles.VIEW)
        _endpoint, rows = selectors.notification_deliveries(user=request.user, tenant=t,
                                                            endpoint_id=endpoint_id)
        return Response(s.NotificationDeliveriesSerializer.render({"results": rows}))


class NotificationResendApi(TenantApi):
    @extend_schema(operation_id="notification_resend",
                   summary="Tenant admin: send a delivered or failed message again, with "
                           "the same event id (receivers deduplicate)",
                   parameters=[TENANT, ENDPOINT, EVENT], request=None,
                   responses={202: s.NotificationMessageSerializer, **_errors(422)})
    def post(self, request, tenant, endpoint_id, event_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        _exists(request, t, endpoint_id)
        _only_fields(read_object(request, empty_ok=True), set())
        message = services.notification_resend(actor=request.user, tenant=t,
                                               endpoint_id=endpoint_id, event_id=event_id)
        message.attempt_list = []
        return Response(s.NotificationMessageSerializer.render(message),
                        status=status.HTTP_202_ACCEPTED)
