"""Top-level URLs: the dashboard at /, the API at /api/v1/, its schema at /api/schema/."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("checkpoints.api.urls")),
    path("admin/", admin.site.urls),
    path("", include("checkpoints.urls")),
]
