"""Bulk actions (issue 9, item 3): one review action on many runs, and its results."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from ... import roles, selectors, services
from ...exceptions import InvalidPayload, ReasonRequired
from ...jsonparse import name_problem, text_problem
from ...vocab import RecoveryState
from .. import params as p
from .. import serializers as s
from .common import (
    TENANT,
    TenantApi,
    _errors,
    _only_fields,
    _path,
    _reason_operation,
    page_url,
    read_object,
    read_reason,
    url_uuid,
)

# CONTRACT.md 3 names the selection `runs`; `run_ids` is the name it had first (kept).
BULK_FIELDS = {"action", "reason", "runs", "run_ids", "filters", "client_token", "lease_owner"}
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.UUID, OpenApiParameter.HEADER,
    description="the request's idempotency key (a UUID), or `client_token` in the body: "
                "the same key with the same request answers the first one's results (200) "
                "and acts on nothing")


def _bulk_token(request: Request, body: dict) -> str:
    """The bulk request's client token: the ``Idempotency-Key`` header or the body's
    ``client_token`` (equal if both). Required: a client that retries must be able to."""
    header = request.META.get("HTTP_IDEMPOTENCY_KEY")
    field = body.get("client_token")
    if field is not None and not isinstance(field, str):
        raise InvalidPayload("client_token: must be a UUID string")
    if header is not None and field is not None and header.strip().lower() != field.lower():
        raise InvalidPayload("Idempotency-Key: differs from client_token in the body")
    token = field if field is not None else (header.strip() if header is not None else None)
    if not token:
        raise InvalidPayload("client_token: required (or the Idempotency-Key header), a "
                             "UUID the client keeps to resubmit safely")
    return token


def _bulk_filters(value) -> selectors.RunFilters:
    """The body's ``filters`` object (``BulkFiltersSerializer``) as ``RunFilters``; 400
    naming ``filters.<field>``."""
    if not isinstance(value, dict):
        raise InvalidPayload("filters: must be an object")
    unknown = sorted(set(value) - {"recovery_state", "kind", "subject", "age_s_min", "q"})
    if unknown:
        raise InvalidPayload(f"filters.{str(unknown[0])[:40]}: unknown field")
    state = value.get("recovery_state")
    if state is not None and state not in RecoveryState.values:
        raise InvalidPayload(
            f"filters.recovery_state: must be one of {', '.join(RecoveryState.values)}")
    texts = {}
    for name in ("kind", "subject"):
        limit = selectors.filter_limit(name)
        text = value.get(name)
        if text is not None and (not isinstance(text, str) or not text or len(text) > limit
                                 or text_problem(text)):
            raise InvalidPayload(f"filters.{name}: must be a non-empty string of at most "
                                 f"{limit} characters")
        texts[name] = text
    for name in ("kind", "subject", "q"):
        # The name rule, as the same filters in a query string get it
        # (``querystring.single_values``: GET …/runs, the dashboard's bulk bar); the
        # stop-35 attack's finding: a body took a value the list's query refuses.
        text = value.get(name)
        problem = name_problem(text) if isinstance(text, str) else ""
        if problem:
            raise InvalidPayload(f"filters.{name}: {problem}")
    age = value.get("age_s_min")
    if age is not None and (type(age) is not int or not 0 <= age <= 10**9):
        raise InvalidPayload("filters.age_s_min: must be an integer in 0..1000000000")
    q = value.get("q")
    if q is not None:
        if not isinstance(q, str):
            raise InvalidPayload("filters.q: must be a string (the search of GET …/runs?q=)")
        try:
            q = services.bulk_search(q)
        except InvalidPayload as exc:
            raise InvalidPayload(f"filters.{exc.detail}") from None
    return selectors.RunFilters(recovery_state=state, kind=texts["kind"],
                                subject=texts["subject"], age_s_min=age or None, q=q)


class BulkActionListApi(TenantApi):
    params = {"get": p.BulkListParams}

    @extend_schema(
        operation_id="bulk_action_list",
        summary="The tenant's bulk actions, newest first, keyset-paginated: what, who, "
                "when and the counts of each (its per-run results: GET …/bulk-actions/{id})",
        description="Any role of the tenant, as one bulk action's read. Filters are exact: "
                    "`action`, `state` (a value outside their choices is 400 naming the "
                    "parameter and listing them), `requested_by` (a username). Reads only.",
        parameters=[TENANT, p.BulkListParams],
        responses={200: s.BulkActionPageSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        """Keyset pages on the row's id (``selectors.bulk_list``): a bulk action
        submitted while a client pages never moves the ones after it."""
        t = self.tenant(request, tenant, roles.VIEW)
        q = self.query
        limit = q["limit"]
        rows = selectors.bulk_list(user=request.user, tenant=t, action=q["action"],
                                   state=q["state"], requested_by=q["requested_by"],
                                   before=q["cursor"], limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = page_url(request, cursor=str(rows[-1].pk)) if more else None
        return Response(s.BulkActionPageSerializer.render({"results": rows, "next": nxt}))

    @extend_schema(
        operation_id="bulk_action_create",
        summary="Reviewer: one review action on many runs (by id, or every run matching "
                "filters), each run acted on and audited on its own: up to 500 in the "
                "request, more (up to 50,000) as a stored job answered `queued`",
        parameters=[TENANT, IDEMPOTENCY_KEY],
        request=s.BulkActionInputSerializer,
        responses={201: s.BulkActionSerializer,
                   200: OpenApiResponse(s.BulkActionSerializer,
                                        description="the same client token and request "
                                                    "again: the first submission's results; "
                                                    "nothing was done again"),
                   **_errors(400, 413)},
    )
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.REVIEW)
        body = read_object(request, empty_ok=True)
        _only_fields(body, BULK_FIELDS)
        token = _bulk_token(request, body)
        reason = body.get("reason")
        if reason is None or (isinstance(reason, str) and not reason.strip()):
            raise ReasonRequired("reason: a reason is required")
        if not isinstance(reason, str):
            raise InvalidPayload("reason: must be a string")
        action = body.get("action")
        if not isinstance(action, str):
            raise InvalidPayload("action: must be a string")
        if "runs" in body and "run_ids" in body:
            raise InvalidPayload("runs: give runs (or its older name run_ids), not both")
        field = "runs" if "runs" in body else "run_ids"
        try:
            bulk, created = services.bulk_submit(
                actor=request.user, tenant=t, action=action, reason=reason,
                client_token=token, run_ids=body.get(field),
                filters=_bulk_filters(body["filters"]) if "filters" in body else None,
                lease_owner=body.get("lease_owner"))
        except InvalidPayload as exc:
            if field == "runs" and str(exc.detail).startswith("run_ids:"):
                raise InvalidPayload("runs:" + str(exc.detail)[len("run_ids:"):]) from None
            raise
        result = _with_progress(request, t, selectors.bulk_get(
            user=request.user, tenant=t, bulk_id=bulk.uuid))
        return Response(s.BulkActionSerializer.render(result),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class BulkActionApi(TenantApi):
    @extend_schema(
        operation_id="bulk_action_get",
        summary="A bulk action and its per-run results",
        parameters=[TENANT, _path("bulk_id")],
        responses={200: s.BulkActionSerializer, **_errors()},
    )
    def get(self, request, tenant, bulk_id):
        t = self.tenant(request, tenant, roles.VIEW)
        bid = url_uuid(bulk_id, "bulk action")
        result = _with_progress(request, t,
                                selectors.bulk_get(user=request.user, tenant=t, bulk_id=bid))
        return Response(s.BulkActionSerializer.render(result))


class BulkActionAbortApi(TenantApi):
    @_reason_operation(
        "bulk_action_abort",
        "Reviewer: stop a bulk action running as a stored job (more than 500 runs); the "
        "runs done stay done; audited bulk.abort (422 when it ran inline or already ended)",
        _path("bulk_id"), s.BulkActionSerializer)
    def post(self, request, tenant, bulk_id):
        t = self.tenant(request, tenant, roles.REVIEW)
        bid = url_uuid(bulk_id, "bulk action")
        services.bulk_abort(actor=request.user, tenant=t, bulk_id=bid,
                            reason=read_reason(request))
        result = _with_progress(request, t, selectors.bulk_get(
            user=request.user, tenant=t, bulk_id=bid))
        return Response(s.BulkActionSerializer.render(result))


def _with_progress(request, tenant, result):
    """``result`` with each row's ``progress`` and ``pending`` (``selectors.bulk_outcomes``,
    the bulk result page's own reading): a reconcile's run says ``queued``/``running``
    until its look-up settles it, then what it found (issue 21, item 8)."""
    outcomes = selectors.bulk_outcomes(user=request.user, tenant=tenant, items=result.items)
    for item in result.items:
        item.progress = outcomes[item.pk].word
        item.pending = outcomes[item.pk].pending
    return result
