"""Declarative kinds (issue 19, item 1; docs/kinds.md "Declaring a kind without Python"):
``PUT``/``GET …/kinds/{kind}/versions/{v}``, ``manage.py register_kind``, the tenant's
checkpoints classified by its own declarations and no other tenant's, declared migrations
(their inverse derived), and hostile schemas refused before anything is stored."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import time
import uuid
from urllib.parse import quote

import pytest
from django.core.management import CommandError, call_command

from checkpoints import kinds, services
from checkpoints.kinds import declarative
from checkpoints.models import AuditEvent, DeclaredKindVersion, Run
from checkpoints.vocab import AuditAction, MigrationOutcome, PhaseClass, RecoveryState
from tests.api.apihelpers import get, new_checkpoint, put_cp, snapshot, url
from tests.helpers import age_world, envelope

KIND = "acme.refund_flow"

V1 = {
    "description": "refunds, declared",
    "schema": {
        "type": "object", "required": ["state", "refund_id"],
        "properties": {
            "state": {"enum": ["ready", "refunding", "refunded"]},
            "refund_id": {"type": "string", "pattern": "^rf_[a-z0-9]+$"},
            "attempt": {"type": "integer", "minimum": 0},
            "agent": {"type": "string"},
            "usage": {"type": "object", "properties": {"tokens": {"type": "integer"}}},
        },
    },
    "phase": {"pointer": "/state", "stable": ["ready"], "in_flight": ["refunding"],
              "completed": ["refunded"], "label": "refund {phase}, attempt {/attempt}"},
    "identity": {"agent": "/agent"},
    "usage": {"tokens": "/usage/tokens"},
}

#: v2 renames ``refund_id`` to ``refund`` and adds ``currency``: reversible.
V2 = copy.deepcopy(V1) | {"migration": {"ops": [
    {"op": "rename", "from": "/refund_id", "to": "/refund"},
    {"op": "add", "path": "/currency", "value": "EUR"}]}}
V2["schema"]["required"] = ["state", "refund", "currency"]
V2["schema"]["properties"]["refund"] = V2["schema"]["properties"].pop("refund_id")
V2["schema"]["properties"]["currency"] = {"enum": ["EUR", "USD"]}
V2["schema"]["additionalProperties"] = False
V1["schema"]["additionalProperties"] = False


def declare(client, version, body, tenant="acme", kind=KIND):
    return client.put(url(tenant, f"kinds/{kind}/versions/{version}"), data=json.dumps(body),
                      content_type="application/json")


@pytest.fixture
def v1(api_as, adam):
    r = declare(api_as(adam), 1, V1)
    assert r.status_code == 201, r.content
    return r.json()


def test_an_admin_declares_a_version_and_every_role_reads_it(api_as, adam, vic, v1):
    assert (v1["kind"], v1["version"], v1["outcome"], v1["declared_by"]) == (KIND, 1, "created",
                                                                            "adam")
    assert v1["declaration"] == V1 and len(v1["digest"]) == 64
    r = get(api_as(vic), "acme", f"kinds/{KIND}/versions/1")
    assert r.status_code == 200 and r.json()["outcome"] == "read"
    assert r.json()["digest"] == v1["digest"]
    event = AuditEvent.objects.filter(action=AuditAction.KIND_DECLARE).get()
    assert (event.target_ref, event.actor_name) == (f"{KIND} v1", "adam")


@pytest.mark.parametrize("who", ["vic", "rita", "april", "wendy"])
def test_only_the_admin_declares(api_as, request, who, acme):
    client = api_as(request.getfixturevalue(who))
    before = snapshot()
    r = declare(client, 1, V1)
    assert r.status_code == 403, r.content
    assert snapshot() == before and not DeclaredKindVersion.objects.exists()


def test_the_tenants_checkpoints_are_classified_by_it(api_as, adam, wendy, v1):
    body = new_checkpoint(api_as(wendy), "acme", kind=KIND, payload={
        "state": "refunding", "refund_id": "rf_1", "attempt": 2, "agent": "refunder",
        "usage": {"tokens": 7}})
    run = Run.objects.get(uuid=body["run_id"])
    assert (run.phase_class, run.phase_label, run.agent) == (
        PhaseClass.IN_FLIGHT, "refund refunding, attempt 2", "refunder")
    bad = new_checkpoint(api_as(wendy), "acme", kind=KIND, payload={"state": "ready",
                                                                    "refund_id": "RF-no"})
    run = Run.objects.get(uuid=bad["run_id"])
    assert run.recovery_state == RecoveryState.SCHEMA_MISMATCH
    assert run.phase_label.endswith("at #/properties/refund_id/pattern")
    assert "RF-no" not in run.phase_label


def test_a_usage_counter_it_declares_never_goes_down(api_as, wendy, v1):
    w = api_as(wendy)
    body = new_checkpoint(w, "acme", kind=KIND, payload={
        "state": "ready", "refund_id": "rf_1", "usage": {"tokens": 7}})
    lower = dict(body, revision=1, payload={"state": "ready", "refund_id": "rf_1",
                                            "usage": {"tokens": 6}})
    r = put_cp(w, "acme", lower, match=0)
    assert r.status_code == 422 and r.json()["error"] == "usage_decreased", r.content


def test_another_tenant_never_sees_it(api_as, wes, omar, v1):
    body = new_checkpoint(api_as(wes), "globex", kind=KIND,
                          payload={"state": "refunding", "refund_id": "rf_1"})
    run = Run.objects.get(uuid=body["run_id"])
    assert run.recovery_state == RecoveryState.SCHEMA_MISMATCH
    assert run.phase_label == f"kind '{KIND}' is not registered"
    assert get(api_as(omar), "globex", f"kinds/{KIND}/versions/1").status_code == 404
    kinds = {k["kind"]: k for k in get(api_as(omar), "globex", "kinds").json()["kinds"]}
    assert (kinds[KIND]["registered"], kinds[KIND]["declared"]) == (False, False)


def test_the_kinds_list_says_declared(api_as, vic, v1):
    kinds = {k["kind"]: k for k in get(api_as(vic), "acme", "kinds").json()["kinds"]}
    assert (kinds[KIND]["registered"], kinds[KIND]["declared"], kinds[KIND]["description"],
            kinds[KIND]["supported_versions"]) == (True, True, "refunds, declared", [1])
    assert kinds["acme.order"]["declared"] is False


def test_the_same_declaration_again_changes_nothing(api_as, adam, v1):
    events = AuditEvent.objects.count()
    r = declare(api_as(adam), 1, json.loads(json.dumps(V1)))
    assert (r.status_code, r.json()["outcome"], r.json()["digest"]) == (200, "unchanged",
                                                                       v1["digest"])
    assert AuditEvent.objects.count() == events


def test_an_unused_version_may_change_a_used_one_may_not(api_as, adam, wendy, v1):
    changed = copy.deepcopy(V1)
    changed["phase"]["label"] = "refund {phase}"
    r = declare(api_as(adam), 1, changed)
    assert (r.status_code, r.json()["outcome"]) == (200, "replaced"), r.content
    event = AuditEvent.objects.filter(action=AuditAction.KIND_DECLARE).order_by("-seq").first()
    assert event.before == {"kind": KIND, "version": 1, "digest": v1["digest"]}
    new_checkpoint(api_as(wendy), "acme", kind=KIND,
                   payload={"state": "ready", "refund_id": "rf_1"})
    before = snapshot()
    r = declare(api_as(adam), 1, V1)
    assert (r.status_code, r.json()["error"]) == (409, "kind_version_in_use"), r.content
    assert "declare v2" in r.json()["detail"]
    assert snapshot() == before
    assert DeclaredKindVersion.objects.get().body == changed


def test_a_kind_in_code_cannot_be_declared(api_as, adam):
    r = declare(api_as(adam), 3, V1, kind="acme.order")
    assert r.status_code == 400 and r.json()["detail"].startswith("kind: acme.order is a kind "
                                                                  "in code"), r.content


@pytest.mark.parametrize(("version", "put_status", "get_status"), [
    ("x", 400, 404), ("01", 400, 404), ("4294967296", 400, 404), ("-1", 400, 404)])
def test_a_bad_version_in_the_url(api_as, adam, version, put_status, get_status):
    r = declare(api_as(adam), version, V1)
    assert r.status_code == put_status and r.json()["detail"].startswith("version:")
    assert get(api_as(adam), "acme", f"kinds/{KIND}/versions/{version}").status_code \
        == get_status
    assert not DeclaredKindVersion.objects.exists()


def _chain(n: int) -> dict:
    """``n`` definitions, each ``anyOf`` the next twice: 2^n subschemas on one value."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
            for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


