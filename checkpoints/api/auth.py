"""``Authorization: Bearer <token>`` for runtimes and scripts."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from ..services import token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates ``Authorization: Bearer rcv_…`` against hashed ``ApiToken`` rows."""

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
        user = token_authenticate(parts[1])
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
