"""What the reads share: the run list's columns, and a malformed id answered like a missing
object.
"""

from __future__ import annotations

import uuid

from ..exceptions import NotFound

RUN_LIST_FIELDS = (
    "id", "tenant_id", "uuid", "kind", "schema_version", "agent", "model", "workflow",
    "definition_version", "phase_class", "phase_label", "recovery_state", "recovery_reason",
    "state_changed_at", "last_write_at", "created_at", "lease_owner", "lease_expires_at",
    "fencing_token", "unacknowledged_conflicts", "closed_at", "closed_reason",
    "closed_by__username", "payloads_deleted_at",
)


def _uuid_or_404(value, what: str) -> uuid.UUID:
    """``value`` as a UUID; a malformed id is answered like a missing object."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotFound(f"no such {what}") from None
