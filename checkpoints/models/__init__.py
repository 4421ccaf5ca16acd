"""The store: tenants, runs, checkpoints with revision history, effects, conflicts, retry
requests, API tokens and the audit log.

Nothing outside ``checkpoints.services`` writes these tables (DESIGN.md section 5). Each
row belongs to exactly one tenant, and every runtime-visible identity is (tenant, UUID):
the same UUID in two tenants is two objects (CONTRACT.md section 3).

Payloads (checkpoint payloads, refused writes, effect receipts and requests, reconcile
evidence) are stored encrypted (``checkpoints.crypto``); lists read only metadata columns.

Tenant scoping (issue 7, docs/tenancy.md). Every tenant-owned model's manager is a
``TenantQuerySet``: a query on tenant data starts with ``Model.objects.for_tenant(t)``
(one tenant, a tenant id, or the caller's tenants), or, in the few places that span
tenants by design, with ``Model.objects.for_all_tenants(reason=...)``. A related manager
(``run.effects``) is scoped by construction: its parent row was read scoped.
``tests/test_tenant_scoping_lint.py`` fails on any other start (``Model.objects.filter``,
``.get``, ``.all``, ``select_for_update`` ...) in ``checkpoints/``, and lists every
``for_all_tenants`` use with its reason.
"""

# ruff: noqa: F401 - the package's interface: every model and helper, as ``checkpoints.models.X``

from ..vocab import (
    ConflictReason,
    EffectClass,
    EffectState,
    PhaseClass,
    ReconcileState,
    RecoveryState,
    RetryState,
)
from .audit import (
    AuditChainHead,
    AuditEvent,
    AuditHashScheme,
    AuditLeaf,
    AuditPending,
    AuditTenant,
    AuditTreeHead,
    AuditTreeNode,
)
from .bulk import BULK_JOB_MAX_RUNS, BULK_MAX_RUNS, BulkAction, BulkActionItem
from .effects import Effect, EffectRevision, EncryptedReceipt, RetryRequest, encrypt_receipt
from .keys import TenantDataKey
from .kinds import DeclaredKindVersion
from .langgraph import GraphCheckpoint, GraphWrite
from .lifecycle import (
    LIFECYCLE_MAX_RUNS,
    REASON_MAX,
    TOMBSTONE_PURGE_MAX,
    AuditExport,
    CleanupLease,
    DataPolicy,
    ErasureRequest,
    HeldRun,
    LegalHold,
    RunSubject,
    Tombstone,
    TombstonePurge,
)
from .migrations import MIGRATION_MAX_RUNS, MigrationJob, MigrationJobItem
from .notifications import (
    NotificationAgingMark,
    NotificationAttempt,
    NotificationEndpoint,
    NotificationIncident,
    NotificationIncidentRun,
    NotificationMessage,
    NotificationOutbox,
)
from .ops import Heartbeat
from .reconcile import ReconcileAttempt, ReconcilerConfig, ReconcileRequest
from .runs import (
    COUNT_SHARDS,
    MAX_REVISION,
    RESOLVED_STATES,
    ROLLUP_SHARDS,
    Checkpoint,
    CheckpointRevision,
    CheckpointSizeRollup,
    Conflict,
    EffectStateCount,
    ReportCount,
    ResumeDecision,
    Run,
    RunStateCount,
    RunTransition,
    StateCounter,
)
from .tenancy import ApiToken, Tenant, TenantManager, TenantOwned, TenantQuerySet, TimestampedModel

__all__ = [  # the vocabulary, re-exported for the code that imported it from here
    "ConflictReason", "EffectClass", "EffectState", "PhaseClass", "ReconcileState",
    "RecoveryState", "RetryState",
]
