"""The tenant's audit trail, newest first."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from ... import roles, selectors
from .. import params as p
from .. import serializers as s
from .common import TENANT, TenantApi, _errors, page_url


class AuditEventListApi(TenantApi):
    params = {"get": p.AuditListParams}

    @extend_schema(
        operation_id="audit_event_list",
        summary="The tenant's audit events, newest first",
        parameters=[TENANT, p.AuditListParams],
        responses={200: s.AuditPageSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        q = self.query
        limit = q["limit"]
        events = selectors.audit_list(user=request.user, tenant=t, run_id=q["run"],
                                      actor=q["actor"], action=q["action"],
                                      before_seq=q["before_seq"], q=q["q"],
                                      limit=limit + 1)
        more = len(events) > limit
        events = events[:limit]
        nxt = page_url(request, before_seq=str(events[-1].seq)) if more else None
        return Response(s.AuditPageSerializer.render({"results": events, "next": nxt}))
