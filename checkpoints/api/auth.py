"""``Authorization: Bearer <token>`` for runtimes and scripts."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.sql import Query
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .. import permissions, services, sql
from ..dbclock import NOW
from ..models import ApiToken, Tenant

_SQL: dict[bool, str] = {}


def _token_sql(scoped: bool = False) -> str:
    """One statement: the account owning a live token (``WHERE key_hash = %s AND
    revoked_at IS NULL``), every column of it, then the token's ``last_used_at`` and the
    database's time, with every name taken from the models. ``scoped``: also the tenant
    of a slug and the account's rights in it (``permissions.scope_join``: one row per
    right; parameters: ``scope_params(slug)``, then the digest)."""
    if scoped not in _SQL:
        q = connection.ops.quote_name
        user, token = get_user_model()._meta, ApiToken._meta

        def col(meta, name):
            return q(meta.get_field(name).column)

        now_sql, now_params = Query(ApiToken).get_compiler(connection=connection).compile(NOW)
        assert not now_params
        columns = ", ".join(f"u.{q(f.column)}" for f in user.concrete_fields)
        scope_columns, scope_joins = (permissions.scope_join(f"u.{col(user, 'id')}")
                                      if scoped else ("", ""))
        _SQL[scoped] = (
            f"SELECT {columns}, t.{col(token, 'last_used_at')} AS token_last_used_at, "
            f"{now_sql} AS token_db_now{', ' + scope_columns if scoped else ''} "
            f"FROM {q(token.db_table)} t JOIN {q(user.db_table)} u "
            f"ON u.{col(user, 'id')} = t.{col(token, 'user')} {scope_joins}"
            f"WHERE t.{col(token, 'key_hash')} = %s AND t.{col(token, 'revoked_at')} IS NULL")
    return _SQL[scoped]


def _aware(value) -> datetime | None:
    """A time read by ``_token_sql`` as an aware UTC datetime (SQLite answers text or a
    naive datetime; PostgreSQL an aware one)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def token_user(raw: str, *, tenant_slug: str | None = None):
    """The active account owning bearer token ``raw``, or ``None``: exactly
    ``services.token_authenticate``'s answer, in one query without the ORM's cost
    (issue 8: about a millisecond of CPU per request).

    The same rules: the SHA-256 of an ASCII token names a row not revoked, whose account
    is active. When the token's ``last_used_at`` is due for its note (empty, or
    ``services.TOKEN_TOUCH_INTERVAL`` old on the database's clock), the request goes
    through ``services.token_authenticate``, which writes it: at most once a minute per
    token, and the write stays a service's.

    ``tenant_slug`` (the URL's tenant of an API request): the same statement also reads
    that tenant and the account's rights in it, kept on the account for
    ``permissions.access_tenant`` (``permissions.scope_rows``): a request's token, tenant
    and role in one round trip instead of two (issue 22, item 3). Nothing is cached
    between requests: a revoked token, a deactivated account or a revoked role counts
    from the very next request, as before."""
    if not isinstance(raw, str) or not raw.isascii():
        return None
    digest = hashlib.sha256(raw.encode()).hexdigest()
    scoped = (tenant_slug is not None
              and len(tenant_slug) <= Tenant._meta.get_field("slug").max_length)
    params = [*permissions.scope_params(tenant_slug), digest] if scoped else [digest]
    found = list(sql.raw(get_user_model(), _token_sql(scoped), params))
    if not found or not found[0].is_active:
        return None
    user = found[0]
    last, now = _aware(user.token_last_used_at), _aware(user.token_db_now)
    for row in found:
        del row.token_last_used_at, row.token_db_now
    if last is None or now - last >= services.TOKEN_TOUCH_INTERVAL:
        user = services.token_authenticate(raw)
        if user is None:  # revoked or deactivated between the two statements
            return None
    if scoped:
        permissions.scope_rows(user, tenant_slug, found)
    return user


def _url_tenant(request) -> str | None:
    """The tenant slug of the URL when the view is a tenant API (``TenantApi``, whose
    ``initial`` resolves it right after authentication), else ``None``."""
    context = getattr(request, "parser_context", None) or {}
    view = context.get("view")
    if getattr(view, "reads_tenant_with_token", False):
        slug = (context.get("kwargs") or {}).get("tenant")
        return slug if isinstance(slug, str) else None
    return None


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates ``Authorization: Bearer rcv_…`` against hashed ``ApiToken`` rows
    (``token_user``)."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0].lower() != "bearer":
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization: expected 'Bearer <token>'")
        user = token_user(parts[1], tenant_slug=_url_tenant(request))
        if user is None:
            raise exceptions.AuthenticationFailed("Authorization: unknown or revoked token")
        return (user, None)

    def authenticate_header(self, request):
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents ``BearerTokenAuthentication`` in the OpenAPI schema (HTTP bearer)."""

    target_class = "checkpoints.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "an API token from `manage.py issue_token USERNAME`"}
