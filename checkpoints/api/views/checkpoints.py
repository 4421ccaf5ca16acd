"""Checkpoints: read the latest envelope, compare-and-swap it, and export its revisions."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from ... import roles, selectors, services
from ...exceptions import Forbidden
from ...models import Tenant
from ...permissions import tenant_perms
from ...vocab import AuditAction
from .. import params as p
from .. import serializers as s
from .common import (
    CAS_HEADERS,
    FENCED_OR_DELETED,
    STALE,
    TENANT,
    TenantApi,
    _errors,
    _etag,
    _known_account,
    _path,
    etag,
    page_url,
    parse_fencing_token,
    parse_precondition,
    read_object,
    url_uuid,
)


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


class CheckpointApi(TenantApi):
    """``…/checkpoints/{id}``: read the latest envelope (GET) or compare-and-swap it (PUT)."""

    @extend_schema(
        operation_id="checkpoint_get",
        summary="Latest revision of a checkpoint (payload read, audited)",
        parameters=[TENANT, _path("checkpoint_id"), _etag(200)],
        responses={200: OpenApiResponse(s.EnvelopeSerializer, description="with ETag"),
                   **_errors(410)},
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
            409: FENCED_OR_DELETED,
            412: STALE,
            422: OpenApiResponse(
                s.UnprocessableWriteSerializer,
                description='{"error": "usage_decreased", "counter": ...}: a usage '
                            "counter below the stored revision's (CONTRACT.md 8); kept "
                            'as a conflict. {"error": "secret_detected", "paths": [...]}: '
                            "a credential-like value under the tenant's refuse data "
                            "policy (docs/security/secrets.md); nothing stored"),
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
        responses={200: s.RevisionsSerializer, **_errors(400, 410)},
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
