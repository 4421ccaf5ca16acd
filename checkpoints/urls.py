"""Dashboard URLs (server-rendered, htmx). The tenant is in the path by slug; fragment
URLs sit under the page they belong to. The JSON API lives in ``checkpoints.api.urls``."""

from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

T = "t/<slug:slug>/"  # a tenant's pages

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True),
         name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),  # POST only (Django 5)
    path("", views.home, name="inbox"),  # settings.LOGIN_REDIRECT_URL
    path(T, views.run_list, name="run_list"),
    path(T + "counts/", views.run_counts, name="run_counts"),
    path(T + "report/", views.report, name="report"),
    path(T + "audit/", views.audit_log, name="audit_log"),
    path(T + "bulk/", views.bulk_submit, name="bulk_submit"),
    path(T + "bulk/<str:bulk_id>/", views.bulk_detail, name="bulk_detail"),
    path(T + "runs/<str:run_id>/", views.run_detail, name="run_detail"),
    path(T + "runs/<str:run_id>/audit/", views.run_audit, name="run_audit"),
    path(T + "runs/<str:run_id>/retry/", views.run_retry_request, name="run_retry_request"),
    path(T + "runs/<str:run_id>/reconcile/", views.run_reconcile, name="run_reconcile"),
    path(T + "runs/<str:run_id>/close/", views.run_close, name="run_close"),
    path(T + "runs/<str:run_id>/conflicts/acknowledge/", views.conflicts_acknowledge,
         name="conflicts_acknowledge"),
    path(T + "retry-requests/<int:retry_id>/approve/", views.retry_approve, name="retry_approve"),
    path(T + "retry-requests/<int:retry_id>/reject/", views.retry_reject, name="retry_reject"),
    path(T + "retry-requests/<int:retry_id>/withdraw/", views.retry_withdraw,
         name="retry_withdraw"),
    path(T + "effects/<str:effect_id>/mark-unknown/", views.effect_mark_unknown,
         name="effect_mark_unknown"),
    path(T + "effects/<str:effect_id>/receipt/", views.effect_receipt_reveal,
         name="effect_receipt_reveal"),
    path(T + "checkpoints/<str:checkpoint_id>/revisions/", views.checkpoint_history,
         name="checkpoint_history"),
    path(T + "effects/<str:effect_id>/revisions/", views.effect_history, name="effect_history"),
    path(T + "checkpoints/<str:checkpoint_id>/reveal/", views.checkpoint_reveal,
         name="checkpoint_reveal"),
    path(T + "checkpoints/<str:checkpoint_id>/diff/", views.checkpoint_diff,
         name="checkpoint_diff"),
    path(T + "reconcile-attempts/<int:attempt_id>/evidence/",
         views.reconcile_evidence_reveal, name="reconcile_evidence_reveal"),
]
