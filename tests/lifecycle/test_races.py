"""Races of legal holds and erasure (issue 20) on real PostgreSQL, by real threads
(``tests.transactional.test_races.race``): one decision per erasure request, one release
per hold, and a hold placed while an approval erases never lets a held run be erased."""

from __future__ import annotations

from collections import Counter

import pytest

from checkpoints import services
from checkpoints.models import AuditEvent, ErasureRequest, Tombstone
from tests.conftest import _person
from tests.lifecycle.test_erasure_holds import completed_run
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 3


def kinds(results) -> Counter:
    return Counter(type(r).__name__ for r in results)


@pytest.mark.parametrize("second", ["approve", "reject"])
def test_two_approvers_deciding_one_erasure_request(acme, wendy, rita, april, second):
    april2 = _person("april2", acme, "approver")
    deciders = [(april, services.erasure_approve),
                (april2, {"approve": services.erasure_approve,
                          "reject": services.erasure_reject}[second])]
    for _ in range(ROUNDS):
        run = completed_run(wendy, acme)
        request = services.erasure_request(actor=rita, tenant=acme, runs=[run.uuid],
                                           reason="x")
        results = race(2, lambda i, rid=request.uuid: deciders[i][1](
            actor=deciders[i][0], tenant=acme, request_id=rid, reason=f"decider {i}"))
        assert kinds(results) == {"ErasureRequest": 1, "AlreadyDecided": 1}, results
        stored = ErasureRequest.objects.get(pk=request.pk)
        erased = Tombstone.objects.filter(run_uuid=run.uuid).count()
        assert erased == (1 if stored.state == "executed" else 0)
    assert AuditEvent.objects.filter(action__in=["erasure.approve", "erasure.reject"]).count() \
        == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_two_releases_of_one_hold(acme, adam):
    adam2 = _person("adam2", acme, "admin")
    for _ in range(ROUNDS):
        hold = services.legal_hold_place(actor=adam, tenant=acme, whole_tenant=True,
                                         reason="x")
        results = race(2, lambda i, h=hold.uuid: services.legal_hold_release(
            actor=(adam, adam2)[i], tenant=acme, hold_id=h, reason=f"release {i}"))
        assert kinds(results) == {"LegalHold": 1, "AlreadyDecided": 1}, results
    assert AuditEvent.objects.filter(action="legal_hold.release").count() == ROUNDS


def test_a_hold_racing_an_approval_never_lets_a_held_run_go(acme, wendy, rita, april, adam):
    """Both take the tenant's audit head first: either the hold commits first (the run is
    counted held, nothing erased) or the erasure does (then the hold holds a tombstone)."""
    for _ in range(ROUNDS):
        run = completed_run(wendy, acme)
        request = services.erasure_request(actor=rita, tenant=acme, runs=[run.uuid],
                                           reason="x")
        results = race(2, lambda i, rid=request.uuid, r=run.uuid: (
            services.erasure_approve(actor=april, tenant=acme, request_id=rid) if i == 0
            else services.legal_hold_place(actor=adam, tenant=acme, runs=[r], reason="x")))
        assert kinds(results) == {"ErasureRequest": 1, "LegalHold": 1}, results
        done, hold = results
        erased = Tombstone.objects.filter(run_uuid=run.uuid).exists()
        assert done.counts["erased"] == int(erased)
        assert done.counts["legal_hold"] == int(not erased)
        seq = dict(AuditEvent.objects.filter(tenant=acme, target_ref__in=[
            str(hold.uuid), str(done.uuid)], action__in=["legal_hold.place",
                                                         "erasure.execute"])
                   .values_list("action", "seq"))
        # The order of the chain is the order of the decisions.
        assert (seq["erasure.execute"] < seq["legal_hold.place"]) == erased
    assert services.audit_verify(tenant=acme)[0]
