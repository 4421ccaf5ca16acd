"""``Authorization: Bearer <token>`` for runtimes and scripts."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.sql import Query
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .. import services
from ..dbclock import NOW
from ..models import ApiToken

_SQL: list[str] = []


def _token_sql() -> str:
    """One statement: the account owning a live token (``WHERE key_hash = %s AND
    revoked_at IS NULL``), every column of it, then the token's ``last_used_at`` and the
    database's time, with every name taken from the models."""
    if not _SQL:
        q = connection.ops.quote_name
        user, token = get_user_model()._meta, ApiToken._meta

        def col(meta, name):
            return q(meta.get_field(name).column)

        now_sql, now_params = Query(ApiToken).get_compiler(connection=connection).compile(NOW)
        assert not now_params
        columns = ", ".join(f"u.{q(f.column)}" for f in user.concrete_fields)
        _SQL.append(
            f"SELECT {columns}, t.{col(token, 'last_used_at')} AS token_last_used_at, "
            f"{now_sql} AS token_db_now "
            f"FROM {q(token.db_table)} t JOIN {q(user.db_table)} u "
            f"ON u.{col(user, 'id')} = t.{col(token, 'user')} "
            f"WHERE t.{col(token, 'key_hash')} = %s AND t.{col(token, 'revoked_at')} IS NULL")
    return _SQL[0]


def _aware(value) -> datetime | None:
    """A time read by ``_token_sql`` as an aware UTC datetime (SQLite answers text or a
    naive datetime; PostgreSQL an aware one)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def token_user(raw: str):
    """The active account owning bearer token ``raw``, or ``None``: exactly
    ``services.token_authenticate``'s answer, in one query without the ORM's cost
    (issue 8: about a millisecond of CPU per request).

    The same rules: the SHA-256 of an ASCII token names a row not revoked, whose account
    is active. When the token's ``last_used_at`` is due for its note (empty, or
    ``services.TOKEN_TOUCH_INTERVAL`` old on the database's clock), the request goes
    through ``services.token_authenticate``, which writes it: at most once a minute per
    token, and the write stays a service's."""
    if not isinstance(raw, str) or not raw.isascii():
        return None
    digest = hashlib.sha256(raw.encode()).hexdigest()
    found = list(get_user_model().objects.raw(_token_sql(), [digest]))
    if not found or not found[0].is_active:
        return None
    user = found[0]
    last, now = _aware(user.token_last_used_at), _aware(user.token_db_now)
    del user.token_last_used_at, user.token_db_now
    if last is None or now - last >= services.TOKEN_TOUCH_INTERVAL:
        return services.token_authenticate(raw)
    return user


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
        user = token_user(parts[1])
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
