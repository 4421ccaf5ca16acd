"""Maps domain errors and DRF's own errors to the contract's JSON bodies; never a 500 for
bad input, never an HTML page for an API client (CONTRACT.md section 6).

Two layers:

- ``exception_handler`` (DRF's ``EXCEPTION_HANDLER``) for what an API view raises:
  domain errors, DRF's errors, and an outage of the database or the broker, which is
  503 ``{"error": "unavailable"}`` with ``Retry-After`` (retrying helps). Anything else
  is left to Django, which logs it with its traceback and calls ``server_error``.
- ``bad_request``, ``permission_denied``, ``not_found`` and ``server_error``, the
  project's ``handler400/403/404/500`` (``recovery/urls.py``): JSON for paths under
  ``/api/`` (no such URL, a tenant slug that is not one, an error raised in a middleware,
  an unexpected exception: 500 ``{"error": "internal"}`` without details), Django's
  pages for the dashboard: during an outage of the database or the broker a
  self-contained 503 page with ``Retry-After`` (``templates/503.html``: no database, no
  session, no static file), any other unexpected exception ``templates/500.html``.

Whether an exception is an outage is decided once, in ``checkpoints.ops.outage``.
"""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpResponse, JsonResponse
from django.template import loader
from django.utils.cache import add_never_cache_headers
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from ..exceptions import DomainError
from ..ops.outage import RETRY_AFTER_S, unavailable_service
from ..ops.staticcheck import manifest_problem
from .serializers import ErrorSerializer, error_body

log = logging.getLogger(__name__)

UNAVAILABLE_BODY = ErrorSerializer.render({"error": "unavailable"})
INTERNAL_BODY = ErrorSerializer.render({"error": "internal"})


def exception_handler(exc, context):
    """DRF's exception handler: the JSON answer for ``exc``, or ``None`` to let Django
    handle it (and log it) as a 500 (``server_error``)."""
    if isinstance(exc, DomainError):
        return Response(error_body(exc), status=exc.status, headers=exc.headers() or None)
    if isinstance(exc, RequestDataTooBig):
        # Django refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE; that is our 413, not a 400.
        limit = settings.RECOVERY_MAX_BODY_BYTES
        return Response(ErrorSerializer.render(
            {"error": "payload_too_large", "detail": f"body: larger than {limit} bytes"}),
            status=413)
    if isinstance(exc, Http404):
        return Response(ErrorSerializer.render({"error": "not_found"}), status=404)
    if isinstance(exc, exceptions.ParseError):
        return Response(ErrorSerializer.render(
            {"error": "invalid_payload", "detail": f"body: {exc.detail}"}), status=400)
    service = unavailable_service(exc)
    if service:
        log.warning("API request answered 503: %s unavailable (%s)", service,
                    type(exc).__name__, exc_info=exc)
        set_rollback()
        return Response(UNAVAILABLE_BODY, status=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "error" not in response.data:
        detail = response.data.get("detail", response.data)
        word = getattr(exc, "default_code", "error")
        response.data = ErrorSerializer.render({"error": word, "detail": detail})
    return response


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def _json(body: dict, status: int, **headers) -> JsonResponse:
    response = JsonResponse(ErrorSerializer.render(body), status=status)
    for name, value in headers.items():
        response[name] = value
    add_never_cache_headers(response)
    return response


def bad_request(request, exception, template_name="400.html"):
    """``handler400``: e.g. a header Django itself refuses (``SuspiciousOperation``)."""
    if _is_api(request):
        return _json({"error": "bad_request"}, 400)
    return defaults.bad_request(request, exception, template_name)


def permission_denied(request, exception, template_name="403.html"):
    """``handler403``: a ``PermissionDenied`` raised outside DRF (DRF answers its own)."""
    if _is_api(request):
        return _json({"error": "forbidden"}, 403)
    return defaults.permission_denied(request, exception, template_name)


def not_found(request, exception, template_name="404.html"):
    """``handler404``: no URL matched (an unknown path, a tenant slug that is not a slug)."""
    if _is_api(request):
        return _json({"error": "not_found"}, 404)
    return defaults.page_not_found(request, exception, template_name)


def _page(template_name: str, status: int, context: dict, **headers) -> HttpResponse:
    # No request: no context processor runs (they read the session and the user, which
    # need the database); the templates load no static file (the manifest may be missing).
    response = HttpResponse(loader.render_to_string(template_name, context), status=status)
    for name, value in headers.items():
        response[name] = value
    add_never_cache_headers(response)
    return response


def server_error(request, template_name="500.html"):
    """``handler500``: an exception nothing else answered; Django has logged it already.

    When the database or broker is down (``checkpoints.ops.outage``; raised by a view, a
    middleware reading the session or the user, or a template): 503 with ``Retry-After``,
    under ``/api/`` ``{"error": "unavailable"}``, else the self-contained page
    ``503.html`` saying which service is unavailable and to retry. Anything else: 500,
    under ``/api/`` ``{"error": "internal"}``, else ``500.html``; neither shows a
    traceback, SQL or a payload value; ``500.html`` says when the static files manifest is
    missing or stale (``checkpoints.ops.staticcheck``), the cause of every page failing."""
    service = unavailable_service(sys.exc_info()[1])
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    if _is_api(request):
        if service:
            return _json(UNAVAILABLE_BODY, 503, **retry)
        return _json(INTERNAL_BODY, 500)
    if service:
        return _page("503.html", 503, {"service": service, "retry_after": RETRY_AFTER_S},
                     **retry)
    # With collectstatic skipped (or stale) every page fails here: say so (issue 17, item 5).
    return _page(template_name, 500, {"static_missing": manifest_problem() is not None})
