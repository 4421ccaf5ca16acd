"""The Django admin: a read-only operator's view of tenants, accounts and API tokens, and
nothing of any tenant's content (issue 6, fault 1; docs/security/access.md).

The admin cannot scope by tenant (it knows staff and superuser flags, which give nothing
inside a tenant), and it writes no audit event. So:

- it shows only what the operator's commands deal with: tenants (slug, name, threshold),
  accounts (username, flags, the roles they hold, live tokens) and tokens (prefix,
  created, last used, revoked; never the hash);
- it shows no run, checkpoint, effect, conflict, retry, reconcile job or audit event:
  those are read in the dashboard and the API by the tenant's roles;
- it changes nothing: add, change and delete are refused for everyone, superusers
  included, and Django's own user and group pages are replaced or removed, because a
  role granted there (adding an account to a ``tenant:<slug>:<role>`` group) or a
  password or flag changed there would bypass the audit. Roles, tokens and accounts
  change only through the commands (``grant``, ``revoke``, ``issue_token``,
  ``revoke_token``, ``deactivate_account``), which call the audited services.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from .models import ApiToken, Tenant

User = get_user_model()


class ReadOnlyAdmin(admin.ModelAdmin):
    """A ModelAdmin that lists and shows rows but never adds, changes or deletes them."""

    actions = None

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "ambiguity_threshold_s", "created_at")
    search_fields = ("slug", "name")
    fields = ("slug", "name", "ambiguity_threshold_s", "created_at", "updated_at")
    readonly_fields = fields


# Django's UserAdmin edits passwords, flags, groups and permissions; its GroupAdmin edits
# group membership and permissions, which is how roles are held. Neither is audited.
admin.site.unregister(Group)
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(ReadOnlyAdmin):
    """Accounts: who exists, whether it may log in, and which roles it holds where."""

    list_display = ("username", "is_active", "roles", "live_tokens", "last_login",
                    "date_joined", "is_staff", "is_superuser")
    list_filter = ("is_active", "is_staff", "is_superuser")
    search_fields = ("username",)
    fields = ("username", "is_active", "roles", "live_tokens", "last_login", "date_joined",
              "is_staff", "is_superuser")
    readonly_fields = fields
    ordering = ("username",)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("groups", "api_tokens")

    @admin.display(description="roles (tenant:role)")
    def roles(self, obj) -> str:
        names = sorted(g.name.removeprefix("tenant:") for g in obj.groups.all()
                       if g.name.startswith("tenant:"))
        return ", ".join(names) or "—"

    @admin.display(description="live tokens")
    def live_tokens(self, obj) -> int:
        return sum(1 for t in obj.api_tokens.all() if t.revoked_at is None)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Bearer tokens by prefix (the secret is never stored; its hash is not shown)."""

    list_display = ("prefix", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "user__username")
    list_select_related = ("user",)
    fields = ("prefix", "user", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    ordering = ("-created_at",)
