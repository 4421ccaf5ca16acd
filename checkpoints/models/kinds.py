"""Declarative kinds: a kind version a tenant's admin declared as data (issue 19, item 1;
``kinds.declarative``, ``services.kinds``, docs/kinds.md)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from .tenancy import Tenant, TenantOwned


class DeclaredKindVersion(TenantOwned):
    """One version of a tenant's declared kind: the declaration as given (``body``: JSON
    Schema, phase map, identity and usage pointers, the migration from the version before)
    and its digest (SHA-256 of the canonical JSON). Seen only by its tenant; a kind in
    code with the same name always wins. Immutable once a checkpoint of the tenant uses
    (kind, version): a change is then a new version (``services.kind_declare``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # the unique (tenant, kind, version) starts with it
    kind = models.CharField(max_length=200)
    # The API takes 0..2^32-1 like ``Checkpoint.schema_version`` (a 64-bit column there too).
    version = models.BigIntegerField()
    body = models.JSONField()
    digest = models.CharField(max_length=64)
    description = models.CharField(max_length=200, blank=True)
    declared_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                    related_name="+", null=True, blank=True)
    # The database clock, on insert and (``services.kind_declare``) on a replacement.
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind", "version"],
                                    name="declared_kind_one_per_version"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} v{self.version}"
