"""The tenant's kinds: which kinds and schema versions its checkpoints use, and what the
kind registry supports (``selectors.kind_usage``, the Kinds page's one source)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from ... import roles, selectors
from .. import serializers as s
from .common import TENANT, TenantApi, _errors


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
