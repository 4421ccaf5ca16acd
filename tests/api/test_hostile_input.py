"""Issue 6, fault 4: hostile input never reaches a 500, each kind everywhere.

- Query parameters: every parameter of every API operation, read from the OpenAPI
  schema (so a new parameter is covered by itself), refuses U+0000 and an over-long
  value with 400 naming it; every operation refuses a parameter it does not take and one
  given twice. The schema and ``checkpoints.api.params`` are the same classes.
- Path segments: NUL and non-UUIDs in every API URL pattern (from the resolver) are
  JSON 404s (400 naming ``id`` on a PUT), never an HTML page.
- Bodies: unpaired surrogates in payloads, keys, operation keys, reasons, owners and
  resume identities; an identity part taken from a payload longer than its run column;
  an ``updated_at_ms`` the column cannot hold.

Each answer is checked with "nothing stored" (``snapshot``).
"""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from checkpoints import services
from checkpoints.api import params
from checkpoints.exceptions import InvalidPayload
from checkpoints.models import AuditEvent, NotificationMessage, Run
from checkpoints.vocab import DeliveryState
from tests.api.apihelpers import new_checkpoint, post, put_cp, put_fx, snapshot, url
from tests.helpers import effect_body, envelope
from tests.kind_fixtures import fixtures as kind_fixtures

PREFIX = "/api/v1/tenants/{tenant}/"


def _schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def _query_params() -> list[tuple[str, str, dict]]:
    """(method, path, parameter) of every query parameter the schema documents."""
    out = []
    for path, ops in _schema()["paths"].items():
        for method, op in ops.items():
            if method == "head":  # its GET's parameters, checked by the same code
                continue
            for param in op.get("parameters", []):
                if param["in"] == "query":
                    out.append((method, path, param))
    return out


def _operations() -> list[tuple[str, str]]:
    # A HEAD is its GET without the body (the same view code); the GET's cases cover it.
    return [(method, path) for path, ops in _schema()["paths"].items()
            for method in ops if path.startswith(PREFIX) and method != "head"]


#: A webhook endpoint's create body (issue 21).
ENDPOINT = {"name": "ops", "channel": "webhook", "url": "https://hooks.example.com/in",
            "event_types": ["run.needs_review"]}
QUERY_PARAMS = _query_params()
OPERATIONS = _operations()


@pytest.fixture
def ids(api_as, wendy, adam, acme) -> dict:
    """A real checkpoint, run and effect of acme for the path templates, and a real
    notification endpoint of acme with a failed message (it may be resent)."""
    w = api_as(wendy)
    cp = new_checkpoint(w, "acme")
    fx = effect_body(run_id=cp["run_id"])
    assert put_fx(w, "acme", fx, create=True).status_code == 201
    # The issue-19 routes (…/kinds/{kind}/versions/{version}, …/migrations/{job_id}) were
    # missing here, so this sweep raised KeyError on them instead of checking their
    # parameters (attack finding).
    endpoint, _secret = services.endpoint_create(actor=adam, tenant=acme, body=ENDPOINT)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    NotificationMessage.objects.filter(pk=message.pk).update(state=DeliveryState.FAILED)
    return {"tenant": "acme", "checkpoint_id": cp["id"], "run_id": cp["run_id"],
            "effect_id": fx["id"], "retry_id": "1", "bulk_id": str(uuid.uuid4()),
            "kind": "acme.order", "version": "1", "job_id": str(uuid.uuid4()),
            # Issue 20's routes (legal holds, erasure requests, tombstone purges).
            "hold_id": str(uuid.uuid4()), "request_id": str(uuid.uuid4()),
            "purge_id": str(uuid.uuid4()),
            # Issue 21's routes (notification endpoints, their delivery log).
            "endpoint_id": str(endpoint.uuid), "event_id": message.event_id,
            # Issue 22's route (an audit event's inclusion proof): an integrated event.
            "audit_event_id": str(_integrated_event(acme))}


def _integrated_event(tenant) -> int:
    services.audit_integrate(tenant)
    return AuditEvent.objects.filter(tenant=tenant).order_by("seq").first().pk


