"""Tombstone governance over the API (issue 20, item 5; beyond CONTRACT.md 8, listed in
``tests/api/test_schema.py``): the tenant's tombstones by cursor (viewer), and the
four-eyes purge of tombstones, ``…/tombstone-purges`` (prepare and execute: admin;
approve and reject: approver, never the preparer; list and detail: viewer)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import roles, selectors, services
from .. import params as p
from .. import serializers as s
from .common import (
    TENANT,
    TenantApi,
    _errors,
    _only_fields,
    _path,
    page_url,
    read_object,
    read_reason,
    url_uuid,
)

PURGE_ID = _path("purge_id", description="the purge's id")
REFUSED = OpenApiResponse(s.PurgeRefusedSerializer, description="purge_refused: `reason` names the "
                          "rule (no_tombstone_retention, no_export, legal_hold, "
                          "nothing_to_purge, expired, changed, state)")


def _render(request, t, purge) -> dict:
    row = selectors.tombstone_purge_get(user=request.user, tenant=t, purge_id=purge.uuid)
    return s.TombstonePurgeSerializer.render(row)


class TombstoneListApi(TenantApi):
    params = {"get": p.TombstoneListParams}

    @extend_schema(
        operation_id="tombstone_list",
        summary="The tenant's tombstones (what remains of runs whose payloads were "
                "deleted), ascending id, by cursor",
        parameters=[TENANT, p.TombstoneListParams],
        responses={200: s.TombstonePageSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        limit = self.query["limit"]
        rows = selectors.tombstone_list(user=request.user, tenant=t,
                                        after=self.query["after"], limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = page_url(request, after=str(rows[-1].pk)) if more else None
        return Response(s.TombstonePageSerializer.render({"results": rows, "next": nxt}))


class TombstonePurgeListApi(TenantApi):
    @extend_schema(
        operation_id="tombstone_purge_list",
        summary="The tenant's tombstone purges and their evidence, newest first",
        parameters=[TENANT],
        responses={200: s.TombstonePurgeListSerializer, **_errors()},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        rows = selectors.tombstone_purge_list(user=request.user, tenant=t)
        return Response(s.TombstonePurgeListSerializer.render({"results": rows}))

    @extend_schema(
        operation_id="tombstone_purge_prepare",
        summary="Tenant admin: freeze up to 1,000 exported tombstones older than the "
                "tombstone retention and free of legal holds, for a second person to "
                "approve before the deadline",
        parameters=[TENANT], request=None,
        responses={201: s.TombstonePurgeSerializer, 409: REFUSED, **_errors(413)},
    )
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.MANAGE)
        _only_fields(read_object(request, empty_ok=True), set())
        purge = services.tombstone_purge_prepare(actor=request.user, tenant=t)
        return Response(_render(request, t, purge), status=status.HTTP_201_CREATED)


class TombstonePurgeApi(TenantApi):
    @extend_schema(
        operation_id="tombstone_purge_get",
        summary="A tombstone purge and its evidence",
        parameters=[TENANT, PURGE_ID],
        responses={200: s.TombstonePurgeSerializer, **_errors()},
    )
    def get(self, request, tenant, purge_id):
        t = self.tenant(request, tenant, roles.VIEW)
        row = selectors.tombstone_purge_get(user=request.user, tenant=t,
                                            purge_id=url_uuid(purge_id, "tombstone purge"))
        return Response(s.TombstonePurgeSerializer.render(row))


class TombstonePurgeApproveApi(TenantApi):
    @extend_schema(
        operation_id="tombstone_purge_approve",
        summary="Approver: approve someone else's prepared tombstone purge before its "
                "deadline",
        parameters=[TENANT, PURGE_ID], request=None,
        responses={200: s.TombstonePurgeSerializer, 409: REFUSED, **_errors(413)},
    )
    def post(self, request, tenant, purge_id):
        t = self.tenant(request, tenant, roles.APPROVE)
        pid = url_uuid(purge_id, "tombstone purge")
        _only_fields(read_object(request, empty_ok=True), set())
        purge = services.tombstone_purge_approve(actor=request.user, tenant=t, purge_id=pid)
        return Response(_render(request, t, purge))


class TombstonePurgeRejectApi(TenantApi):
    @extend_schema(
        operation_id="tombstone_purge_reject",
        summary="Approver: reject someone else's prepared tombstone purge, with a reason",
        parameters=[TENANT, PURGE_ID], request=s.ReasonSerializer,
        responses={200: s.TombstonePurgeSerializer, 409: REFUSED, **_errors(413)},
    )
    def post(self, request, tenant, purge_id):
        t = self.tenant(request, tenant, roles.APPROVE)
        pid = url_uuid(purge_id, "tombstone purge")
        purge = services.tombstone_purge_reject(actor=request.user, tenant=t, purge_id=pid,
                                                reason=read_reason(request))
        return Response(_render(request, t, purge))


class TombstonePurgeExecuteApi(TenantApi):
    @extend_schema(
        operation_id="tombstone_purge_execute",
        summary="Tenant admin: execute an approved tombstone purge (re-checks legal holds, "
                "the fingerprint and the deadline; deletes exactly the frozen tombstones)",
        parameters=[TENANT, PURGE_ID], request=None,
        responses={200: s.TombstonePurgeSerializer, 409: REFUSED, **_errors(413)},
    )
    def post(self, request, tenant, purge_id):
        t = self.tenant(request, tenant, roles.MANAGE)
        pid = url_uuid(purge_id, "tombstone purge")
        _only_fields(read_object(request, empty_ok=True), set())
        purge = services.tombstone_purge_execute(actor=request.user, tenant=t, purge_id=pid)
        return Response(_render(request, t, purge))
