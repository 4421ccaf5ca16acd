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

# ruff: noqa: F401 - the package's interface: ``urls.py`` writes ``views.RunListApi``

from .audit import AuditEventListApi, AuditEventProofApi
from .bulk import BulkActionAbortApi, BulkActionApi, BulkActionListApi
from .checkpoints import CheckpointApi, CheckpointRevisionsApi
from .common import (
    TenantApi,
    etag,
    page_url,
    parse_fencing_token,
    parse_precondition,
    read_object,
    read_reason,
    url_uuid,
)
from .effects import EffectApi, EffectListApi
from .kinds import KindListApi, KindVersionApi
from .langgraph import (
    LangGraphCheckpointsApi,
    LangGraphRunsDeleteApi,
    LangGraphThreadCopyApi,
    LangGraphThreadDeleteApi,
    LangGraphThreadPruneApi,
    LangGraphWritesApi,
)
from .lifecycle_requests import (
    ErasureApproveApi,
    ErasureRejectApi,
    ErasureRequestApi,
    ErasureRequestListApi,
    LegalHoldApi,
    LegalHoldListApi,
    LegalHoldReleaseApi,
)
from .migrations import KindMigrationApi, KindMigrationListApi
from .notifications import (
    NotificationDeliveriesApi,
    NotificationEndpointApi,
    NotificationEndpointListApi,
    NotificationResendApi,
    NotificationRotateApi,
    NotificationTestApi,
)
from .reports import ReportApi
from .retention import DataPolicyApi
from .review import (
    ConflictsAcknowledgeApi,
    EffectMarkUnknownApi,
    EffectReceiptRevealApi,
    RetryApproveApi,
    RetryRejectApi,
    RetryRequestApi,
    RetryRequestCreateApi,
    RetryRequestListApi,
    RetryWithdrawApi,
    RunCloseApi,
    RunLeaseRevokeApi,
    RunReconcileApi,
)
from .runs import RunDetailApi, RunLeaseApi, RunLeaseReleaseApi, RunListApi, RunResumeApi
from .tombstones import (
    TombstoneListApi,
    TombstonePurgeApi,
    TombstonePurgeApproveApi,
    TombstonePurgeExecuteApi,
    TombstonePurgeListApi,
    TombstonePurgeRejectApi,
)