def _client_for(method: str, path: str, api_as, wendy, adam) -> APIClient:
    # The writer may call the writer's operations (resume, lease); the admin every other.
    # By path segment: ".../legal-holds/{hold_id}/release" is not a lease.
    writer_ops = ("resume", "lease")
    return api_as(wendy) if path.rstrip("/").rsplit("/", 1)[-1] in writer_ops else api_as(adam)


def _call(client, method: str, path: str, ids: dict, query: str):
    target = path.format(**ids) + "?" + query
    body = json.dumps({"reason": "r"}) if method == "post" else None
    return getattr(client, method)(target, data=body, content_type="application/json")


def test_it_documents_a_query_parameter_for_every_list_filter():
    """The generated table below is not empty: the list endpoints' filters are in it."""
    names = {(path.rsplit("/", 1)[-1], p["name"]) for _m, path, p in QUERY_PARAMS}
    assert {("runs", "kind"), ("runs", "cursor"), ("effects", "operation_key"),
            ("audit-events", "actor"), ("revisions", "limit"),
            ("resume", "definition_version")} <= names


@pytest.mark.parametrize("method,path,param", QUERY_PARAMS,
                         ids=[f"{m} {p[len(PREFIX):]} {q['name']}" for m, p, q in QUERY_PARAMS])
def test_it_refuses_nul_control_and_overlong_query_values_naming_the_parameter(
        api_as, wendy, adam, ids, method, path, param):
    client = _client_for(method, path, api_as, wendy, adam)
    before = snapshot()
    name = param["name"]
    for value in ("a%00b", "%00", "x" * 1001, "a%01b", "%1F", "a%0A", "a%7F"):
        r = _call(client, method, path, ids, f"{name}={value}")
        assert r.status_code == 400, (name, value, r.content)
        assert r["Content-Type"] == "application/json"
        assert r.json()["error"] == "invalid_payload"
        assert r.json()["detail"].startswith(f"{name}: "), r.json()
    assert snapshot() == before


@pytest.mark.parametrize("method,path", OPERATIONS,
                         ids=[f"{m} {p[len(PREFIX):]}" for m, p in OPERATIONS])
def test_it_refuses_unknown_and_repeated_query_parameters_on_every_operation(
        api_as, wendy, adam, ids, method, path):
    client = _client_for(method, path, api_as, wendy, adam)
    before = snapshot()
    r = _call(client, method, path, ids, "no_such_param=1")
    assert r.status_code == 400 and r.json()["detail"] == "no_such_param: unknown parameter"
    # Not DRF's renderer override (it answered 404 for an unknown format): a parameter.
    r = _call(client, method, path, ids, "format=csv")
    assert r.status_code == 400 and r.json()["detail"] == "format: unknown parameter"
    r = _call(client, method, path, ids, "%00=1")
    assert r.status_code == 400 and r.json()["detail"] == "\\0: unknown parameter"
    documented = [p["name"] for m, pth, p in QUERY_PARAMS if m == method and pth == path]
    if documented:
        name = documented[0]
        r = _call(client, method, path, ids, f"{name}=1&{name}=2")
        assert r.status_code == 400
        assert r.json()["detail"] == f"{name}: given more than once"
    assert snapshot() == before


@pytest.mark.parametrize("cls,name", [(params.RunListParams, "kind"),
                                      (params.EffectListParams, "operation_key"),
                                      (params.AuditListParams, "actor"),
                                      (params.IdentityParams, "agent")])
def test_it_refuses_an_unpaired_surrogate_in_a_parameter(cls, name):
    # HTTP cannot carry one (Django decodes query strings with replacement), but a body
    # checked with the same classes can: the rule holds for both.
    with pytest.raises(InvalidPayload, match=f"^{name}: "):
        params.check(cls, {name: "a\ud800b"})


def test_it_takes_the_parameter_limits_from_the_columns():
    fields = params.IdentityParams().fields
    for name in ("agent", "model", "workflow", "definition_version"):
        assert fields[name].max_length == Run._meta.get_field(name).max_length


def test_it_lists_runs_with_a_nul_kind_as_a_400_not_a_500(api_as, vic, acme):
    """The issue's instance: ``runs?kind=%00``."""
    r = api_as(vic).get(url("acme", "runs") + "?kind=%00")
    assert r.status_code == 400
    assert r.json() == {"error": "invalid_payload",
                        "detail": "kind: Null characters are not allowed."}


