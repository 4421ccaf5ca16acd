"""API routes under ``/api/v1/`` (CONTRACT.md section 3); every path is tenant-scoped.

Ids in paths are matched as plain strings so that a malformed id is answered by the view
(404 on reads, 400 naming ``id`` on a PUT) as JSON, not by Django's HTML 404 page.
"""

from django.urls import path

from . import views

app_name = "api"

T = "tenants/<slug:tenant>/"

urlpatterns = [
    path(T + "checkpoints/<str:checkpoint_id>", views.CheckpointApi.as_view(),
         name="checkpoint"),
    path(T + "checkpoints/<str:checkpoint_id>/revisions", views.CheckpointRevisionsApi.as_view(),
         name="checkpoint-revisions"),
    path(T + "effects", views.EffectListApi.as_view(), name="effect-list"),
    path(T + "effects/<str:effect_id>", views.EffectApi.as_view(), name="effect"),
    path(T + "effects/<str:effect_id>/mark-unknown", views.EffectMarkUnknownApi.as_view(),
         name="effect-mark-unknown"),
    path(T + "effects/<str:effect_id>/reveal-receipt", views.EffectReceiptRevealApi.as_view(),
         name="effect-reveal-receipt"),
    path(T + "runs", views.RunListApi.as_view(), name="run-list"),
    path(T + "runs/<str:run_id>", views.RunDetailApi.as_view(), name="run"),
    path(T + "runs/<str:run_id>/lease", views.RunLeaseApi.as_view(), name="run-lease"),
    path(T + "runs/<str:run_id>/lease/revoke", views.RunLeaseRevokeApi.as_view(),
         name="run-lease-revoke"),
    path(T + "runs/<str:run_id>/lease/release", views.RunLeaseReleaseApi.as_view(),
         name="run-lease-release"),
    path(T + "runs/<str:run_id>/resume", views.RunResumeApi.as_view(), name="run-resume"),
    path(T + "runs/<str:run_id>/retry-requests", views.RetryRequestCreateApi.as_view(),
         name="run-retry-requests"),
    path(T + "runs/<str:run_id>/reconcile", views.RunReconcileApi.as_view(),
         name="run-reconcile"),
    path(T + "runs/<str:run_id>/close", views.RunCloseApi.as_view(), name="run-close"),
    path(T + "runs/<str:run_id>/conflicts/acknowledge", views.ConflictsAcknowledgeApi.as_view(),
         name="run-conflicts-acknowledge"),
    # The approvers' queue, as the dashboard's Approvals page (CONTRACT.md 5).
    path(T + "retry-requests", views.RetryRequestListApi.as_view(), name="retry-requests"),
    path(T + "retry-requests/<str:retry_id>", views.RetryRequestApi.as_view(),
         name="retry-request"),
    path(T + "retry-requests/<str:retry_id>/approve", views.RetryApproveApi.as_view(),
         name="retry-approve"),
    path(T + "retry-requests/<str:retry_id>/reject", views.RetryRejectApi.as_view(),
         name="retry-reject"),
    path(T + "retry-requests/<str:retry_id>/withdraw", views.RetryWithdrawApi.as_view(),
         name="retry-withdraw"),
    path(T + "bulk-actions", views.BulkActionListApi.as_view(), name="bulk-actions"),
    path(T + "bulk-actions/<str:bulk_id>", views.BulkActionApi.as_view(), name="bulk-action"),
    path(T + "bulk-actions/<str:bulk_id>/abort", views.BulkActionAbortApi.as_view(),
         name="bulk-action-abort"),
    path(T + "audit-events", views.AuditEventListApi.as_view(), name="audit-events"),
    path(T + "audit-events/<str:audit_event_id>/proof", views.AuditEventProofApi.as_view(),
         name="audit-event-proof"),
    path(T + "report", views.ReportApi.as_view(), name="report"),
    # The kinds in use and the registry's (CONTRACT.md 8; docs/kinds.md).
    path(T + "kinds", views.KindListApi.as_view(), name="kind-list"),
    path(T + "kinds/<str:kind>/versions/<str:version>", views.KindVersionApi.as_view(),
         name="kind-version"),
    path(T + "kinds/<str:kind>/migrations", views.KindMigrationListApi.as_view(),
         name="kind-migrations"),
    path(T + "kinds/<str:kind>/migrations/<str:job_id>", views.KindMigrationApi.as_view(),
         name="kind-migration"),
    # Legal holds and erasure requests (issue 20, items 2 and 4; CONTRACT.md 8).
    path(T + "legal-holds", views.LegalHoldListApi.as_view(), name="legal-holds"),
    path(T + "legal-holds/<str:hold_id>", views.LegalHoldApi.as_view(), name="legal-hold"),
    path(T + "legal-holds/<str:hold_id>/release", views.LegalHoldReleaseApi.as_view(),
         name="legal-hold-release"),
    path(T + "erasure-requests", views.ErasureRequestListApi.as_view(),
         name="erasure-requests"),
    path(T + "erasure-requests/<str:request_id>", views.ErasureRequestApi.as_view(),
         name="erasure-request"),
    path(T + "erasure-requests/<str:request_id>/approve", views.ErasureApproveApi.as_view(),
         name="erasure-approve"),
    path(T + "erasure-requests/<str:request_id>/reject", views.ErasureRejectApi.as_view(),
         name="erasure-reject"),
    # Tombstone governance (issue 20, item 5; beyond CONTRACT.md 8).
    path(T + "tombstones", views.TombstoneListApi.as_view(), name="tombstones"),
    path(T + "tombstone-purges", views.TombstonePurgeListApi.as_view(),
         name="tombstone-purges"),
    path(T + "tombstone-purges/<str:purge_id>", views.TombstonePurgeApi.as_view(),
         name="tombstone-purge"),
    path(T + "tombstone-purges/<str:purge_id>/approve",
         views.TombstonePurgeApproveApi.as_view(), name="tombstone-purge-approve"),
    path(T + "tombstone-purges/<str:purge_id>/reject", views.TombstonePurgeRejectApi.as_view(),
         name="tombstone-purge-reject"),
    path(T + "tombstone-purges/<str:purge_id>/execute",
         views.TombstonePurgeExecuteApi.as_view(), name="tombstone-purge-execute"),
    # Notifications (issue 21; CONTRACT.md 8; docs/notifications.md).
    path(T + "notification-endpoints", views.NotificationEndpointListApi.as_view(),
         name="notification-endpoints"),
    path(T + "notification-endpoints/<str:endpoint_id>", views.NotificationEndpointApi.as_view(),
         name="notification-endpoint"),
    path(T + "notification-endpoints/<str:endpoint_id>/rotate-secret",
         views.NotificationRotateApi.as_view(), name="notification-endpoint-rotate"),
    path(T + "notification-endpoints/<str:endpoint_id>/test",
         views.NotificationTestApi.as_view(), name="notification-endpoint-test"),
    path(T + "notification-endpoints/<str:endpoint_id>/deliveries",
         views.NotificationDeliveriesApi.as_view(), name="notification-deliveries"),
    path(T + "notification-endpoints/<str:endpoint_id>/deliveries/<str:event_id>/resend",
         views.NotificationResendApi.as_view(), name="notification-resend"),
    # The data lifecycle (issue 20; CONTRACT.md 8; docs/security/retention.md).
    path(T + "data-policy", views.DataPolicyApi.as_view(), name="data-policy"),
    # LangGraph threads (issue 10, docs/langgraph.md).
    path(T + "langgraph/checkpoints", views.LangGraphCheckpointsApi.as_view(),
         name="langgraph-checkpoints"),
    path(T + "langgraph/writes", views.LangGraphWritesApi.as_view(), name="langgraph-writes"),
    path(T + "langgraph/threads/delete", views.LangGraphThreadDeleteApi.as_view(),
         name="langgraph-thread-delete"),
    path(T + "langgraph/threads/copy", views.LangGraphThreadCopyApi.as_view(),
         name="langgraph-thread-copy"),
    path(T + "langgraph/threads/prune", views.LangGraphThreadPruneApi.as_view(),
         name="langgraph-thread-prune"),
    path(T + "langgraph/runs/delete", views.LangGraphRunsDeleteApi.as_view(),
         name="langgraph-runs-delete"),
]
