"""The tenant's kinds: which kinds and schema versions its checkpoints use, and what the
kind registry supports (``selectors.kind_usage``, the Kinds page's one source)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiRequest, extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import intranges, roles, selectors, services
from ...exceptions import InvalidPayload, NotFound
from .. import serializers as s
from .common import TENANT, TenantApi, _errors, _path, read_object


class KindListApi(TenantApi):
    @extend_schema(
        operation_id="kind_list",
        summary="The kinds and schema versions the tenant's checkpoints use, and the ones "
                "the kind registry supports, with checkpoints, runs and schema_mismatch "
                "runs per version (docs/kinds.md)",
        parameters=[TENANT],
        responses={200: s.KindListSerializer, **_errors()},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.VIEW)
        return Response(s.KindListSerializer.render(
            {"kinds": selectors.kind_usage(user=request.user, tenant=t)}))


def _url_version(value: str, *, for_write: bool) -> int:
    """The ``{v}`` of the URL: a schema version in 0..2^32-1, else 400 naming ``version``
    on a PUT and 404 on a GET (as a malformed id)."""
    try:
        return intranges.SCHEMA_VERSION.parse(value, "version")
    except InvalidPayload:
        if for_write:
            raise
        raise NotFound("no such kind version") from None


VERSION = _path("version", intranges.SCHEMA_VERSION.schema(), "the schema version")

_EXAMPLE = {
    "description": "Refunds, declared",
    "schema": {"type": "object", "required": ["state", "refund_id"],
               "properties": {"state": {"enum": ["ready", "refunding", "refunded"]},
                              "refund_id": {"type": "string", "pattern": "^rf_[a-z0-9]+$"},
                              "attempt": {"type": "integer", "minimum": 0}}},
    "phase": {"pointer": "/state", "stable": ["ready"], "in_flight": ["refunding"],
              "completed": ["refunded"], "label": "refund {phase}, attempt {/attempt}"},
    "identity": {"agent": "/agent"},
}


class KindVersionApi(TenantApi):
    @extend_schema(
        operation_id="kind_version_get",
        summary="One version of a kind this tenant declared (docs/kinds.md)",
        parameters=[TENANT, _path("kind", OpenApiTypes.STR), VERSION],
        responses={200: s.KindDeclarationSerializer, **_errors()},
    )
    def get(self, request, tenant, kind, version):
        t = self.tenant(request, tenant, roles.VIEW)
        row = selectors.declared_kind_get(user=request.user, tenant=t, kind=kind,
                                          version=_url_version(version, for_write=False))
        return Response(s.KindDeclarationSerializer.of(row, "read"))

    @extend_schema(
        operation_id="kind_version_put",
        summary="Declare a kind version without Python: a JSON Schema (Draft 2020-12) and a "
                "phase map, and the migration from the version before (tenant admin; "
                "immutable once a checkpoint uses it; docs/kinds.md)",
        parameters=[TENANT, _path("kind", OpenApiTypes.STR), VERSION],
        request=OpenApiRequest(OpenApiTypes.OBJECT, examples=[
            OpenApiExample("a declared kind", value=_EXAMPLE)]),
        responses={200: s.KindDeclarationSerializer, 201: s.KindDeclarationSerializer,
                   **_errors(409, 413)},
    )
    def put(self, request, tenant, kind, version):
        """201 for a new version; 200 when it replaced an unused one or was the same;
        409 ``kind_version_in_use`` to change a version a checkpoint uses."""
        t = self.tenant(request, tenant, roles.MANAGE)
        number = _url_version(version, for_write=True)
        body = read_object(request)
        row, outcome = services.kind_declare(actor=request.user, tenant=t, kind=kind,
                                             version=number, body=body)
        return Response(s.KindDeclarationSerializer.of(row, outcome),
                        status=status.HTTP_201_CREATED if outcome == "created"
                        else status.HTTP_200_OK)
