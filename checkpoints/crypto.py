"""Encryption at rest: envelope encryption with per-tenant data keys (issue 20, item 3;
docs/security/encryption.md). Fernet throughout (AES-128-CBC + HMAC-SHA256, from
``cryptography``).

- **Master keys**: ``RECOVERY_ENCRYPTION_KEYS`` (comma-separated, newest first). They
  encrypt ("wrap") only the tenants' data keys, and the ciphertexts written before issue
  20 (the legacy form: a bare Fernet token).
- **Data keys**: one live ``TenantDataKey`` per tenant (a random Fernet key, stored
  wrapped). A ciphertext written today reads ``k1.<key_id>.<Fernet token>``: it names
  the data key it was written under, so a master key rotates by re-wrapping the data keys
  (``services.payloads_rotate_keys``), and destroying a tenant's data keys makes all it
  wrote unreadable (``services.tenant_shred``: crypto-shredding). Both forms decrypt.

Unwrapped data keys are cached per process (``KEY_CACHE_MAX`` entries, least recently
used first out), each entry for at most ``RECOVERY_DATA_KEY_CACHE_S`` seconds (default
60): a key destroyed by another process is served from here for at most that long; the
process that destroys a key forgets it at once and again when the destruction commits.
A cache miss reads the key's row, so a destroyed key is never unwrapped again (and is
remembered as destroyed: that never changes back). A key
created inside a transaction that is still open is used but cached only once that
transaction commits (a key rolled back must never encrypt anything that commits); a
tenant's first key, created with the tenant itself, is the exception (``data_key_create``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from .exceptions import DomainError

log = logging.getLogger(__name__)

#: The prefix of a ciphertext written under a tenant's data key (format version 1).
PREFIX = "k1."
#: The most data keys one process keeps unwrapped.
KEY_CACHE_MAX = 1024

# InvalidToken is part of this module's interface (callers catch crypto.InvalidToken).
__all__ = ["PREFIX", "DataKeyGone", "InvalidToken", "decrypt_text", "encrypt_text"]


class DataKeyGone(DomainError, status=410, error="erased"):
    """The data key a ciphertext names is destroyed (the tenant was crypto-shredded), or
    is not in this database, or cannot be unwrapped by any configured master key (a
    backup restored after the master key that wrapped it was dropped): 410 ``erased``."""


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            "RECOVERY_ENCRYPTION_KEYS must be Fernet keys (32 url-safe base64 bytes each)"
        ) from exc


def fernet() -> MultiFernet:
    """The master keys (``RECOVERY_ENCRYPTION_KEYS``), newest first."""
    return _fernet(tuple(settings.RECOVERY_ENCRYPTION_KEYS))


# --------------------------------------------------------------------------------------
# The process cache of unwrapped data keys
# --------------------------------------------------------------------------------------

_lock = threading.Lock()
#: key_id -> (tenant id, the unwrapped key or ``None`` when destroyed, monotonic time read)
_keys: OrderedDict[str, tuple[int, Fernet | None, float]] = OrderedDict()
#: tenant id -> key_id of its live key of highest generation
_current: dict[int, str] = {}
#: key ids created by a transaction of this process that has not committed yet
_uncommitted: set[str] = set()
#: the master keys the cached keys were unwrapped with (the cache empties if they change)
_masters: list[str] | None = None


def _ttl() -> float:
    return settings.RECOVERY_DATA_KEY_CACHE_S


def _cached(key_id: str) -> tuple[int, Fernet | None] | None:
    global _masters
    with _lock:
        if settings.RECOVERY_ENCRYPTION_KEYS is not _masters:  # reconfigured (tests)
            _keys.clear()
            _current.clear()
            _masters = settings.RECOVERY_ENCRYPTION_KEYS
            return None
        entry = _keys.get(key_id)
        if entry is None:
            return None
        if entry[1] is not None and time.monotonic() - entry[2] > _ttl():
            del _keys[key_id]
            return None
        _keys.move_to_end(key_id)
        return entry[0], entry[1]


def _remember(key_id: str, tenant_id: int, key: Fernet | None, *, current: bool) -> None:
    with _lock:
        if key_id in _uncommitted:
            return
        _keys[key_id] = (tenant_id, key, time.monotonic())
        _keys.move_to_end(key_id)
        if current:
            _current[tenant_id] = key_id
        while len(_keys) > KEY_CACHE_MAX:
            old, (old_tenant, _, _) = _keys.popitem(last=False)
            if _current.get(old_tenant) == old:
                del _current[old_tenant]


def forget(tenant_id: int | None = None) -> None:
    """Drop the cached data keys of one tenant (by id), or of every tenant (``None``)."""
    with _lock:
        if tenant_id is None:
            _keys.clear()
            _current.clear()
            return
        _current.pop(tenant_id, None)
        for key_id in [k for k, v in _keys.items() if v[0] == tenant_id]:
            del _keys[key_id]


def _tenant_id(tenant) -> int:
    tenant_id = getattr(tenant, "pk", tenant)
    if not isinstance(tenant_id, int) or isinstance(tenant_id, bool):
        raise TypeError(f"crypto: {type(tenant).__name__} is not a tenant")
    return tenant_id


# --------------------------------------------------------------------------------------
# Data keys
# --------------------------------------------------------------------------------------

def wrap(key: bytes) -> str:
    """A data key encrypted with the newest master key (the ``wrapped`` column)."""
    return fernet().encrypt(key).decode("ascii")


def _data_keys():
    """The ``TenantDataKey`` model, looked up in the app registry when first needed: this
    module sits below the models (``pyproject.toml``'s layers; the models import it for
    their encrypted fields), so it never imports them."""
    return apps.get_model("checkpoints", "TenantDataKey")


def _unwrap(key_id: str, wrapped: str) -> Fernet:
    try:
        return Fernet(fernet().decrypt(wrapped.encode("ascii")))
    except InvalidToken:
        log.warning("data key %s fits none of RECOVERY_ENCRYPTION_KEYS", key_id)
        raise DataKeyGone(f"erased: the data key {key_id} cannot be unwrapped with the "
                          f"configured master keys") from None


def data_key_create(tenant, *, with_tenant: bool = False):
    """Create and return a new live ``TenantDataKey`` for ``tenant`` (a ``Tenant`` or its
    id), one generation above its highest. ``with_tenant``: the tenant row was created in
    the same transaction (``tenant_create``), so the key may be cached at once (if that
    transaction rolls back, no tenant is left to use it); otherwise the key is cached
    only when the transaction commits. Raises ``IntegrityError`` if another transaction
    created that generation first (``_current_key`` reads the winner's)."""
    TenantDataKey = _data_keys()

    tenant_id = _tenant_id(tenant)
    last = (TenantDataKey.objects.for_tenant(tenant_id).order_by("-generation")
            .values_list("generation", flat=True).first())
    raw = Fernet.generate_key()
    row = TenantDataKey(tenant_id=tenant_id, key_id=secrets.token_hex(8),
                        generation=(last or 0) + 1, wrapped=wrap(raw))
    with transaction.atomic():  # a savepoint: a lost race leaves the caller's block usable
        row.save(force_insert=True)
    with _lock:
        _current.pop(tenant_id, None)  # a tenant id reused after a rollback (SQLite)
        if not with_tenant and transaction.get_connection().in_atomic_block:
            _uncommitted.add(row.key_id)
            transaction.on_commit(lambda: _uncommitted.discard(row.key_id))
    row.fernet = Fernet(raw)
    _remember(row.key_id, tenant_id, row.fernet, current=True)
    return row


def _current_key(tenant_id: int) -> tuple[str, Fernet]:
    key_id = _current.get(tenant_id)
    if key_id is not None:
        hit = _cached(key_id)
        if hit is not None and hit[1] is not None:
            return key_id, hit[1]
    TenantDataKey = _data_keys()

    for _ in range(2):
        row = (TenantDataKey.objects.for_tenant(tenant_id).filter(destroyed_at__isnull=True)
               .order_by("-generation").values_list("key_id", "wrapped").first())
        if row is not None:
            key = _unwrap(row[0], row[1])
            _remember(row[0], tenant_id, key, current=True)
            return row[0], key
        try:
            created = data_key_create(tenant_id)
        except IntegrityError:
            continue  # another transaction created it: read it
        return created.key_id, created.fernet
    raise DataKeyGone("erased: no data key could be created for the tenant")


def _key(key_id: str, tenant_id: int | None) -> Fernet:
    hit = _cached(key_id)
    if hit is not None:
        if tenant_id is not None and hit[0] != tenant_id:
            raise InvalidToken  # another tenant's ciphertext: never decrypted here
        if hit[1] is None:
            raise DataKeyGone(_DESTROYED)
        return hit[1]
    TenantDataKey = _data_keys()

    rows = (TenantDataKey.objects.for_tenant(tenant_id) if tenant_id is not None
            else TenantDataKey.objects.for_all_tenants(reason=_ANY_TENANT))
    row = rows.filter(key_id=key_id).values_list("tenant_id", "wrapped", "destroyed_at").first()
    if row is None:
        raise DataKeyGone(f"erased: the data key {key_id} is not in this database")
    if row[2] is not None or not row[1]:
        # Destroyed for good: remembered as such (no TTL), so a list of a shredded
        # tenant's effects does not read the row once per receipt.
        _remember(key_id, row[0], None, current=False)
        raise DataKeyGone(_DESTROYED)
    key = _unwrap(key_id, row[1])
    _remember(key_id, row[0], key, current=False)
    return key


_DESTROYED = "erased: the tenant's key was destroyed"
_ANY_TENANT = ("decrypt_text without a tenant (operator tools, tests): the key is found by "
               "its id, which the ciphertext names")


# --------------------------------------------------------------------------------------
# Ciphertexts
# --------------------------------------------------------------------------------------

def encrypt_text(text: str, *, tenant) -> str:
    """Encrypt UTF-8 text under ``tenant``'s live data key (a ``Tenant`` or its id; one is
    created if it has none): ``k1.<key_id>.<Fernet token>``, ASCII. ``tenant=None``
    writes the legacy form under the newest master key (only migration 0004 does)."""
    data = text.encode("utf-8")
    if tenant is None:
        return fernet().encrypt(data).decode("ascii")
    key_id, key = _current_key(_tenant_id(tenant))
    return f"{PREFIX}{key_id}.{key.encrypt(data).decode('ascii')}"


def decrypt_text(token: str, *, tenant=None) -> str:
    """Decrypt a token written by ``encrypt_text`` for ``tenant`` (a ``Tenant`` or its id;
    the service always names it, so another tenant's ciphertext never decrypts; ``None``,
    for operator tools and tests: whichever tenant's key the token names).

    Raises ``DataKeyGone`` (410 ``erased``) when the data key it names is destroyed,
    missing or cannot be unwrapped, and ``cryptography.fernet.InvalidToken`` when the
    token is corrupt, names another tenant's key, or (legacy form) fits no master key.
    """
    if token.startswith(PREFIX):
        key_id, _, body = token[len(PREFIX):].partition(".")
        key = _key(key_id, None if tenant is None else _tenant_id(tenant))
        return key.decrypt(body.encode("ascii")).decode("utf-8")
    return fernet().decrypt(token.encode("ascii")).decode("utf-8")


def is_enveloped(token: str) -> bool:
    """Whether ``token`` was written under a data key (not the legacy master-key form)."""
    return token.startswith(PREFIX)


def key_id_of(token: str) -> str | None:
    """The data key id a ``k1.`` token names, else ``None``."""
    if not token.startswith(PREFIX):
        return None
    return token[len(PREFIX):].partition(".")[0]


def rotate_token(token: str) -> str:
    """Re-encrypt a master-key token (a wrapped data key) under the newest master key."""
    return fernet().rotate(token.encode("ascii")).decode("ascii")


def is_current(token: str) -> bool:
    """Whether a master-key token is already encrypted under the newest key."""
    try:
        Fernet(settings.RECOVERY_ENCRYPTION_KEYS[0].encode()).decrypt(token.encode("ascii"))
    except InvalidToken:
        return False
    return True
