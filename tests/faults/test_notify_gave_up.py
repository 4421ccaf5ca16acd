"""``reconcile.gave_up`` (issue 21, item 2): a reconcile request that gives up after the
cap writes its outbox row in the transaction that gives up, and the dispatcher tells the
run's tenant, naming the service and the counts, never the provider's answer or the
operation key."""

from __future__ import annotations

import json

import pytest

from checkpoints import services
from checkpoints.jobs import reconciliation
from checkpoints.models import NotificationMessage, NotificationOutbox
from checkpoints.services import notify_dispatch as nd
from checkpoints.vocab import NotificationEventType as E
from tests.faults.conftest import in_doubt_run, request_for
from tests.helpers import age_world
from tests.services.test_notify_dispatch import endpoint

CAP = 2
ANSWER = b'{"status": "S3CRET-provider-words"}'


@pytest.mark.django_db
def test_a_reconcile_that_gives_up_is_told_once(acme, wendy, rita, adam, stub, settings,
                                                django_capture_on_commit_callbacks):
    settings.RECOVERY_RECONCILE_MAX_FAILURES = CAP
    ep = endpoint(acme, adam, event_types=[E.RECONCILE_GAVE_UP], group_window_s=0)
    run = in_doubt_run(wendy, acme, keys=("charge:S3CRET-key",))
    stub.answer("charge:S3CRET-key", ANSWER)
    age_world(3600)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="died")
    req = request_for(run.effects["charge:S3CRET-key"])
    for _ in range(CAP + 2):
        age_world(3600)
        if reconciliation.execute(req.pk)["result"] == "gave_up":
            break
    assert NotificationOutbox.objects.filter(event_type=E.RECONCILE_GAVE_UP).count() == 1
    nd.dispatch_round()
    (told,) = NotificationMessage.objects.filter(endpoint=ep, event_type=E.RECONCILE_GAVE_UP)
    assert told.payload["data"]["effect"] == {
        "effect": str(run.effects["charge:S3CRET-key"]), "service": "payments",
        "attempts": CAP, "failures": CAP}
    assert told.subject.startswith(f"[acme] reconciliation gave up on run {str(run.run_id)[:8]}")
    for text in (json.dumps(told.payload), told.subject, told.text):
        assert "S3CRET" not in text
    nd.dispatch_round()
    assert NotificationMessage.objects.filter(event_type=E.RECONCILE_GAVE_UP).count() == 1
