"""Web hardening that no library covers (docs/security/hardening.md).

- ``client_ip``: the address django-axes counts login failures against. Without a
  trusted proxy it is ``REMOTE_ADDR``; behind ``RECOVERY_TRUSTED_PROXY_COUNT`` = N proxies
  it is the N-th address from the right of ``X-Forwarded-For`` (each proxy appends the
  address it saw, so the entries further left are whatever the client chose to send).
- ``login_username``: the username axes records, fitted to its column.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """The client's address as seen by the closest untrusted hop (see the module doc).
    Always a valid IP address (axes stores it in an address column), or None."""
    proxies = settings.RECOVERY_TRUSTED_PROXY_COUNT
    remote = _valid_ip(request.META.get("REMOTE_ADDR"))
    if proxies <= 0:
        return remote
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    hops = [h for h in hops if h]
    if len(hops) < proxies:
        # Fewer hops than proxies: the request did not come through all of them (or a
        # proxy is misconfigured); count it against the address that reached us.
        return remote
    return _valid_ip(hops[-proxies]) or remote


def _valid_ip(value: str | None) -> str | None:
    try:
        return str(ipaddress.ip_address((value or "").strip()))
    except ValueError:
        return None


def login_username(request: HttpRequest, credentials: dict | None) -> str | None:
    """The username axes counts failures against: as typed, without NUL characters and
    cut to the width of its column (a login form does not limit it; a longer value
    would fail the insert on PostgreSQL and answer 500)."""
    field = settings.AXES_USERNAME_FORM_FIELD
    name = credentials.get(field) if credentials else request.POST.get(field)
    if name is None:
        return None
    return str(name).replace("\x00", "")[:_USERNAME_WIDTH]


#: ``axes.models.AccessAttempt.username`` (and ``AccessLog.username``) is varchar(255).
_USERNAME_WIDTH = 255
