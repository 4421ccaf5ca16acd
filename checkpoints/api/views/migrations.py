"""Migrations of a kind's checkpoints as stored jobs (CONTRACT.md 8; docs/migrations.md):
``POST …/kinds/{kind}/migrations`` (the tenant's admin: a dry run's preview, or a job)
and ``GET …/kinds/{kind}/migrations/{id}`` (any role: the job and its results)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import kinds, roles, selectors, services
from ...exceptions import InvalidPayload, NotFound
from .. import serializers as s
from .bulk import IDEMPOTENCY_KEY, _bulk_token
from .common import TENANT, TenantApi, _errors, _only_fields, _path, read_object, url_uuid

MIGRATION_FIELDS = {"to_version", "dry_run", "reverse", "runs", "client_token"}
KIND = _path("kind", OpenApiTypes.STR, "the kind's name, e.g. acme.order")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if type(value) is not bool:
        raise InvalidPayload(f"{name}: must be true or false")
    return value


class KindMigrationListApi(TenantApi):
    @extend_schema(
        operation_id="kind_migration_create",
        summary="Tenant admin: migrate the kind's checkpoints to another schema version, as "
                "a job run in the background (202), or preview it with dry_run (200, "
                "nothing written)",
        parameters=[TENANT, KIND, IDEMPOTENCY_KEY],
        request=s.MigrationInputSerializer,
        responses={202: OpenApiResponse(s.MigrationJobSerializer,
                                        description="the stored job (queued, or, for the "
                                                    "same idempotency key and request again, "
                                                    "the first one in its current state)"),
                   200: OpenApiResponse(s.MigrationPreviewSerializer,
                                        description="dry_run: what the job would do now"),
                   **_errors(400, 413)},
    )
    def post(self, request, tenant, kind):
        t = self.tenant(request, tenant, roles.MANAGE)
        if not kinds.is_kind_name(kind):  # as any path id that can name nothing: 404
            raise NotFound("no such kind")
        body = read_object(request, empty_ok=True)
        _only_fields(body, MIGRATION_FIELDS)
        if "to_version" not in body:
            raise InvalidPayload("to_version: required, one of the kind's versions")
        dry_run, reverse = _flag(body, "dry_run"), _flag(body, "reverse")
        runs = body.get("runs")
        if "runs" in body and runs is None:
            raise InvalidPayload("runs: must be a list of run ids (or left out)")
        if dry_run:
            preview = services.migration_preview(
                actor=request.user, tenant=t, kind=kind, to_version=body["to_version"],
                run_ids=runs, reverse=reverse)
            return Response(s.MigrationPreviewSerializer.render(preview))
        # The request's own fields are named before a missing idempotency key.
        services.migration_target_check(t, kind, body["to_version"])
        services.migration_runs_check(runs)
        token = _bulk_token(request, body)
        job, _ = services.migration_job_submit(
            actor=request.user, tenant=t, kind=kind, to_version=body["to_version"],
            run_ids=runs, reverse=reverse, client_token=token)
        result = selectors.migration_job_get(user=request.user, tenant=t, kind=kind,
                                             job_id=job.uuid)
        return Response(s.MigrationJobSerializer.render(result),
                        status=status.HTTP_202_ACCEPTED)


class KindMigrationApi(TenantApi):
    @extend_schema(
        operation_id="kind_migration_get",
        summary="A migration job: its state, counts and per-checkpoint results (no payload "
                "values)",
        parameters=[TENANT, KIND, _path("job_id")],
        responses={200: s.MigrationJobSerializer, **_errors()},
    )
    def get(self, request, tenant, kind, job_id):
        t = self.tenant(request, tenant, roles.VIEW)
        jid = url_uuid(job_id, "migration job")
        result = selectors.migration_job_get(user=request.user, tenant=t, kind=kind,
                                             job_id=jid)
        return Response(s.MigrationJobSerializer.render(result))
