"""Tenants, API tokens, and what every model of the store shares: tenant scoping
(``TenantQuerySet``, ``TenantOwned``) and timestamps.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class TenantQuerySet(models.QuerySet):
    """The queryset (and, through ``TenantManager``, the manager) of every tenant-owned
    model: the one way to start a query on tenant data."""

    def for_tenant(self, tenants) -> TenantQuerySet:
        """Rows of one tenant (a ``Tenant`` or its id) or of several (an iterable or a
        queryset of tenants or ids: the caller's tenants). Raises ``TypeError`` for
        ``None``, a bool or anything else, so a missing tenant never means "all"."""
        if isinstance(tenants, Tenant):
            return self.filter(tenant_id=tenants.pk)
        if isinstance(tenants, int) and not isinstance(tenants, bool):
            return self.filter(tenant_id=tenants)
        if isinstance(tenants, models.QuerySet):
            if tenants.model is not Tenant:
                raise TypeError(f"for_tenant: a queryset of {tenants.model.__name__}, "
                                f"not of tenants")
            return self.filter(tenant__in=tenants)
        if isinstance(tenants, list | tuple | set | frozenset):
            ids = []
            for t in tenants:
                if isinstance(t, Tenant):
                    ids.append(t.pk)
                elif isinstance(t, int) and not isinstance(t, bool):
                    ids.append(t)
                else:
                    raise TypeError(f"for_tenant: {type(t).__name__} is not a tenant")
            return self.filter(tenant_id__in=ids)
        raise TypeError(f"for_tenant: {type(tenants).__name__} is not a tenant")

    def for_all_tenants(self, *, reason: str) -> TenantQuerySet:
        """Every tenant's rows: the explicit escape hatch for what spans tenants by design
        (the sweep, re-driving and claiming reconcile jobs, key rotation). The
        ``reason`` (required, non-blank) documents the use; each one is listed with it in
        ``tests/test_tenant_scoping_lint.py``. Raises ``ValueError`` without a reason."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("for_all_tenants: a reason is required")
        return self.all()


TenantManager = models.Manager.from_queryset(TenantQuerySet)


class TenantOwned(models.Model):
    """Abstract base of every tenant-owned model: ``objects`` is a ``TenantManager``."""

    objects = TenantManager()

    class Meta:
        abstract = True


class TimestampedModel(models.Model):
    """``created_at`` is the database's time of the insert (``db_default``, read back by
    ``RETURNING``), never the writing process's clock (CONTRACT.md 3): approvals and
    effects are listed oldest first by it, and a node whose clock ran an hour ahead put
    its rows out of order (the attack's finding). ``updated_at`` is still ``auto_now``;
    the services that compare it write the database's time themselves."""

    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class Tenant(TimestampedModel):
    """An organisation. Roles are django-guardian object permissions on this row.

    The custom permissions below are the only rights the service checks; a role
    (``checkpoints.roles``) is a named set of them, granted through a per-tenant group.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    ambiguity_threshold_s = models.PositiveIntegerField(
        default=300,
        help_text="A run with an in-flight checkpoint and no lease is ambiguous after this many seconds.",
    )

    class Meta:
        ordering = ["slug"]
        permissions = [
            ("view_runs", "See runs, metadata, reports and audit"),
            ("reveal_payload", "Reveal checkpoint payloads"),
            ("review_runs", "Request retry, mark unknown, reconcile, acknowledge conflicts"),
            ("approve_retry", "Approve or reject retry requests"),
            ("write_runs", "Write checkpoints and effects, take leases, ask resume decisions"),
            ("manage_roles", "Grant roles in this tenant"),
        ]

    def __str__(self) -> str:
        return self.slug


class ApiToken(models.Model):
    """A bearer token for runtimes and scripts. Only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    prefix = models.CharField(max_length=12)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
