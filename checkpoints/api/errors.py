"""Maps domain errors and DRF's own errors to the contract's JSON bodies; never a 500 for
bad input."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..exceptions import DomainError


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        return Response(exc.body(), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        # Django refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE; that is our 413, not a 400.
        limit = settings.RECOVERY_MAX_BODY_BYTES
        return Response({"error": "payload_too_large", "detail": f"body: larger than {limit} bytes"},
                        status=413)
    if isinstance(exc, Http404):
        return Response({"error": "not_found"}, status=404)
    if isinstance(exc, exceptions.ParseError):
        return Response({"error": "invalid_payload", "detail": f"body: {exc.detail}"}, status=400)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "error" not in response.data:
        detail = response.data.get("detail", response.data)
        word = getattr(exc, "default_code", "error")
        response.data = {"error": word, "detail": detail}
    return response
