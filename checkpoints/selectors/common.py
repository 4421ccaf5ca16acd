"""What the reads share: the run list's columns, whether a lease is live, and a malformed id answered like a missing
object.
"""

from __future__ import annotations

import uuid

from django.db.models import BooleanField, ExpressionWrapper, Q

from ..dbclock import NOW
from ..exceptions import NotFound

RUN_LIST_FIELDS = (
    "id", "tenant_id", "uuid", "kind", "schema_version", "agent", "model", "workflow",
    "definition_version", "phase_class", "phase_label", "recovery_state", "recovery_reason",
    "state_changed_at", "last_write_at", "created_at", "lease_owner", "lease_expires_at",
    "fencing_token", "unacknowledged_conflicts", "closed_at", "closed_reason",
    "closed_by__username", "payloads_deleted_at", "lease_live",
)

#: ``policy.lease_live`` as SQL, for a run read to be shown: the run has a lease owner
#: and its lease expires after the database's time (CONTRACT.md 3), never after the web
#: process's clock. Annotated as ``lease_live`` (the inbox's rows, ``run_get``, the live
#: page), so the badge "live"/"expired" a page shows is the rule reconcile applies.
LEASE_LIVE = ExpressionWrapper(Q(lease_expires_at__gt=NOW) & ~Q(lease_owner=""),
                               output_field=BooleanField())


def _uuid_or_404(value, what: str) -> uuid.UUID:
    """``value`` as a UUID; a malformed id is answered like a missing object (404), in
    words saying that ids here are whole UUIDs: the API takes no short id (the 8 hex
    digits the dashboard shows resolve in its run page URLs only,
    ``dashboard.run._run_by_prefix``; docs/search.md)."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotFound(f"no such {what}: a {what} id is a whole UUID (36 characters); "
                       "short ids are for the dashboard's run page URLs only") from None
