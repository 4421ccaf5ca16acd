"""Every bad input of CONTRACT.md section 6: 400 naming the field (or 413), nothing stored,
no conflict, no audit event, and the same client's next request works."""

from __future__ import annotations

import json
import uuid

import pytest

from checkpoints.models import AuditEvent, Checkpoint, Conflict, Effect, RetryRequest, Run
from tests.api.apihelpers import new_checkpoint, post, put_cp, put_fx
from tests.helpers import effect_body

CID = "0190f5c2-7c1e-7d3a-9a51-1f2e3d4c5b6a"
RID = "0190f5c2-7b00-7e11-8c22-334455667788"
MIB = 1024 * 1024


def body_text(payload: str = '{"phase": "ready"}', **override) -> str:
    """A checkpoint body as raw JSON text, fields replaced by raw JSON fragments."""
    fields = {"id": f'"{CID}"', "run_id": f'"{RID}"', "revision": "0", "kind": '"acme.order"',
              "schema_version": "1", "payload": payload, "updated_at_ms": "1764460800000"}
    fields.update(override)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


def nested(depth: int) -> str:
    """A payload whose innermost value sits ``depth`` levels deep inside the body object
    (the body itself is level 1)."""
    return '{"phase": "ready", "n": ' + "[" * (depth - 2) + "]" * (depth - 2) + "}"


CASES = {
    "malformed-json": ('{"id": "' + CID + '", ', "body"),
    "trailing-garbage": (body_text() + " x", "body"),
    "empty-body": ("", "body"),
    "not-utf8": (b'{"id": "\xff\xfe"}', "body"),
    "array-body": ("[1, 2, 3]", "body"),
    "string-body": ('"hello"', "body"),
    "null-body": ("null", "body"),
    "duplicated-key": (body_text().replace('"revision": 0', '"revision": 0, "revision": 0'),
                       "body"),
    "duplicated-key-in-payload": (body_text(payload='{"phase": "ready", "phase": "ready"}'),
                                  "body"),
    "id-differs-from-url": (body_text(id=f'"{uuid.uuid4()}"'), "id"),
    "id-not-uuid": (body_text(id='"nope"'), "id"),
    "run-id-not-uuid": (body_text(run_id="12"), "run_id"),
    "revision-bool": (body_text(revision="true"), "revision"),
    "revision-float": (body_text(revision="0.0"), "revision"),
    "revision-string": (body_text(revision='"0"'), "revision"),
    "revision-negative": (body_text(revision="-1"), "revision"),
    "revision-2^63": (body_text(revision=str(2**63)), "revision"),
    "revision-null": (body_text(revision="null"), "revision"),
    "kind-uppercase": (body_text(kind='"Acme.Order"'), "kind"),
    "kind-no-namespace": (body_text(kind='"acme"'), "kind"),
    "kind-not-string": (body_text(kind="7"), "kind"),
    "kind-trailing-newline": (body_text(kind='"acme.order\\n"'), "kind"),
    "schema-version-float": (body_text(schema_version="1.5"), "schema_version"),
    "unknown-field": (body_text(extra="1"), "extra"),
    "nul-in-value": (body_text(payload='{"phase": "ready", "note": "a\\u0000b"}'), "body.payload.note"),
    "nul-in-key": (body_text(payload='{"phase": "ready", "a\\u0000": 1}'), "body.payload"),
    "nul-in-kind": (body_text(kind='"acme.order\\u0000"'), "body.kind"),
    "nan": (body_text(payload='{"phase": "ready", "x": NaN}'), "body.payload.x"),
    "infinity": (body_text(payload='{"phase": "ready", "x": Infinity}'), "body"),
    "minus-infinity": (body_text(payload='{"phase": "ready", "x": -Infinity}'), "body"),
    "overflow-1e400": (body_text(payload='{"phase": "ready", "x": 1e400}'), "body.payload.x"),
    "overflow-minus-1e400": (body_text(payload='{"phase": "ready", "x": -1e400}'), "body"),
    "nesting-65": (body_text(payload=nested(65)), "body"),
    "nesting-100000": (body_text(payload=nested(100000)), "body"),
}


def _counts() -> dict:
    return {"checkpoints": Checkpoint.objects.count(), "runs": Run.objects.count(),
            "conflicts": Conflict.objects.count(), "effects": Effect.objects.count(),
            "audit": AuditEvent.objects.count(), "retries": RetryRequest.objects.count()}


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


@pytest.mark.parametrize("name", list(CASES))
def test_it_refuses_bad_input_naming_the_field_and_stores_nothing(w, acme, name):
    raw, field = CASES[name]
    before = _counts()
    r = put_cp(w, "acme", raw, create=True, headers={"url_id": CID})
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_payload"
    assert r.json()["detail"].startswith(field)
    assert _counts() == before
    # The same client (connection) serves the next request.
    assert put_cp(w, "acme", body_text(), create=True, headers={"url_id": CID}).status_code == 201


def test_it_accepts_nesting_of_exactly_the_limit(w, acme):
    r = put_cp(w, "acme", body_text(payload=nested(64)), create=True, headers={"url_id": CID})
    assert r.status_code == 201, r.content


@pytest.mark.parametrize("name", ["duplicated-key", "nan", "nul-in-value", "revision-bool",
                                  "id-differs-from-url"])