def test_it_still_filters_with_good_parameters(api_as, wendy, vic, acme):
    w = api_as(wendy)
    cp = new_checkpoint(w, "acme")
    r = api_as(vic).get(url("acme", "runs"), {"kind": "acme.order", "limit": "1"})
    assert r.status_code == 200 and [x["run_id"] for x in r.json()["results"]] == [cp["run_id"]]
    # An empty text filter filters nothing; an empty typed value is not a value.
    r = api_as(vic).get(url("acme", "runs"), {"kind": "", "subject": ""})
    assert r.status_code == 200 and len(r.json()["results"]) == 1
    for name in ("recovery_state", "limit", "age_s_min"):
        r = api_as(vic).get(url("acme", "runs"), {name: ""})
        assert r.status_code == 400 and r.json()["detail"].startswith(f"{name}: ")


# --- path segments ------------------------------------------------------------------------

PATH_OPS = [(m, p) for m, p in OPERATIONS if "{" in p[len(PREFIX):]]


@pytest.mark.parametrize("method,path", PATH_OPS,
                         ids=[f"{m} {p[len(PREFIX):]}" for m, p in PATH_OPS])
@pytest.mark.parametrize("segment", ["%00", "a%00b", "%ED%A0%80", "x" * 300])
def test_it_answers_json_for_bad_ids_in_every_path(api_as, adam, ids, method, path, segment):
    before = snapshot()
    bad = {k: (segment if k != "tenant" else v) for k, v in ids.items()}
    r = _call(api_as(adam), method, path, bad, "")
    assert r["Content-Type"] == "application/json", r.content[:200]
    if method == "put":  # the declared kind's PUT names its own path fields
        named = ("kind: ", "version: ") if "{kind}" in path else ("id: ",)
        assert r.status_code == 400 and r.json()["detail"].startswith(named), r.content
    else:
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert snapshot() == before


@pytest.mark.parametrize("segment", ["%00", "ac%00me", "%ED%A0%80", "x" * 300])
def test_it_answers_json_404_for_a_tenant_that_is_not_a_slug(api_as, adam, acme, segment):
    r = api_as(adam).get(f"/api/v1/tenants/{segment}/runs")
    assert r.status_code == 404
    assert r["Content-Type"] == "application/json"
    assert r.json()["error"] == "not_found"
    assert len(r.json().get("detail", "")) < 100


# --- bodies -------------------------------------------------------------------------------

SURROGATE = "\\ud800"


@pytest.mark.parametrize("where", ["payload-value", "payload-key", "kind"])
def test_it_refuses_unpaired_surrogates_in_checkpoint_bodies(api_as, wendy, acme, where):
    body = json.dumps(envelope())
    if where == "payload-value":
        body = body.replace('"A-1042"', f'"A{SURROGATE}"')
    elif where == "payload-key":
        body = body.replace('"order_id"', f'"o{SURROGATE}"')
    else:
        body = body.replace('"acme.order"', f'"acme.order{SURROGATE}"')
    before = snapshot()
    r = put_cp(api_as(wendy), "acme", body, create=True,
               headers={"url_id": json.loads(body.replace(SURROGATE, ""))["id"]})
    assert r.status_code == 400 and "surrogate" in r.json()["detail"], r.content
    assert r.json()["detail"].startswith("body")
    assert snapshot() == before


@pytest.mark.parametrize("field", ["operation_key", "service", "receipt"])
def test_it_refuses_unpaired_surrogates_in_effect_bodies(api_as, wendy, acme, field):
    fx = effect_body(receipt={"note": "x"})
    raw = json.dumps(fx)
    raw = raw.replace(json.dumps(fx[field])[:-1] if field != "receipt" else '"x',
                      (json.dumps(fx[field])[:-1] if field != "receipt" else '"x') + SURROGATE)
    before = snapshot()
    r = put_fx(api_as(wendy), "acme", raw, create=True, headers={"url_id": fx["id"]})
    assert r.status_code == 400 and "surrogate" in r.json()["detail"], r.content
    assert r.json()["detail"].startswith(f"body.{field}")
    assert snapshot() == before


@pytest.mark.parametrize("action", ["retry-requests", "close", "conflicts/acknowledge",
                                    "reconcile"])
