"""Effect records over HTTP: CAS, the state machine, operation keys (CONTRACT.md 3)."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from checkpoints.models import Conflict, Effect, EffectRevision
from tests.api.apihelpers import get, put_fx, snapshot, walk
from tests.helpers import FP, effect_body


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


def test_it_creates_an_effect_as_planned_with_etag_0(w, acme):
    body = effect_body()
    r = put_fx(w, "acme", body, create=True)
    assert r.status_code == 201 and r["ETag"] == '"0"'
    data = r.json()
    assert data["state"] == "planned" and data["attempt"] == 1 and data["id"] == body["id"]
    r = get(w, "acme", f"effects/{body['id']}")
    assert r.status_code == 200 and r["ETag"] == '"0"'


def test_it_walks_planned_submitted_confirmed_with_a_receipt(w, acme):
    body = effect_body()
    data = walk(w, "acme", body, "submitted", "confirmed")
    assert data["state"] == "confirmed" and data["revision"] == 2
    assert data["receipt"] == {"charge_id": "ch_1"}
    states = list(EffectRevision.objects.filter(effect__uuid=body["id"])
                  .order_by("revision").values_list("state", flat=True))
    assert states == ["planned", "submitted", "confirmed"]


def test_it_refuses_confirmed_without_a_receipt(w, acme):
    body = effect_body()
    walk(w, "acme", body, "submitted")
    before = snapshot()
    r = put_fx(w, "acme", dict(body, revision=2, state="confirmed", receipt=None), match=1)
    assert r.status_code == 400 and r.json()["detail"].startswith("receipt")
    assert snapshot() == before


@pytest.mark.parametrize("path,to", [
    ((), "confirmed"),                          # planned -> confirmed skips submitted
    (("submitted",), "planned"),
    (("submitted", "confirmed"), "failed"),     # confirmed is final
    (("submitted",), "not_executed"),           # only reconciliation, from unresolved
    (("submitted",), "unknown"),                # reviewer or reconciliation only
    (("submitted", "unresolved", "not_executed"), "planned"),  # needs an approved retry
])
def test_it_answers_422_invalid_transition_for_a_move_the_runtime_may_not_make(w, acme, path,
                                                                             to):
    body = effect_body()
    walk(w, "acme", body, *path)
    before = snapshot()
    receipt = {"x": 1} if to == "confirmed" else None
    r = put_fx(w, "acme", dict(body, revision=len(path) + 1, state=to, receipt=receipt),
               match=len(path))
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_transition"
    assert snapshot() == before


def test_it_refuses_a_new_effect_that_does_not_start_planned(w, acme):
    r = put_fx(w, "acme", effect_body(state="submitted"), create=True)
    assert r.status_code == 422 and r.json()["error"] == "invalid_transition"
    assert not Effect.objects.exists()


def test_it_answers_409_operation_exists_for_the_same_key_and_fingerprint(w, acme):
    first = effect_body()
    assert put_fx(w, "acme", first, create=True).status_code == 201
    before = snapshot()
    r = put_fx(w, "acme", effect_body(run_id=first["run_id"]), create=True)
    assert r.status_code == 409
    assert r.json() == {"error": "operation_exists", "effect_id": first["id"]}
    assert snapshot() == before


def test_it_answers_422_idempotency_key_reuse_for_another_fingerprint(w, acme):
    assert put_fx(w, "acme", effect_body(), create=True).status_code == 201
    other = hashlib.sha256(b"another request").hexdigest()
    before = snapshot()
    r = put_fx(w, "acme", effect_body(fingerprint=other), create=True)
    assert r.status_code == 422 and r.json()["error"] == "idempotency_key_reuse"
    assert snapshot() == before


def test_it_allows_the_same_key_in_another_service(w, acme):
    assert put_fx(w, "acme", effect_body(), create=True).status_code == 201
    assert put_fx(w, "acme", effect_body(service="mail"), create=True).status_code == 201


def test_it_stores_the_fingerprint_lower_case(w, acme):
    body = effect_body(fingerprint=FP.upper())
    r = put_fx(w, "acme", body, create=True)
    assert r.status_code == 201 and r.json()["request_fingerprint"] == FP
    assert Effect.objects.get(uuid=body["id"]).request_fingerprint == FP


def test_it_finds_an_effect_by_service_and_operation_key(w, acme):
    wanted = effect_body(operation_key="charge:A-1")
    put_fx(w, "acme", wanted, create=True)
    put_fx(w, "acme", effect_body(operation_key="charge:A-2"), create=True)
    r = get(w, "acme", "effects", service="payments", operation_key="charge:A-1")
    assert r.status_code == 200
    assert [e["id"] for e in r.json()["results"]] == [wanted["id"]]
    r = get(w, "acme", "effects", run=wanted["run_id"])
    assert [e["id"] for e in r.json()["results"]] == [wanted["id"]]
    r = get(w, "acme", "effects", run="nope")
    assert r.status_code == 400 and r.json()["detail"].startswith("run")


def test_it_answers_412_for_a_stale_effect_revision_and_records_the_conflict(w, acme):
    body = effect_body()
    walk(w, "acme", body, "submitted")
    r = put_fx(w, "acme", dict(body, revision=1, state="submitted"), match=0)
    assert r.status_code == 412
    assert r.json() == {"error": "conflict", "current_revision": 1}
    assert Conflict.objects.filter(target_type="effect", target_uuid=body["id"]).count() == 1


def test_it_refuses_a_change_of_operation_key_with_400(w, acme):
    body = effect_body()
    walk(w, "acme", body)
    before = snapshot()
    r = put_fx(w, "acme", dict(body, revision=1, state="submitted", operation_key="x"), match=0)
    assert r.status_code == 400 and r.json()["detail"].startswith("operation_key")
    assert snapshot() == before


def test_it_answers_404_for_an_update_of_a_missing_effect(w, acme):
    before = snapshot()
    r = put_fx(w, "acme", effect_body(revision=1, state="submitted"), match=0)
    assert r.status_code == 404
    assert snapshot() == before  # no effect, and no run for its run_id either
    assert get(w, "acme", f"effects/{uuid.uuid4()}").status_code == 404


def test_it_fences_effect_writes_while_the_run_is_leased(w, acme):
    """409 fenced on an effect PUT (documented beside operation_exists): an update and a
    create with a missing or old token change nothing and are kept as conflicts."""
    from tests.api.apihelpers import post

    body = effect_body()
    assert put_fx(w, "acme", body, create=True).status_code == 201
    lease = post(w, "acme", f"runs/{body['run_id']}/lease", {"owner": "worker-1", "ttl_s": 60})
    assert lease.status_code == 200
    token = lease.json()["fencing_token"]
    before = snapshot()
    other = effect_body(run_id=body["run_id"], operation_key="charge:other")
    for sent in (None, token - 1):
        r = put_fx(w, "acme", dict(body, revision=1, state="submitted"), match=0, token=sent)
        assert (r.status_code, r.json()) == (409, {"error": "fenced", "fencing_token": token})
        r = put_fx(w, "acme", other, create=True, token=sent)
        assert (r.status_code, r.json()) == (409, {"error": "fenced", "fencing_token": token})
    after = snapshot()
    assert (after["effects"], after["effect_revisions"]) == (before["effects"],
                                                             before["effect_revisions"])
    assert list(Conflict.objects.values_list("reason", flat=True)) == ["fenced"] * 4
    r = put_fx(w, "acme", dict(body, revision=1, state="submitted"), match=0, token=token)
    assert r.status_code == 200
