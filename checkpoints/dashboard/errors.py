"""The dashboard's error answers that no view raises: ``csrf_failure``
(``settings.CSRF_FAILURE_VIEW``). A view's own ``DomainError`` becomes its page or
fragment in ``common.domain_errors``."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from .common import _in_place, _referer

#: What an htmx action says in place when its CSRF token is no longer the session's.
SESSION_CHANGED = "Your session changed (you logged out or in, maybe in another tab): " \
                  "nothing was done. Reload the page and try again."


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``settings.CSRF_FAILURE_VIEW``: a POST whose CSRF token is not the session's (the
    page was loaded before a logout/login, perhaps in another tab, rotated the token).

    403 always, and ``Vary: HX-Request`` (the answer depends on it): htmx gets
    ``SESSION_CHANGED`` in place (``_in_place``: the form's error slot, never Django's
    error page swapped into the run page); a plain form post a readable page; a path
    under ``/api/`` the API's JSON error (``{"error": "forbidden", "detail"}``; DRF's
    views are CSRF-exempt and check it themselves, so this is a fallback). ``reason``
    (Django's words) is not shown: it would only confuse a reviewer.
    """
    if request.path.startswith("/api/"):
        response = JsonResponse({"error": "forbidden",
                                 "detail": "csrf: the CSRF token is missing or stale"},
                                status=403)
    elif getattr(request, "htmx", None):  # set by HtmxMiddleware, unless it never ran
        here = request.htmx.current_url_abs_path or request.get_full_path()
        response = _in_place(request, SESSION_CHANGED, 403, link=(here, "Reload the page"))
    else:
        back = _referer(request)
        response = render(request, "checkpoints/error.html",
                          {"status": 403, "message": SESSION_CHANGED, "back": back,
                           "link": (back, "Reload the page") if back else None},
                          status=403)
    patch_vary_headers(response, ("HX-Request",))
    return response
