"""No secrets in checkpoints by default (issue 20, item 7; docs/security/secrets.md):
every checkpoint payload, effect receipt and request is screened on write; under the
tenant's ``warn`` policy the write is stored with the field paths flagged, under
``refuse`` it is answered 422 ``secret_detected`` and nothing is stored. The value never
appears in a response, a row's label, an audit event or a log line."""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import logging
import uuid
from pathlib import Path

import pytest
from django.core import serializers as django_serializers
from django.test import Client

from checkpoints import secrets_scan
from checkpoints.jsonparse import dumps
from checkpoints.management.loaddata import agent_payload, order_payload, workflow_payload
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    DataPolicy,
    Effect,
    EffectRevision,
    Run,
)
from tests.api.apihelpers import put_cp, put_fx
from tests.helpers import effect_body, envelope

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


# Each kind of credential: (the secret value, how it sits in a payload, the path, the
# type). Built at run time so the repository holds no credential-shaped literal.
_JWT = (_b64({"alg": "HS256", "typ": "JWT"}) + "." + _b64({"sub": "user-42"})
        + ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
_OPAQUE = "b3" + "Zx9KqL2mN8pR4tV6wY1z"
KINDS = {
    "aws": ("AKIA" + "IOSFODNN7" + "Q2ZK4XW", lambda v: {"env": {"AWS_KEY_ID": v}},
            "/env/AWS_KEY_ID", "aws_access_key"),
    "github": ("gh" + "p_" + "R8c2" * 9, lambda v: {"tool": {"output": f"cloned with {v}"}},
               "/tool/output", "github_token"),
    "slack": ("xo" + "xb-" + "123456789012-" + "abcdefghij", lambda v: {"notes": [v]},
              "/notes/0", "slack_token"),
    "stripe": ("sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc", lambda v: {"cfg": v},
               "/cfg", "stripe_key"),
    "openai": ("sk-" + "proj-" + "A" * 20 + "T3Blbk" + "FJ" + "B" * 20,
               lambda v: {"llm": {"key_in_text": f"using {v} now"}}, "/llm/key_in_text",
               "openai_key"),
    "bearer": ("Bearer " + _OPAQUE, lambda v: {"headers": {"authorization": v}},
               "/headers/authorization", "bearer_token"),
    "jwt": (_JWT, lambda v: {"session": {"id_blob": v}}, "/session/id_blob", "jwt"),
    "private_key": ("-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END "
                    "RSA PRIVATE KEY-----", lambda v: {"files": {"deploy": v}},
                    "/files/deploy", "private_key"),
    "url_password": ("postgres://app:" + "hunter22xy" + "@db.internal:5432/app",
                     lambda v: {"dsn": v}, "/dsn", "url_password"),
    "keyword": ('config {"db_' + 'password": "' + "s3cr3t-Vq8" + '"}',
                lambda v: {"log": v}, "/log", "keyword_secret"),
    "named_field": ("Zq7" + "wx-42", lambda v: {"user": {"password": v}}, "/user/password",
                    "credential_field"),
}
#: The part of each value that must appear nowhere (the whole value, less the prose).
SECRET_PART = {"aws": "IOSFODNN7Q2ZK4XW", "github": "R8c2R8c2R8c2",
               "slack": "123456789012-abcdefghij", "stripe": "4eC39HqLyjWDarjtT1zdp7dc",
               "openai": "T3BlbkFJ", "bearer": _OPAQUE, "jwt": _JWT.split(".")[2],
               "private_key": "MIIEowIBAAKCAQEA7", "url_password": "hunter22xy",
               "keyword": "s3cr3t-Vq8", "named_field": "Zq7wx-42"}


def _policy(tenant, **fields):
    DataPolicy.objects.update_or_create(tenant=tenant, defaults=fields)


def _audit_dump(tenant) -> str:
    return django_serializers.serialize("json", AuditEvent.objects.for_tenant(tenant))


def _assert_nowhere(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


# --------------------------------------------------------------------------------------
# The scanner
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_scanner_names_the_path_and_type_of_each_kind(kind):
    value, place, path, type_ = KINDS[kind]
    found = secrets_scan.scan(place(value))
    assert [f.as_json() for f in found] == [{"path": path, "type": type_}]
    assert SECRET_PART[kind] not in repr(found) + found[0].sentence


def test_json_pointers_escape_slash_and_tilde():
    found = secrets_scan.scan({"a/b~c": [{"refresh_token": "rt-" + "x" * 12}]})
    assert [f.path for f in found] == ["/a~1b~0c/0/refresh_token"]


@pytest.mark.parametrize("value", ["${DB_PASSWORD}", "<your password>", "{password}", "***",
                                   "", "$SECRET"])
def test_a_placeholder_under_a_credential_name_is_not_a_finding(value):
    assert secrets_scan.scan({"password": value, "api_key": value}) == []


def test_no_false_positive_on_the_kind_fixtures_and_the_demo_payloads():
    docs = []
    for name in glob.glob(str(FIXTURES / "**" / "*.json*"), recursive=True):
        text = Path(name).read_text()
        if name.endswith(".jsonl"):
            docs += [json.loads(line) for line in text.splitlines()
                     if line.strip() and "bad" not in name]
        else:
            docs.append(json.loads(text))
    for seed in range(60):
        docs += [agent_payload(1 + seed % 5, "turn_in_flight" if seed % 2 else "ready_for_turn",
                               seed=seed),
                 workflow_payload(seed % 4, "ready", seed=seed),
                 order_payload("charged", seed=seed)]
    assert len(docs) > 250
    assert [d for d in docs if secrets_scan.scan(d)] == []


#: Strings a document of the property test below is built from: every kind's value and
#: the prose around it, placeholders, credential and plain key names, near misses.
_PIECES = sorted({v for v, *_ in KINDS.values()} | {
    "${DB_PASSWORD}", "<your password>", "***", "", " ", "hello world", "password",
    "api_key", "X-Api-Key", "authorization", "order_id", "A-1042", "Bearer", "sk_live_",
    "ghp_", "AKIA", "-----BEGIN", "postgres://app@db/app", "a" * 7, "b" * 8,
    '{"db_password": "x"}', "\n", "é€𝄞"})


def _documents():
    from hypothesis import strategies as st

    text = st.one_of(st.sampled_from(_PIECES),
                     st.lists(st.sampled_from(_PIECES), min_size=2, max_size=3).map(" ".join),
                     st.text(max_size=12))
    scalars = st.one_of(text, st.integers(), st.booleans(), st.none())
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=12)


def test_the_clear_shortcut_answers_what_the_whole_walk_answers():
    """``scan`` answers at once for a document ``_clear`` vouches for (issue 22: a
    quarter of a write's Python time went to building paths no finding needed); on every
    document, generated from credential-like and plain pieces, the answer is the whole
    walk's (``scan_all``). Also on each kind's own payload, which must not be cleared."""
    from hypothesis import given, settings

    @settings(max_examples=400, deadline=None)
    @given(_documents())
    def same(document):
        assert secrets_scan.scan(document) == secrets_scan.scan_all(document)

    same()
    # Short keys and values no prefilter sees: only the credential-name rule finds them
    # (fixed, so a shortcut that skipped that rule fails here every run, not by chance).
    for document in ({"secret": "hunter2"}, {"pwd": [{"token": "abc"}]},
                     {"a": {"api_key": "k-123"}}, {"secret": "${X}"}):
        assert secrets_scan.scan(document) == secrets_scan.scan_all(document)
    assert secrets_scan.scan({"secret": "hunter2"}) != []
    for value, place, _path, _type in KINDS.values():
        assert not secrets_scan._clear(place(value))
        assert secrets_scan.scan(place(value)) == secrets_scan.scan_all(place(value)) != []


def test_long_strings_are_scanned_on_their_first_scan_chars_only():
    key = KINDS["aws"][0]
    assert secrets_scan.scan({"t": "x " * 10 + key})
    assert secrets_scan.scan({"t": "x" * secrets_scan.SCAN_CHARS + key}) == []


# --------------------------------------------------------------------------------------
# Checkpoint writes
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_warn_stores_the_checkpoint_and_flags_the_path_never_the_value(
        kind, acme, wendy, api_as, caplog):
    value, place, path, type_ = KINDS[kind]
    secret = SECRET_PART[kind]
    caplog.set_level(logging.DEBUG)
    w = api_as(wendy)
    body = envelope(payload={"phase": "ready", "order_id": "A-1", **place(value)})
    created = put_cp(w, "acme", body, create=True)
    assert created.status_code == 201, created.content
    cp = Checkpoint.objects.for_tenant(acme).get(uuid=body["id"])
    assert cp.secret_paths == [{"path": path, "type": type_}]
    # An update (PostgreSQL's SQL dialect) flags it the same, on its history row too.
    updated = put_cp(w, "acme", {**body, "revision": 1}, match=0)
    assert updated.status_code == 200, updated.content
    cp.refresh_from_db()
    assert cp.revision == 1 and cp.secret_paths == [{"path": path, "type": type_}]
    assert (CheckpointRevision.objects.for_tenant(acme).filter(checkpoint=cp, revision=1)
            .get().secret_paths == cp.secret_paths)
    events = AuditEvent.objects.for_tenant(acme).filter(action="checkpoint.write")
    assert [e.after["flagged_paths"] for e in events] == [[{"path": path, "type": type_}]] * 2
    _assert_nowhere(secret, created.content.decode(), updated.content.decode(),
                    _audit_dump(acme), caplog.text, cp.phase_label, json.dumps(cp.secret_paths))


@pytest.mark.django_db
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_refuse_answers_422_naming_the_path_and_stores_nothing(
        kind, acme, wendy, api_as, caplog):
    value, place, path, type_ = KINDS[kind]
    caplog.set_level(logging.DEBUG)
    _policy(acme, secrets_policy="refuse")
    before = (AuditEvent.objects.count(), Run.objects.count(), Conflict.objects.count())
    body = envelope(payload={"phase": "ready", **place(value)})
    refused = put_cp(api_as(wendy), "acme", body, create=True)
    assert refused.status_code == 422, refused.content
    answer = refused.json()
    assert answer["error"] == "secret_detected"
    assert answer["paths"] == [{"path": path, "type": type_}]
    assert path in answer["detail"]
    assert (AuditEvent.objects.count(), Run.objects.count(), Conflict.objects.count()) == before
    assert not Checkpoint.objects.filter(uuid=body["id"]).exists()
    _assert_nowhere(SECRET_PART[kind], refused.content.decode(), _audit_dump(acme),
                    caplog.text)


@pytest.mark.django_db
def test_refuse_of_an_update_keeps_the_stored_revision(acme, wendy, api_as):
    w = api_as(wendy)
    body = envelope()
    assert put_cp(w, "acme", body, create=True).status_code == 201
    _policy(acme, secrets_policy="refuse")
    value, place, *_ = KINDS["bearer"]
    refused = put_cp(w, "acme", {**body, "revision": 1, "payload": place(value)}, match=0)
    assert refused.status_code == 422
    cp = Checkpoint.objects.for_tenant(acme).get(uuid=body["id"])
    assert cp.revision == 0 and cp.secret_paths == []
    assert not Conflict.objects.for_tenant(acme).exists()


@pytest.mark.django_db
def test_a_large_payload_is_flagged_never_refused(acme, wendy, api_as):
    _policy(acme, secrets_policy="refuse", payload_flag_bytes=200)
    body = envelope(payload={"phase": "ready", "note": "n" * 300})
    answer = put_cp(api_as(wendy), "acme", body, create=True)
    assert answer.status_code == 201, answer.content
    cp = Checkpoint.objects.for_tenant(acme).get(uuid=body["id"])
    assert cp.large_above == 200 and cp.payload_size > 300
    small = envelope()
    put_cp(api_as(wendy), "acme", small, create=True)
    assert Checkpoint.objects.for_tenant(acme).get(uuid=small["id"]).large_above is None


# --------------------------------------------------------------------------------------
# Effect receipts and requests
# --------------------------------------------------------------------------------------

def _walk_to_submitted(client, fx):
    assert put_fx(client, "acme", fx, create=True).status_code == 201
    moved = put_fx(client, "acme", {**fx, "revision": 1, "state": "submitted"}, match=0)
    assert moved.status_code == 200, moved.content


@pytest.mark.django_db
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_receipt_is_flagged_under_warn(kind, acme, wendy, api_as, caplog):
    value, place, path, type_ = KINDS[kind]
    caplog.set_level(logging.DEBUG)
    w = api_as(wendy)
    fx = effect_body(operation_key=f"charge:{uuid.uuid4()}")
    _walk_to_submitted(w, fx)
    confirmed = put_fx(w, "acme", {**fx, "revision": 2, "state": "confirmed",
                                   "receipt": place(value)}, match=1)
    assert confirmed.status_code == 200, confirmed.content
    effect = Effect.objects.for_tenant(acme).get(uuid=fx["id"])
    assert effect.secret_paths == [{"path": "/receipt" + path, "type": type_}]
    event = AuditEvent.objects.for_tenant(acme).filter(action="effect.write").latest("seq")
    assert event.after["flagged_paths"] == effect.secret_paths
    # The answer gives the runtime its own receipt back (CONTRACT.md 4, receipts in
    # answers for writers): stored under warn, it is not a label, an error or a log.
    _assert_nowhere(SECRET_PART[kind], _audit_dump(acme), caplog.text,
                    json.dumps(effect.secret_paths))


@pytest.mark.django_db
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_receipt_is_refused_under_refuse(kind, acme, wendy, api_as):
    value, place, path, type_ = KINDS[kind]
    w = api_as(wendy)
    fx = effect_body(operation_key=f"charge:{uuid.uuid4()}")
    _walk_to_submitted(w, fx)
    _policy(acme, secrets_policy="refuse")
    events = AuditEvent.objects.count()
    refused = put_fx(w, "acme", {**fx, "revision": 2, "state": "confirmed",
                                 "receipt": place(value)}, match=1)
    assert refused.status_code == 422, refused.content
    assert refused.json()["paths"] == [{"path": "/receipt" + path, "type": type_}]
    effect = Effect.objects.for_tenant(acme).get(uuid=fx["id"])
    assert (effect.revision, effect.state, effect.has_receipt) == (1, "submitted", False)
    assert EffectRevision.objects.for_tenant(acme).filter(effect=effect).count() == 2
    assert AuditEvent.objects.count() == events
    _assert_nowhere(SECRET_PART[kind], refused.content.decode(), _audit_dump(acme))


@pytest.mark.django_db
def test_a_request_is_screened_and_its_paths_outlive_the_receipt(acme, wendy, api_as):
    w = api_as(wendy)
    value, place, path, type_ = KINDS["bearer"]
    request = {"method": "POST", **place(value)}
    fp = hashlib.sha256(dumps(request).encode()).hexdigest()
    fx = {**effect_body(operation_key=f"charge:{uuid.uuid4()}", fingerprint=fp),
          "request": request}
    _walk_to_submitted(w, fx)
    put_fx(w, "acme", {**fx, "revision": 2, "state": "confirmed",
                       "receipt": {"id": "ch_1"}}, match=1)
    effect = Effect.objects.for_tenant(acme).get(uuid=fx["id"])
    assert effect.secret_paths == [{"path": "/request" + path, "type": type_}]
    _policy(acme, secrets_policy="refuse")
    other = {**fx, "id": str(uuid.uuid4()), "operation_key": f"charge:{uuid.uuid4()}"}
    refused = put_fx(w, "acme", other, create=True)
    assert refused.status_code == 422
    assert not Effect.objects.filter(uuid=other["id"]).exists()
    assert not Run.objects.filter(uuid=other["run_id"]).exists() or \
        other["run_id"] == fx["run_id"]


# --------------------------------------------------------------------------------------
# The run page and the report
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_run_page_and_the_report_show_the_flags_never_the_values(
        acme, wendy, rita, api_as):
    _policy(acme, payload_flag_bytes=200)
    w = api_as(wendy)
    value, place, *_ = KINDS["bearer"]
    body = envelope(payload={"phase": "ready", "pad": "p" * 250, **place(value)})
    put_cp(w, "acme", body, create=True)
    fx = effect_body(run_id=body["run_id"], operation_key=f"charge:{uuid.uuid4()}")
    _walk_to_submitted(w, fx)
    put_fx(w, "acme", {**fx, "revision": 2, "state": "confirmed",
                       "receipt": {"dsn": KINDS["url_password"][0]}}, match=1)
    put_cp(w, "acme", envelope())  # an unflagged run
    client = Client()
    client.force_login(rita)
    page = client.get(f"/t/acme/runs/{body['run_id']}/").content.decode()
    assert "credential-like value at /headers/authorization (bearer token)" in page
    assert "credential-like value at /receipt/dsn (password in a URL)" in page
    size = Checkpoint.objects.for_tenant(acme).get(uuid=body["id"]).payload_size
    assert f"large payload: {size} bytes, above the tenant&#x27;s 200" in page
    _assert_nowhere(_OPAQUE, page)
    _assert_nowhere("hunter22xy", page)
    report = client.get("/t/acme/report/").content.decode()
    assert ("1 run with credential-like values: 1 checkpoint, 1 effect; "
            "1 large payload.") in report


GITHUB_KEY = KINDS["github"][0]
URL_KEY = "postgres://app:" + "Sup3rS3cretPw" + "@db.internal/x"


@pytest.mark.parametrize("payload, paths", [
    ({"phase": "ready", GITHUB_KEY: 1}, ["/(credential-like key)"]),
    ({"tokens": {GITHUB_KEY: "ok"}}, ["/tokens/(credential-like key)"]),
    ({URL_KEY: {"api_key": "zzzzzzzzzzzzzzzzzzzz"}},
     ["/(credential-like key)", "/(credential-like key)/api_key"]),
])
def test_a_credential_used_as_a_key_is_found_and_never_shown_in_a_path(payload, paths):
    """Object keys are scanned like values, and a path never shows a credential-like key
    (the attack helper's finding: a key was stored in the audit event's paths)."""
    found = secrets_scan.scan(payload)
    assert [f.path for f in found] == paths
    shown = str([f.as_json() for f in found])
    assert GITHUB_KEY not in shown and "Sup3rS3cretPw" not in shown


def test_a_long_key_is_cut_in_a_path():
    key = "k" * 200
    [finding] = secrets_scan.scan({key: {"password": "hunter2hunter2"}})
    assert finding.path == "/" + "k" * 64 + "\u2026/password"


def test_a_runifold_import_is_screened_as_an_api_write(acme, tmp_path):
    """Outside data passes the same checks as API bodies: a credential in an imported
    checkpoint or effect record is flagged by path under warn, and the line refused
    (an error naming the path, nothing of it stored) under refuse."""
    import io

    from checkpoints.interop import runifold
    from checkpoints.interop.runifold import jsonl_lines

    secret = KINDS["github"][0]
    agent, effect = (FIXTURES / "runifold" / name for name in ("agent.v1.jsonl",
                                                                "effects.jsonl"))
    first = json.loads(agent.read_text().splitlines()[0])
    first["payload"]["transcript"][1]["content"][0]["text"] = f"token {secret}"
    record = json.loads(effect.read_text().splitlines()[0])
    record["request"]["input"]["note"] = f"use {secret}"
    record["run_id"] = first["run_id"]

    def run_import():
        errors = []
        data = (json.dumps(first) + "\n" + json.dumps(record) + "\n").encode()
        runifold.runifold_import(actor=None, tenant=acme, lines=jsonl_lines(io.BytesIO(data)),
                                 on_error=lambda n, d: errors.append((n, d)))
        return errors

    assert run_import() == []
    cp = Checkpoint.objects.for_tenant(acme).get()
    assert cp.secret_paths == [{"path": "/transcript/1/content/0/text",
                                "type": "github_token"}]
    assert Effect.objects.for_tenant(acme).get().secret_paths == [
        {"path": "/request/input/note", "type": "github_token"}]
    DataPolicy.objects.update_or_create(tenant=acme, defaults={"secrets_policy": "refuse"})
    first["id"], record["request"]["effect_id"] = str(uuid.uuid4()), str(uuid.uuid4())
    first["run_id"] = record["run_id"] = str(uuid.uuid4())
    record["request"]["idempotency_key"] = "k-refused"
    errors = run_import()
    assert [n for n, _ in errors] == [1, 2]
    assert all("github" in d or "credential" in d for _, d in errors)
    assert all(secret not in d for _, d in errors)
    assert not Checkpoint.objects.for_tenant(acme).filter(uuid=first["id"]).exists()
