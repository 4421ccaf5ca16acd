"""The report: tenant numbers now and the figures over a range (``checkpoints.reports``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from ... import replica, reports, roles, selectors
from .. import params as p
from .. import serializers as s
from .common import TENANT, TenantApi, _errors


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
        with replica.replica_reads():  # issue 22: after the access check (primary)
            numbers = selectors.report(user=request.user, tenant=t)
            numbers |= reports.figures(user=request.user, tenant=t,
                                       range_name=q["range"] or None,
                                       start=q["from"] or None, end=q["to"] or None)
        return Response(s.ReportSerializer.render(numbers))
