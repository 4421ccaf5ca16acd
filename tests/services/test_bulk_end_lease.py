"""Bulk ``end_lease`` (``services.bulk_submit`` with ``lease_owner``): a node died with its
runtime, and every run it leased stays "owner live" until the leases expire. One bulk
action ends the leases of that owner, each run by the run page's own
``services.lease_revoke`` with the owner expected: a run whose live lease another owner
holds is refused ``lease_held`` and left alone, one with none ``no_live_lease``; the
owner is part of the request (its selection, fingerprint, events, result); the action's
own parameter is required for it and refused for the others."""

from __future__ import annotations

import uuid

import pytest

from checkpoints import selectors, services
from checkpoints.exceptions import Fenced, InvalidPayload
from checkpoints.models import AuditEvent, BulkAction, BulkActionItem, Run
from checkpoints.vocab import AuditAction, BulkOutcome
from tests.helpers import envelope, put_checkpoint

pytestmark = pytest.mark.django_db


def leased_run(wendy, acme, owner: str | None) -> tuple[uuid.UUID, int]:
    """A run with a checkpoint and, when ``owner``, a one-hour lease: ``(run, token)``."""
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(uuid.uuid4(), run_id, 0, payload={"phase": "ready"}))
    token = 0
    if owner is not None:
        token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner=owner,
                                       ttl_s=3600).fencing_token
    return run_id, token


def end_leases(actor, tenant, runs, lease_owner="worker-7", *, action="end_lease",
               token=None, reason="worker-7's node was terminated"):
    return services.bulk_submit(actor=actor, tenant=tenant, action=action, reason=reason,
                                client_token=token or uuid.uuid4(),
                                run_ids=[str(r) for r in runs], lease_owner=lease_owner)


def test_it_ends_the_named_owners_leases_and_leaves_the_others(acme, wendy, rita):
    gone, gone_token = leased_run(wendy, acme, "worker-7")
    gone2, _ = leased_run(wendy, acme, "worker-7")
    other, other_token = leased_run(wendy, acme, "worker-8")
    free, _ = leased_run(wendy, acme, None)
    bulk, created = end_leases(rita, acme, [gone, other, free, gone2])
    assert created
    items = {i.run_uuid: (i.outcome, i.error)
             for i in BulkActionItem.objects.filter(bulk=bulk)}
    assert items == {gone: (BulkOutcome.DONE, ""), gone2: (BulkOutcome.DONE, ""),
                     other: (BulkOutcome.REFUSED, "lease_held"),
                     free: (BulkOutcome.REFUSED, "no_live_lease")}
    runs = {r.uuid: r for r in Run.objects.all()}
    assert runs[gone].fencing_token == gone_token + 1
    assert not services.run_facts(runs[gone]).lease_live
    # The other owner's lease is untouched: live, same token.
    assert runs[other].fencing_token == other_token
    assert services.run_facts(runs[other]).lease_live
    # Each ended lease has its own event with the bulk's id; the refused ones none.
    events = AuditEvent.objects.filter(action=AuditAction.LEASE_REVOKE)
    assert sorted(e.run_uuid for e in events) == sorted([gone, gone2])
    assert {e.after["bulk_id"] for e in events} == {str(bulk.uuid)}
    assert {e.before["owner"] for e in events} == {"worker-7"}
    # The request names the owner: its submit event, its row, its result.
    [submit] = AuditEvent.objects.filter(action=AuditAction.BULK_SUBMIT)
    assert submit.after["lease_owner"] == "worker-7"
    result = selectors.bulk_get(user=rita, tenant=acme, bulk_id=bulk.uuid)
    assert result.lease_owner == "worker-7"
    assert (result.done, result.refused) == (2, 2)


