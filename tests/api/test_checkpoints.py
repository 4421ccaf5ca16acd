"""Checkpoint compare-and-swap over HTTP (CONTRACT.md section 3, "Checkpoints")."""

from __future__ import annotations

import json
import uuid

import pytest

from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Conflict, Run
from tests.api.apihelpers import get, new_checkpoint, post, put_cp, snapshot
from tests.helpers import envelope


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


def test_it_creates_with_if_none_match_star(w, acme):
    body = envelope()
    r = put_cp(w, "acme", body, create=True)
    assert r.status_code == 201
    assert r["ETag"] == '"0"'
    assert r.json()["revision"] == 0 and r.json()["id"] == body["id"]
    cp = Checkpoint.objects.get(tenant=acme, uuid=body["id"])
    assert cp.revision == 0 and cp.written_by.username == "wendy"
    assert AuditEvent.objects.filter(action="checkpoint.write", target_ref=body["id"]).count() == 1


def test_it_updates_with_if_match_to_the_next_revision(w, acme):
    body = new_checkpoint(w, "acme")
    r = put_cp(w, "acme", dict(body, revision=1, payload={"phase": "charging"}), match=0)
    assert r.status_code == 200
    assert r["ETag"] == '"1"'
    r = get(w, "acme", f"checkpoints/{body['id']}")
    assert r.status_code == 200 and r["ETag"] == '"1"'
    assert r.json()["payload"] == {"phase": "charging"}
    assert CheckpointRevision.objects.filter(checkpoint__uuid=body["id"]).count() == 2


def test_it_answers_412_for_a_stale_revision_and_records_the_conflict(w, acme):
    body = new_checkpoint(w, "acme")
    assert put_cp(w, "acme", dict(body, revision=1), match=0).status_code == 200
    r = put_cp(w, "acme", dict(body, revision=1, payload={"phase": "charged"}), match=0)
    assert r.status_code == 412
    assert r.json() == {"error": "conflict", "current_revision": 1}
    conflict = Conflict.objects.get(target_uuid=body["id"])
    assert (conflict.expected_revision, conflict.actual_revision) == (0, 1)
    run = Run.objects.get(uuid=body["run_id"])
    assert run.unacknowledged_conflicts == 1 and run.recovery_state == "conflicted"
    assert Checkpoint.objects.get(uuid=body["id"]).revision == 1


def test_it_answers_412_when_creating_an_existing_id(w, acme):
    body = new_checkpoint(w, "acme")
    r = put_cp(w, "acme", body, create=True)
    assert r.status_code == 412
    assert r.json() == {"error": "conflict", "current_revision": 0}
    assert Conflict.objects.filter(target_uuid=body["id"], expected_revision=None).count() == 1


def test_it_answers_404_for_an_update_of_a_missing_checkpoint(w, acme):
    before = snapshot()
    r = put_cp(w, "acme", envelope(revision=1), match=0)
    assert r.status_code == 404
    assert snapshot() == before


def test_it_answers_404_for_a_get_of_a_missing_or_malformed_checkpoint(w, acme):
    assert get(w, "acme", f"checkpoints/{uuid.uuid4()}").status_code == 404
    assert get(w, "acme", "checkpoints/not-a-uuid").status_code == 404


def test_it_answers_428_without_a_precondition(w, acme):
    before = snapshot()
    r = put_cp(w, "acme", envelope())
    assert r.status_code == 428
    assert r.json()["error"] == "precondition_required"
    assert snapshot() == before


@pytest.mark.parametrize("headers", [
    {"HTTP_IF_MATCH": "*"},
    {"HTTP_IF_MATCH": '"0", "1"'},
    {"HTTP_IF_MATCH": 'W/"0"'},
    {"HTTP_IF_MATCH": "0"},
    {"HTTP_IF_MATCH": '"abc"'},
    {"HTTP_IF_MATCH": '"-1"'},
    {"HTTP_IF_MATCH": '"1.0"'},
    {"HTTP_IF_MATCH": '""'},
    {"HTTP_IF_MATCH": f'"{2**63}"'},
    {"HTTP_IF_NONE_MATCH": '"0"'},
    {"HTTP_IF_NONE_MATCH": "*", "HTTP_IF_MATCH": '"0"'},
], ids=["if-match-star", "list", "weak", "unquoted", "non-integer", "negative", "float",
        "empty", "over-2^63", "if-none-match-tag", "both-headers"])
def test_it_refuses_every_bad_precondition_form_with_400(w, acme, headers):
    body = new_checkpoint(w, "acme")
    before = snapshot()
    r = put_cp(w, "acme", dict(body, revision=1), headers=headers)
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_payload"
    assert r.json()["detail"].startswith(("If-Match", "If-None-Match"))
    assert snapshot() == before


@pytest.mark.parametrize("revision,create,match", [(1, True, None), (2, False, 0),
                                                   (0, False, 0)])
def test_it_refuses_a_body_revision_other_than_n_plus_1_with_400(w, acme, revision, create,
                                                                  match):
    body = new_checkpoint(w, "acme")
    if create:
        body = envelope(revision=revision)
    before = snapshot()
    r = put_cp(w, "acme", dict(body, revision=revision), create=create, match=match)
    assert r.status_code == 400
    assert r.json()["detail"].startswith("revision")
    assert snapshot() == before


