"""Top-level URLs: the dashboard at /, the API at /api/v1/, its schema at /api/schema/.

The schema and the docs page need a login (issue 6): the schema answers 401 JSON to an
anonymous client (a bearer token or a session works), the docs page redirects a browser
to the login page. Swagger UI is served from the pinned ``drf-spectacular-sidecar``
package, never a CDN, with its init script as a separate file and its page rules as a
static stylesheet (``templates/api_docs.html``): no inline script or style.
Errors under ``/api/`` are JSON (``checkpoints.api.errors``), the dashboard's are pages.
Operations (``checkpoints.ops.health``): ``/healthz`` (liveness), ``/readyz`` (database and
broker), ``/metrics`` (Prometheus, bearer ``RECOVERY_METRICS_TOKEN``).
"""

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularSwaggerSplitView

from checkpoints.api import errors as api_errors
from checkpoints.api.schema import SchemaView
from checkpoints.ops import health as ops

urlpatterns = [
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", login_required(SpectacularSwaggerSplitView.as_view(
        url_name="schema", template_name="api_docs.html")),
         name="api-docs"),
    path("api/v1/", include("checkpoints.api.urls")),
    # Any other path of the API: its JSON 404 with DEBUG on too (``make demo``), where
    # Django would answer its HTML debug page instead of ``handler404`` (CONTRACT.md 6:
    # API errors are JSON, never a page; the newcomer's finding, stop 35).
    # CSRF-exempt as every API view is (DRF's): a write to a mistyped path is its 404,
    # not the session CSRF check's 403 (the final attack's finding).
    re_path(r"^api/v1/", csrf_exempt(api_errors.not_found), {"exception": None},
            name="api-not-found"),
    path("admin/", admin.site.urls),
    path("", include("checkpoints.urls")),
]

handler400 = "checkpoints.api.errors.bad_request"
handler403 = "checkpoints.api.errors.permission_denied"
handler404 = "checkpoints.api.errors.not_found"
handler500 = "checkpoints.api.errors.server_error"
