"""The OpenAPI schema: the view (drf-spectacular's, with its errors in JSON) and the
``AutoSchema`` of the API's views.

The schema itself is YAML by default (``?format=json`` or ``Accept:
application/vnd.oai.openapi+json`` for JSON), but an error (401 without an account) is
JSON like every other API error (CONTRACT.md section 6), not YAML.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer


class SchemaView(SpectacularAPIView):
    """``GET /api/schema/``; needs an account (``SERVE_PERMISSIONS``)."""

    def finalize_response(self, request, response, *args, **kwargs):
        if response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


class ApiSchema(AutoSchema):
    """Request bodies are ``application/json`` and nothing else (``views.read_object``
    answers 415 for any other type). The views' parser reads nothing (it accepts ``*/*``
    so that DRF never parses a body itself), which drf-spectacular would otherwise
    document as "any media type"."""

    def map_parsers(self):
        return ["application/json"]
