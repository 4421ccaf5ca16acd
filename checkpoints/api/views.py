"""The HTTP API (CONTRACT.md sections 3 and 6): one APIView per path, one method per operation.

Every view does the same four steps, in this order:

1. **Tenant scope**: ``permissions.access_tenant(user, slug, right)``. No role in the
   tenant -> 404, exactly as for a tenant that does not exist (so nothing about its
   objects leaks and nothing is changed); a role lacking ``right`` -> 403. This runs
   before the body is read or any id is looked at.
2. **Query, headers and body**: the query parameters are checked against the
   endpoint's ``params`` (``checkpoints.api.params``: one place, 400 naming the
   parameter) as part of step 1; the raw body is read here (413 over
   ``settings.RECOVERY_MAX_BODY_BYTES``, 411 when sent chunked without
   ``Content-Length``) and parsed by ``jsonparse.loads_object`` (strict JSON, 400
   ``invalid_payload``); DRF's parsers never see it (``_NoParse``).
3. **One service or selector call**, which re-checks the right and writes its audit event
   in the same transaction.
4. **Answer** with the documented JSON: rendered by the serializer that also documents
   it in the schema (``serializers.Answer.render``), and, for CAS resources, an
   ``ETag: "N"``. Every answer is ``Cache-Control: no-store`` (tenant data, payloads and
   receipts must not sit in a cache).

Domain errors (``checkpoints.exceptions``) become their status and body in
``checkpoints.api.errors.exception_handler``.
"""

from __future__ import annotations

import re
import uuid

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.utils.cache import add_never_cache_headers
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework import status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import intranges, reconciliation, reports, roles, selectors, services
from ..exceptions import (
    Forbidden,
    InvalidPayload,
    LengthRequired,
    NotFound,
    PayloadTooLarge,
    PreconditionRequired,
    ReasonRequired,
    UnsupportedMediaType,
)
from ..interop import langgraph
from ..jsonparse import loads_object, text_problem
from ..models import MAX_REVISION, Tenant
from ..permissions import access_tenant, receipts_in_answers, require, tenant_perms
from ..vocab import AuditAction, RecoveryState
from . import params as p
from . import serializers as s
from .auth import BearerTokenAuthentication
from .schema import ApiSchema

# --------------------------------------------------------------------------------------
# Request helpers
# --------------------------------------------------------------------------------------

_STRONG_ETAG_RE = re.compile(r'^"(0|[1-9][0-9]{0,18})"\Z')
_UINT_RE = re.compile(r"^(0|[1-9][0-9]{0,18})\Z")
_PK_RE = re.compile(r"^[1-9][0-9]{0,18}\Z")


class _NoParse(BaseParser):
    """Accepts any media type and reads nothing.

    DRF's CSRF check for session-authenticated POSTs touches ``request.POST``, which would
    otherwise run DRF's (lenient) JSON parser over the body and consume the stream. Our
    bodies are read raw by ``read_object`` and parsed strictly instead.
    """

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        return {}


def read_object(request: Request, *, empty_ok: bool = False) -> dict:
    """The request body as one strict JSON object (CONTRACT.md section 6).

    Raises ``LengthRequired`` (411) for a body sent with ``Transfer-Encoding`` (chunked)
    instead of ``Content-Length``: under WSGI Django would read it as empty, so it is
    refused rather than taken for ``{}``. Raises ``PayloadTooLarge`` (413) when
    ``Content-Length`` or the bytes actually read exceed ``RECOVERY_MAX_BODY_BYTES`` (also
    when Django itself refuses the body), and ``InvalidPayload`` (400) for everything
    ``jsonparse.loads_object`` refuses. With ``empty_ok`` an empty body reads as ``{}``
    (review actions: then "reason" is named).
    """
    limit = settings.RECOVERY_MAX_BODY_BYTES
    raw_request = request._request
    if raw_request.META.get("HTTP_TRANSFER_ENCODING"):
        raise LengthRequired("Content-Length: required; a body sent with Transfer-Encoding "
                             "(chunked) is not accepted")
    declared = raw_request.META.get("CONTENT_LENGTH") or "0"
    if not _UINT_RE.match(declared.strip()):
        raise InvalidPayload("Content-Length: not a non-negative integer")
    if int(declared) > limit:
        raise PayloadTooLarge(f"body: larger than {limit} bytes")
    try:
        raw = raw_request.body
    except RequestDataTooBig:
        raise PayloadTooLarge(f"body: larger than {limit} bytes") from None
    if len(raw) > limit:
        raise PayloadTooLarge(f"body: larger than {limit} bytes")
    if empty_ok and not raw.strip():
        return {}
    media_type = (raw_request.META.get("CONTENT_TYPE") or "").split(";")[0].strip().lower()
    if media_type and media_type != "application/json" and not media_type.endswith("+json"):
        raise UnsupportedMediaType(f"Content-Type: {media_type} is not application/json")
    return loads_object(raw)


