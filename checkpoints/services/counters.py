"""The state counters' compaction (issue 22, item 1; migration 0038).

The triggers of migration 0038 only ever INSERT a counter row (a +1 or -1 delta), so no
writer waits on another's counter row; readers SUM ``n`` per state. Left alone the
tenant's rows grow by one or two per state change: ``counters_compact`` folds them into
one row per state, run by the sweep (every 10 s, or the in-process thread).
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Count, Sum

from .. import locks
from ..models import EffectStateCount, RunStateCount

#: The advisory lock class of a tenant's compaction ("RCNT"; the tenant id is the second
#: key): one compaction per tenant at a time, so two never delete the same rows.
COMPACT_LOCK = 0x52434E54
#: A tenant's counter table is compacted once it holds more rows than this.
COMPACT_ABOVE = 64
#: At most this many tenants per call (the sweep calls again on its next pass).
COMPACT_TENANTS = 100


def _compact_one(model, tenant_id: int) -> int:
    table = connection.ops.quote_name(model._meta.db_table)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH gone AS (DELETE FROM {table} WHERE tenant_id = %s RETURNING state, n) "
                f"INSERT INTO {table} (tenant_id, state, shard, n) "
                f"SELECT %s, state, 0, SUM(n) FROM gone GROUP BY state HAVING SUM(n) <> 0",
                [tenant_id, tenant_id])
            return cursor.rowcount
    rows = model.objects.for_tenant(tenant_id)
    sums = list(rows.order_by().values_list("state").annotate(total=Sum("n"))
                .values_list("state", "total"))
    rows.delete()
    model.objects.bulk_create([model(tenant_id=tenant_id, state=state, shard=0, n=total)
                               for state, total in sums if total])
    return len(sums)


def counters_compact(*, above: int = COMPACT_ABOVE) -> int:
    """Fold the run and effect state counter rows of every tenant holding more than
    ``above`` rows into one row per state (their SUM; none for a sum of 0), each tenant in its own
    transaction under the tenant's ``COMPACT_LOCK`` (tried, not waited for: a tenant
    another process is compacting is skipped). Concurrent writers are not blocked:
    they only insert, and rows committed after the compaction's snapshot are left as
    they are, so every sum stays exact. Returns how many tenants' tables were compacted.
    System work (no actor, no audit event: the counts do not change)."""
    done = 0
    for model in (RunStateCount, EffectStateCount):
        crowded = (model.objects.for_all_tenants(reason="compaction of the state counters")
                   .order_by().values("tenant_id").annotate(rows=Count("id"))
                   .filter(rows__gt=above).values_list("tenant_id", flat=True)
                   [:COMPACT_TENANTS])
        for tenant_id in list(crowded):
            with transaction.atomic():
                if locks.try_transaction_key(COMPACT_LOCK, tenant_id):
                    _compact_one(model, tenant_id)
                    done += 1
    return done