@pytest.mark.parametrize("field,value", [
    ("run_id", str(uuid.uuid4())), ("kind", "acme.other"), ("id", str(uuid.uuid4())),
])
def test_it_refuses_a_change_of_id_run_id_or_kind_with_400(w, acme, field, value):
    body = new_checkpoint(w, "acme")
    before = snapshot()
    r = put_cp(w, "acme", dict(body, revision=1, **{field: value}), match=0,
               headers={"url_id": body["id"]})
    assert r.status_code == 400
    assert r.json()["detail"].startswith(field)
    assert snapshot() == before


def test_it_fences_writes_while_the_run_is_leased(w, acme):
    body = new_checkpoint(w, "acme")
    lease = post(w, "acme", f"runs/{body['run_id']}/lease", {"owner": "worker-1", "ttl_s": 60})
    assert lease.status_code == 200
    token = lease.json()["fencing_token"]
    before = snapshot()
    for sent in (None, token - 1, token + 5):
        r = put_cp(w, "acme", dict(body, revision=1), match=0, token=sent)
        assert r.status_code == 409
        assert r.json() == {"error": "fenced", "fencing_token": token}
    after = snapshot()
    # The checkpoint is untouched; each refused write is kept as a "fenced" conflict.
    assert after["checkpoints"] == before["checkpoints"]
    assert list(Conflict.objects.values_list("reason", flat=True)) == ["fenced"] * 3
    assert after["runs"][0][1] == "conflicted"
    r = put_cp(w, "acme", dict(body, revision=1), match=0, token=token)
    assert r.status_code == 200


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", str(2**63), ""])
def test_it_refuses_a_non_integer_fencing_token_with_400(w, acme, value):
    body = new_checkpoint(w, "acme")
    before = snapshot()
    r = put_cp(w, "acme", dict(body, revision=1), match=0,
               headers={"HTTP_FENCING_TOKEN": value})
    assert r.status_code == 400
    assert r.json()["detail"].startswith("Fencing-Token")
    assert snapshot() == before


def test_it_refuses_a_malformed_url_id_on_put_naming_id(w, acme):
    before = snapshot()
    r = put_cp(w, "acme", envelope(), create=True, headers={"url_id": "nope"})
    assert r.status_code == 400 and r.json()["detail"].startswith("id")
    assert snapshot() == before


def test_it_round_trips_big_integers_and_escaped_nul_byte_for_byte(w, acme):
    cid, rid = str(uuid.uuid4()), str(uuid.uuid4())
    raw = ('{"id": "' + cid + '", "run_id": "' + rid + '", "revision": 0, '
           '"kind": "acme.order", "schema_version": 1, "updated_at_ms": 1764460800000, '
           '"payload": {"phase": "ready", "big": 9007199254740993, '
           '"huge": 18446744073709551617, "esc": "\\\\u0000", "neg": -9007199254740993}}')
    r = put_cp(w, "acme", raw, create=True, headers={"url_id": cid})
    assert r.status_code == 201, r.content
    r = get(w, "acme", f"checkpoints/{cid}")
    assert r.status_code == 200
    assert b"9007199254740993" in r.content and b"18446744073709551617" in r.content
    assert b'"\\\\u0000"' in r.content
    payload = json.loads(r.content)["payload"]
    assert payload["big"] == 2**53 + 1 and payload["huge"] == 2**64 + 1
    assert payload["neg"] == -(2**53 + 1)
    assert payload["esc"] == "\\u0000" and len(payload["esc"]) == 6


def test_it_audits_a_writer_read_as_payload_read_and_a_reviewer_read_as_reveal(
        w, api_as, rita, acme):
    body = new_checkpoint(w, "acme")
    assert get(w, "acme", f"checkpoints/{body['id']}").status_code == 200
    assert get(api_as(rita), "acme", f"checkpoints/{body['id']}").status_code == 200
    actions = list(AuditEvent.objects.filter(target_ref=body["id"], action__startswith="payload.")
                   .order_by("seq").values_list("actor_name", "action"))
    assert actions == [("wendy", "payload.read"), ("rita", "payload.reveal")]


def test_it_exports_every_revision_oldest_first(w, acme):
    body = new_checkpoint(w, "acme")
    put_cp(w, "acme", dict(body, revision=1, payload={"phase": "charging"}), match=0)
    r = get(w, "acme", f"checkpoints/{body['id']}/revisions")
    assert r.status_code == 200
    results = r.json()["results"]
    assert [x["revision"] for x in results] == [0, 1]
    assert results[1]["payload"] == {"phase": "charging"}
    assert set(results[0]) == {"id", "run_id", "revision", "kind", "schema_version", "payload",
                               "updated_at_ms"}
    assert AuditEvent.objects.filter(action="payload.export", target_ref=body["id"]).count() == 1


def test_it_stores_an_unknown_kind_and_marks_the_run_schema_mismatch(w, acme):
    body = new_checkpoint(w, "acme", kind="zeta.thing", payload={"anything": 1})
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "schema_mismatch"
