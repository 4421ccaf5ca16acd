"""Web hardening that no library covers (docs/security/hardening.md).

- ``client_ip``: the address django-axes counts login failures against. Without a
  trusted proxy it is ``REMOTE_ADDR``; behind ``RECOVERY_TRUSTED_PROXY_COUNT`` = N proxies
  it is the N-th address from the right of ``X-Forwarded-For`` (each proxy appends the
  address it saw, so the entries further left are whatever the client chose to send).
- ``login_username``: the username axes records, fitted to its column.
- ``dev_defaults_check``: ``check --deploy`` reports every setting still on its
  development value (``recovery.W001``), e.g. ``RECOVERY_ENCRYPTION_KEYS``.
- ``LoginSlotsMiddleware``: a login POST (``/login/``, ``/admin/login/``) runs only while it
  holds one of ``RECOVERY_LOGIN_SLOTS`` machine-wide slots (file locks), so password
  hashing never takes more than that many cores from the API, whichever worker or thread
  the guesses land on. A POST that finds no free slot within ``RECOVERY_LOGIN_SLOT_WAIT_MS``
  is answered 429 with ``Retry-After`` before anything is hashed. Lockouts (axes) stop a
  guesser that uses one account or address; the slots bound the rest (many addresses).
- ``PrivateNoStoreMiddleware``: every dynamic response is ``Cache-Control: no-store,
  private`` unless its view said otherwise: pages, fragments and API answers carry
  per-account data (revealed payloads, receipts), which no browser or proxy may keep.
- ``MessageStorage`` (``MESSAGE_STORAGE``): Django's cookie-then-session flash messages,
  whose cookie is deleted with the attributes it was set with (``HttpOnly``, ``Secure``
  when set, ``SameSite``); Django's own deletion (``response.delete_cookie``) leaves out
  ``HttpOnly`` and ``Secure`` (the newcomer's finding: ``Set-Cookie: messages="";
  expires=...`` without them, after one with ``HttpOnly``).
- ``SessionCookieDeletionMiddleware``: Django's deletion of the session cookie (a logout)
  carries ``HttpOnly`` and ``Secure`` as the cookie it deletes did (same reason).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.contrib.messages.storage.cookie import CookieStorage
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.messages.storage.session import SessionStorage
from django.core import checks
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers


@checks.register(checks.Tags.security, deploy=True)
def dev_defaults_check(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    return [checks.Warning(f"{name} is not set: the service runs on a public development "
                           "value.", hint=f"Set {name} (or {name}_FILE) in the environment.",
                           id="recovery.W001")
            for name in getattr(settings, "RECOVERY_DEV_DEFAULTS", [])]


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


class PrivateNoStoreMiddleware:
    """``Cache-Control: max-age=0, no-cache, no-store, must-revalidate, private`` (Django's
    ``never_cache``) on every response whose view set no ``Cache-Control`` of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not response.has_header("Cache-Control"):
            add_never_cache_headers(response)
        return response


class LoginSlotsMiddleware:
    """Bounds how many login POSTs run at once on this machine (see the module doc)."""

    POLL_S = 0.02

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self._paths: frozenset[str] | None = None

    def login_paths(self) -> frozenset[str]:
        if self._paths is None:
            self._paths = frozenset({reverse("login"), reverse("admin:login")})
        return self._paths

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST" or request.path not in self.login_paths():
            return self.get_response(request)
        slot = acquire_login_slot(settings.RECOVERY_LOGIN_SLOT_WAIT_MS / 1000)
        if slot is None:
            response = render(request, "registration/login_busy.html", status=429)
            response["Retry-After"] = "1"
            return response
        try:
            return self.get_response(request)
        finally:
            release_login_slot(slot)


