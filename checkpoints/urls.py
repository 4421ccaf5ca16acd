"""Dashboard URLs (server-rendered, htmx). The tenant is in the path by slug; fragment
URLs sit under the page they belong to. The views are ``checkpoints.dashboard``, one module
per page; the JSON API lives in ``checkpoints.api.urls``."""

from django.contrib.auth import views as auth_views
from django.urls import path

from .dashboard import (
    actions,
    approvals,
    audit,
    bulk,
    data,
    inbox,
    incident,
    kinds,
    lifecycle_requests,
    live,
    notifications,
    reports,
    run,
)

T = "t/<slug:slug>/"  # a tenant's pages

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True),
         name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),  # POST only (Django 5)
    path("", inbox.home, name="inbox"),  # settings.LOGIN_REDIRECT_URL
    path(T, inbox.run_list, name="run_list"),
    path(T + "counts/", inbox.run_counts, name="run_counts"),
    # Pages that move by themselves (issue 21, item 8): the inbox's and the run page's polls.
    path(T + "new-runs/", live.run_new, name="run_new"),
    # The approver's queue (issue 21, item 9).
    path(T + "approvals/", approvals.approval_queue, name="approval_queue"),
    path(T + "approvals/approve/", approvals.approval_bulk, name="approval_bulk"),
    path(T + "approvals/<int:retry_id>/", approvals.approval_decide, name="approval_decide"),
    # The incident a reviewer works on (issue 21, item 10): kept in the session.
    path(T + "incident/", incident.incident_set, name="incident_set"),
    path(T + "report/", reports.report, name="report"),
    path(T + "audit/", audit.audit_log, name="audit_log"),
    path(T + "kinds/", kinds.kind_list, name="kind_list"),
    path(T + "kinds/<str:kind>/versions/<str:version>/", kinds.kind_version,
         name="kind_version"),
    # Migrations (issue 19, item 2): the admin's preview (GET) and confirm (POST), the job.
    path(T + "kinds/<str:kind>/migrate/", kinds.migration_preview_page,
         name="migration_preview"),
    path(T + "kinds/<str:kind>/migrations/", kinds.migration_submit, name="migration_submit"),
    path(T + "kinds/<str:kind>/migrations/<str:job_id>/", kinds.migration_detail,
         name="migration_detail"),
    # Erasure requests and legal holds (issue 20, items 2 and 4).
    path(T + "erasure-requests/", lifecycle_requests.erasure_requests,
         name="erasure_requests"),
    path(T + "erasure-requests/<str:request_id>/approve/", lifecycle_requests.erasure_approve,
         name="erasure_approve"),
    path(T + "erasure-requests/<str:request_id>/reject/", lifecycle_requests.erasure_reject,
         name="erasure_reject"),
    path(T + "runs/<str:run_id>/erasure-request/", lifecycle_requests.erasure_request_file,
         name="erasure_request_file"),
    path(T + "legal-holds/", lifecycle_requests.legal_holds, name="legal_holds"),
    path(T + "legal-holds/place/", lifecycle_requests.legal_hold_place,
         name="legal_hold_place"),
    path(T + "legal-holds/<str:hold_id>/release/", lifecycle_requests.legal_hold_release,
         name="legal_hold_release"),
    path(T + "runs/<str:run_id>/legal-hold/", lifecycle_requests.legal_hold_place_run,
         name="legal_hold_place_run"),
    # The data lifecycle (issue 20): the policy, tombstones, holds, erasure requests.
    path(T + "data/", data.data_page, name="data_page"),
    path(T + "data/policy/", data.data_policy_post, name="data_policy_post"),
    # Notifications (issue 21, items 1 and 5): the endpoints, the admin's forms, the
    # delivery log of one endpoint.
    path(T + "notifications/", notifications.notification_list, name="notification_list"),
    path(T + "notifications/new/", notifications.notification_create,
         name="notification_create"),
    path(T + "notifications/<str:endpoint_id>/", notifications.notification_detail,
         name="notification_detail"),
    path(T + "notifications/<str:endpoint_id>/edit/", notifications.notification_update,
         name="notification_update"),
    path(T + "notifications/<str:endpoint_id>/rotate/", notifications.notification_rotate,
         name="notification_rotate"),
    path(T + "notifications/<str:endpoint_id>/delete/", notifications.notification_delete,
         name="notification_delete"),
    path(T + "notifications/<str:endpoint_id>/test/", notifications.notification_send_test,
         name="notification_send_test"),
    path(T + "notifications/<str:endpoint_id>/deliveries/<str:event_id>/resend/",
         notifications.notification_resend, name="notification_resend"),
    path(T + "bulk/", bulk.bulk_submit, name="bulk_submit"),
    path(T + "bulk-actions/", bulk.bulk_list, name="bulk_list"),
    path(T + "bulk/<str:bulk_id>/", bulk.bulk_detail, name="bulk_detail"),
    path(T + "bulk/<str:bulk_id>/abort/", bulk.bulk_abort, name="bulk_abort"),
    path(T + "runs/<str:run_id>/", run.run_detail, name="run_detail"),
    path(T + "runs/<str:run_id>/audit/", run.run_audit, name="run_audit"),
    path(T + "runs/<str:run_id>/live/", run.run_live, name="run_live"),
    path(T + "runs/<str:run_id>/retry/", actions.run_retry_request, name="run_retry_request"),
    path(T + "runs/<str:run_id>/reconcile/", actions.run_reconcile, name="run_reconcile"),
    path(T + "runs/<str:run_id>/close/", actions.run_close, name="run_close"),
    path(T + "runs/<str:run_id>/lease/revoke/", actions.run_lease_revoke,
         name="run_lease_revoke"),
    path(T + "runs/<str:run_id>/conflicts/acknowledge/", actions.conflicts_acknowledge,
         name="conflicts_acknowledge"),
    path(T + "retry-requests/<int:retry_id>/approve/", actions.retry_approve, name="retry_approve"),
    path(T + "retry-requests/<int:retry_id>/reject/", actions.retry_reject, name="retry_reject"),
    path(T + "retry-requests/<int:retry_id>/withdraw/", actions.retry_withdraw,
         name="retry_withdraw"),
    path(T + "effects/<str:effect_id>/mark-unknown/", actions.effect_mark_unknown,
         name="effect_mark_unknown"),
    path(T + "effects/<str:effect_id>/receipt/", run.effect_receipt_reveal,
         name="effect_receipt_reveal"),
    path(T + "checkpoints/<str:checkpoint_id>/revisions/", run.checkpoint_history,
         name="checkpoint_history"),
    path(T + "effects/<str:effect_id>/revisions/", run.effect_history, name="effect_history"),
    path(T + "checkpoints/<str:checkpoint_id>/reveal/", run.checkpoint_reveal,
         name="checkpoint_reveal"),
    path(T + "checkpoints/<str:checkpoint_id>/diff/", run.checkpoint_diff,
         name="checkpoint_diff"),
    path(T + "reconcile-attempts/<int:attempt_id>/evidence/",
         run.reconcile_evidence_reveal, name="reconcile_evidence_reveal"),
]