def _only_fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidPayload(f"{unknown[0]}: unknown field")


def parse_precondition(request: Request) -> int | None:
    """The CAS precondition: ``None`` to create (``If-None-Match: *``), N to update from N.

    Exactly one strong entity tag is accepted (CONTRACT.md section 3). Raises
    ``PreconditionRequired`` (428) when neither header is sent and ``InvalidPayload``
    (400) for both headers, ``If-Match: *``, a list, a weak ``W/"N"``, an unquoted,
    non-integer or out-of-range tag, or an ``If-None-Match`` other than ``*``.
    """
    if_match = request.META.get("HTTP_IF_MATCH")
    if_none_match = request.META.get("HTTP_IF_NONE_MATCH")
    if if_match is None and if_none_match is None:
        raise PreconditionRequired(
            'If-Match: required ("N" to update from revision N), or If-None-Match: * to create')
    if if_match is not None and if_none_match is not None:
        raise InvalidPayload("If-Match: send If-Match or If-None-Match, not both")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise InvalidPayload("If-None-Match: must be exactly * (create)")
        return None
    match = _STRONG_ETAG_RE.match(if_match.strip())
    if match is None or int(match[1]) > MAX_REVISION:
        raise InvalidPayload(
            'If-Match: must be exactly one strong entity tag "N", N the current revision')
    return int(match[1])


def parse_fencing_token(request: Request) -> int | None:
    """``Fencing-Token: T`` as an integer in 0..2^63-1, ``None`` when absent; else 400."""
    raw = request.META.get("HTTP_FENCING_TOKEN")
    if raw is None:
        return None
    raw = raw.strip()
    if not _UINT_RE.match(raw) or not intranges.FENCING_TOKEN.contains(int(raw)):
        raise InvalidPayload("Fencing-Token: must be an integer in 0..2^63-1")
    return int(raw)