def test_it_refuses_bad_input_on_an_update_without_writing_a_conflict(w, acme, name):
    put_cp(w, "acme", body_text(), create=True, headers={"url_id": CID})
    raw, field = CASES[name]
    raw = raw.replace('"revision": 0', '"revision": 1') if isinstance(raw, str) else raw
    before = _counts()
    r = put_cp(w, "acme", raw, match=0, headers={"url_id": CID})
    assert r.status_code == 400 and r.json()["detail"].startswith(field)
    assert _counts() == before


def test_it_answers_413_for_a_body_over_the_limit_and_stores_nothing(w, acme):
    big = body_text(payload='{"phase": "ready", "pad": "' + "x" * MIB + '"}')
    before = _counts()
    r = put_cp(w, "acme", big, create=True, headers={"url_id": CID})
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large"
    assert _counts() == before
    assert put_cp(w, "acme", body_text(), create=True, headers={"url_id": CID}).status_code == 201


def test_it_accepts_a_body_just_under_the_limit(w, acme):
    small = body_text(payload='{"phase": "ready", "pad": ""}')
    pad = MIB - len(small.encode())
    body = body_text(payload='{"phase": "ready", "pad": "' + "x" * pad + '"}')
    assert len(body.encode()) == MIB
    assert put_cp(w, "acme", body, create=True, headers={"url_id": CID}).status_code == 201


def test_it_turns_djangos_request_data_too_big_into_413(w, acme, settings):
    settings.RECOVERY_MAX_BODY_BYTES = 8192
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = body_text(payload='{"phase": "ready", "pad": "' + "x" * 2000 + '"}')
    r = put_cp(w, "acme", body, create=True, headers={"url_id": CID})
    assert r.status_code == 413
    assert not Checkpoint.objects.exists()


def test_it_answers_413_on_review_actions_and_lease_too(w, api_as, rita, acme):
    rid = new_checkpoint(w, "acme")["run_id"]
    big = json.dumps({"reason": "x" * MIB})
    assert post(api_as(rita), "acme", f"runs/{rid}/retry-requests", raw=big).status_code == 413
    assert post(w, "acme", f"runs/{rid}/lease", raw=big).status_code == 413
    assert not RetryRequest.objects.exists()


@pytest.mark.parametrize("raw,field", [
    ('{"reason": "x", "reason": "y"}', "body"),
    ('{"reason": "a\\u0000"}', "body"),
    ("[]", "body"),
    ('{"reason": NaN}', "body"),
])
def test_it_parses_review_bodies_strictly(w, api_as, rita, acme, raw, field):
    rid = new_checkpoint(w, "acme")["run_id"]
    before = _counts()
    r = post(api_as(rita), "acme", f"runs/{rid}/retry-requests", raw=raw)
    assert r.status_code == 400 and r.json()["detail"].startswith(field)
    assert _counts() == before


@pytest.mark.parametrize("reason", ["a\x1b[2Jb", "line\x07bell", "del\x7f", "a\x9b2Jb",
                                    "a\x85b", "evil\u202egnp.exe", "mark\u200fx"])
def test_a_review_reason_must_be_printable_as_a_lifecycle_reason_must(w, api_as, rita, acme,
                                                                       reason):
    """(stop 32, the attack's finding) One rule for the reasons people write: the
    review actions took control characters (an ESC sequence shown to the next reviewer)
    that lifecycle requests refused. Both refuse them now, naming ``reason``; tab and
    newline stay allowed."""
    rid = new_checkpoint(w, "acme")["run_id"]
    before = _counts()
    r = post(api_as(rita), "acme", f"runs/{rid}/close", {"reason": reason})
    assert r.status_code == 400 and r.json()["detail"] == (
        "reason: must be printable (no control characters)")
    assert _counts() == before
    assert post(api_as(rita), "acme", f"runs/{rid}/close",
                {"reason": "tab\there\nnext line"}).status_code == 200


@pytest.mark.parametrize("field,value", [("effect_class", '"sometimes"'),
                                         ("request_fingerprint", '"abc"'),
                                         ("state", '"done"'), ("receipt", "[1]"),
                                         ("revision", "1.0"), ("operation_key", '""')])
def test_it_refuses_bad_effect_fields_naming_them(w, acme, field, value):
    body = effect_body()
    raw = json.dumps(body)
    raw = raw.replace(f'"{field}": {json.dumps(body[field])}', f'"{field}": {value}')
    before = _counts()
    r = put_fx(w, "acme", raw, create=True, headers={"url_id": body["id"]})
    assert r.status_code == 400 and r.json()["detail"].startswith(field), r.content
    assert _counts() == before


@pytest.mark.parametrize("fingerprint", ["a" * 64 + "\n", "a" * 63, "g" * 64, "a" * 65])
def test_it_refuses_a_fingerprint_that_is_not_exactly_64_hex_digits(w, fingerprint):
    before = _counts()
    r = put_fx(w, "acme", effect_body(fingerprint=fingerprint), create=True)
    assert r.status_code == 400
    assert r.json()["detail"].startswith("request_fingerprint")
    assert _counts() == before


def test_it_answers_415_for_a_body_that_is_not_json(w):
    before = _counts()
    r = w.put(f"/api/v1/tenants/acme/checkpoints/{CID}", data=body_text(),
              content_type="text/plain", HTTP_IF_NONE_MATCH="*")
    assert r.status_code == 415
    assert r.json()["error"] == "unsupported_media_type"
    assert _counts() == before
    r = w.put(f"/api/v1/tenants/acme/checkpoints/{CID}", data=body_text(),
              content_type="application/json; charset=utf-8", HTTP_IF_NONE_MATCH="*")
    assert r.status_code == 201
