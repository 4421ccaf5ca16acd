"""Encryption at rest for payloads (Fernet: AES-128-CBC + HMAC-SHA256, from ``cryptography``).

Keys come from ``RECOVERY_ENCRYPTION_KEYS`` (comma-separated, newest first). Encryption
uses the newest key; decryption tries each, so keys rotate by prepending a new one and
running ``manage.py rotate_payload_keys``.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            "RECOVERY_ENCRYPTION_KEYS must be Fernet keys (32 url-safe base64 bytes each)"
        ) from exc


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.RECOVERY_ENCRYPTION_KEYS))


def encrypt_text(text: str) -> str:
    """Encrypt UTF-8 text; returns the Fernet token as ASCII text."""
    return fernet().encrypt(text.encode("utf-8")).decode("ascii")


def decrypt_text(token: str) -> str:
    """Decrypt a token written by ``encrypt_text`` with any configured key.

    Raises ``cryptography.fernet.InvalidToken`` when no key fits.
    """
    return fernet().decrypt(token.encode("ascii")).decode("utf-8")


def rotate_token(token: str) -> str:
    """Re-encrypt a token under the newest key."""
    return fernet().rotate(token.encode("ascii")).decode("ascii")


def is_current(token: str) -> bool:
    """Whether ``token`` is already encrypted under the newest key (rotation skips it)."""
    try:
        Fernet(settings.RECOVERY_ENCRYPTION_KEYS[0].encode()).decrypt(token.encode("ascii"))
    except InvalidToken:
        return False
    return True