HOSTILE = {
    "remote $ref": ({"$ref": "https://example.com/schema.json"}, "schema/$ref"),
    "a $ref loop": ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
                    "schema/$defs/a"),
    "an allOf loop": ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]},
                                 "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
                       "$ref": "#/$defs/a"}, "schema/$defs/a"),
    "2^20 subschemas": (_chain(20), "schema/$defs/d"),
    # Attack finding: each $ref of a chain is a recursion in the check and in jsonschema;
    # 400 were declared and overflowed Python's stack on every payload, 900 on the PUT.
    "a chain of 400 $refs": ({"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"}
                                        for i in range(400)} | {"d400": {"type": "string"}},
                              "$ref": "#/$defs/d0"}, "schema/$defs/d"),
    "a backreference": ({"type": "string", "pattern": "^(a+)\\1$"}, "schema/pattern"),
    # Attack finding: RE2 takes it, but the schema check's "regex" format runs Python's
    # re.compile over it, which recursed past the stack: a 500.
    "a pattern nested 500 groups deep": ({"properties": {"x": {
        "pattern": "(" * 500 + "a" + ")" * 500}}}, "schema/properties/x/pattern"),
    "patternProperties": ({"patternProperties": {"^(a+)+$": {}}}, "schema/patternProperties"),
    "$id": ({"$id": "https://example.com/x", "type": "object"}, "schema/$id"),
    "$dynamicRef": ({"$dynamicRef": "#x"}, "schema/$dynamicRef"),
    "too deep": (_nested(20), "schema"),
    "not a schema": ({"type": "objekt"}, "schema/type"),
    "another draft": ({"$schema": "http://json-schema.org/draft-04/schema#"},
                      "schema/$schema"),
    "a $ref to nothing": ({"$ref": "#/$defs/missing"}, "schema/$ref"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_schema_is_refused_naming_where(api_as, adam, case):
    schema, field = HOSTILE[case]
    client = api_as(adam)
    before = snapshot()
    started = time.monotonic()
    r = declare(client, 1, V1 | {"schema": schema})
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith(field), r.json()
    assert snapshot() == before and not DeclaredKindVersion.objects.exists()
    assert time.monotonic() - started < 10  # refused, not evaluated


BAD_DECLARATIONS = {
    "unknown field": ({"schemas": {}}, "schemas"),
    "no phase": ({"phase": None}, "phase"),
    "phase pointer": ({"phase": V1["phase"] | {"pointer": "state"}}, "phase.pointer"),
    "a phase value twice": ({"phase": V1["phase"] | {"completed": ["ready"]}},
                            "phase.completed"),
    "a label pointer": ({"phase": V1["phase"] | {"label": "{nope}"}}, "phase.label"),
    "identity part": ({"identity": {"owner": "/x"}}, "identity.owner"),
    "usage counter name": ({"usage": {"Tokens": "/t"}}, "usage.Tokens"),
    "migration without ops": ({"migration": {}}, "migration"),
    "an unknown op": ({"migration": {"ops": [{"op": "copy", "from": "/a", "to": "/b"}]}},
                      "migration.ops[0]/op"),
    "a rename across objects": ({"migration": {"ops": [
        {"op": "rename", "from": "/a", "to": "/b/c"}]}}, "migration.ops[0]/to"),
    "too big": ({"description": "x" * 100, "schema": V1["schema"] | {
        "$comment": "y" * declarative.MAX_DECLARATION_BYTES}}, "body"),
}


@pytest.mark.parametrize("case", list(BAD_DECLARATIONS))
def test_a_bad_declaration_is_400_naming_the_field(api_as, adam, case):
    change, field = BAD_DECLARATIONS[case]
    body = {k: v for k, v in (V1 | change).items() if v is not None}
    r = declare(api_as(adam), 2, body)
    assert r.status_code in (400, 413), r.content
    if r.status_code == 400:
        assert r.json()["detail"].startswith(field), r.json()
    assert not DeclaredKindVersion.objects.exists()


def test_a_migration_needs_the_version_before(api_as, adam):
    r = declare(api_as(adam), 2, V2)
    assert r.status_code == 400 and r.json()["detail"].startswith("migration:"), r.content


def _migrate(acme, to, **kw):
    age_world(3600)  # the runtime's writes are an hour old: its owner is gone
    return services.checkpoints_migrate(actor=None, tenant=acme, kind=KIND, to_version=to,
                                        **kw)


def test_a_declared_migration_goes_up_and_back(api_as, adam, wendy, acme, v1):
    assert declare(api_as(adam), 2, V2).status_code == 201
    payload = {"state": "ready", "refund_id": "rf_9", "attempt": 1}
    body = new_checkpoint(api_as(wendy), "acme", kind=KIND, payload=payload)
    report = _migrate(acme, 2)
    assert report.counts[MigrationOutcome.MIGRATED] == 1, report.items
    run = Run.objects.get(uuid=body["run_id"])
    assert (run.schema_version, run.phase_class) == (2, PhaseClass.STABLE)
    envelope_now = get(api_as(wendy), "acme", f"checkpoints/{body['id']}").json()
    assert envelope_now["payload"] == {"state": "ready", "refund": "rf_9", "attempt": 1,
                                       "currency": "EUR"}
    back = _migrate(acme, 1, reverse=True)
    assert back.counts[MigrationOutcome.MIGRATED] == 1, back.items
    assert get(api_as(wendy), "acme", f"checkpoints/{body['id']}").json()["payload"] == payload


def test_a_one_way_step_refuses_the_reverse(api_as, adam, wendy, acme, v1):
    one_way = copy.deepcopy(V2)
    one_way["migration"]["ops"].append({"op": "set_default", "path": "/attempt", "value": 0})
    assert declare(api_as(adam), 2, one_way).json()["outcome"] == "created"
    event = AuditEvent.objects.filter(action=AuditAction.KIND_DECLARE).order_by("-seq").first()
    assert event.after["reversible_from_previous"] is False
    new_checkpoint(api_as(wendy), "acme", kind=KIND,
                   payload={"state": "ready", "refund_id": "rf_9"})
    assert _migrate(acme, 2).counts[MigrationOutcome.MIGRATED] == 1
    back = _migrate(acme, 1, reverse=True)
    assert back.refusals == {"not_reversible": 1}, back.items


def test_register_kind_declares_from_a_file(tmp_path, acme):
    path = tmp_path / "refund.json"
    path.write_text(json.dumps(V1))
    out = io.StringIO()
    call_command("register_kind", "acme", KIND, "1", str(path), stdout=out)
    assert out.getvalue().startswith(f"acme: {KIND} v1 created")
    event = AuditEvent.objects.filter(action=AuditAction.KIND_DECLARE).get()
    assert event.actor_id is None
    path.write_text(json.dumps(V1 | {"schema": {"$ref": "http://x"}}))
    with pytest.raises(CommandError, match=r"^schema/\$ref"):
        call_command("register_kind", "acme", KIND, "2", str(path))
    with pytest.raises(CommandError, match="tenant: no tenant"):
        call_command("register_kind", "nope", KIND, "1", str(path))
    assert DeclaredKindVersion.objects.count() == 1


def test_the_declared_envelope_is_a_plain_checkpoint_otherwise(api_as, wendy, v1):
    """A declared kind changes classification only: the CAS rules hold as for any kind."""
    w = api_as(wendy)
    body = envelope(kind=KIND, payload={"state": "ready", "refund_id": "rf_1"})
    assert put_cp(w, "acme", body, create=True).status_code == 201
    assert put_cp(w, "acme", body, create=True).status_code == 412


def test_a_declaration_replaced_mid_write_is_read_again_under_the_head(
        api_as, wendy, adam, acme, monkeypatch, v1):
    """The runtime's payload is classified before its write takes the tenant's audit head;
    the admin replaces the (still unused) declaration in between. The write reads the
    declaration again under the head, so the stored classification is the new one's."""
    relabelled = copy.deepcopy(V1)
    relabelled["phase"]["label"] = "relabelled {phase}"
    real, calls = kinds.classify, []

    def classify_then_replace(*args, **kwargs):
        answer = real(*args, **kwargs)
        if not calls:
            services.kind_declare(actor=adam, tenant=acme, kind=KIND, version=1,
                                  body=relabelled)
        calls.append(answer.phase.label)
        return answer

    monkeypatch.setattr(kinds, "classify", classify_then_replace)
    body = new_checkpoint(api_as(wendy), "acme", kind=KIND,
                          payload={"state": "ready", "refund_id": "rf_1", "attempt": 0})
    assert calls == ["refund ready, attempt 0", "relabelled ready"]
    assert Run.objects.get(uuid=body["run_id"]).phase_label == "relabelled ready"
    assert DeclaredKindVersion.objects.get().body == relabelled


@pytest.mark.parametrize("kind", ["a.b%00", "%00", "a.b%ED%A0%80", "a." + "b" * 199])
def test_a_kind_in_the_url_that_cannot_be_one_is_404_or_400_naming_kind(api_as, adam, vic,
                                                                         kind):
    """Attack finding (PostgreSQL): a U+0000 in the URL's kind reached the queries of the
    declared-kind look-up and answered 500 on every new route; a kind that cannot be a
    kind name is now never queried: the GETs and the POST answer 404 (as any path id that
    can name nothing: tests/api/test_hostile_input.py), the PUT 400 naming ``kind``."""
    before = snapshot()
    for client in (api_as(adam), api_as(vic)):
        assert get(client, "acme", f"kinds/{kind}/versions/1").status_code == 404
        assert get(client, "acme", f"kinds/{kind}/migrations/{uuid.uuid4()}").status_code \
            == 404
    for body in ({"to_version": 1, "dry_run": True}, {"to_version": 1}):
        r = api_as(adam).post(url("acme", f"kinds/{kind}/migrations"), data=json.dumps(body),
                              content_type="application/json",
                              HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
        assert r.status_code == 404 and r.json()["error"] == "not_found", r.content
    r = declare(api_as(adam), 1, V1, kind=kind)
    assert r.status_code == 400 and r.json()["detail"].startswith("kind:"), r.content
    assert snapshot() == before


def _spec(items_schema: dict):
    body = {"schema": {"properties": {"xs": {"items": items_schema}}},
            "phase": {"pointer": "/state", "stable": ["ready"]}}
    return declarative.parse_declaration("acme.costly", 1, body).spec()


#: Schemas each accepted (within ``MAX_SCHEMA_COST``, 64 KiB) whose validation of a
#: payload of a few thousand items took minutes to hours before the validation budget
#: (attack finding: 3,933 integers against the allOf took 176 s; ~1 MiB, about 40 min).
COSTLY = {
    "allOf of 999": ({"allOf": [{"type": "integer"}] * 999}, 1),
    "anyOf of 999, every branch failing": ({"anyOf": [{"type": "string"}] * 999}, 1),
    "enum of 7,000 values, none matching": ({"enum": [f"v{i:05d}" for i in range(7000)]}, "z"),
}


@pytest.mark.parametrize("case", list(COSTLY))
def test_a_payload_too_costly_for_its_declared_schema_is_refused_in_bounded_time(case):
    """A declared schema's work on one payload is bounded by ``MAX_VALIDATION_STEPS``
    (a count of the keywords run, weighted by what they apply: the same answer on every
    machine, unlike a clock); past it the payload is refused (stored as schema_mismatch)."""
    items, value = COSTLY[case]
    validate = _spec(items).validate
    started = time.monotonic()
    for _ in range(2):  # deterministic: the same payload, the same refusal
        with pytest.raises(kinds.SchemaError, match=r"more than 1000000 steps"):
            validate({"state": "ready", "xs": [value] * 20_000})
    assert time.monotonic() - started < 30  # was 15 minutes and more


def test_unique_items_over_objects_is_linear_and_keeps_json_equality():
    validate = _spec({}).validate
    unique = declarative.parse_declaration("acme.costly", 1, {
        "schema": {"properties": {"xs": {"uniqueItems": True}}},
        "phase": {"pointer": "/state", "stable": ["ready"]}}).spec().validate
    started = time.monotonic()
    unique({"state": "ready", "xs": [{"a": i} for i in range(60_000)]})  # was ~30 min
    assert time.monotonic() - started < 10
    for same in ([{"a": 1}, {"a": 1.0}], [[1, {"b": None}], [1.0, {"b": None}]], ["x", "x"]):
        with pytest.raises(kinds.SchemaError, match="uniqueItems"):
            unique({"state": "ready", "xs": same})
    for different in ([1, True], [0, False], [{"a": 1}, {"a": 1, "b": 1}], [[1, 2], [2, 1]]):
        unique({"state": "ready", "xs": different})
    validate({"state": "ready", "xs": [1, 1]})


@pytest.mark.parametrize(("where", "number"), [
    ("schema/properties/attempt/const", 1e300), ("schema/properties/attempt/enum/1", 1e16),
    ("schema/properties/attempt/default", -0.0), ("schema/properties/attempt/maximum", 2.5e20),
    ("migration/ops/1/value", 1e22)])
def test_a_number_the_database_would_not_keep_as_given_is_refused(api_as, adam, v1, where,
                                                                   number):
    """Attack finding (PostgreSQL): jsonb keeps numbers as decimals, so a declaration's
    ``1e300`` read back as the integer 10**300 (and ``const`` then no longer matched the
    float 1e300 a payload holds), ``-0.0`` as ``0.0``: the stored declaration was not the
    one declared, nor the one its digest names. Such a number is refused, naming where."""
    body = copy.deepcopy(V2)
    body["schema"]["properties"]["attempt"] = {"type": "number", "enum": [1, 2], "const": 1,
                                               "default": 0, "maximum": 10}
    body["migration"]["ops"][1]["value"] = "EUR"
    node = body["schema"]["properties"]["attempt"]
    key = where.split("/")[3]
    if key == "enum":
        node["enum"][1] = number
    elif where.startswith("schema"):
        node[key] = number
    else:
        body["migration"]["ops"][1]["value"] = number
    r = declare(api_as(adam), 2, body)
    assert r.status_code == 400 and r.json()["detail"].startswith(where + ":"), r.content
    assert DeclaredKindVersion.objects.count() == 1


def test_numbers_the_database_keeps_read_back_exactly(api_as, adam):
    body = copy.deepcopy(V1)
    body["schema"]["properties"]["attempt"] = {
        "enum": [0.1, 1.5e-07, 1e-300, 10**300, -12345678901234567890123, 100.0, 0, -0.5]}
    r = declare(api_as(adam), 1, body)
    assert r.status_code == 201, r.content
    back = get(api_as(adam), "acme", f"kinds/{KIND}/versions/1").json()
    assert back["declaration"] == body
    assert [type(v) for v in back["declaration"]["schema"]["properties"]["attempt"]["enum"]] \
        == [type(v) for v in body["schema"]["properties"]["attempt"]["enum"]]
    stored = DeclaredKindVersion.objects.get()
    assert hashlib.sha256(declarative.canonical(stored.body).encode()).hexdigest() \
        == stored.digest == back["digest"]


def test_the_audit_event_of_a_200_character_kind_names_it_whole(api_as, adam):
    """Attack finding: ``target_ref`` holds 64 characters, so the ``kind.declare`` event of
    a long kind was cut to its first 64 (not even the version was left): two kinds
    sharing those, or two versions of one, had events that could not be told apart. The
    event's ``after`` (and ``before``) name the kind and version whole, and its sentence
    uses them."""
    from checkpoints import auditwords

    kind = "acme." + "k" * 195
    assert declare(api_as(adam), 4294967295, V1, kind=kind).status_code == 201
    changed = V1 | {"description": "changed"}
    assert declare(api_as(adam), 4294967295, changed, kind=kind).status_code == 200
    created, replaced = AuditEvent.objects.filter(action=AuditAction.KIND_DECLARE).order_by("seq")
    for event in (created, replaced):
        assert (event.after["kind"], event.after["version"]) == (kind, 4294967295)
        assert len(event.target_ref) <= 64
    assert (replaced.before["kind"], replaced.before["version"]) == (kind, 4294967295)
    assert auditwords.sentence(created).endswith(f"declared kind {kind} v4294967295")
    assert f"{kind} v4294967295" in auditwords.sentence(replaced)


@pytest.mark.parametrize("text", ["01", "1_0", "+1", " 1", "\u0661", "-1", "4294967296", "1.0"])
def test_the_command_and_the_api_read_a_version_by_one_rule(api_as, adam, tmp_path, text):
    """Attack finding (two code paths for one rule): ``register_kind``'s version went
    through Python's ``int()``, which takes ``01``, ``1_0``, ``+1``, `` 1`` and an
    Arabic-Indic ``١`` as numbers the API's ``{v}`` refuses; both now read it with
    ``intranges.SCHEMA_VERSION.parse``, and refuse the same texts with the same words."""
    path = tmp_path / "k.json"
    path.write_text(json.dumps(V1))
    message = "version: must be an integer in 0..4294967295"
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("register_kind", "acme", KIND, text, str(path))
    r = declare(api_as(adam), quote(text), V1)
    assert (r.status_code, r.json()["detail"]) == (400, message)
    assert not DeclaredKindVersion.objects.exists()


def test_a_payload_nested_deeper_than_the_schema_can_check_is_refused_not_overflowing():
    """Validation nests Python calls, a few per keyword within another: past
    ``MAX_VALIDATION_NESTING`` keywords the payload is refused (unsupported), whoever
    calls it, never a RecursionError (which the write path logged as a bug in the kind).
    Here five keywords a level (allOf, $ref, anyOf, items, $ref): 80 levels overflowed
    the stack of a bare interpreter before (~2.5 frames a keyword), a request's sooner."""
    validate = declarative.parse_declaration("acme.deep", 1, {
        "schema": {"properties": {"x": {"$ref": "#/$defs/r"}},
                   "$defs": {"r": {"allOf": [{"$ref": "#/$defs/s"}]},
                             "s": {"anyOf": [{"type": "integer"},
                                             {"items": {"$ref": "#/$defs/r"}}]}}},
        "phase": {"pointer": "/state", "stable": ["ready"]}}).spec().validate

    def nested(depth):
        value = 1
        for _ in range(depth):
            value = [value]
        return value

    validate({"state": "ready", "x": nested(40)})
    with pytest.raises(kinds.SchemaError, match="nests deeper than the declared schema"):
        validate({"state": "ready", "x": nested(60)})


@pytest.mark.parametrize("where", ["top", "phase", "identity", "usage"])
def test_a_declaration_error_echoes_a_key_as_one_printable_line(api_as, adam, acme, where):
    """(stop 33, the second attack's finding) An unknown key was echoed into the 400's
    detail raw: an ESC sequence and a direction override reached the admin's terminal
    or page. It is escaped (``jsonparse.shown``), and nothing is declared."""
    key = "x\x1b[2J\u202eevil"
    body = copy.deepcopy(V1)
    if where == "top":
        body[key] = 1
    elif where == "phase":
        body["phase"][key] = 1
    else:
        body[where] = {key: "/agent"}
    before = DeclaredKindVersion.objects.count()
    r = declare(api_as(adam), 1, body)
    assert r.status_code == 400, r.content
    detail = r.json()["detail"]
    assert "\x1b" not in detail and "\u202e" not in detail and "x\\x1b[2J\\u202eevil" in detail
    assert DeclaredKindVersion.objects.count() == before


@pytest.mark.parametrize("phase", [{"stable": ["ok\u202egnp.exe"]},
                                   {"label": "\x1b[31m{phase}\x1b[0m"}])
def test_a_declared_phase_value_or_label_must_be_a_printable_name(api_as, adam, acme, phase):
    """(stop 33, the second attack's finding) A declared phase value or label is shown
    to every viewer as the run's phase: one with a control or bidirectional character
    is refused, naming it."""
    body = copy.deepcopy(V1)
    body["phase"] = {**body["phase"], **phase}
    r = declare(api_as(adam), 1, body)
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith("phase.")
    assert "control character" in r.json()["detail"]


def test_a_kinds_phase_label_is_one_printable_line():
    """A built-in kind builds its label from payload text (a workflow's step name): a
    control or bidirectional character in it is stored escaped (``kinds._checked_phase``)."""
    phase = kinds._checked_phase(kinds.Phase(PhaseClass.STABLE, "ready next a\x1b[2J\u202eb"))
    assert phase.label == "ready next a\\x1b[2J\\u202eb"
    plain = kinds.Phase(PhaseClass.STABLE, "ready next charge é")
    assert kinds._checked_phase(plain) is plain
    # Cut after escaping, on an escape's boundary: it fits the column whole.
    long = kinds._checked_phase(kinds.Phase(PhaseClass.STABLE, "\u202e" * 100)).label
    assert len(long) <= 256 and long == "\\u202e" * (256 // 6)
