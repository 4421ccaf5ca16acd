"""Runs: the list, one run with everything under it, its lease, and the resume
decision (preview and claim)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response

from ... import replica, roles, selectors, services
from ...exceptions import Forbidden, InvalidPayload
from ...jobs import reconciliation
from ...permissions import receipts_in_answers
from .. import params as p
from .. import serializers as s
from ..auth import BearerTokenAuthentication
from .common import (
    RUN_DELETED,
    TENANT,
    TenantApi,
    _errors,
    _only_fields,
    _path,
    page_url,
    read_object,
    url_uuid,
)


class RunListApi(TenantApi):
    params = {"get": p.RunListParams}

    @extend_schema(
        operation_id="run_list",
        summary="The tenant's runs, newest run first, searchable, keyset-paginated",
        parameters=[TENANT, p.RunListParams],
        responses={200: s.RunPageSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        """Keyset pages on the run's creation order (``selectors.run_list``): a run
        written while a client pages is listed exactly once. A ``cursor`` made for other
        filters or another ``sort`` is a 400 naming ``cursor``."""
        t = self.tenant(request, tenant, roles.VIEW)
        q = self.query
        filters = selectors.RunFilters(
            recovery_state=q["recovery_state"], kind=q["kind"], subject=q["subject"],
            age_s_min=q["age_s_min"], q=q["q"])
        with replica.replica_reads():  # issue 22: after the access check (primary)
            page = selectors.run_list(user=request.user, tenant=t, filters=filters,
                                      sort=q["sort"], cursor=q["cursor"], limit=q["limit"])
            # What the dashboard's inbox says to do, the same words (selectors.nextstep).
            steps = selectors.page_steps(user=request.user, tenant=t, rows=page.rows)
        for row in page.rows:
            row["next_step"] = steps[row["id"]].short
        nxt = page_url(request, cursor=page.next_cursor) if page.next_cursor else None
        prev = (page_url(request, cursor=page.previous_cursor)
                if page.previous_cursor else None)
        return Response(s.RunPageSerializer.render(
            {"results": page.rows, "next": nxt, "previous": prev}, tenant=t))


class RunDetailApi(TenantApi):
    @extend_schema(
        operation_id="run_get",
        summary="A run, its latest checkpoints (metadata), effects and open review items",
        parameters=[TENANT, _path("run_id")],
        responses={200: s.RunDetailSerializer, **_errors()},
    )
    def get(self, request, tenant, run_id):
        """Reads only what it answers (``selectors.run_summary``): no revision history, no
        audit, whatever the run's length."""
        t = self.tenant(request, tenant, roles.VIEW)
        d = selectors.run_summary(user=request.user, tenant=t, run_id=run_id)
        rid = d.run.uuid
        return Response(s.RunDetailSerializer.render({
            "run": d.run,
            "checkpoints": d.checkpoints,
            "effects": d.effects,
            "open_review_items": {
                "retry_request": d.open_retry,
                "conflicts": d.open_conflicts,
            },
            "reconcile_requests": reconciliation.requests_for_run(d.run),
            "retry_preview": services.retry_preview(d.run),
            "tombstone": selectors.run_tombstone(user=request.user, tenant=t, run=d.run),
            "legal_holds": selectors.run_legal_holds(user=request.user, tenant=t, run=d.run),
            # The list's words for the same run (selectors.nextstep, the inbox's rule).
            "next_step": selectors.run_step(user=request.user, tenant=t, run=d.run).short,
        }, tenant=t, receipts=receipts_in_answers(request.user, t), run_id=rid))


class RunLeaseApi(TenantApi):
    @extend_schema(
        operation_id="run_lease",
        summary="Take or renew the run's lease; a new owner bumps the fencing token",
        parameters=[TENANT, _path("run_id")],
        request=s.LeaseInputSerializer,
        responses={200: s.LeaseSerializer, **_errors(400, 413),
                   409: OpenApiResponse(s.ErrorSerializer,
                                        description="lease_held: another owner's lease is "
                                                    "live; or run_deleted: the run's payloads "
                                                    "were deleted (retention or erasure)")},
    )
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.WRITE)
        rid = url_uuid(run_id, "run")
        body = read_object(request)
        _only_fields(body, {"owner", "ttl_s"})
        run = services.lease_acquire(actor=request.user, tenant=t, run_id=rid,
                                     owner=body.get("owner"), ttl_s=body.get("ttl_s"))
        return Response(s.LeaseSerializer.render(run))


