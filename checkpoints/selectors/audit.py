"""The audit log's page and the tenant's report figures.
"""

from __future__ import annotations

import uuid

from django.db.models import (
    Count,
    Q,
)

from .. import roles
from ..exceptions import InvalidPayload
from ..models import (
    AuditEvent,
    Checkpoint,
    Conflict,
    Effect,
    EffectStateCount,
    RetryRequest,
    Run,
    Tenant,
)
from ..permissions import require
from ..vocab import EffectState
from .inbox import _counted, state_counts
from .search import _IdAmong, _search_run_ids, incident_match, search_terms


def audit_list(*, user, tenant: Tenant, run_id=None, actor: str | None = None,
               action: str | None = None, before_seq: int | None = None,
               q: str | None = None, limit: int = 100) -> list[AuditEvent]:
    """Audit events of the tenant, newest first, filtered; ``before_seq`` pages backwards
    (``seq`` never changes, so paging never skips); at most ``limit`` (1-500).

    ``q``: the events of the runs the inbox search finds (``_search_run_ids``, a
    semi-join on ``audit_run_idx`` ``(tenant, run_uuid, -seq)``) and the events whose
    incident reference starts with it (``search.incident_match``, on
    ``audit_incident_idx``). Each branch is its own newest-first page of ids, and the
    list is the newest ``limit`` of the two (``id = ANY(ARRAY(branch))`` on PostgreSQL):
    one ``OR`` of the two conditions made PostgreSQL check each event of a broad search
    against the array of its runs (727 ms against 150 ms for ``?q=refund`` at 200,000
    events, docs/search.md). Raises ``InvalidPayload`` naming ``run`` or ``q``."""
    require(user, tenant, roles.VIEW)
    limit = max(1, min(limit, 500))
    qs = AuditEvent.objects.for_tenant(tenant)
    if run_id:
        try:
            qs = qs.filter(run_uuid=uuid.UUID(str(run_id)))
        except ValueError:
            raise InvalidPayload("run: not a UUID") from None
    if actor:
        qs = qs.filter(actor_name=actor)
    if action:
        qs = qs.filter(action=action)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    if text := search_terms(q):
        runs = Run.objects.for_tenant(tenant).filter(id__in=_search_run_ids(tenant, text))
        by_run = qs.filter(run_uuid__in=runs.values("uuid"))
        by_incident = qs.filter(incident_match(text))
        # ``qs`` again, not a second ``for_tenant``: the tenant is filtered in one
        # place (a search's answer was scoped by this line alone, so the curated mutant
        # ``tenant-audit_list`` survived every test with ``q``).
        qs = qs.filter(
            Q(_IdAmong(by_run.order_by("-seq").values("id")[:limit]))
            | Q(_IdAmong(by_incident.order_by("-seq").values("id")[:limit])))
    return list(qs.order_by("-seq")[:limit])


def report(*, user, tenant: Tenant) -> dict:
    """Tenant-scoped numbers: runs per state, effects per state, open conflicts, retries,
    and what screening flagged (``flagged_counts``).

    Four queries: runs and effects per state from their counter tables (``RunStateCount``,
    ``EffectStateCount``: a few rows per state whatever the tenant's size); retry
    requests with an index-only count of their ``(tenant, state)`` index (a tenant has
    few); open conflicts from the partial ``conflict_open_idx``, which holds only the
    open ones. Effect states with no effect are left out."""
    require(user, tenant, roles.VIEW)
    effects = {state: n for state, n in _counted(EffectStateCount, tenant,
                                                 EffectState.values).items() if n}
    retries = dict(RetryRequest.objects.for_tenant(tenant).values_list("state")
                   .annotate(n=Count("*")).values_list("state", "n"))
    return {
        "runs": state_counts(tenant=tenant),
        "effects": effects,
        "retry_requests": retries,
        "open_conflicts": Conflict.objects.for_tenant(tenant).filter(
            acknowledged_at__isnull=True).count(),
        "flagged": flagged_counts(tenant),
    }


def flagged_counts(tenant: Tenant) -> dict[str, int]:
    """What screening flagged in ``tenant``'s stored data (docs/security/secrets.md):
    ``checkpoints`` whose current revision holds a credential-like value, ``effects``
    whose request or receipt does, ``runs`` with either, and ``large_payloads``
    (checkpoints above the tenant's ``payload_flag_bytes`` when written). Three queries,
    each on a partial index holding only the flagged rows (``checkpoint_secret_idx``,
    ``effect_secret_idx``, ``checkpoint_large_idx``; migration 0036): before them, a scan
    of every checkpoint and effect of the tenant (105 ms at 100,000 runs)."""
    checkpoints = Checkpoint.objects.for_tenant(tenant)
    secret_cps = checkpoints.exclude(secret_paths=[])
    secret_fxs = Effect.objects.for_tenant(tenant).exclude(secret_paths=[])
    cp_runs = set(secret_cps.values_list("run_id", flat=True))
    fx_runs = set(secret_fxs.values_list("run_id", flat=True))
    return {
        "runs": len(cp_runs | fx_runs),
        "checkpoints": secret_cps.count() if cp_runs else 0,
        "effects": secret_fxs.count() if fx_runs else 0,
        "large_payloads": checkpoints.filter(large_above__isnull=False).count(),
    }