def test_it_refuses_unpaired_surrogates_in_reasons(api_as, wendy, rita, acme, action):
    rid = new_checkpoint(api_as(wendy), "acme")["run_id"]
    before = snapshot()
    r = post(api_as(rita), "acme", f"runs/{rid}/{action}", raw='{"reason": "x' + SURROGATE + '"}')
    assert r.status_code == 400 and r.json()["detail"].startswith("body.reason"), r.content
    assert snapshot() == before


def test_it_refuses_unpaired_surrogates_in_lease_owners_and_resume_identities(
        api_as, wendy, acme):
    w = api_as(wendy)
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease", raw='{"owner": "w' + SURROGATE + '", "ttl_s": 5}')
    assert r.status_code == 400 and r.json()["detail"].startswith("body.owner")
    r = post(w, "acme", f"runs/{rid}/resume", raw='{"agent": "a' + SURROGATE + '"}')
    assert r.status_code == 400 and r.json()["detail"].startswith("body.agent")
    assert snapshot() == before


#: Names with a character no name may hold (``jsonparse.name_problem``): C0 (tab and
#: newline included), DEL, C1 (U+009B reads as ``ESC [``), a bidirectional override, and
#: (stop 34) an invisible character: ``charge:\u200bA-1042`` reads as another key.
BAD_NAMES = ["a\x1b[2Jb", "tab\tname", "two\nlines", "del\x7f", "a\x9b2Jb",
             "evil\u202egnp.exe", "two\u2028lines", "two\u2029paragraphs",
             "charge:\u200bA-1042", "bom\ufeff", "soft\u00adhyphen",
             # Unicode's default ignorables beyond stop 34's five, an interlinear
             # annotation, a variation selector with no character before it:
             "x\u2062y", "cgj\u034f", "\u3164filler", "tag\U000e0041\U000e007f",
             "khmer\u17b4", "ann\ufff9x\ufffbo", "\ufe0fstart"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_every_name_door_refuses_control_and_bidi_characters_naming_the_field(
        api_as, wendy, acme, name):
    """(stop 33) One rule for the names a runtime sends (``jsonparse.name_problem``):
    the lease owner, an effect's service and operation key, and the resume identity in
    the POST body took what the GET query refused (C0 only) or nothing refused at all,
    and five checks of their own had drifted apart. Each door answers 400 naming its
    field and writes nothing; the GET query refuses the same name."""
    w = api_as(wendy)
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/lease", {"owner": name, "ttl_s": 5})
    assert r.status_code == 400 and r.json()["detail"].startswith("owner: "), r.content
    r = post(w, "acme", f"runs/{rid}/resume", {"agent": name})
    assert r.status_code == 400 and r.json()["detail"].startswith("agent: "), r.content
    r = w.get(url("acme", f"runs/{rid}/resume"), {"model": name})
    assert r.status_code == 400 and r.json()["detail"].startswith("model: "), r.content
    for field in ("service", "operation_key"):
        fx = effect_body(run_id=rid, **{field: name})
        r = put_fx(w, "acme", fx, create=True)
        assert r.status_code == 400 and r.json()["detail"].startswith(field), r.content
        r = w.get(url("acme", "effects"), {field: name})
        assert r.status_code == 400 and r.json()["detail"].startswith(field), r.content
    assert snapshot() == before
    # A plain name still passes every door.
    assert post(w, "acme", f"runs/{rid}/lease",
                {"owner": "worker-1@host:42", "ttl_s": 5}).status_code == 200


def test_a_query_value_gets_the_names_own_words(api_as, rita):
    """(stop 34's second attack) A query value with an invisible character was refused
    as "a control character"; it gets ``name_problem``'s words, as a body does."""
    r = api_as(rita).get(url("acme", "effects"), {"operation_key": "charge:\u200bA-1042"})
    assert r.status_code == 400
    assert r.json()["detail"] == "operation_key: an invisible character is not allowed"


def test_invisible_characters_are_refused_in_names_only_and_escaped_when_shown():
    """(stop 34) The zero-width space, word joiner, byte order mark, soft hyphen and
    Mongolian vowel separator are refused in a name, never in a reason (free text pasted
    from documents holds them), and ``shown`` escapes them; the zero-width joiner and
    non-joiner stay allowed in names (an emoji sequence, Persian text)."""
    from checkpoints.jsonparse import INVISIBLE, name_problem, printable_problem, shown

    for ch in sorted(INVISIBLE):
        assert name_problem(f"a{ch}b") == "an invisible character is not allowed"
        assert printable_problem(f"a{ch}b") == ""
        assert shown(f"a{ch}b", 40) == "a" + ch.encode("unicode_escape").decode() + "b"
    assert name_problem("dev-\U0001F469\u200d\U0001F4BB") == ""
    assert name_problem("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") == ""


@pytest.mark.parametrize("name,detail", [("Acme\x1b[2J", "name: a control character"),
                                         ("Acme\u202e", "name: a control character"),
                                         ("A" * 201, "name: must be text of at most 200"),
                                         ("   ", "name: must not be blank"),
                                         ("\u200d \u200c", "name: must not be blank"),
                                         ("\u2800 \u200d", "name: must not be blank"),
                                         ("\u3164", "name: must not be blank"),
                                         ("\u3164x", "name: an invisible character")])
def test_a_tenant_name_is_a_printable_name_that_fits_its_column(db, name, detail):
    """(stop 33, the second attack's finding) A tenant's display name is shown on every
    page of the tenant: one with a control or bidirectional character, or longer than
    its column, is refused naming ``name``, and no tenant is made; so is a blank one
    (stop 34: only spaces, shown as nothing at all; left out, the slug is shown)."""
    from checkpoints.models import Tenant

    with pytest.raises(InvalidPayload, match=detail):
        services.tenant_create(slug="evil", name=name)
    assert not Tenant.objects.filter(slug="evil").exists()


@pytest.mark.parametrize("body,detail", [
    ({"definition_version": "v" * 65}, "definition_version: "),
    ({"agent": "a" * 257}, "agent: "),
    ({"model": 7}, "model: "),
    ({"workflow": None}, "workflow: "),
])
def test_it_checks_the_resume_body_like_the_resume_query(api_as, wendy, acme, body, detail):
    w = api_as(wendy)
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = post(w, "acme", f"runs/{rid}/resume", body)
    assert r.status_code == 400 and r.json()["detail"].startswith(detail), r.content
    assert snapshot() == before
    query = {k: str(v) for k, v in body.items() if v is not None and not isinstance(v, int)}
    if query:
        r = w.get(url("acme", f"runs/{rid}/resume"), query)
        assert r.status_code == 400 and r.json()["detail"].startswith(detail)


# Identity parts a payload yields, one over its column's limit, for each built-in kind.
OVERLONG_IDENTITY = {
    "acme.order definition_version": (
        "acme.order", 1, {"phase": "ready", "definition_version": "v" * 65},
        "definition_version", 64),
    "acme.order definition_version (a 65-digit integer)": (
        "acme.order", 1, {"phase": "ready", "definition_version": 10**64}, "definition_version",
        64),
    "acme.order workflow": (
        "acme.order", 1, {"phase": "ready", "workflow": "w" * 257}, "workflow", 256),
    "runifold.agent agent": (
        "runifold.agent", 1, None, "agent", 256),
    "runifold.agent model": (
        "runifold.agent", 1, None, "model", 256),
    "runifold.workflow workflow": (
        "runifold.workflow", 3, None, "workflow", 256),
}
# runifold.workflow's definition_version is its workflow_version, a u32 (RUNIFOLD.md §3): at
# most 10 digits, so it never reaches the 64-character column; tests/test_kinds.py refuses
# one past u32.


def _fixture_payload(kind: str, version: int, part: str) -> dict:
    """The first fixture payload of ``kind`` v``version`` with ``part`` made too long."""
    payload = copy.deepcopy(kind_fixtures(kind, version)[0].payload)
    if part == "agent":
        payload["agent"] = "a" * 257
    elif part == "model":
        payload["model"] = {"provider": "p" * 200, "name": "n" * 56}  # "p…/n…" is 257
    elif part == "workflow":
        payload["workflow"] = "w" * 257
    return payload


@pytest.mark.parametrize("name", list(OVERLONG_IDENTITY))
def test_it_makes_an_overlong_identity_a_schema_error_not_a_database_error(
        api_as, wendy, vic, acme, name):
    kind, version, payload, part, limit = OVERLONG_IDENTITY[name]
    if payload is None:
        payload = _fixture_payload(kind, version, part)
    body = envelope(kind=kind, schema_version=version, payload=payload)
    r = put_cp(api_as(wendy), "acme", body, create=True)
    # Stored (the runtime's data is never lost), the run is schema_mismatch, the label
    # names the identity part and its limit, and no column got the value.
    assert r.status_code == 201, r.content
    assert r.json()["phase_class"] == "unsupported"
    assert f"identity {part} is longer than {limit} characters" in r.json()["phase_label"]
    run = Run.objects.get(uuid=body["run_id"])
    assert run.recovery_state == "schema_mismatch"
    assert (run.agent, run.model, run.workflow, run.definition_version) == ("", "", "", "")
    assert "vvvv" not in run.phase_label and "wwww" not in run.phase_label
    listed = api_as(vic).get(url("acme", "runs")).json()["results"]
    assert [x["recovery_state"] for x in listed] == ["schema_mismatch"]


@pytest.mark.parametrize("part,value", [("workflow", "refund\u202eevil"),
                                        ("definition_version", "v\x1b[2J")])
def test_an_identity_no_resume_could_name_is_a_schema_error(api_as, wendy, acme, part, value):
    """(stop 33, the attack's finding) A payload's identity holding a control or
    bidirectional character was stored on the run, while the resume identity that must
    equal it is refused by the names rule: no runtime could ever resume the run. Such
    an identity part is now a schema error, like an overlong one, on a create and on an
    update (PostgreSQL's SQL path)."""
    w = api_as(wendy)
    body = envelope(payload={"phase": "ready", "order_id": "A-1"})
    assert put_cp(w, "acme", body, create=True).status_code == 201
    body = dict(body, revision=1, payload={"phase": "ready", "order_id": "A-1", part: value})
    r = put_cp(w, "acme", body, match=0)
    assert r.status_code == 200, r.content
    assert r.json()["phase_class"] == "unsupported"
    assert f"identity {part}: a control character is not allowed" in r.json()["phase_label"]
    run = Run.objects.get(uuid=body["run_id"])
    assert run.recovery_state == "schema_mismatch" and value not in (run.workflow,
                                                                      run.definition_version)
    fresh = envelope(payload={"phase": "ready", "order_id": "A-2", part: value})
    r = put_cp(w, "acme", fresh, create=True)
    assert r.status_code == 201 and r.json()["phase_class"] == "unsupported"


def test_it_accepts_identities_of_exactly_the_column_limits(api_as, wendy, acme):
    body = envelope(payload={"phase": "ready", "definition_version": "v" * 64,
                             "workflow": "w" * 256})
    r = put_cp(api_as(wendy), "acme", body, create=True)
    assert r.status_code == 201 and r.json()["phase_class"] == "stable"
    run = Run.objects.get(uuid=body["run_id"])
    assert (len(run.definition_version), len(run.workflow)) == (64, 256)


@pytest.mark.parametrize("value,status", [(2**63 - 1, 201), (2**63, 400), (2**64 - 1, 400)])
def test_it_refuses_an_updated_at_ms_the_column_cannot_hold(api_as, wendy, acme, value, status):
    before = snapshot()
    body = envelope(checkpoint_id=uuid.uuid4(), updated_at_ms=value)
    r = put_cp(api_as(wendy), "acme", body, create=True)
    assert r.status_code == status, r.content
    if status == 400:
        assert r.json()["detail"].startswith("updated_at_ms: ")
        assert snapshot() == before


@pytest.mark.parametrize("path,param", [("effects", "operation_key"), ("effects", "service"),
                                        ("audit-events", "actor"), ("audit-events", "action"),
                                        ("runs", "kind")])
@pytest.mark.parametrize("raw", ["%ED%A0%80", "%FF", "a%C3"])
def test_it_refuses_query_bytes_that_are_not_utf8_naming_the_parameter(api_as, vic, acme, path,
                                                                       param, raw):
    """Django decodes such bytes to U+FFFD; the raw query string is checked before that."""
    r = api_as(vic).get(url("acme", path) + f"?{param}={raw}")
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_payload"
    assert r.json()["detail"].startswith(f"{param}: not UTF-8")


# --- notification endpoints (issue 21) --------------------------------------------------------

NE = "notification-endpoints"
#: (route under the tenant, method, raw body, the field the 400 names): every body of the
#: routes, each hostile in one field; the create's from a good body.


def _create(field: str, raw: str) -> str:
    """The good create body with ``field``'s value written as ``raw`` (JSON text)."""
    rest = json.dumps({k: v for k, v in ENDPOINT.items() if k != field})[:-1]
    return rest + f', "{field}": {raw}' + "}"


NOTIFY_BODIES = {
    "create: surrogate in name": (NE, "post", _create("name", '"o' + SURROGATE + '"'),
                                  "body.name"),
    "create: NUL in name": (NE, "post", _create("name", '"o\\u0000ps"'), "body.name"),
    "create: control character in url": (
        NE, "post", _create("url", '"https://hooks.example.com/\\u0007"'), "url"),
    "create: over-long url": (
        NE, "post", _create("url", '"https://hooks.example.com/' + "a" * 3000 + '"'), "url"),
    "create: credentials in url": (
        NE, "post", _create("url", '"https://u:p@hooks.example.com/"'), "url"),
    "create: a private address": (NE, "post", _create("url", '"https://10.0.0.1/"'), "url"),
    "create: event_types not a list": (NE, "post", _create("event_types", '"test"'),
                                       "event_types"),
    "create: event type test": (NE, "post", _create("event_types", '["test"]'),
                                "event_types"),
    "create: a filter of objects": (NE, "post", _create("kinds", '[{"a": 1}]'), "kinds"),
    "create: a thousand filter values": (
        NE, "post", _create("agents", json.dumps(["a"] * 1000)), "agents"),
    "create: a boolean window": (NE, "post", _create("group_window_s", "true"),
                                 "group_window_s"),
    "create: a string quiet period": (NE, "post", _create("quiet_period_s", '"60"'),
                                      "quiet_period_s"),
    "create: enabled a string": (NE, "post", _create("enabled", '"yes"'), "enabled"),
    "create: unknown field": (NE, "post", _create("secret", '"whsec_x"'), "secret"),
    "create: email on a webhook": (NE, "post", _create("email", '"a@example.com"'), "email"),
    "create: an array": (NE, "post", "[1]", "body"),
    "create: a duplicate key": (NE, "post", _create("name", '"a", "name": "b"'), "body"),
    "update: channel": (NE + "/{endpoint_id}", "patch", '{"channel": "slack"}', "channel"),
    "update: surrogate in name": (NE + "/{endpoint_id}", "patch",
                                  '{"name": "' + SURROGATE + '"}', "body.name"),
    "update: null url": (NE + "/{endpoint_id}", "patch", '{"url": null}', "url"),
    "update: unknown field": (NE + "/{endpoint_id}", "patch", '{"previous_secret": ""}',
                              "previous_secret"),
    "rotate: a body": (NE + "/{endpoint_id}/rotate-secret", "post", '{"secret": "x"}', "secret"),
    "test: a body": (NE + "/{endpoint_id}/test", "post", '{"event_type": "digest"}',
                     "event_type"),
    "resend: a body": (NE + "/{endpoint_id}/deliveries/{event_id}/resend", "post",
                       '{"attempts": 0}', "attempts"),
}


@pytest.mark.parametrize("case", list(NOTIFY_BODIES))
def test_it_refuses_hostile_notification_bodies_naming_the_field(api_as, adam, ids, case):
    route, method, raw, field = NOTIFY_BODIES[case]
    before = snapshot()
    r = getattr(api_as(adam), method)(url("acme", route.format(**ids)), data=raw,
                                      content_type="application/json")
    assert r.status_code == 400, (case, r.status_code, r.content[:300])
    assert r["Content-Type"] == "application/json"
    assert r.json()["detail"].startswith(f"{field}: "), (case, r.json())
    assert snapshot() == before


@pytest.mark.parametrize("query", ["a%00b", "x" * 1001, "%ED%A0%80"])
def test_it_refuses_a_hostile_event_id_in_the_resend_path(api_as, adam, ids, query):
    """The event id is not a UUID: a NUL, an over-long or a surrogate one is not found."""
    before = snapshot()
    route = f"{NE}/{ids['endpoint_id']}/deliveries/{query}/resend"
    r = api_as(adam).post(url("acme", route), data="{}", content_type="application/json")
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.content[:200]
    assert snapshot() == before
