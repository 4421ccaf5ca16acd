"""Review actions: retry requests (ask, approve, reject, withdraw), reconcile, close,
acknowledge conflicts, mark an effect unknown and reveal its receipt (each POSTs a
``reason``, audited); and the approvers' queue of retry requests, read as the dashboard's
Approvals page reads it (``GET …/retry-requests``, one, or a list)."""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.response import Response

from ... import intranges, roles, selectors, services
from ...exceptions import NotFound
from ...jobs import reconciliation
from ...permissions import receipts_in_answers
from .. import params as p
from .. import serializers as s
from .common import (
    OWNER_LIVE,
    TENANT,
    TenantApi,
    _errors,
    _known_account,
    _path,
    _reason_operation,
    page_url,
    read_reason,
    read_reason_body,
    url_uuid,
)

_PK_RE = re.compile(r"^[1-9][0-9]{0,18}\Z")
RETRY_ID = _path("retry_id", intranges.ROW_ID.schema())


class EffectMarkUnknownApi(TenantApi):
    @_reason_operation(
        "effect_mark_unknown", "Reviewer: nobody can tell whether this effect happened",
        _path("effect_id"), s.EffectSerializer, more={409: OWNER_LIVE})
    def post(self, request, tenant, effect_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        eid = url_uuid(effect_id, "effect")
        reason = read_reason(request)
        effect = services.effect_mark_unknown(actor=request.user, tenant=t, effect_id=eid,
                                              reason=reason)
        # The answer is the row the service moved; its run (which never changes) is read
        # here rather than lazily by the serializer.
        run_id = selectors.effect_get(user=request.user, tenant=t, effect_id=eid).run.uuid
        shown = receipts_in_answers(request.user, t)
        return Response(s.EffectSerializer.render(effect, receipts=shown, run_id=run_id))


class EffectReceiptRevealApi(TenantApi):
    @_reason_operation(
        "effect_reveal_receipt",
        "Reviewer, approver or admin: reveal an effect's receipt (reason required, audited)",
        _path("effect_id"), s.ReceiptRevealSerializer, codes=(410,))
    def post(self, request, tenant, effect_id):
        """Receipts are treated like payloads (CONTRACT.md 4): roles that may reveal see
        one only through this audited call; writers read them in effect answers."""
        t = self.tenant(request, tenant, roles.REVEAL)
        eid = url_uuid(effect_id, "effect")
        revealed = services.receipt_reveal(actor=request.user, tenant=t, effect_id=eid,
                                           reason=read_reason(request))
        return Response(s.ReceiptRevealSerializer.render(revealed))


class RetryRequestCreateApi(TenantApi):
    @_reason_operation(
        "retry_request_create",
        "Reviewer: ask for a retry of an in-doubt run (a different approver decides)",
        _path("run_id"), s.RetryRequestSerializer, status=201, more={409: OWNER_LIVE})
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        rid = url_uuid(run_id, "run")
        retry = services.retry_request(actor=request.user, tenant=t, run_id=rid,
                                       reason=read_reason(request))
        return Response(s.RetryRequestSerializer.render(retry, run_id=rid),
                        status=status.HTTP_201_CREATED)


def _retry_pk(value: str) -> int:
    if not _PK_RE.match(value) or not intranges.ROW_ID.contains(int(value)):
        raise NotFound("no such retry request")
    return int(value)


class RetryRequestListApi(TenantApi):
    """``GET …/retry-requests``: the approvers' work queue (CONTRACT.md 4's approver;
    the dashboard's Approvals page, issue 21 item 9) over the API, so a script deciding
    retries reads what the page shows instead of paging ``GET …/runs`` for the open
    request of each run awaiting approval."""

    params = {"get": p.RetryListParams}

    @extend_schema(
        operation_id="retry_request_list",
        summary="Approver: the tenant's retry requests, awaiting a decision by default "
                "(the dashboard's Approvals queue), newest first, keyset-paginated",
        description="The rows of the Approvals page (`selectors.retry_requests_in`, one "
                    "queryset for both): with `state=requested`, the default, exactly "
                    "the requests the page lists, each with what an approval would do "
                    "(`preview`) and its possible duplicates; `own` marks yours, which "
                    "another approver decides. Approvers and admins, as the page (403 "
                    "for other roles). Reads only: no audit event.",
        parameters=[TENANT, p.RetryListParams],
        responses={200: s.RetryRequestPageSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        """Keyset pages on the request's id (``selectors.retry_request_list``): a
        request decided while a client pages keeps its place."""
        t = self.tenant(request, tenant, roles.APPROVE)
        q = self.query
        limit = q["limit"]
        rows = selectors.retry_request_list(
            user=request.user, tenant=t, run_id=q["run"], sort=q["sort"],
            # One run's requests: all of them, decided too (the stop-38 newcomer's
            # ?run= found nothing once the request was approved).
            state=q["state"] or ("all" if q["run"] else "requested"),
            after=q["cursor"], limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = page_url(request, cursor=str(rows[-1].retry.pk)) if more else None
        return Response(s.RetryRequestPageSerializer.render({"results": rows, "next": nxt}))


class RetryRequestApi(TenantApi):
    @extend_schema(
        operation_id="retry_request_get",
        summary="Approver: one retry request, in any state, as the retry request list "
                "gives it",
        parameters=[TENANT, RETRY_ID],
        responses={200: s.RetryRequestItemSerializer, **_errors()},
    )
    def get(self, request, tenant, retry_id):
        t = self.tenant(request, tenant, roles.APPROVE)
        row = selectors.retry_request_get(user=request.user, tenant=t,
                                          retry_id=_retry_pk(retry_id))
        return Response(s.RetryRequestItemSerializer.render(row))


class _RetryDecisionApi(TenantApi):
    """Approve or reject someone else's retry request (approver role, four eyes)."""

    decide = staticmethod(services.retry_approve)

    def post(self, request, tenant, retry_id):
        t = self.tenant(request, tenant, roles.APPROVE)
        pk = _retry_pk(retry_id)
        retry = self.decide(actor=request.user, tenant=t, retry_id=pk,
                            reason=read_reason(request))
        # The decided row as the service left it; its run and requester (which never
        # change) read here in one query rather than lazily by the serializer.
        loaded = selectors.retry_get(user=request.user, tenant=t, retry_id=pk)
        retry.requested_by = loaded.requested_by
        _known_account(retry, "decided_by", request.user)
        return Response(s.RetryRequestSerializer.render(retry, run_id=loaded.run.uuid))


@extend_schema_view(post=_reason_operation(
    "retry_request_approve", "Approver: approve someone else's retry request", RETRY_ID,
    s.RetryRequestSerializer))
class RetryApproveApi(_RetryDecisionApi):
    decide = staticmethod(services.retry_approve)


@extend_schema_view(post=_reason_operation(
    "retry_request_reject", "Approver: reject someone else's retry request", RETRY_ID,
    s.RetryRequestSerializer))
class RetryRejectApi(_RetryDecisionApi):
    decide = staticmethod(services.retry_reject)


class RetryWithdrawApi(TenantApi):
    @_reason_operation(
        "retry_request_withdraw",
        "Reviewer: withdraw your own retry request while no approver has decided it",
        RETRY_ID, s.RetryRequestSerializer,
        description="The request becomes `withdrawn` (`decided_by` stays null: nobody "
                    "decided it) and the run leaves `awaiting_approval`. 403 for someone "
                    "else's request; 422 `invalid_transition` once it is approved, rejected, "
                    "withdrawn, expired or consumed (`detail` says by whom and when).")
    def post(self, request, tenant, retry_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        pk = _retry_pk(retry_id)
        retry = services.retry_withdraw(actor=request.user, tenant=t, retry_id=pk,
                                        reason=read_reason(request))
        # The caller is the requester; the run (which never changes) read in one query.
        loaded = selectors.retry_get(user=request.user, tenant=t, retry_id=pk)
        _known_account(retry, "requested_by", request.user)
        return Response(s.RetryRequestSerializer.render(retry, run_id=loaded.run.uuid))


class RunReconcileApi(TenantApi):
    @_reason_operation(
        "run_reconcile", "Reviewer: reconcile the run's in-doubt effects (stored jobs, retried)",
        _path("run_id"), s.TaskSerializer, status=202, more={409: OWNER_LIVE})
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        rid = url_uuid(run_id, "run")
        queued = services.run_reconcile(actor=request.user, tenant=t, run_id=rid,
                                              reason=read_reason(request))
        requests = reconciliation.requests_get(t, [r.pk for r in queued.requests])
        return Response(s.TaskSerializer.render({"task_id": queued.task_id,
                                                 "queued": queued.dispatched,
                                                 "dispatch": queued.dispatch,
                                                 "detail": queued.detail, "requests": requests}),
                        status=status.HTTP_202_ACCEPTED)


class RunCloseApi(TenantApi):
    @_reason_operation(
        "run_close", "Reviewer: close a run handled outside the system (until its next write)",
        _path("run_id"), s.ClosedSerializer)
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        rid = url_uuid(run_id, "run")
        run = services.run_close(actor=request.user, tenant=t, run_id=rid,
                                 reason=read_reason(request))
        return Response(s.ClosedSerializer.render(run))


class RunLeaseRevokeApi(TenantApi):
    @extend_schema(
        operation_id="run_lease_revoke",
        summary="Reviewer: end the run's live lease when you know its owner is gone (its "
                "writes are refused from now on: the fencing token goes up)",
        description="For a runtime that took a long lease and died: reconcile, mark "
                    "unknown and retry requests stop answering owner_live for the lease. "
                    "A call the owner already made to an outside service may still land, "
                    "so reconcile the run next. ``owner`` and ``fencing_token`` (optional): "
                    "the lease you saw; a lease taken since is not ended (409).",
        parameters=[TENANT, _path("run_id")],
        request=s.LeaseRevokeInputSerializer,
        responses={200: s.LeaseStateSerializer, **_errors(400, 413),
                   409: OpenApiResponse(s.ErrorSerializer,
                                        description="no_live_lease: the run holds no live "
                                                    "lease; lease_held: another owner than "
                                                    "``owner`` holds it; or run_deleted")},
    )
    def post(self, request, tenant, run_id):
        """``services.lease_revoke``; answers the run's lease ``{owner, fencing_token,
        expires_at}`` (``RunLeaseApi``'s answer, with the owner)."""
        t = self.tenant(request, tenant, roles.REVIEW)
        rid = url_uuid(run_id, "run")
        reason, body = read_reason_body(request, frozenset({"owner", "fencing_token"}))
        run = services.lease_revoke(actor=request.user, tenant=t, run_id=rid, reason=reason,
                                    expected_owner=body.get("owner"),
                                    expected_token=body.get("fencing_token"))
        return Response(s.LeaseStateSerializer.render(run))


class ConflictsAcknowledgeApi(TenantApi):
    @_reason_operation(
        "run_conflicts_acknowledge", "Reviewer: acknowledge every open conflict of the run",
        _path("run_id"), s.AcknowledgedSerializer, codes=())
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        rid = url_uuid(run_id, "run")
        n = services.conflicts_acknowledge(actor=request.user, tenant=t, run_id=rid,
                                           reason=read_reason(request))
        return Response(s.AcknowledgedSerializer.render({"acknowledged": n}))
