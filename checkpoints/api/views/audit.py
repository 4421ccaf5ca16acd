"""The tenant's audit trail, newest first, and an event's inclusion proof."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response

from ... import audittree, intranges, roles, selectors
from .. import params as p
from .. import serializers as s
from .common import TENANT, TenantApi, _errors, _path, page_url


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


NOT_INTEGRATED = OpenApiResponse(
    s.ErrorSerializer,
    description="not_integrated: the event is queued for the audit sequencer (it runs every "
                "second), not yet under a signed tree head; retry after Retry-After seconds. "
                "audit_tree_incomplete: rows of the stored tree the proof needs are missing "
                "(run verify_audit_chain)",
    )


class AuditEventProofApi(TenantApi):
    """An audit event's inclusion proof in the tenant's Merkle tree (issue 22, item 1;
    CONTRACT.md 8): viewer and up; a GET never integrates (a queued event is 409)."""

    params = {"get": p.AuditProofParams}

    @extend_schema(
        operation_id="audit_event_proof",
        summary="An audit event's inclusion proof under a signed tree head",
        description="The event as the audit list gives it, its leaf input and hash, a signed "
                    "tree head (the newest, or the one of tree_size leaves) and the audit "
                    "path: anyone holding the head's public key checks it "
                    "(docs/security/audit.md). 400 names tree_size when it is outside the "
                    "event's leaf index + 1 .. the newest head's size, or no head was signed "
                    "at that size.",
        parameters=[TENANT, _path("audit_event_id", intranges.ROW_ID.schema(),
                                  "the event's id, as the audit list gives it"),
                    p.AuditProofParams,
                    OpenApiParameter("Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER,
                                     response=[409], required=False,
                                     description="with not_integrated (always): seconds to "
                                                 "wait before asking again")],
        responses={200: s.AuditProofSerializer, **_errors(400), 409: NOT_INTEGRATED},
    )
    def get(self, request, tenant, audit_event_id):
        t = self.tenant(request, tenant, roles.VIEW)
        proof = audittree.audit_proof(user=request.user, tenant=t, event_id=audit_event_id,
                                      tree_size=self.query["tree_size"])
        return Response(s.AuditProofSerializer.render(proof))
