"""Effects: find them, read one, compare-and-swap one (the runtime's state machine)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import roles, selectors, services
from ...permissions import receipts_in_answers
from .. import params as p
from .. import serializers as s
from .common import (
    CAS_HEADERS,
    STALE,
    TENANT,
    TenantApi,
    _errors,
    _etag,
    _path,
    etag,
    parse_fencing_token,
    parse_precondition,
    read_object,
    url_uuid,
)

EFFECT_CONFLICT = OpenApiResponse(
    PolymorphicProxySerializer(
        component_name="EffectPutConflict",
        serializers=[s.OperationExistsSerializer, s.FencedErrorSerializer,
                     s.RunDeletedSerializer],
        resource_type_field_name=None),
    description="operation_exists: another effect id holds this operation key with the same "
                "fingerprint; or fenced, as for checkpoints; or run_deleted: the run's "
                "payloads were deleted (retention or erasure)")


class EffectListApi(TenantApi):
    params = {"get": p.EffectListParams}

    @extend_schema(
        operation_id="effect_list",
        summary="Find effects by service and operation key, and/or run",
        parameters=[TENANT, p.EffectListParams],
        responses={200: s.EffectListSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        q = self.query
        effects = selectors.effect_find(
            user=request.user, tenant=t, service=q["service"], operation_key=q["operation_key"],
            run_id=q["run"], limit=q["limit"])
        shown = receipts_in_answers(request.user, t)
        return Response(s.EffectListSerializer.render({"results": effects}, receipts=shown))


class EffectApi(TenantApi):
    """``…/effects/{id}``: read an effect record (GET) or compare-and-swap it (PUT)."""

    @extend_schema(
        operation_id="effect_get",
        summary="One effect record",
        parameters=[TENANT, _path("effect_id"), _etag(200)],
        responses={200: OpenApiResponse(s.EffectSerializer, description="with ETag"),
                   **_errors()},
    )
    def get(self, request, tenant, effect_id):
        t = self.tenant(request, tenant, roles.VIEW)
        effect = selectors.effect_get(user=request.user, tenant=t, effect_id=effect_id)
        shown = receipts_in_answers(request.user, t)
        return Response(s.EffectSerializer.render(effect, receipts=shown),
                        headers=etag(effect.revision))

    @extend_schema(
        operation_id="effect_put",
        summary="Create (planned) or move an effect record one state, by compare-and-swap",
        parameters=[TENANT, _path("effect_id"), *CAS_HEADERS, _etag(200, 201)],
        request=s.EffectWriteSerializer,
        responses={
            201: OpenApiResponse(s.EffectSerializer, description='created; ETag "0"'),
            200: OpenApiResponse(s.EffectSerializer, description='updated; ETag "N+1"'),
            **_errors(413, 428),
            409: EFFECT_CONFLICT,
            412: STALE,
            422: OpenApiResponse(s.UnprocessableWriteSerializer,
                                 description="invalid_transition, idempotency_key_reuse, or "
                                             "secret_detected (a credential-like value in the "
                                             "receipt or request under the tenant's refuse "
                                             "data policy; nothing stored)"),
        },
    )
    def put(self, request, tenant, effect_id):
        """The effect state machine of CONTRACT.md section 3, as the runtime may walk it."""
        t = self.tenant(request, tenant, roles.WRITE)
        url_id = url_uuid(effect_id, "effect", for_write=True)
        expected = parse_precondition(request)
        token = parse_fencing_token(request)
        body = services.parse_effect(read_object(request), url_id=url_id)
        effect, created = services.effect_put(actor=request.user, tenant=t, body=body,
                                              expected_revision=expected, fencing_token=token)
        shown = receipts_in_answers(request.user, t)
        return Response(s.EffectSerializer.render(effect, receipts=shown, run_id=body.run_id),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=etag(effect.revision))
