"""Read-only Django admin for audit events and runs.

Nothing is written through the admin (DESIGN.md section 5: every write goes through a
service), so add, change and delete are refused for everyone, superusers included.
Payload columns are not shown: a payload reveal is an audited action of the dashboard.
"""

from __future__ import annotations

from django.contrib import admin

from .models import AuditEvent, Run


class ReadOnlyAdmin(admin.ModelAdmin):
    """A ModelAdmin that lists and shows rows but never adds, changes or deletes them."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "seq", "created_at", "actor_name", "action", "target_type",
                    "target_id", "run_id")
    list_filter = ("tenant", "action", "target_type")
    search_fields = ("actor_name", "action", "target_id", "run_id", "reason")
    list_select_related = ("tenant",)
    ordering = ("tenant", "-seq")
    readonly_fields = [f.name for f in AuditEvent._meta.fields]


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("run_id", "tenant", "recovery_state", "kind", "schema_version",
                    "phase_label", "lease_owner", "fencing_token", "unacknowledged_conflicts",
                    "last_write_at")
    list_filter = ("tenant", "recovery_state", "kind")
    search_fields = ("run_id", "agent", "workflow", "lease_owner")
    list_select_related = ("tenant",)
    ordering = ("-last_write_at", "-id")
    readonly_fields = [f.name for f in Run._meta.fields]
