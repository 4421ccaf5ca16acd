"""The notification round's cost when nothing is configured (issue 21): a tenant with no
endpoint pays a fixed handful of queries per round, however many of its runs changed
state (its outbox rows are dropped in bulk, never looked at one by one), and a tenant
with endpoints does not pay for another's rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints.jobs import notify
from checkpoints.models import NotificationMessage, NotificationOutbox, Run
from checkpoints.vocab import RecoveryState as S
from tests.helpers import envelope, put_checkpoint

pytestmark = pytest.mark.django_db


def changes(writer, tenant, n: int) -> None:
    """``n`` outbox rows of ``tenant``, the costly mix: runs that went ambiguous, then on
    to awaiting approval (a move out of a state a person acts on), then resolved."""
    for i in range(max(1, n // 3)):
        put_checkpoint(writer, tenant, envelope(payload={"phase": "charging",
                                                         "order_id": f"A-{i}"}))
    runs = list(Run.objects.for_tenant(tenant).values_list("pk", flat=True))
    steps = [("", S.AMBIGUOUS), (S.AMBIGUOUS, S.AWAITING_APPROVAL),
             (S.AWAITING_APPROVAL, S.COMPLETED)]
    NotificationOutbox.objects.bulk_create(
        NotificationOutbox(tenant=tenant, run_id=runs[i % len(runs)], from_state=a, to_state=b)
        for i in range(n) for a, b in [steps[i % 3]])


def round_queries() -> int:
    notify.notify_round()  # the first round of a process reads what later ones cache
    with CaptureQueriesContext(connection) as queries:
        counts = notify.notify_round()
    assert counts["send"]["sent"] == 0
    return len(queries)


@pytest.mark.parametrize("n", [30, 300])
def test_a_tenant_with_no_endpoint_costs_the_same_few_queries_however_many_rows(
        acme, wendy, n):
    base = round_queries()
    changes(wendy, acme, n)
    with CaptureQueriesContext(connection) as queries:
        counts = notify.notify_round()
    assert counts["dispatch"]["dispatched"] == n
    assert NotificationOutbox.objects.count() == 0
    assert NotificationMessage.objects.count() == 0
    print(f"\n{n} rows, no endpoint: {len(queries)} queries (an empty round: {base})")
    assert len(queries) <= base + 2


def test_another_tenants_endpoint_does_not_make_the_unconfigured_tenants_rows_cost(
        acme, globex, wendy, adam, on_postgres):
    """globex has an endpoint and no changes; acme's 90 changes are dropped in bulk."""
    from tests.services.test_notify_dispatch import endpoint

    endpoint(globex, adam)
    base = round_queries()
    changes(wendy, acme, 90)
    with CaptureQueriesContext(connection) as queries:
        counts = notify.notify_round()
    assert counts["dispatch"]["dropped"] == 90 and NotificationOutbox.objects.count() == 0
    assert len(queries) <= base + 2
    if on_postgres:  # one statement, leaving to another worker the rows it holds
        (drop,) = [q["sql"] for q in queries.captured_queries
                   if q["sql"].startswith('DELETE FROM "checkpoints_notificationoutbox"')]
        assert "NOT (EXISTS" in drop and "SKIP LOCKED" in drop
