"""Shapes of the API's JSON (CONTRACT.md section 3), for the OpenAPI schema and for output.

Each answer's shape is written once, as an ``Answer`` serializer: drf-spectacular reads
its fields for the schema, and the view renders the answer with it
(``RunSerializer.render(run, tenant=t)``), so the schema and the wire cannot drift apart.
Error bodies too (``ErrorSerializer`` and the four specific ones; ``error_body`` picks
the one for a domain error). ``tests/conftest.py`` validates every answer of the test
suite against the served schema.

Request bodies are never parsed or validated by these serializers: the views read the raw
body with ``checkpoints.jsonparse.loads_object`` and validate it with the service layer's
``parse_envelope`` / ``parse_effect`` (CONTRACT.md section 6 is stricter than DRF). The
input serializers (``*InputSerializer``, ``ReasonSerializer``) only *describe* those bodies
in the schema.

Times are ISO 8601 strings as Python writes them (UTC, ``+00:00``); ``*_ms`` are integers,
milliseconds since the epoch.
"""

# ruff: noqa: F401 - the package's interface: views and errors write ``s.RunSerializer``

from .audit import (
    AuditEventSerializer,
    AuditPageSerializer,
    AuditProofSerializer,
    TreeHeadSerializer,
)
from .bulk import (
    BulkActionInputSerializer,
    BulkActionPageSerializer,
    BulkActionSerializer,
    BulkActionSummarySerializer,
    BulkFiltersSerializer,
    BulkResultSerializer,
)
from .checkpoints import CheckpointMetaSerializer, EnvelopeSerializer, RevisionsSerializer
from .common import (
    ERROR_SHAPES,
    Answer,
    ConflictErrorSerializer,
    ErrorSerializer,
    FencedErrorSerializer,
    IsoDateTimeField,
    OperationExistsSerializer,
    OwnerLiveSerializer,
    PurgeRefusedSerializer,
    RunDeletedSerializer,
    RunUuidField,
    SecretPathSerializer,
    TenantSlugField,
    ThreadConflictSerializer,
    UnprocessableWriteSerializer,
    WriterReceiptField,
    error_body,
    error_word,
)
from .effects import (
    EffectInputSerializer,
    EffectListSerializer,
    EffectSerializer,
    EffectWriteSerializer,
    ReceiptRevealSerializer,
)
from .kinds import (
    KindDeclarationSerializer,
    KindListSerializer,
    KindSerializer,
    KindVersionSerializer,
)
from .langgraph import (
    CopiedSerializer,
    DeletedSerializer,
    GraphPageSerializer,
    GraphPutInputSerializer,
    GraphPutSerializer,
    GraphTupleSerializer,
    GraphWriteInputSerializer,
    GraphWritesInputSerializer,
    PendingWriteSerializer,
    RunsDeleteInputSerializer,
    StoredSerializer,
    ThreadCopyInputSerializer,
    ThreadInputSerializer,
    ThreadPruneInputSerializer,
    TypedValueSerializer,
)
from .lifecycle_requests import (
    ErasureRequestInputSerializer,
    ErasureRequestListSerializer,
    ErasureRequestSerializer,
    LegalHoldInputSerializer,
    LegalHoldListSerializer,
    LegalHoldSerializer,
    OptionalReasonSerializer,
)
from .migrations import (
    MigrationInputSerializer,
    MigrationJobSerializer,
    MigrationPreviewSerializer,
)
from .notifications import (
    NotificationDeliveriesSerializer,
    NotificationEndpointInputSerializer,
    NotificationEndpointListSerializer,
    NotificationEndpointSecretSerializer,
    NotificationEndpointSerializer,
    NotificationMessageSerializer,
)
from .reports import ApprovalsSerializer, ReportRangeSerializer, ReportSerializer, StatsSerializer
from .retention import DataPolicyInputSerializer, DataPolicySerializer
from .review import (
    AcknowledgedSerializer,
    ClosedSerializer,
    ConflictSerializer,
    ReasonSerializer,
    ReconcileAttemptSerializer,
    ReconcileRequestSerializer,
    RetryPreviewSerializer,
    RetryRequestItemSerializer,
    RetryRequestPageSerializer,
    RetryRequestSerializer,
    TaskSerializer,
)
from .runs import (
    RECOVERY_STATES,
    LeaseInputSerializer,
    LeaseReleaseInputSerializer,
    LeaseRevokeInputSerializer,
    LeaseSerializer,
    LeaseStateSerializer,
    OpenReviewItemsSerializer,
    ResumeInputSerializer,
    ResumeSerializer,
    RunDetailSerializer,
    RunListItemSerializer,
    RunPageSerializer,
    RunSerializer,
    resume_usage,
)
from .tombstones import (
    TombstonePageSerializer,
    TombstonePurgeListSerializer,
    TombstonePurgeSerializer,
    TombstoneSerializer,
)
