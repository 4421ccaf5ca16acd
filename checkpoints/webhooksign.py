"""Standard Webhooks signing (https://www.standardwebhooks.com/; issue 21, item 4;
docs/notifications.md): the three headers a signed webhook carries.

- ``webhook-id``: the message's event id, the same on every retry and resend (receivers
  deduplicate by it);
- ``webhook-timestamp``: the send time, integer seconds since the epoch;
- ``webhook-signature``: ``v1,<base64 of HMAC-SHA256("{id}.{timestamp}.{body}")>`` keyed
  with the secret's bytes (the base64 after ``whsec_``); during a rotation one
  signature per secret, separated by a space.

Pure (no Django, no database): tested against the ``standardwebhooks`` package.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
#: Random bytes in a new secret (Standard Webhooks: 24 to 64).
SECRET_BYTES = 24


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` + base64 of ``SECRET_BYTES`` random bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_hint(secret: str) -> str:
    """What an admin may see of a stored secret: ``whsec_…`` and its last 4 characters."""
    return f"{PREFIX}…{secret[-4:]}" if secret else ""


def _key(secret: str) -> bytes:
    raw = secret[len(PREFIX):] if secret.startswith(PREFIX) else secret
    return base64.b64decode(raw)


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64 HMAC-SHA256>`` signature of ``{msg_id}.{timestamp}.{body}``.
    Raises ``binascii.Error`` when ``secret`` is not base64 after ``whsec_``."""
    signed = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(secrets_: list[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers for ``body`` sent at ``timestamp`` (seconds), signed
    with each secret of ``secrets_`` (the current one first; two during a rotation)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body)
                                      for s in secrets_ if s),
    }
