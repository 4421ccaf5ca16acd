"""The tenant's data policy (issue 20, item 1; CONTRACT.md 8; docs/security/retention.md):
``GET`` for any role of the tenant, ``PUT`` for its admin (``services.data_policy_set``)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiRequest, extend_schema
from rest_framework.response import Response

from ... import roles, selectors, services
from .. import serializers as s
from .common import TENANT, TenantApi, _errors, _only_fields, read_object

_EXAMPLE = {"payload_retention_days": 30, "effect_retention_days": 90,
            "restart_interval_s": 86400, "secrets_policy": "warn",
            "subject_fields": {"customer": "/customer/id"}}


class DataPolicyApi(TenantApi):
    @extend_schema(
        operation_id="data_policy_get",
        summary="The tenant's data policy: retention of payloads, effect records and "
                "tombstones, the restart interval, the secrets policy, the payload size "
                "flag, the subject fields (docs/security/retention.md)",
        parameters=[TENANT],
        responses={200: s.DataPolicySerializer, **_errors()},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        row = selectors.data_policy_get(user=request.user, tenant=t)
        return Response(s.DataPolicySerializer.of(row, changed=False))

    @extend_schema(
        operation_id="data_policy_put",
        summary="Set the tenant's data policy (tenant admin; any subset of its fields, one "
                "left out keeps its value; the same values again write nothing). Refused "
                "naming the field: a value out of range, an effect retention shorter than "
                "the restart interval (the idempotency window), a bad JSON pointer",
        parameters=[TENANT],
        request=OpenApiRequest(s.DataPolicyInputSerializer, examples=[
            OpenApiExample("thirty days of payloads", value=_EXAMPLE)]),
        responses={200: s.DataPolicySerializer, **_errors(413)},
    )
    def put(self, request, tenant):
        t = self.tenant(request, tenant, roles.MANAGE)
        body = read_object(request)
        _only_fields(body, set(services.POLICY_FIELDS))  # 400 naming an unknown field
        row, changed = services.data_policy_set(actor=request.user, tenant=t, **body)
        return Response(s.DataPolicySerializer.of(row, changed=changed))