class RunLeaseReleaseApi(TenantApi):
    @extend_schema(
        operation_id="run_lease_release",
        summary="Give back the run's live lease you hold (a runtime done with the run, or "
                "shutting down): the next owner takes it at once",
        description="``owner`` and ``fencing_token``: the lease you hold. The fencing "
                    "token goes up, so a write still on its way with the old one is "
                    "refused. A run released while its checkpoint is in flight is "
                    "ambiguous at once. Audited lease.release.",
        parameters=[TENANT, _path("run_id")],
        request=s.LeaseReleaseInputSerializer,
        responses={200: s.LeaseStateSerializer, **_errors(400, 413),
                   409: OpenApiResponse(s.ErrorSerializer,
                                        description="no_live_lease: the run holds no live "
                                                    "lease; lease_held: another owner or "
                                                    "token holds it; or run_deleted")},
    )
    def post(self, request, tenant, run_id):
        """``services.lease_release``; answers the lease ``{owner, fencing_token,
        expires_at}`` as ``…/lease/revoke`` does."""
        t = self.tenant(request, tenant, roles.WRITE)
        rid = url_uuid(run_id, "run")
        body = read_object(request)
        _only_fields(body, {"owner", "fencing_token"})
        for field in ("owner", "fencing_token"):
            if field not in body:
                raise InvalidPayload(f"{field}: required (the lease you hold)")
        run = services.lease_release(actor=request.user, tenant=t, run_id=rid,
                                     owner=body["owner"], held_token=body["fencing_token"])
        return Response(s.LeaseStateSerializer.render(run))


class RunResumeApi(TenantApi):
    params = {"get": p.IdentityParams}

    @extend_schema(
        operation_id="run_resume_preview",
        summary="Preview the resume decision: changes nothing (no approval consumed, no "
                "fencing, no audit)",
        parameters=[TENANT, _path("run_id"), p.IdentityParams],
        responses={200: s.ResumeSerializer, **_errors(400), 409: RUN_DELETED},
    )
    def get(self, request, tenant, run_id):
        """Each identity parameter given must equal the run's, else reject/identity_mismatch."""
        t = self.tenant(request, tenant, roles.WRITE)
        rid = url_uuid(run_id, "run")
        asked = {k: v for k, v in self.query.items() if v is not None}
        answer = services.resume_preview(actor=request.user, tenant=t, run_id=rid, asked=asked)
        return Response(s.ResumeSerializer.render(answer))

    @extend_schema(
        operation_id="run_resume_claim",
        summary="Claim the resume decision (runtime's bearer token, writer): an approved "
                "retry is consumed and the old owner fenced",
        parameters=[TENANT, _path("run_id")],
        request=s.ResumeInputSerializer,
        responses={200: s.ResumeSerializer, **_errors(400, 413), 409: RUN_DELETED},
    )
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.WRITE)
        if not isinstance(request.successful_authenticator, BearerTokenAuthentication):
            raise Forbidden("authorization: claiming a resume needs a runtime's bearer token, "
                            "not a browser session")
        rid = url_uuid(run_id, "run")
        body = read_object(request, empty_ok=True)
        usage = s.resume_usage(body.pop("usage")) if "usage" in body else None
        # The body's identity obeys the same rules as the GET's query (params.IdentityParams).
        checked = p.check(p.IdentityParams, body)
        asked = {k: v for k, v in checked.items() if v is not None}
        answer = services.resume_claim(actor=request.user, tenant=t, run_id=rid, asked=asked,
                                       usage=usage)
        return Response(s.ResumeSerializer.render(answer))
