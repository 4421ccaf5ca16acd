"""The OpenAPI schema: the view (drf-spectacular's, with its errors in JSON) and the
``AutoSchema`` of the API's views.

The schema itself is YAML by default (``?format=json`` or ``Accept:
application/vnd.oai.openapi+json`` for JSON), but an error (401 without an account) is
JSON like every other API error (CONTRACT.md section 6), not YAML.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from drf_spectacular.views import SpectacularAPIView
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from .. import audit
from . import params


class SchemaParams(params.Params):
    """``GET /api/schema/``: ``format`` only (``lang`` is not taken: the service has no
    translations, ``USE_I18N`` off)."""

    format = serializers.ChoiceField(choices=["yaml", "json"], required=False,
                                     help_text="yaml (default) or json")


class SchemaView(SpectacularAPIView):
    """``GET /api/schema/``; needs an account (``SERVE_PERMISSIONS``). Its query string is
    checked as every API path's is, after authentication (``params.validate``; stop 36's attack: an unknown
    parameter, a repeated or NUL one were ignored, ``?format=bogus`` was DRF's 404), before
    content negotiation reads ``format``."""

    def initial(self, request, *args, **kwargs):
        # Authentication and the account check first (401 before 400, as every API
        # path: ``TenantApi.initial``), then the query, then DRF's content negotiation.
        self.perform_authentication(request)
        self.check_permissions(request)
        params.validate(request, SchemaParams)
        super().initial(request, *args, **kwargs)

    def finalize_response(self, request, response, *args, **kwargs):
        if response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


#: The header of every 503 (``checkpoints.ops.outage.RETRY_AFTER_S``), on every operation.
RETRY_AFTER = OpenApiParameter("Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER,
                               response=[503], required=True,
                               description="seconds to wait before retrying")


#: The optional header of every operation (``views.common.TenantApi.initial``): the
#: incident the caller works on, stored on each audit event the request causes.
INCIDENT_REF = OpenApiParameter(
    "Incident-Ref", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="the incident you are working on (e.g. INC-2041): every audit event this "
                "request causes (a write's, a payload reveal's) carries it as "
                "incident_ref, as a reviewer's dashboard incident does. Optional; at most "
                f"{audit.INCIDENT_REF_MAX} printable characters, UTF-8 (400 naming "
                "Incident-Ref otherwise, nothing written).")


class ApiSchema(AutoSchema):
    """Request bodies are ``application/json`` and nothing else (``views.read_object``
    answers 415 for any other type). The views' parser reads nothing (it accepts ``*/*``
    so that DRF never parses a body itself), which drf-spectacular would otherwise
    document as "any media type". Every operation's 503 carries ``Retry-After``."""

    def map_parsers(self):
        return ["application/json"]

    def get_override_parameters(self):
        incident = [INCIDENT_REF] if self.method not in ("HEAD", "OPTIONS") else []
        return [*super().get_override_parameters(), RETRY_AFTER, *incident]



def nullable_refs(result, generator, request, public):
    """drf-spectacular post-processing hook: a nullable nested shape, which it writes
    ``{"allOf": [{"$ref": X}], "nullable": true}``, becomes ``{"oneOf": [{"$ref": X},
    {"type": "object", "nullable": true, "enum": [null]}]}``.

    OpenAPI 3.0.3 gives ``nullable`` a meaning only beside a ``type`` in the same schema
    object, so the first form does not allow ``null`` (validators that follow 3.0.3,
    openapi-core among them, refuse it), while ``open_review_items.retry_request`` is
    null whenever no retry is open (CONTRACT.md 3). The second form says "X or null" in
    3.0.3. Returns the schema (``result``), changed in place."""

    def visit(node):
        if isinstance(node, dict):
            all_of = node.get("allOf")
            if node.get("nullable") is True and isinstance(all_of, list) and len(all_of) == 1 \
                    and set(all_of[0]) == {"$ref"}:
                del node["allOf"], node["nullable"]
                node["oneOf"] = [all_of[0], {"type": "object", "nullable": True, "enum": [None]}]
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(result)
    return result


#: ``operationId`` of a GET -> (``operationId``, summary, description) of the HEAD that
#: the same view answers without a body (drf-spectacular documents no HEAD itself).
HEAD_OPERATIONS = {
    "checkpoint_get": (
        "checkpoint_head", "Current revision of a checkpoint (ETag only: no payload, "
        "not audited)",
        "The GET's status and `ETag` without its body: a runtime learns the current "
        "revision without reading (and so without an audit event, or any write). The same "
        "roles as the GET."),
    "checkpoint_revisions": (
        "checkpoint_revisions_head", "Whether the revisions may be read (no body, no "
        "export, not audited)",
        "The GET's status without its body; nothing is exported, audited or written."),
    "langgraph_checkpoint_list": (
        "langgraph_checkpoint_list_head", "LangGraph: whether the checkpoints may be "
        "listed (no body, not audited)",
        "The GET's status (its role, its 400s for the query parameters) without its body; "
        "nothing is read, audited or written."),
}


def head_operations(result, generator, request, public):
    """drf-spectacular post-processing hook: a ``head`` operation beside each GET named
    in ``HEAD_OPERATIONS``, with the GET's parameters and answers (status codes and
    headers) and no answer bodies. Returns the schema, changed in place."""
    for operations in result.get("paths", {}).values():
        get = operations.get("get")
        if not get or get.get("operationId") not in HEAD_OPERATIONS:
            continue
        operation_id, summary, description = HEAD_OPERATIONS[get["operationId"]]
        head = {key: value for key, value in get.items()
                if key not in ("responses", "operationId", "summary", "description")}
        head.update(operationId=operation_id, summary=summary, description=description,
                    responses={code: {**{k: v for k, v in answer.items() if k != "content"},
                                      "description": answer.get("description")
                                      or "as the GET answers, without its body"}
                               for code, answer in get["responses"].items()})
        operations["head"] = head
    return result
