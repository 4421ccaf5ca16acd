"""Legal holds and erasure requests (CONTRACT.md 8; issue 20, items 2 and 4):
``…/legal-holds`` (the tenant's admin places and releases; every role reads) and
``…/erasure-requests`` (a reviewer or admin files; an approver who is not the requester
approves, which executes it, or rejects; every role reads)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import roles, selectors, services
from ...exceptions import InvalidPayload, ReasonRequired
from .. import serializers as s
from .common import (
    TENANT,
    TenantApi,
    _errors,
    _only_fields,
    _path,
    _reason_operation,
    read_object,
    read_reason,
)

HOLD_FIELDS = {"runs", "subject", "tenant", "reason"}
ERASURE_FIELDS = {"runs", "subject", "reason"}
DECIDED = OpenApiResponse(s.ErrorSerializer, description="already_decided: approved, "
                                                         "rejected or released before")


def _body(request, allowed: set[str]) -> dict:
    """The body, only ``allowed`` keys, ``reason`` required; a key sent as null is 400
    naming it (never read as left out)."""
    body = read_object(request, empty_ok=True)
    _only_fields(body, allowed)
    for key in sorted(allowed - {"reason"}):
        if key in body and body[key] is None:
            raise InvalidPayload(f"{key}: must not be null (leave it out instead)")
    reason = body.get("reason")
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        raise ReasonRequired("reason: a reason is required")
    return body


class LegalHoldListApi(TenantApi):
    @extend_schema(operation_id="legal_hold_list",
                   summary="The tenant's legal holds, active first (at most 200)",
                   parameters=[TENANT], responses={200: s.LegalHoldListSerializer, **_errors()})
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        holds = selectors.legal_hold_list(user=request.user, tenant=t)
        return Response(s.LegalHoldListSerializer.render({"results": holds}))

    @extend_schema(operation_id="legal_hold_place",
                   summary="Tenant admin: place a legal hold on runs, a subject or the whole "
                           "tenant; neither retention nor erasure touches what it covers",
                   parameters=[TENANT], request=s.LegalHoldInputSerializer,
                   responses={201: s.LegalHoldSerializer, **_errors(400, 413)})
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.MANAGE)
        body = _body(request, HOLD_FIELDS)
        if "tenant" in body and body["tenant"] is not True:
            raise InvalidPayload("tenant: must be true (a hold on every run of the tenant), "
                                 "or left out")
        hold = services.legal_hold_place(
            actor=request.user, tenant=t, runs=body.get("runs"), subject=body.get("subject"),
            whole_tenant=body.get("tenant", False), reason=body["reason"])
        hold = selectors.legal_hold_get(user=request.user, tenant=t, hold_id=hold.uuid)
        return Response(s.LegalHoldSerializer.render(hold), status=status.HTTP_201_CREATED)


class LegalHoldApi(TenantApi):
    @extend_schema(operation_id="legal_hold_get", summary="One legal hold",
                   parameters=[TENANT, _path("hold_id")],
                   responses={200: s.LegalHoldSerializer, **_errors()})
    def get(self, request, tenant, hold_id):
        t = self.tenant(request, tenant, roles.VIEW)
        hold = selectors.legal_hold_get(user=request.user, tenant=t, hold_id=hold_id)
        return Response(s.LegalHoldSerializer.render(hold))


class LegalHoldReleaseApi(TenantApi):
    @_reason_operation("legal_hold_release",
                       "Tenant admin: release a legal hold (the row is kept, with who, when "
                       "and why)", _path("hold_id"), s.LegalHoldSerializer, codes=(),
                       more={409: DECIDED})
    def post(self, request, tenant, hold_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        reason = read_reason(request)
        hold = services.legal_hold_release(actor=request.user, tenant=t, hold_id=hold_id,
                                           reason=reason)
        hold = selectors.legal_hold_get(user=request.user, tenant=t, hold_id=hold.uuid)
        return Response(s.LegalHoldSerializer.render(hold))


class ErasureRequestListApi(TenantApi):
    @extend_schema(operation_id="erasure_request_list",
                   summary="The tenant's erasure requests, those waiting for a decision "
                           "first (at most 200)",
                   parameters=[TENANT],
                   responses={200: s.ErasureRequestListSerializer, **_errors()})
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        rows = selectors.erasure_request_list(user=request.user, tenant=t)
        for row in rows:  # what approving it would do, as the dashboard's queue shows
            row.preview = services.erasure_preview(user=request.user, tenant=t, request=row)
        return Response(s.ErasureRequestListSerializer.render({"results": rows}))

    @extend_schema(operation_id="erasure_request_create",
                   summary="Reviewer or admin: ask to erase the payloads of runs, or of every "
                           "run of a subject; an approver (not you) decides",
                   parameters=[TENANT], request=s.ErasureRequestInputSerializer,
                   responses={201: s.ErasureRequestSerializer, **_errors(400, 413)})
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.REVIEW)
        body = _body(request, ERASURE_FIELDS)
        row = services.erasure_request(actor=request.user, tenant=t, runs=body.get("runs"),
                                       subject=body.get("subject"), reason=body["reason"])
        row.preview = services.erasure_preview(user=request.user, tenant=t, request=row)
        return Response(s.ErasureRequestSerializer.render(row), status=status.HTTP_201_CREATED)


class ErasureRequestApi(TenantApi):
    @extend_schema(operation_id="erasure_request_get", summary="One erasure request",
                   parameters=[TENANT, _path("request_id")],
                   responses={200: s.ErasureRequestSerializer, **_errors()})
    def get(self, request, tenant, request_id):
        t = self.tenant(request, tenant, roles.VIEW)
        row = selectors.erasure_request_get(user=request.user, tenant=t, request_id=request_id)
        row.preview = services.erasure_preview(user=request.user, tenant=t, request=row)
        return Response(s.ErasureRequestSerializer.render(row))


class ErasureApproveApi(TenantApi):
    @extend_schema(operation_id="erasure_request_approve",
                   summary="Approver, never the requester: approve an erasure request; it is "
                           "executed at once (counts: erased, and what blocked the rest)",
                   parameters=[TENANT, _path("request_id")], request=s.OptionalReasonSerializer,
                   responses={200: s.ErasureRequestSerializer, **_errors(400, 413),
                              409: DECIDED})
    def post(self, request, tenant, request_id):
        t = self.tenant(request, tenant, roles.APPROVE)
        body = read_object(request, empty_ok=True)
        _only_fields(body, {"reason"})
        row = services.erasure_approve(actor=request.user, tenant=t, request_id=request_id,
                                       reason=body.get("reason", ""))
        return Response(s.ErasureRequestSerializer.render(row))


class ErasureRejectApi(TenantApi):
    @_reason_operation("erasure_request_reject",
                       "Approver, never the requester: reject an erasure request (nothing "
                       "is erased; the row is kept)", _path("request_id"),
                       s.ErasureRequestSerializer, codes=(), more={409: DECIDED})
    def post(self, request, tenant, request_id):
        t = self.tenant(request, tenant, roles.APPROVE)
        reason = read_reason(request)
        row = services.erasure_reject(actor=request.user, tenant=t, request_id=request_id,
                                      reason=reason)
        return Response(s.ErasureRequestSerializer.render(row))
