"""What every API view shares: the base ``TenantApi`` (tenant first, then the query
parameters, every answer ``Cache-Control: no-store``), the request helpers (strict
bodies, CAS preconditions, fencing tokens, ids in the URL, reasons) and the OpenAPI
helpers (path parameters, CAS headers, the error answers every operation may give)."""

from __future__ import annotations

import re
import uuid
from contextlib import ExitStack

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.utils.cache import add_never_cache_headers
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.views import APIView

from ... import audit, intranges
from ...exceptions import (
    InvalidPayload,
    LengthRequired,
    NotFound,
    PayloadTooLarge,
    PreconditionRequired,
    ReasonRequired,
    UnsupportedMediaType,
)
from ...jsonparse import loads_object
from ...models import MAX_REVISION, Tenant
from ...permissions import access_tenant, require
from .. import params as p
from .. import serializers as s
from ..schema import ApiSchema

# --------------------------------------------------------------------------------------
# Request helpers
# --------------------------------------------------------------------------------------

_STRONG_ETAG_RE = re.compile(r'^"(0|[1-9][0-9]{0,18})"\Z')
_UINT_RE = re.compile(r"^(0|[1-9][0-9]{0,18})\Z")


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
    return read_reason_body(request)[0]


def read_reason_body(request: Request, also: frozenset[str] = frozenset()) -> tuple[str, dict]:
    """``read_reason`` of a review action whose body may also hold the fields ``also``
    (``{"reason", "owner"?}`` of ``…/lease/revoke``): ``(reason, body)``, the other
    fields unchecked (the service checks them)."""
    body = read_object(request, empty_ok=True)
    _only_fields(body, {"reason", *also})
    return _reason_of(body), body


def _reason_of(body: dict) -> str:
    reason = body.get("reason")
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        raise ReasonRequired("reason: a reason is required")
    if not isinstance(reason, str):
        raise InvalidPayload("reason: must be a string")
    return reason


def etag(revision: int) -> dict[str, str]:
    return {"ETag": f'"{revision}"'}


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
FENCED_OR_DELETED = OpenApiResponse(
    PolymorphicProxySerializer(
        component_name="WriteConflict",
        serializers=[s.FencedErrorSerializer, s.RunDeletedSerializer],
        resource_type_field_name=None),
    description="fenced: the run is leased and Fencing-Token is not its current token (kept "
                "as a conflict); or run_deleted: the run's payloads were deleted by retention "
                "or erasure, it takes no more writes (docs/security/retention.md)")
RUN_DELETED = OpenApiResponse(
    s.RunDeletedSerializer, description="run_deleted: the run's payloads were deleted by "
                                        "retention or erasure; it takes no more writes")
OWNER_LIVE = OpenApiResponse(s.OwnerLiveSerializer,
                             description="owner_live: the run's owner is alive")


def _errors(*codes: int) -> dict:
    """The error answers every operation may give: 401 unauthenticated, 403 role, 404
    tenant/object, 400 query, 503 outage; and ``codes`` (an ``Error`` body each), with 413
    (a body): also 411 (chunked, no Content-Length) and 415 (not JSON). An operation adds
    its specific bodies (409, 412) after these. 410 ``erased``: an operation that decrypts
    a payload of a crypto-shredded tenant (``crypto.DataKeyGone``)."""
    out = {400: ERR, 401: ERR, 403: ERR, 404: ERR, 503: UNAVAILABLE}
    for code in codes:
        out[code] = ERR
    if 413 in codes:
        out[411] = ERR
        out[415] = ERR
    return out


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


class _NoFormatOverride(DefaultContentNegotiation):
    """Content negotiation by ``Accept`` only: ``?format=`` is not DRF's renderer override
    here (``URL_FORMAT_OVERRIDE``), which answered 404 for an unknown format before any
    check ran, but a query parameter like any other, refused by ``params.validate`` as
    unknown (400 naming it, CONTRACT.md 6). The schema view keeps ``?format=json``."""

    class settings:  # noqa: N801 - the one setting DefaultContentNegotiation reads here
        URL_FORMAT_OVERRIDE = None


#: The request header naming the incident an API client works on (``INC-2041``); the
#: schema documents it on every operation (``schema.INCIDENT_REF``).
INCIDENT_REF_HEADER = "Incident-Ref"


def _utf8_header(request: Request, key: str) -> str | None:
    """The request header ``key`` (a ``META`` name) as the client sent it in UTF-8: WSGI
    gives each header's bytes decoded as ISO-8859-1 (PEP 3333), so ``INC-2041-é`` came
    out ``INC-2041-Ã©`` and one incident had two spellings (the stop-38 newcomer).
    Raises ``InvalidPayload`` naming the header when its bytes are not UTF-8."""
    value = request.META.get(key)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        name = key.removeprefix("HTTP_").replace("_", "-").title()
        raise InvalidPayload(f"{name}: not UTF-8") from None


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
    content_negotiation_class = _NoFormatOverride
    schema = ApiSchema()
    #: The query parameters each method takes (``params.Params`` classes, which also
    #: document them in the schema); a method not listed takes none.
    params: dict[str, type[p.Params]] = {}
    #: The checked query parameters of this request (``params.validate``).
    query: dict
    #: The URL's tenant, resolved through the caller's grants by ``initial``.
    scope_tenant: Tenant
    #: The bearer token's look-up reads the URL's tenant and the caller's rights in it in
    #: the same statement (``auth.token_user``; issue 22, item 3), which ``initial``'s
    #: ``access_tenant`` then uses instead of reading them again.
    reads_tenant_with_token = True

    def dispatch(self, request, *args, **kwargs):
        # ``initial`` enters the request's incident (``Incident-Ref``) here, so that it
        # covers the handler and ends with the request.
        with ExitStack() as self._incident:
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args, **kwargs) -> None:
        """Authentication (401 before 404), the URL's tenant through the caller's grants
        (404), then the optional ``Incident-Ref`` header: every audit event the request
        causes carries it (``audit.working_on``; a write's, a payload reveal's), checked
        by the dashboard's rule (``audit.incident_ref_checked``: 400 naming the header,
        before anything is written), on every method."""
        super().initial(request, *args, **kwargs)  # authentication first: 401 before 404
        self.scope_tenant = access_tenant(request.user, kwargs["tenant"])
        # Every method: a GET may record events too (a payload's reveal; the stop-38
        # attack: an API reveal was untagged where the dashboard's carried the incident).
        ref = audit.incident_ref_checked(_utf8_header(request, "HTTP_INCIDENT_REF"),
                                         name=INCIDENT_REF_HEADER)
        self._incident.enter_context(audit.working_on(ref))

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