def acquire_login_slot(wait_s: float) -> int | None:
    """An open, exclusively locked slot file (its descriptor), or None if every one of
    ``RECOVERY_LOGIN_SLOTS`` stayed taken for ``wait_s`` seconds."""
    directory = Path(settings.RECOVERY_LOGIN_SLOT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for i in range(settings.RECOVERY_LOGIN_SLOTS):
            fd = os.open(directory / f"slot-{i}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        if time.monotonic() >= deadline:
            return None
        time.sleep(LoginSlotsMiddleware.POLL_S)


def check_login_slots() -> None:
    """``/readyz``'s ``login_slots`` check: raises ``NotADirectoryError`` or
    ``PermissionError`` when a login could not take a slot file
    (``RECOVERY_LOGIN_SLOT_DIR``, made on the first login: ``acquire_login_slot``), so
    the probe fails instead of every login answering 500 while ``/readyz`` said ok (an
    attack's finding, stop 34: the folder below a regular file). Writes nothing: it asks
    whether the folder, or the nearest one that exists above it, and the slot files
    there can be written."""
    directory = Path(settings.RECOVERY_LOGIN_SLOT_DIR)
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"login slots: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"login slots: {existing} cannot be written")
    if existing == directory:
        for i in range(settings.RECOVERY_LOGIN_SLOTS):
            _check_slot(directory / f"slot-{i}")


def _check_slot(slot: Path) -> None:
    """Raise what ``acquire_login_slot``'s ``os.open`` of ``slot`` would meet: a directory
    (``IsADirectoryError``), a link in a loop (``OSError``, ``ELOOP``) or one to nothing
    (``FileNotFoundError``), another kind of file or one that cannot be written
    (``PermissionError``); nothing when it is missing (the first login makes it) or a
    writable regular file (stop 34's second attack: a directory and a link loop passed)."""
    try:
        mode = os.stat(slot).st_mode  # follows a link, as os.open does
    except FileNotFoundError:
        if os.path.lexists(slot):
            raise FileNotFoundError(f"login slots: {slot} is a link to nothing") from None
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"login slots: {slot} is a directory")
    if not stat.S_ISREG(mode) or not os.access(slot, os.R_OK | os.W_OK):
        raise PermissionError(f"login slots: {slot} cannot be written")


def release_login_slot(fd: int) -> None:
    os.close(fd)  # closing the descriptor releases its lock


def delete_cookie_as_set(response, name: str, path: str = "/") -> None:
    """Delete cookie ``name`` (at ``path``) as ``response.delete_cookie`` does (an empty
    value, ``Max-Age=0``, expired in 1970) with the attributes the session settings set
    it with, ``HttpOnly`` and ``Secure`` included, which ``delete_cookie`` leaves out:
    the flash-message cookie (``_MessageCookieStorage``) and the session cookie
    (``SessionCookieDeletionMiddleware``)."""
    response.set_cookie(
        name, "", max_age=0, path=path, expires="Thu, 01 Jan 1970 00:00:00 GMT",
        domain=settings.SESSION_COOKIE_DOMAIN,
        secure=settings.SESSION_COOKIE_SECURE or None,
        httponly=settings.SESSION_COOKIE_HTTPONLY or None,
        samesite=settings.SESSION_COOKIE_SAMESITE)


class _MessageCookieStorage(CookieStorage):
    """Django's ``CookieStorage`` whose cookie, once its messages are read, is deleted
    with the attributes it is set with: ``HttpOnly`` (``SESSION_COOKIE_HTTPONLY``),
    ``Secure`` (``SESSION_COOKIE_SECURE``), ``SameSite``, the domain; as
    ``delete_cookie`` does (an empty value, ``Max-Age=0``, expired in 1970) with the two
    it leaves out."""

    def _update_cookie(self, encoded_data, response) -> None:
        if encoded_data:
            super()._update_cookie(encoded_data, response)
            return
        delete_cookie_as_set(response, self.cookie_name)


class MessageStorage(FallbackStorage):
    """``MESSAGE_STORAGE``: Django's default (messages in a cookie, what does not fit in
    the session), its cookie set and deleted with the same attributes
    (``_MessageCookieStorage``)."""

    storage_classes = (_MessageCookieStorage, SessionStorage)


class SessionCookieDeletionMiddleware:
    """Placed just outside ``django.contrib.sessions``' middleware (which stays in
    ``MIDDLEWARE`` by its own name: Django's session-cookie deploy checks look for it):
    its deletion of the session cookie (an emptied session: a logout; ``delete_cookie``:
    an empty value, ``Max-Age=0``) then also says ``HttpOnly``
    (``SESSION_COOKIE_HTTPONLY``) and ``Secure`` (``SESSION_COOKIE_SECURE``), as the
    cookie it deletes did. A session key is never empty, so an empty value is always
    the deletion."""

    def __init__(self, get_response: Callable):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        morsel = response.cookies.get(settings.SESSION_COOKIE_NAME)
        if morsel is not None and morsel.value == "":
            delete_cookie_as_set(response, settings.SESSION_COOKIE_NAME,
                                 path=settings.SESSION_COOKIE_PATH)
        return response