def test_the_gone_owners_old_token_is_fenced_after(acme, wendy, rita):
    gone, token = leased_run(wendy, acme, "worker-7")
    end_leases(rita, acme, [gone])
    run = Run.objects.get(uuid=gone)
    cp = run.latest_checkpoint
    with pytest.raises(Fenced):
        put_checkpoint(wendy, acme, envelope(cp.uuid, gone, 1, payload={"phase": "ready"}),
                       expected=0, token=token)


@pytest.mark.parametrize("owner, words", [
    (None, "lease_owner: required for end_lease"),
    ("", "lease_owner: must be a non-empty string"),
    ("  ", "lease_owner: must be a non-empty string"),
    ("w" * 257, "lease_owner: must be a non-empty string of at most 256"),
    ("worker\u202e7", "lease_owner:"),
    (7, "lease_owner: must be a non-empty string"),
])
def test_end_lease_needs_an_owners_name(acme, wendy, rita, owner, words):
    gone, token = leased_run(wendy, acme, "worker-7")
    with pytest.raises(InvalidPayload) as exc:
        end_leases(rita, acme, [gone], lease_owner=owner)
    assert str(exc.value.detail).startswith(words)
    assert not BulkAction.objects.exists()
    assert Run.objects.get(uuid=gone).fencing_token == token


@pytest.mark.parametrize("action", ["close", "reconcile", "mark_unknown", "request_retry",
                                    "acknowledge_conflicts"])
def test_no_other_action_takes_an_owner(acme, wendy, rita, action):
    gone, _ = leased_run(wendy, acme, "worker-7")
    with pytest.raises(InvalidPayload) as exc:
        end_leases(rita, acme, [gone], action=action)
    assert str(exc.value.detail).startswith("lease_owner: only end_lease takes an owner")
    assert not BulkAction.objects.exists()


def test_the_owner_is_part_of_the_request_the_token_answers(acme, wendy, rita):
    gone, _ = leased_run(wendy, acme, "worker-7")
    token = uuid.uuid4()
    first, _ = end_leases(rita, acme, [gone], token=token)
    again, created = end_leases(rita, acme, [gone], token=token)
    assert (again.pk, created) == (first.pk, False)
    with pytest.raises(InvalidPayload) as exc:
        end_leases(rita, acme, [gone], lease_owner="worker-8", token=token)
    assert str(exc.value.detail).startswith("client_token:")


def test_a_stored_job_passes_the_owner_to_every_run(acme, wendy, rita, monkeypatch):
    from checkpoints.jobs import bulk as bulk_job

    monkeypatch.setattr("checkpoints.services.bulk.BULK_MAX_RUNS", 2)
    monkeypatch.setattr(bulk_job, "BATCH", 2)
    runs = [leased_run(wendy, acme, "worker-7")[0] for _ in range(3)]
    other, _ = leased_run(wendy, acme, "worker-8")
    bulk, _ = end_leases(rita, acme, [*runs, other])
    assert bulk.background
    bulk_job.execute(bulk.pk)
    bulk.refresh_from_db()
    assert (bulk.done, bulk.refused) == (3, 1)
    assert BulkActionItem.objects.get(bulk=bulk, run_uuid=other).error == "lease_held"
    result = selectors.bulk_get(user=rita, tenant=acme, bulk_id=bulk.uuid)
    assert result.lease_owner == "worker-7"


def test_a_search_for_the_owner_selects_its_runs(acme, wendy, rita):
    gone = [leased_run(wendy, acme, "worker-7")[0] for _ in range(2)]
    other, token = leased_run(wendy, acme, "worker-8")
    bulk, _ = services.bulk_submit(
        actor=rita, tenant=acme, action="end_lease", reason="node 3 terminated",
        client_token=uuid.uuid4(), filters=selectors.RunFilters(q="worker-7"),
        lease_owner="worker-7")
    assert sorted(i.run_uuid for i in BulkActionItem.objects.filter(bulk=bulk)) == sorted(gone)
    assert bulk.selection["filters"]["q"] == "worker-7"
    assert Run.objects.get(uuid=other).fencing_token == token
