"""Per-tenant data keys (issue 20, item 3; docs/security/encryption.md): envelope
encryption and crypto-shredding.

Every ciphertext column of a tenant is encrypted with one of the tenant's data keys (a
random Fernet key), and only the data key is encrypted ("wrapped") with the master keys
of ``RECOVERY_ENCRYPTION_KEYS``. Rotating a master key re-wraps the data keys (a few
rows) instead of re-encrypting every payload; destroying a tenant's data keys
(``services.tenant_shred``) makes every ciphertext written under them unreadable
(crypto-shredding). ``checkpoints.crypto`` reads and caches them.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from .tenancy import Tenant, TenantOwned

#: Length of a key id (hex digits of 8 random bytes).
KEY_ID_LENGTH = 16


class TenantDataKey(TenantOwned):
    """One data key of a tenant. ``key_id`` (16 hex digits, unique across tenants) is named
    in every ciphertext written under it (``k1.<key_id>.<Fernet token>``); ``wrapped`` is
    the data key encrypted with ``RECOVERY_ENCRYPTION_KEYS`` (a Fernet token); the key in
    use for new ciphertexts is the tenant's live key of highest ``generation``.

    Destroyed (``destroyed_at`` set, by ``destroyed_by``; ``None`` for an operator's
    command): ``wrapped`` is empty, so nothing in this database can decrypt what was
    written under it. The row stays, so a ciphertext naming it is answered "erased", not
    "unknown key".
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)
    key_id = models.CharField(max_length=KEY_ID_LENGTH, unique=True)
    generation = models.PositiveIntegerField()
    wrapped = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)
    destroyed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints = [
            # One key per generation: two processes creating a tenant's first key at
            # once collide here, and the loser reads the winner's.
            models.UniqueConstraint(fields=["tenant", "generation"],
                                    name="tenantdatakey_one_per_generation"),
            # A destroyed key keeps nothing of its material.
            models.CheckConstraint(condition=Q(destroyed_at__isnull=True) | Q(wrapped=""),
                                   name="tenantdatakey_destroyed_is_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.key_id}"
