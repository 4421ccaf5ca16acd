"""What the reads share: the run list's columns, whether a lease is live and the word for
it, and a malformed id answered like a missing object.
"""

from __future__ import annotations

import uuid

from django.db.models import BooleanField, ExpressionWrapper, Q

from .. import policy
from ..dbclock import NOW
from ..exceptions import NotFound

RUN_LIST_FIELDS = (
    "id", "tenant_id", "uuid", "kind", "schema_version", "agent", "model", "workflow",
    "definition_version", "phase_class", "phase_label", "recovery_state", "recovery_reason",
    "state_changed_at", "last_write_at", "created_at", "lease_owner", "lease_expires_at",
    "fencing_token", "unacknowledged_conflicts", "closed_at", "closed_reason",
    "closed_by__username", "payloads_deleted_at", "lease_live", "lease_ended_at",
    "lease_ended_by",
)

#: ``policy.lease_live`` as SQL, for a run read to be shown: the run has a lease owner
#: and its lease expires after the database's time (CONTRACT.md 3), never after the web
#: process's clock. Annotated as ``lease_live`` (the inbox's rows, ``run_get``, the live
#: page), so the badge "live"/"expired" a page shows is the rule reconcile applies.
LEASE_LIVE = ExpressionWrapper(Q(lease_expires_at__gt=NOW) & ~Q(lease_owner=""),
                               output_field=BooleanField())


def lease_state_of(run) -> str:
    """``policy.lease_state`` (the one rule: ``live``, ``expired``, ``ended``, ``""`` with no
    owner) of a run read to be shown: a ``RUN_LIST_FIELDS`` row (a dict) or a ``Run``
    annotated with ``lease_live`` (``LEASE_LIVE``: the database's clock). No query.
    ``selectors.run_list`` puts it on each row and ``run_get`` on the run
    (``lease_state``), which the run page, the inbox and ``RunSerializer`` read."""
    get = run.get if isinstance(run, dict) else lambda name: getattr(run, name)
    return policy.lease_state(get("lease_owner"), get("lease_expires_at"),
                              get("lease_ended_at"), bool(get("lease_live")))


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