def url_uuid(value: str, what: str, *, for_write: bool = False) -> uuid.UUID:
    """A UUID from the URL. A malformed one is 404 on reads (no such object can exist) and
    400 naming ``id`` on a PUT (the client means to create it)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        if for_write:
            raise InvalidPayload(f"id: {value[:64]!r} in the URL is not a UUID") from None
        raise NotFound(f"no such {what}") from None


def read_reason(request: Request) -> str:
    """The ``reason`` of a review action body ``{"reason": str}``.

    Missing or blank -> ``ReasonRequired`` (400 naming ``reason``); not a string or any
    other field -> ``InvalidPayload``. The service trims and length-checks it.
    """
    body = read_object(request, empty_ok=True)
    _only_fields(body, {"reason"})
    reason = body.get("reason")
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        raise ReasonRequired("reason: a reason is required")
    if not isinstance(reason, str):
        raise InvalidPayload("reason: must be a string")
    return reason


def etag(revision: int) -> dict[str, str]:
    return {"ETag": f'"{revision}"'}


def _payload_action(user, tenant: Tenant) -> str:
    """How ``user`` reads a checkpoint's payload in ``tenant``: ``payload.reveal``
    (reviewer, approver, admin), ``payload.read`` (writer); ``Forbidden`` for a role that
    may not read payloads (viewer)."""
    perms = tenant_perms(user, tenant)
    if roles.REVEAL in perms:
        return AuditAction.PAYLOAD_REVEAL
    if roles.WRITE in perms:
        return AuditAction.PAYLOAD_READ
    raise Forbidden("your role may not read payloads")


def _known_account(row, field: str, user) -> None:
    """Set ``row.<field>`` (a foreign key to an account) to ``user`` when it names that
    account: the caller of a write is its writer, so rendering its name loads nothing."""
    if user is not None and getattr(row, f"{field}_id") == user.pk:
        setattr(row, field, user)


def page_url(request: Request, **changes) -> str:
    """The absolute URL of this request with query parameters replaced by ``changes``."""
    params = request.query_params.copy()
    for key, value in changes.items():
        params[key] = value
    return request.build_absolute_uri(request.path) + "?" + params.urlencode()


# --------------------------------------------------------------------------------------
# OpenAPI helpers
# --------------------------------------------------------------------------------------

def _path(name: str, kind=OpenApiTypes.UUID, description: str = "") -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.PATH, description=description)


TENANT = _path("tenant", OpenApiTypes.STR, "the tenant's slug")
CAS_HEADERS = [
    OpenApiParameter("If-None-Match", OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description="`*` to create (body revision 0)"),
    OpenApiParameter("If-Match", OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description='`"N"` to update from revision N (body revision N+1)'),
    OpenApiParameter("Fencing-Token", intranges.FENCING_TOKEN.schema(), OpenApiParameter.HEADER,
                     description="the run's current fencing token; required while it is leased"),
]


def _etag(*codes: int) -> OpenApiParameter:
    """The ``ETag: "N"`` answer header of a CAS resource, on answers ``codes``."""
    return OpenApiParameter("ETag", OpenApiTypes.STR, OpenApiParameter.HEADER,
                            response=list(codes), required=True,
                            description='the stored revision, `"N"`')


ERR = OpenApiResponse(s.ErrorSerializer)
UNAVAILABLE = OpenApiResponse(
    s.ErrorSerializer, description="unavailable: the database or the task broker is down; "
                                   "retry after Retry-After seconds (CONTRACT.md 6)")
STALE = OpenApiResponse(s.ConflictErrorSerializer,
                        description="conflict: the stored revision is not the one in If-Match "
                                    "(or the id exists, on a create); kept as a conflict")
FENCED = OpenApiResponse(s.FencedErrorSerializer,
                         description="fenced: the run is leased and Fencing-Token is not its "
                                     "current token; kept as a conflict")
OWNER_LIVE = OpenApiResponse(s.OwnerLiveSerializer,
                             description="owner_live: the run's owner is alive")
EFFECT_CONFLICT = OpenApiResponse(
    PolymorphicProxySerializer(
        component_name="EffectPutConflict",
        serializers=[s.OperationExistsSerializer, s.FencedErrorSerializer],
        resource_type_field_name=None),
    description="operation_exists: another effect id holds this operation key with the same "
                "fingerprint; or fenced, as for checkpoints")


def _errors(*codes: int) -> dict:
    """The error answers every operation may give: 401 unauthenticated, 403 role, 404
    tenant/object, 400 query, 503 outage; and ``codes`` (an ``Error`` body each), with 413
    (a body): also 411 (chunked, no Content-Length) and 415 (not JSON). An operation adds
    its specific bodies (409, 412) after these."""
    out = {400: ERR, 401: ERR, 403: ERR, 404: ERR, 503: UNAVAILABLE}
    for code in codes:
        out[code] = ERR
    if 413 in codes:
        out[411] = ERR
        out[415] = ERR
    return out


RETRY_ID = _path("retry_id", intranges.ROW_ID.schema())


def _reason_operation(operation_id: str, summary: str, on: OpenApiParameter, answer, *,
                      status: int = 200, codes: tuple[int, ...] = (422,),
                      more: dict | None = None, description: str | None = None):
    """``extend_schema`` of an action that POSTs ``{"reason": ...}``
    (``ReasonSerializer``) to the object named by the path parameter ``on``: ``status``
    with ``answer``, the errors of every body and ``codes`` (``_errors(400, 413,
    *codes)``; 422 by default: the move is refused), then ``more`` (status -> response).
    """
    extra = {} if description is None else {"description": description}
    return extend_schema(operation_id=operation_id, summary=summary, parameters=[TENANT, on],
                         request=s.ReasonSerializer,
                         responses={status: answer, **_errors(400, 413, *codes), **(more or {})},
                         **extra)


class TenantApi(APIView):
    """Base of every endpoint: raw bodies only (no DRF parsing), tenant resolved first,
    then the query parameters checked, every answer ``Cache-Control: no-store``.

    The tenant of the URL is resolved once, in ``initial`` (after authentication, before
    any handler): through the caller's grants (``permissions.access_tenant``: no role ->
    404). A handler gets it back from ``tenant(request, slug, right)``, which checks the
    right it needs (403); everything the handler reads starts from that tenant
    (docs/tenancy.md), so no handler can reach tenant data from an unresolved slug.
    """

    parser_classes = [_NoParse]
    schema = ApiSchema()
    #: The query parameters each method takes (``params.Params`` classes, which also
    #: document them in the schema); a method not listed takes none.
    params: dict[str, type[p.Params]] = {}
    #: The checked query parameters of this request (``params.validate``).
    query: dict
    #: The URL's tenant, resolved through the caller's grants by ``initial``.
    scope_tenant: Tenant

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)  # authentication first: 401 before 404
        self.scope_tenant = access_tenant(request.user, kwargs["tenant"])

    def tenant(self, request: Request, slug: str, right: str) -> Tenant:
        """The tenant ``initial`` resolved, or 403 (role lacks ``right``); then the query
        parameters, checked against ``params`` into ``self.query`` (400 naming the
        parameter, CONTRACT.md 6). Every handler starts here, so none skips either."""
        tenant = self.scope_tenant
        assert slug == tenant.slug, "the handler's slug is the URL's"
        require(request.user, tenant, right)
        method = "get" if request.method == "HEAD" else request.method.lower()
        self.query = p.validate(request, self.params.get(method, p.Params))
        return tenant

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        # Payloads, receipts and every other tenant answer stay out of caches (issue 6).
        add_never_cache_headers(response)
        return response


# --------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------

class CheckpointApi(TenantApi):
    """``…/checkpoints/{id}``: read the latest envelope (GET) or compare-and-swap it (PUT)."""

    @extend_schema(
        operation_id="checkpoint_get",
        summary="Latest revision of a checkpoint (payload read, audited)",
        parameters=[TENANT, _path("checkpoint_id"), _etag(200)],
        responses={200: OpenApiResponse(s.EnvelopeSerializer, description="with ETag"),
                   **_errors()},
    )
    def get(self, request, tenant, checkpoint_id):
        """Writers read their own checkpoints (``payload.read``); reviewers, approvers and
        admins reveal them (``payload.reveal``); viewers may not read payloads (403)."""
        t = self.tenant(request, tenant, roles.VIEW)
        action = _payload_action(request.user, t)
        cp = selectors.checkpoint_get(user=request.user, tenant=t, checkpoint_id=checkpoint_id)
        envelope = services.payload_reveal(actor=request.user, tenant=t, checkpoint=cp,
                                           action=action)
        return Response(s.EnvelopeSerializer.render(envelope),
                        headers=etag(envelope["revision"]))

    def head(self, request, tenant, checkpoint_id):
        """The GET's status and ``ETag`` without its body: the current revision, for a
        runtime that needs only that (``HttpCheckpointStore.revision``). Nothing is
        revealed, so nothing is audited and nothing written (issue 8); the same roles as
        the GET (viewers 403), the same 404s. Documented by ``schema.head_operations``."""
        t = self.tenant(request, tenant, roles.VIEW)
        _payload_action(request.user, t)
        cp = selectors.checkpoint_get(user=request.user, tenant=t, checkpoint_id=checkpoint_id)
        return Response(headers=etag(cp.revision))

    @extend_schema(
        operation_id="checkpoint_put",
        summary="Create (If-None-Match: *) or update (If-Match: \"N\") a checkpoint",
        parameters=[TENANT, _path("checkpoint_id"), *CAS_HEADERS, _etag(200, 201)],
        request=s.EnvelopeSerializer,
        responses={
            201: OpenApiResponse(s.CheckpointMetaSerializer, description='created; ETag "0"'),
            200: OpenApiResponse(s.CheckpointMetaSerializer, description='updated; ETag "N+1"'),
            **_errors(413, 428),
            409: FENCED,
            412: STALE,
        },
    )
    def put(self, request, tenant, checkpoint_id):
        """Compare-and-swap (CONTRACT.md section 3); a refused one is kept as a conflict."""
        t = self.tenant(request, tenant, roles.WRITE)
        url_id = url_uuid(checkpoint_id, "checkpoint", for_write=True)
        expected = parse_precondition(request)
        token = parse_fencing_token(request)
        envelope = services.parse_envelope(read_object(request), url_id=url_id)
        cp, created = services.checkpoint_put(actor=request.user, tenant=t, envelope=envelope,
                                              expected_revision=expected, fencing_token=token)
        _known_account(cp, "written_by", request.user)
        return Response(s.CheckpointMetaSerializer.render(cp, run_id=envelope.run_id),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=etag(cp.revision))


class CheckpointRevisionsApi(TenantApi):
    params = {"get": p.RevisionListParams}

    @extend_schema(
        operation_id="checkpoint_revisions",
        summary="Every accepted revision of a checkpoint, oldest first, one page at a time "
                "(audited export)",
        parameters=[TENANT, _path("checkpoint_id"), p.RevisionListParams],
        responses={200: s.RevisionsSerializer, **_errors(400)},
    )
    def get(self, request, tenant, checkpoint_id):
        """Readers of payloads only (writer, reviewer, approver, admin); one audit event
        per page. A page holds at most ``limit`` revisions and about four times the body
        limit of payload bytes; ``next`` continues after its last revision."""
        t = self.tenant(request, tenant, roles.VIEW)
        cp = selectors.checkpoint_get(user=request.user, tenant=t, checkpoint_id=checkpoint_id)
        results, more = services.revisions_export(
            actor=request.user, tenant=t, checkpoint=cp, after=self.query["cursor"],
            limit=self.query["limit"])
        nxt = page_url(request, cursor=str(results[-1]["revision"])) if more and results else None
        return Response(s.RevisionsSerializer.render({"results": results, "next": nxt}))

    def head(self, request, tenant, checkpoint_id):
        """The GET's status without its body (and without the export: nothing audited or
        written): 404 for no such checkpoint, then 403 for a role that may not read
        payloads, as the GET answers."""
        t = self.tenant(request, tenant, roles.VIEW)
        selectors.checkpoint_get(user=request.user, tenant=t, checkpoint_id=checkpoint_id)
        _payload_action(request.user, t)
        return Response()


# --------------------------------------------------------------------------------------
# Effects
# --------------------------------------------------------------------------------------

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
            422: OpenApiResponse(s.ErrorSerializer,
                                 description="invalid_transition or idempotency_key_reuse"),
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
        _path("effect_id"), s.ReceiptRevealSerializer, codes=())
    def post(self, request, tenant, effect_id):
        """Receipts are treated like payloads (CONTRACT.md 4): roles that may reveal see
        one only through this audited call; writers read them in effect answers."""
        t = self.tenant(request, tenant, roles.REVEAL)
        eid = url_uuid(effect_id, "effect")
        revealed = services.receipt_reveal(actor=request.user, tenant=t, effect_id=eid,
                                           reason=read_reason(request))
        return Response(s.ReceiptRevealSerializer.render(revealed))


# --------------------------------------------------------------------------------------
# Runs, leases, resume
# --------------------------------------------------------------------------------------

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
        page = selectors.run_list(user=request.user, tenant=t, filters=filters,
                                  sort=q["sort"], cursor=q["cursor"], limit=q["limit"])
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
        }, tenant=t, receipts=receipts_in_answers(request.user, t), run_id=rid))


class RunLeaseApi(TenantApi):
    @extend_schema(
        operation_id="run_lease",
        summary="Take or renew the run's lease; a new owner bumps the fencing token",
        parameters=[TENANT, _path("run_id")],
        request=s.LeaseInputSerializer,
        responses={200: s.LeaseSerializer, **_errors(400, 413),
                   409: OpenApiResponse(s.ErrorSerializer,
                                        description="lease_held: another owner's lease is live")},
    )
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.WRITE)
        rid = url_uuid(run_id, "run")
        body = read_object(request)
        _only_fields(body, {"owner", "ttl_s"})
        run = services.lease_acquire(actor=request.user, tenant=t, run_id=rid,
                                     owner=body.get("owner"), ttl_s=body.get("ttl_s"))
        return Response(s.LeaseSerializer.render(run))


class RunResumeApi(TenantApi):
    params = {"get": p.IdentityParams}

    @extend_schema(
        operation_id="run_resume_preview",
        summary="Preview the resume decision: changes nothing (no approval consumed, no "
                "fencing, no audit)",
        parameters=[TENANT, _path("run_id"), p.IdentityParams],
        responses={200: s.ResumeSerializer, **_errors(400)},
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
        responses={200: s.ResumeSerializer, **_errors(400, 413)},
    )
    def post(self, request, tenant, run_id):
        t = self.tenant(request, tenant, roles.WRITE)
        if not isinstance(request.successful_authenticator, BearerTokenAuthentication):
            raise Forbidden("authorization: claiming a resume needs a runtime's bearer token, "
                            "not a browser session")
        rid = url_uuid(run_id, "run")
        body = read_object(request, empty_ok=True)
        # The body's identity obeys the same rules as the GET's query (params.IdentityParams).
        checked = p.check(p.IdentityParams, body)
        asked = {k: v for k, v in checked.items() if v is not None}
        answer = services.resume_claim(actor=request.user, tenant=t, run_id=rid, asked=asked)
        return Response(s.ResumeSerializer.render(answer))


# --------------------------------------------------------------------------------------
# Review actions
# --------------------------------------------------------------------------------------

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
        queued = reconciliation.run_reconcile(actor=request.user, tenant=t, run_id=rid,
                                              reason=read_reason(request))
        requests = reconciliation.requests_get(t, [r.pk for r in queued.requests])
        return Response(s.TaskSerializer.render({"task_id": queued.task_id,
                                                 "queued": queued.dispatched,
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


# --------------------------------------------------------------------------------------
# Audit and report
# --------------------------------------------------------------------------------------

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


class ReportApi(TenantApi):
    params = {"get": p.ReportParams}

    @extend_schema(
        operation_id="report",
        summary="Tenant numbers now (runs, effects, retries per state, open conflicts) and "
                "the report's figures over a range (checkpoints.reports)",
        parameters=[TENANT, p.ReportParams],
        responses={200: s.ReportSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        q = self.query
        numbers = selectors.report(user=request.user, tenant=t)
        numbers |= reports.figures(user=request.user, tenant=t, range_name=q["range"] or None,
                                   start=q["from"] or None, end=q["to"] or None)
        return Response(s.ReportSerializer.render(numbers))


# --------------------------------------------------------------------------------------
# Bulk actions (issue 9, item 3)
# --------------------------------------------------------------------------------------

# CONTRACT.md 3 names the selection `runs`; `run_ids` is the name it had first (kept).
BULK_FIELDS = {"action", "reason", "runs", "run_ids", "filters", "client_token"}
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
    for name, limit in (("kind", 200), ("subject", 256)):
        text = value.get(name)
        if text is not None and (not isinstance(text, str) or not text or len(text) > limit
                                 or text_problem(text)):
            raise InvalidPayload(f"filters.{name}: must be a non-empty string of at most "
                                 f"{limit} characters")
        texts[name] = text
    age = value.get("age_s_min")
    if age is not None and (type(age) is not int or not 0 <= age <= 10**9):
        raise InvalidPayload("filters.age_s_min: must be an integer in 0..1000000000")
    q = value.get("q")
    if q is not None:
        if not isinstance(q, str):
            raise InvalidPayload("filters.q: must be a string (the search of GET …/runs?q=)")
        try:
            q = selectors.search_terms(q) or None
        except InvalidPayload as exc:
            raise InvalidPayload(f"filters.{exc.detail}") from None
    return selectors.RunFilters(recovery_state=state, kind=texts["kind"],
                                subject=texts["subject"], age_s_min=age or None, q=q)


class BulkActionListApi(TenantApi):
    @extend_schema(
        operation_id="bulk_action_create",
        summary="Reviewer: one review action on many runs (by id, or every run matching "
                "filters; at most 500), each run acted on and audited on its own",
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
                filters=_bulk_filters(body["filters"]) if "filters" in body else None)
        except InvalidPayload as exc:
            if field == "runs" and str(exc.detail).startswith("run_ids:"):
                raise InvalidPayload("runs:" + str(exc.detail)[len("run_ids:"):]) from None
            raise
        result = selectors.bulk_get(user=request.user, tenant=t, bulk_id=bulk.uuid)
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
        result = selectors.bulk_get(user=request.user, tenant=t, bulk_id=bid)
        return Response(s.BulkActionSerializer.render(result))


# --------------------------------------------------------------------------------------
# LangGraph threads (issue 10, docs/langgraph.md)
# --------------------------------------------------------------------------------------

THREAD_CONFLICT = OpenApiResponse(
    s.ThreadConflictSerializer,
    description="conflict: the parent is not the head of the thread's namespace, the id "
                "holds other content, or the id does not sort after the head's; kept as a "
                "conflict of the thread's run")
LG = "LangGraph (writer): "


def _thread_list(body: dict, key: str, limit: int, check) -> list[str]:
    values = body.get(key)
    if not isinstance(values, list) or len(values) > limit:
        raise InvalidPayload(f"{key}: must be an array of at most {limit} strings")
    return [check(value, f"{key}[{i}]") for i, value in enumerate(values)]


class LangGraphCheckpointsApi(TenantApi):
    """``…/langgraph/checkpoints``: store one LangGraph checkpoint (POST, ``put``), or
    read them newest first (GET, ``get_tuple`` and ``list``)."""

    params = {"get": p.LangGraphListParams}

    def _list_args(self) -> dict:
        """The checked query parameters as ``graph_list`` takes them (400 naming one)."""
        q = self.query
        lg = langgraph
        return dict(
            thread_id=None if q["thread_id"] is None else lg.check_thread_id(q["thread_id"]),
            checkpoint_ns=None if q["checkpoint_ns"] is None else lg.check_ns(q["checkpoint_ns"]),
            checkpoint_id=(None if q["checkpoint_id"] is None
                           else lg.check_checkpoint_id(q["checkpoint_id"])),
            before=None if q["before"] is None else lg.check_checkpoint_id(q["before"], "before"),
            limit=q["limit"], metadata_filter=langgraph.parse_filter(q["filter"]))

    @extend_schema(
        operation_id="langgraph_checkpoint_list",
        summary=LG + "LangGraph checkpoints with their pending writes, newest first "
                     "(payload read, audited once per thread namespace)",
        parameters=[TENANT, p.LangGraphListParams],
        responses={200: s.GraphPageSerializer, **_errors(400)},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.WRITE)
        results, next_before = langgraph.graph_list(actor=request.user, tenant=t,
                                                   **self._list_args())
        return Response(s.GraphPageSerializer.render({"results": results,
                                                      "next_before": next_before}))

    def head(self, request, tenant):
        """The GET's status without its body: the same role and the same 400s for its
        parameters, but nothing is read, so nothing is audited or written (as
        ``CheckpointApi.head``; issue 10). Documented by ``schema.head_operations``."""
        self.tenant(request, tenant, roles.WRITE)
        self._list_args()
        return Response()

    @extend_schema(
        operation_id="langgraph_checkpoint_put",
        summary=LG + "store one LangGraph checkpoint (compare-and-swap on the thread "
                     "namespace's head)",
        parameters=[TENANT, CAS_HEADERS[2]],
        request=s.GraphPutInputSerializer,
        responses={201: OpenApiResponse(s.GraphPutSerializer, description="stored"),
                   200: OpenApiResponse(s.GraphPutSerializer,
                                        description="the same checkpoint again (a retry): "
                                                    "the first answer, nothing written"),
                   **_errors(400, 413), 409: FENCED, 412: THREAD_CONFLICT},
    )
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.WRITE)
        token = parse_fencing_token(request)
        put = langgraph.parse_put(read_object(request))
        answer, created = langgraph.graph_put(actor=request.user, tenant=t, put=put,
                                             fencing_token=token)
        return Response(s.GraphPutSerializer.render(answer),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def _lg_operation(operation_id: str, summary: str, request, answer, *, fenced: bool = False,
                  more: dict | None = None):
    """``extend_schema`` of a LangGraph write that POSTs a JSON body: ``request`` (its
    serializer) in, 200 ``answer`` out, the errors of every body (``_errors(400, 413)``)
    and ``more`` (status -> response). ``fenced``: it also takes ``Fencing-Token`` and may
    answer 409 ``fenced``. ``summary`` follows the tag ``LG``."""
    responses = {200: answer, **_errors(400, 413)}
    if fenced:
        responses[409] = FENCED
    return extend_schema(operation_id=operation_id, summary=LG + summary,
                         parameters=[TENANT, CAS_HEADERS[2]] if fenced else [TENANT],
                         request=request, responses={**responses, **(more or {})})


# Base of the LangGraph thread operations (delete, copy, prune, delete for runs): a writer
# POSTs one JSON object holding ``fields`` only (``writer_body``), one service call
# answers. No docstring on purpose: the schema describes an operation by its view's
# docstring, inherited, and these keep ``TenantApi``'s.
class _LangGraphThreadsApi(TenantApi):
    #: The fields the body may hold; any other is 400 naming it.
    fields: frozenset[str] = frozenset()

    def writer_body(self, request: Request, slug: str) -> tuple[Tenant, dict]:
        """The tenant (``WRITE`` right: 403 without) and the body, a JSON object with
        ``fields`` only (``read_object``'s 400/411/413/415, then 400 naming an unknown
        field)."""
        t = self.tenant(request, slug, roles.WRITE)
        body = read_object(request)
        _only_fields(body, self.fields)
        return t, body


class LangGraphWritesApi(TenantApi):
    @_lg_operation("langgraph_writes_put",
                   "store a task's pending writes on a checkpoint (put_writes)",
                   s.GraphWritesInputSerializer, s.StoredSerializer, fenced=True)
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.WRITE)
        token = parse_fencing_token(request)
        body = langgraph.parse_writes(read_object(request))
        stored = langgraph.graph_put_writes(actor=request.user, tenant=t, body=body,
                                           fencing_token=token)
        return Response(s.StoredSerializer.render({"stored": stored}))


class LangGraphThreadDeleteApi(_LangGraphThreadsApi):
    fields = frozenset({"thread_id"})

    @_lg_operation("langgraph_thread_delete",
                   "delete a thread's checkpoints and pending writes (delete_thread); "
                   "effects stay", s.ThreadInputSerializer, s.DeletedSerializer)
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        thread_id = langgraph.check_thread_id(body.get("thread_id"))
        deleted = langgraph.graph_thread_delete(actor=request.user, tenant=t,
                                               thread_id=thread_id)
        return Response(s.DeletedSerializer.render({"deleted": deleted}))


class LangGraphThreadCopyApi(_LangGraphThreadsApi):
    fields = frozenset({"source_thread_id", "target_thread_id"})

    @_lg_operation("langgraph_thread_copy",
                   "copy a thread's checkpoints and pending writes onto an empty thread "
                   "(copy_thread)", s.ThreadCopyInputSerializer, s.CopiedSerializer,
                   more={412: THREAD_CONFLICT})
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        check = langgraph.check_thread_id
        source = check(body.get("source_thread_id"), "source_thread_id")
        target = check(body.get("target_thread_id"), "target_thread_id")
        copied = langgraph.graph_thread_copy(actor=request.user, tenant=t,
                                            source_thread_id=source, target_thread_id=target)
        return Response(s.CopiedSerializer.render({"copied": copied}))


class LangGraphThreadPruneApi(_LangGraphThreadsApi):
    fields = frozenset({"thread_ids", "strategy"})

    @_lg_operation("langgraph_thread_prune",
                   "prune threads: keep each namespace's newest checkpoint, or delete "
                   "them (prune)", s.ThreadPruneInputSerializer, s.DeletedSerializer)
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        threads = _thread_list(body, "thread_ids", 1000, langgraph.check_thread_id)
        strategy = body.get("strategy")
        if strategy not in langgraph.PRUNE_STRATEGIES:
            raise InvalidPayload("strategy: must be keep_latest or delete")
        deleted = langgraph.graph_threads_prune(actor=request.user, tenant=t,
                                               thread_ids=threads, strategy=strategy)
        return Response(s.DeletedSerializer.render({"deleted": deleted}))


class LangGraphRunsDeleteApi(_LangGraphThreadsApi):
    fields = frozenset({"run_ids"})

    @_lg_operation("langgraph_runs_delete",
                   "delete the checkpoints of LangGraph runs (delete_for_runs)",
                   s.RunsDeleteInputSerializer, s.DeletedSerializer)
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        run_ids = _thread_list(body, "run_ids", 1000, langgraph.check_lg_run_id)
        deleted = langgraph.graph_runs_delete(actor=request.user, tenant=t, run_ids=run_ids)
        return Response(s.DeletedSerializer.render({"deleted": deleted}))
