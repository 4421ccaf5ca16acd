"""The boundary table (issue 17, item 1): every integer the API or an import takes, x the
values where integers break, each answered by a success or a 400 naming the field, never
a 500, and a refused request stores nothing.

- **Fields** are read from the served OpenAPI schema, which drf-spectacular generates
  from the request serializers (``checkpoints/api/serializers/``), the query-parameter
  classes (``checkpoints/api/params.py``) and the declared headers and path parameters:
  every ``integer`` of a request body (nested objects and arrays included), a query, a
  header or a path, of every operation. A few integers the schema cannot type are listed
  in ``EXTRA`` (an integer inside a string header, integers inside LangGraph's
  free-form checkpoint object, payload numbers, the runifold line validator's fields,
  the checkpoint lines' taken from ``EnvelopeSerializer`` itself). Every field needs a
  recipe in ``RECIPES`` (a request that the value alone decides), and every recipe a
  field: ``test_every_integer_input_has_a_recipe``. Every header the API reads
  (``HTTP_*`` in ``checkpoints/api/views/``) is an integer with a recipe or is named
  in ``OTHER_HEADERS``.
- **Values**: -1, 0, 2^31-1, 2^31, 2^32-1, 2^32, 2^53+1, 2^63-1, 2^63, 2^64, and the
  field's own minimum - 1, minimum, maximum and maximum + 1 (the range the schema
  documents: every field must document both; ``test_every_integer_documents_its_range``).
- **Rule**: inside the documented range the recipe's request succeeds (2xx; an import
  line is imported); outside it the answer is 400 whose ``detail`` starts with the field's
  name, and nothing is stored: no table's row count changes and no row of a run,
  checkpoint, effect or tenant changes (``snapshot``). A path
  id answers 404 either way (no such object). Each value runs in a savepoint rolled back
  afterwards, so one world serves a field's values.

Runs on PostgreSQL (where ``integer out of range`` bites) and SQLite alike: no marker.
The table is written to ``$RECOVERY_VAR_DIR/integer-bounds.txt``.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection, transaction
from rest_framework import serializers as drf

from checkpoints import services
from checkpoints.api import serializers as s
from checkpoints.interop import runifold
from checkpoints.interop.runifold import jsonl_lines
from checkpoints.models import Checkpoint, DataPolicy, Effect, Run, Tenant
from tests.helpers import effect_body, envelope, lg_put, lg_writes
from tests.matrixhelpers import SKIPPED_MODELS
from tests.openapi_check import served_schema

T = "/api/v1/tenants/{tenant}/"
CP = T + "checkpoints/{checkpoint_id}"
FX = T + "effects/{effect_id}"
LG = T + "langgraph/checkpoints"
LGW = T + "langgraph/writes"
RUNIFOLD = "runifold line"
MAX63 = 2**63 - 1

#: Headers the API reads that carry no integer (each is tested where its rule lives).
OTHER_HEADERS = {
    "If-None-Match": "only *",
    "Idempotency-Key": "a UUID",
    "Transfer-Encoding": "refused when present (tests/test_input_limits.py)",
    "Content-Length": "the body's size, checked against RECOVERY_MAX_BODY_BYTES "
                      "(tests/test_input_limits.py); a bad one is 400 naming it",
    "Authorization": "a bearer token",
    "Incident-Ref": "printable text, the incident rule (tests/views/test_incident_ref_header.py)",
}

BASE_VALUES = [-1, 0, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64]


# --------------------------------------------------------------------------------------
# Introspection
# --------------------------------------------------------------------------------------

Key = tuple[str, str, str, str]  # (method, path or surface, location, field)


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _integers(schema: dict, node: dict, path: str, out: dict) -> None:
    node = _resolve(schema, node)
    for sub in node.get("allOf", []) + node.get("oneOf", []) + node.get("anyOf", []):
        _integers(schema, sub, path, out)
    if node.get("type") == "integer":
        out[path] = (node.get("minimum"), node.get("maximum"))
    for name, sub in node.get("properties", {}).items():
        _integers(schema, sub, f"{path}.{name}" if path else name, out)
    if node.get("type") == "array":
        _integers(schema, node["items"], path + "[]", out)
    if isinstance(node.get("additionalProperties"), dict):  # a map: {name: integer, ...}
        _integers(schema, node["additionalProperties"], path + ".*", out)


def schema_integers() -> dict[Key, tuple]:
    """Every integer input of every operation of the served schema: its (min, max)."""
    schema = served_schema()
    found: dict[Key, tuple] = {}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            for param in op.get("parameters", []):
                sub = _resolve(schema, param.get("schema", {}))
                if sub.get("type") == "integer":
                    found[(method.upper(), path, param["in"], param["name"])] = (
                        sub.get("minimum"), sub.get("maximum"))
            content = (op.get("requestBody") or {}).get("content", {})
            if "application/json" in content:
                fields: dict = {}
                _integers(schema, content["application/json"]["schema"], "", fields)
                for name, bounds in fields.items():
                    found[(method.upper(), path, "body", name)] = bounds
    return found


def envelope_integers() -> dict[str, tuple]:
    """The integer fields of the checkpoint envelope, from ``EnvelopeSerializer``: a
    runifold checkpoint line is an envelope (``parse_envelope``)."""
    return {name: (f.min_value, f.max_value) for name, f in s.EnvelopeSerializer().fields.items()
            if isinstance(f, drf.IntegerField)}


I64 = (-(2**63), MAX63)
#: Integers the schema cannot type: (min, max), None for no bound (any JSON integer).
EXTRA: dict[Key, tuple] = {
    ("PUT", CP, "header", "If-Match"): (0, MAX63),          # '"N"': an integer in a string
    ("PUT", FX, "header", "If-Match"): (0, MAX63),
    ("PUT", CP, "body", "payload.n"): (None, None),          # payload numbers round-trip
    ("POST", LG, "body", "checkpoint.v"): (0, 2**31 - 1),    # LangGraph's free-form checkpoint
    ("POST", LG, "body", "checkpoint.channel_versions.*"): I64,
    ("POST", LG, "body", "checkpoint.versions_seen.*.*"): I64,
    ("POST", LG, "body", "metadata.step"): (None, None),
    ("GET", LG, "query", "filter.step"): (None, None),      # a JSON object in a string
    **{("IMPORT", RUNIFOLD, "checkpoint", name): bounds
       for name, bounds in envelope_integers().items()},
    ("IMPORT", RUNIFOLD, "effect", "revision"): (0, MAX63),
    # A subject's value is matched by its keyed digest, never stored: any integer, as
    # the payload holds it (services.subject_value).
    ("POST", T + "legal-holds", "body", "subject.value"): (None, None),
    ("POST", T + "erasure-requests", "body", "subject.value"): (None, None),
}


@functools.cache
def all_integers() -> dict[Key, tuple]:
    return {**schema_integers(), **EXTRA}


#: Rows a refused request could change rather than add (the table's targets).
WATCHED = (Run, Checkpoint, Effect, Tenant)


def snapshot() -> dict:
    """Row counts of every table (one query) and every row of ``WATCHED``: what a refused
    request must leave as it was. (``tests.matrixhelpers.db_state`` reads every row of
    every table: about 0.35 s a time, too slow for a cell of this table.)"""
    tables = [m._meta.db_table for m in apps.get_models()
              if m._meta.label not in SKIPPED_MODELS and m._meta.managed]
    sql = " UNION ALL ".join(f"SELECT '{t}', COUNT(*) FROM {connection.ops.quote_name(t)}"
                             for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(sql)
        counts = dict(cursor.fetchall())
    rows = {m._meta.label: sorted(map(str, m.objects.values_list())) for m in WATCHED}
    return {"counts": counts, **rows}


def changes(before: dict, after: dict) -> dict:
    """The tables whose count changed and the watched models whose rows changed."""
    out = {t: (n, after["counts"][t]) for t, n in before["counts"].items()
           if after["counts"][t] != n}
    out.update({label: "rows changed" for label in before if label != "counts"
                and before[label] != after[label]})
    return out


# --------------------------------------------------------------------------------------
# The world and the recipes
# --------------------------------------------------------------------------------------

@dataclass
class World:
    tenant: object
    client: object     # an admin's bearer client: every right of the tenant
    cp: dict           # an existing checkpoint's body at revision 0
    fx: dict           # an existing effect's body at revision 0 (planned)
    thread: str        # a LangGraph thread with one checkpoint, LG_HEAD
    watch: bool = False  # take ``before`` when a recipe sends its request
    before: dict | None = None

    def sending(self) -> None:
        """Called by every recipe right before its request: what its own preparation
        wrote (``_set_revision``, a fencing token) is not the request's doing."""
        if self.watch:
            self.before = snapshot()


LG_HEAD = "1f0c0000-0000-6000-8000-0000000000aa"
LG_NEXT = "1f0c0000-0000-6000-8000-0000000000ab"


@dataclass
class Outcome:
    status: int
    detail: str = ""
    extra: str = ""


@dataclass(frozen=True)
class Recipe:
    """``send(world, value)`` -> ``Outcome``; ``label`` is how a refusal names the field;
    ``ok`` the success statuses; ``expect(value)`` may name the field an in-range value
    is refused on instead (a value that no request can make succeed)."""

    send: Callable[[World, int], Outcome]
    label: str
    ok: tuple[int, ...] = (200, 201)
    expect: Callable[[int], str | None] = lambda value: None


def _answer(response) -> Outcome:
    detail = ""
    if response.get("Content-Type", "").startswith("application/json") and response.content:
        body = json.loads(response.content)
        detail = body.get("detail", "") if isinstance(body, dict) else ""
    return Outcome(response.status_code, detail)


def _json(w: World, method: str, route: str, body, **headers) -> Outcome:
    url = route.format(tenant="acme", **headers.pop("path", {}))
    raw = json.dumps(body)
    w.sending()
    return _answer(getattr(w.client, method)(url, data=raw, content_type="application/json",
                                             **headers))


def _get(w: World, method: str, route: str, query: dict, **kw) -> Outcome:
    url = route.format(tenant="acme", **kw)
    w.sending()
    return _answer(getattr(w.client, method)(url, {k: str(v) for k, v in query.items()}))


def _cp_url(body) -> dict:
    return {"path": {"checkpoint_id": body["id"]}}


def _set_revision(model, uid, revision: int) -> None:
    assert model.objects.filter(uuid=uid).update(revision=revision) == 1


def cp_revision(w: World, v: int) -> Outcome:
    if not 1 <= v <= MAX63:  # 0 creates; out of range: only the body is wrong
        body = envelope(revision=v)
        return _json(w, "put", CP, body, HTTP_IF_NONE_MATCH="*", **_cp_url(body))
    _set_revision(Checkpoint, w.cp["id"], v - 1)
    body = dict(w.cp, revision=v)
    return _json(w, "put", CP, body, HTTP_IF_MATCH=f'"{v - 1}"', **_cp_url(body))


def cp_if_match(w: World, v: int) -> Outcome:
    if 0 <= v <= MAX63:
        _set_revision(Checkpoint, w.cp["id"], v)
    body = dict(w.cp, revision=min(v + 1, MAX63) if v >= 0 else 1)
    return _json(w, "put", CP, body, HTTP_IF_MATCH=f'"{v}"', **_cp_url(body))


def cp_new(field: str) -> Callable:
    def send(w: World, v: int) -> Outcome:
        body = envelope(**{field: v})
        return _json(w, "put", CP, body, HTTP_IF_NONE_MATCH="*", **_cp_url(body))
    return send


def cp_update(field: str) -> Callable:
    def send(w: World, v: int) -> Outcome:
        body = dict(w.cp, revision=1, **{field: v})
        return _json(w, "put", CP, body, HTTP_IF_MATCH='"0"', **_cp_url(body))
    return send


def cp_payload(w: World, v: int) -> Outcome:
    body = envelope(payload={"phase": "ready", "n": v})
    out = _json(w, "put", CP, body, HTTP_IF_NONE_MATCH="*", **_cp_url(body))
    if out.status == 201:  # integers beyond 2^53 round-trip exactly (CONTRACT.md 6)
        got = w.client.get(CP.format(tenant="acme", checkpoint_id=body["id"]))
        n = json.loads(got.content)["payload"]["n"]
        out.extra = "" if type(n) is int and n == v else f"read back as {n!r}"
    return out


def fencing(kind: str) -> Callable:
    """A write to an existing object carrying ``Fencing-Token: v``; the run's token is
    set to ``v`` first when it can hold it, so an in-range token is the current one."""
    def send(w: World, v: int) -> Outcome:
        run_id = {"cp": w.cp, "fx": w.fx}.get(kind, {}).get("run_id")
        if kind in ("lg", "lgw"):
            run_id = Run.objects.get(tenant=w.tenant, kind="langgraph.checkpoint").uuid
        if 0 <= v <= MAX63:
            Run.objects.filter(uuid=run_id).update(fencing_token=v)
        headers = {"HTTP_FENCING_TOKEN": str(v)}
        if kind == "cp":
            return _json(w, "put", CP, dict(w.cp, revision=1), HTTP_IF_MATCH='"0"',
                         **_cp_url(w.cp), **headers)
        if kind == "fx":
            return _json(w, "put", FX, dict(w.fx, revision=1, state="submitted"),
                         HTTP_IF_MATCH='"0"', path={"effect_id": w.fx["id"]}, **headers)
        if kind == "lg":
            return _json(w, "post", LG, lg_put(w.thread, LG_NEXT, parent=LG_HEAD), **headers)
        return _json(w, "post", LGW, lg_writes(w.thread, LG_HEAD, "task-1", [(0, "a", 1)]),
                     **headers)
    return send


def fx_revision(w: World, v: int) -> Outcome:
    if not 1 <= v <= MAX63:
        body = effect_body(revision=v, operation_key=f"bound:{v}")
        return _json(w, "put", FX, body, HTTP_IF_NONE_MATCH="*", path={"effect_id": body["id"]})
    _set_revision(Effect, w.fx["id"], v - 1)
    return _json(w, "put", FX, dict(w.fx, revision=v, state="submitted"),
                 HTTP_IF_MATCH=f'"{v - 1}"', path={"effect_id": w.fx["id"]})


def fx_if_match(w: World, v: int) -> Outcome:
    if 0 <= v <= MAX63:
        _set_revision(Effect, w.fx["id"], v)
    body = dict(w.fx, revision=min(v + 1, MAX63) if v >= 0 else 1, state="submitted")
    return _json(w, "put", FX, body, HTTP_IF_MATCH=f'"{v}"', path={"effect_id": w.fx["id"]})


def lease(w: World, v: int) -> Outcome:
    return _json(w, "post", T + "runs/{run_id}/lease", {"owner": "bounds", "ttl_s": v},
                 path={"run_id": w.cp["run_id"]})


def resume_usage(w: World, v: int) -> Outcome:
    """A resume claim carrying ``usage.tokens = v`` (the world's run is an acme.order,
    which declares no usage, so any counter in range suits the decision: 200)."""
    return _json(w, "post", T + "runs/{run_id}/resume", {"usage": {"tokens": v}},
                 path={"run_id": w.cp["run_id"]})


def bulk(w: World, v: int) -> Outcome:
    return _json(w, "post", T + "bulk-actions", {"action": "reconcile", "reason": "bounds",
                                                  "client_token": str(uuid.uuid4()),
                                                  "filters": {"age_s_min": v}})


def query(path: str, name: str, method: str = "get", **fixed) -> Callable:
    def send(w: World, v: int) -> Outcome:
        ids = {"checkpoint_id": w.cp["id"]} if "{checkpoint_id}" in path else {}
        return _get(w, method, path, {**fixed, name: v}, **ids)
    return send


PROOF = T + "audit-events/{audit_event_id}/proof"


def _sealed_event(w: World) -> int:
    """An event of the world in a signed tree head (sealed now, before ``sending``)."""
    from checkpoints import services
    from checkpoints.models import AuditEvent

    services.audit_integrate(w.tenant)
    return AuditEvent.objects.for_tenant(w.tenant).order_by("seq").values_list(
        "pk", flat=True).first()


def proof_path(w: World, v: int) -> Outcome:
    return _get(w, "get", PROOF, {}, audit_event_id=str(v))


def proof_tree_size(w: World, v: int) -> Outcome:
    return _get(w, "get", PROOF, {"tree_size": v}, audit_event_id=str(_sealed_event(w)))


def retry_path(action: str) -> Callable:
    def send(w: World, v: int) -> Outcome:
        return _json(w, "post", T + "retry-requests/{retry_id}/" + action, {"reason": "bounds"},
                     path={"retry_id": str(v)})
    return send


def retry_get(w: World, v: int) -> Outcome:
    return _get(w, "get", T + "retry-requests/{retry_id}", {}, retry_id=str(v))


#: A declared kind (issue 19, item 1) and a declaration of it any version takes.
KV = T + "kinds/{kind}/versions/{version}"
DECLARED = "acme.bounds"
DECLARATION = {"schema": {"type": "object"}, "phase": {"pointer": "/state", "stable": ["s"]}}


def kind_version(method: str) -> Callable:
    def send(w: World, v: int) -> Outcome:
        path = {"kind": DECLARED, "version": str(v)}
        if method == "get":
            return _get(w, "get", KV, {}, **path)
        return _json(w, "put", KV, DECLARATION, path=path)
    return send


def migration_job(w: World, v: int) -> Outcome:
    """A stored migration job to ``v``: the kind is declared at ``v`` first when ``v`` can
    be a version, else at 1 (the recipe's preparation), so every version in range is one
    to go to, and only the number is wrong outside it."""
    services.kind_declare(actor=None, tenant=w.tenant, kind=DECLARED,
                          version=v if 0 <= v < 2**32 else 1, body=DECLARATION)
    return _json(w, "post", T + "kinds/{kind}/migrations", {"to_version": v},
                 path={"kind": DECLARED}, HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))


def data_policy(field: str) -> Callable:
    """``PUT …/data-policy`` with ``field`` alone (issue 20): every number in range is a
    policy (the restart interval left at its default of one day, the effect retention is
    never below it), outside the range a 400 naming the field."""
    def send(w: World, v: int) -> Outcome:
        return _json(w, "put", T + "data-policy", {field: v})
    return send


def lg_checkpoint(change: Callable[[dict, int], None]) -> Callable:
    def send(w: World, v: int) -> Outcome:
        body = lg_put("bounds-new-thread", LG_NEXT, values={"a": 1}, nodes=("n",))
        change(body, v)
        return _json(w, "post", LG, body)
    return send


def _lg_v(body, v):
    body["checkpoint"]["v"] = v


def _lg_version(body, v):
    body["checkpoint"]["channel_versions"]["a"] = v


def _lg_seen(body, v):
    body["checkpoint"]["versions_seen"]["n"] = {"a": v}


def _lg_step(body, v):
    body["metadata"]["step"] = v


def _lg_sends(body, v):
    body["sends"] = v  # the saver's count of pending Send packets (issue 17, item 2)


def lg_filter(w: World, v: int) -> Outcome:
    return _get(w, "get", LG, {"thread_id": w.thread, "filter": json.dumps({"step": v})})


def lg_idx(w: World, v: int) -> Outcome:
    return _json(w, "post", LGW, lg_writes(w.thread, LG_HEAD, "task-1", [(v, "a", 1)]))


#: Notification endpoints (issue 21, item 1): a webhook endpoint's numbers.
NE = T + "notification-endpoints"
NE_BODY = {"name": "bounds", "channel": "webhook", "url": "https://hooks.example.com/b",
           "event_types": ["run.needs_review"]}


def endpoint_field(method: str, field: str) -> Callable:
    """``POST …/notification-endpoints`` with ``field`` = v, or ``PATCH`` of an endpoint
    the recipe creates first (its preparation) with ``field`` alone: every number in the
    range is an endpoint's, outside it a 400 naming the field."""
    def send(w: World, v: int) -> Outcome:
        if method == "post":
            return _json(w, "post", NE, {**NE_BODY, field: v})
        made = w.client.post(NE.format(tenant="acme"), data=json.dumps(NE_BODY),
                             content_type="application/json")
        assert made.status_code == 201, made.content
        eid = json.loads(made.content)["endpoint"]["id"]
        return _json(w, "patch", NE + "/{endpoint_id}", {field: v}, path={"endpoint_id": eid})
    return send


FIXTURES = Path(__file__).parent.parent / "fixtures" / "runifold"


def runifold_line(which: str, field: str) -> Callable:
    """One import line with ``field`` = v through ``runifold.runifold_import``: 201 when
    imported, 400 with the line's error otherwise."""
    def send(w: World, v: int) -> Outcome:
        if which == "checkpoint":
            line = json.loads((FIXTURES / "agent.v1.jsonl").read_text().splitlines()[0])
            line["id"] = str(uuid.uuid4())
            line["payload"]["execution_id"] = line["id"]
        else:
            line = json.loads((FIXTURES / "effects.jsonl").read_text().splitlines()[0])
            line["request"]["effect_id"] = str(uuid.uuid4())
            line["request"]["idempotency_key"] = f"bounds:{uuid.uuid4()}"
            line["run_id"] = w.cp["run_id"]
        line[field] = v
        errors: list = []
        w.sending()
        report = runifold.runifold_import(
            actor=None, tenant=w.tenant, lines=jsonl_lines(io.BytesIO(json.dumps(line).encode())),
            on_error=lambda n, d: errors.append(d))
        if report.imported == 1:
            return Outcome(201)
        return Outcome(400, errors[0] if errors else f"nothing imported: {report}")
    return send


def _cas_max(v: int) -> str | None:
    """If-Match "2^63-1" is a revision that can be stored, but none can follow it: the
    tag is refused."""
    return "If-Match" if v == MAX63 else None


def by_subject(route: str) -> Callable[[World, int], Outcome]:
    """A hold or an erasure request for the subject ``customer`` = ``v`` (the field
    declared first, in the recipe's savepoint)."""
    def send(w: World, v: int) -> Outcome:
        DataPolicy.objects.update_or_create(tenant=w.tenant,
                                            defaults={"subject_fields": {"customer": "/c"}})
        return _json(w, "post", T + route, {"subject": {"field": "customer", "value": v},
                                            "reason": "bounds"})
    return send


def revoke_token(w: World, v: int) -> Outcome:
    """End the run's lease naming the token ``v``: the run's own (set to ``v`` when it
    can hold it) is ended, 200 (``MAX63``: another token, 409); out of range, 400 naming
    ``fencing_token``."""
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.get(username="bounds-admin")
    run_id = w.cp["run_id"]
    services.lease_acquire(actor=admin, tenant=w.tenant, run_id=run_id,
                           owner="bounds-owner", ttl_s=600)
    if 0 <= v < MAX63:  # the largest token cannot go up: naming it, the lease is another's
        Run.objects.filter(tenant=w.tenant, uuid=run_id).update(fencing_token=v)
    return _json(w, "post", T + "runs/{run_id}/lease/revoke",
                 {"reason": "bounds", "fencing_token": v}, path={"run_id": run_id})


def release_token(w, v):
    """A writer gives back the lease it holds, with token ``v``: in range, the lease's own
    (the largest cannot go up: naming it, the lease holds another, 409); out of range,
    400 naming ``fencing_token``."""
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.get(username="bounds-admin")
    run_id = w.cp["run_id"]
    services.lease_acquire(actor=admin, tenant=w.tenant, run_id=run_id,
                           owner="bounds-owner", ttl_s=600)
    if 0 <= v < MAX63:
        Run.objects.filter(tenant=w.tenant, uuid=run_id).update(fencing_token=v)
    return _json(w, "post", T + "runs/{run_id}/lease/release",
                 {"owner": "bounds-owner", "fencing_token": v}, path={"run_id": run_id})


RECIPES: dict[Key, Recipe] = {
    ("POST", T + "runs/{run_id}/lease/release", "body", "fencing_token"): Recipe(
        release_token, "fencing_token", ok=(200, 409)),
    ("POST", T + "runs/{run_id}/lease/revoke", "body", "fencing_token"): Recipe(
        revoke_token, "fencing_token", ok=(200, 409)),
    ("POST", T + "legal-holds", "body", "subject.value"): Recipe(
        by_subject("legal-holds"), "subject.value"),
    ("POST", T + "erasure-requests", "body", "subject.value"): Recipe(
        by_subject("erasure-requests"), "subject.value"),
    ("PUT", CP, "body", "revision"): Recipe(cp_revision, "revision"),
    ("PUT", CP, "body", "schema_version"): Recipe(cp_new("schema_version"), "schema_version"),
    ("PUT", CP, "body", "updated_at_ms"): Recipe(cp_new("updated_at_ms"), "updated_at_ms"),
    ("PUT", CP, "body", "payload.n"): Recipe(cp_payload, "payload"),
    ("PUT", CP, "header", "If-Match"): Recipe(cp_if_match, "If-Match", expect=_cas_max),
    ("PUT", CP, "header", "Fencing-Token"): Recipe(fencing("cp"), "Fencing-Token"),
    ("PUT", FX, "body", "revision"): Recipe(fx_revision, "revision"),
    ("PUT", FX, "header", "If-Match"): Recipe(fx_if_match, "If-Match", expect=_cas_max),
    ("PUT", FX, "header", "Fencing-Token"): Recipe(fencing("fx"), "Fencing-Token"),
    ("POST", T + "runs/{run_id}/lease", "body", "ttl_s"): Recipe(lease, "ttl_s"),
    ("POST", T + "runs/{run_id}/resume", "body", "usage.*"): Recipe(resume_usage,
                                                                   "usage.tokens", ok=(200,)),
    # Every run of the world was written just now: a longer quiet time matches none.
    ("POST", T + "bulk-actions", "body", "filters.age_s_min"): Recipe(
        bulk, "filters.age_s_min", expect=lambda v: "filters" if v > 0 else None),
    ("GET", T + "runs", "query", "age_s_min"): Recipe(query(T + "runs", "age_s_min"),
                                                      "age_s_min"),
    ("GET", T + "runs", "query", "limit"): Recipe(query(T + "runs", "limit"), "limit"),
    ("GET", T + "effects", "query", "limit"): Recipe(query(T + "effects", "limit"), "limit"),
    ("GET", T + "audit-events", "query", "before_seq"): Recipe(
        query(T + "audit-events", "before_seq"), "before_seq"),
    ("GET", T + "audit-events", "query", "limit"): Recipe(query(T + "audit-events", "limit"),
                                                          "limit"),
    **{(method.upper(), CP + "/revisions", "query", name): Recipe(
        query(CP + "/revisions", name, method), name)
       for method in ("get", "head") for name in ("cursor", "limit")},
    **{(method.upper(), LG, "query", "limit"): Recipe(query(LG, "limit", method), "limit")
       for method in ("get", "head")},
    ("POST", LG, "header", "Fencing-Token"): Recipe(fencing("lg"), "Fencing-Token"),
    ("POST", LG, "body", "checkpoint.v"): Recipe(lg_checkpoint(_lg_v), "checkpoint.v"),
    ("POST", LG, "body", "checkpoint.channel_versions.*"): Recipe(
        lg_checkpoint(_lg_version), "checkpoint.channel_versions.a"),
    ("POST", LG, "body", "checkpoint.versions_seen.*.*"): Recipe(
        lg_checkpoint(_lg_seen), "checkpoint.versions_seen.n.a"),
    ("POST", LG, "body", "metadata.step"): Recipe(lg_checkpoint(_lg_step), "metadata.step"),
    ("POST", LG, "body", "sends"): Recipe(lg_checkpoint(_lg_sends), "sends"),
    ("GET", LG, "query", "filter.step"): Recipe(lg_filter, "filter"),
    ("POST", LGW, "header", "Fencing-Token"): Recipe(fencing("lgw"), "Fencing-Token"),
    ("POST", LGW, "body", "writes[].idx"): Recipe(lg_idx, "writes[0].idx"),
    # The audit proof (issue 22): an id nobody wrote is 404 (as a malformed one), one of
    # an event not sealed yet 409; a tree size is refused by its value unless a head was
    # signed at it.
    ("GET", PROOF, "path", "audit_event_id"): Recipe(proof_path, "audit_event_id",
                                                      ok=(404, 409)),
    ("GET", PROOF, "query", "tree_size"): Recipe(proof_tree_size, "tree_size",
                                                 expect=lambda v: "tree_size"),
    **{("POST", T + f"retry-requests/{{retry_id}}/{action}", "path", "retry_id"): Recipe(
        retry_path(action), "retry_id", ok=(404,)) for action in ("approve", "reject",
                                                                   "withdraw")},
    # The approvers' queue: a request nobody filed is 404 whatever the number (as a
    # malformed id); the list's keyset cursor and page size, each alone.
    ("GET", T + "retry-requests/{retry_id}", "path", "retry_id"): Recipe(
        retry_get, "retry_id", ok=(404,)),
    **{("GET", T + "retry-requests", "query", name): Recipe(
        query(T + "retry-requests", name), name) for name in ("cursor", "limit")},
    # The bulk actions' list: its keyset cursor and page size, each alone.
    **{("GET", T + "bulk-actions", "query", name): Recipe(
        query(T + "bulk-actions", name), name) for name in ("cursor", "limit")},
    # Declared kinds and migration jobs (issue 19): a GET of a version nobody declared is
    # 404 whatever the number (as a malformed id); the PUT declares it.
    ("GET", KV, "path", "version"): Recipe(kind_version("get"), "version", ok=(404,)),
    ("PUT", KV, "path", "version"): Recipe(kind_version("put"), "version"),
    ("POST", T + "kinds/{kind}/migrations", "body", "to_version"): Recipe(
        migration_job, "to_version", ok=(202,)),
    # The data policy (issue 20): each number alone.
    **{("PUT", T + "data-policy", "body", name): Recipe(data_policy(name), name)
       for name in ("payload_retention_days", "effect_retention_days", "restart_interval_s",
                    "tombstone_retention_days", "payload_flag_bytes")},
    # The tombstones' keyset page (issue 20, item 5): a cursor and a page size.
    **{("GET", T + "tombstones", "query", name): Recipe(query(T + "tombstones", name), name)
       for name in ("after", "limit")},
    # Notification endpoints (issue 21): each number alone, on a create and a change.
    **{(method.upper(), NE + ("/{endpoint_id}" if method == "patch" else ""), "body", name):
       Recipe(endpoint_field(method, name), name)
       for method in ("post", "patch") for name in ("group_window_s", "quiet_period_s")},
    # The fixture line is runifold.agent v1 (the only version of that kind), and a
    # completed effect record at least revision 2 (RUNIFOLD.md 4).
    **{("IMPORT", RUNIFOLD, "checkpoint", name): Recipe(
        runifold_line("checkpoint", name), name,
        expect=(lambda v: None if v == 1 else "schema_version") if name == "schema_version"
        else lambda v: None)
       for name in envelope_integers()},
    ("IMPORT", RUNIFOLD, "effect", "revision"): Recipe(
        runifold_line("effect", "revision"), "revision",
        expect=lambda v: "status.state" if v < 2 else None),
}

#: The same field on an existing run: a checkpoint update writes it to the run again.
VARIANTS: dict[str, tuple[Key, Recipe]] = {
    "schema_version on an existing run": (
        ("PUT", CP, "body", "schema_version"),
        Recipe(cp_update("schema_version"), "schema_version")),
    "updated_at_ms on an existing run": (
        ("PUT", CP, "body", "updated_at_ms"),
        Recipe(cp_update("updated_at_ms"), "updated_at_ms")),
}


def values_for(bounds: tuple) -> list[int]:
    lo, hi = bounds
    extra = [x for x in (lo, hi) if x is not None]
    extra += [lo - 1] if lo is not None else []
    extra += [hi + 1] if hi is not None else []
    if lo is None or lo < 0:
        extra += [-(2**31), -(2**31) - 1, -(2**63), -(2**63) - 1]
    return sorted(set(BASE_VALUES) | set(extra))


def expected(recipe: Recipe, bounds: tuple, v: int) -> tuple[str, str | None]:
    """("ok", None), or ("refused", the field the 400 names)."""
    lo, hi = bounds
    if set(recipe.ok) <= {404, 409}:  # a path id: unknown or out of range, it is a 404
        return "ok", None
    inside = (lo is None or v >= lo) and (hi is None or v <= hi)
    if not inside:
        return "refused", recipe.label
    named = recipe.expect(v)
    return ("refused", named) if named else ("ok", None)


# --------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------

def _headers_read() -> set[str]:
    from checkpoints.api import views

    source = "".join(module.read_text() for module in Path(views.__file__).parent.glob("*.py"))
    names = set(re.findall(r'"HTTP_([A-Z_]+)"', source)) | {"CONTENT_LENGTH"}
    return {"-".join(part.capitalize() for part in n.split("_")) for n in names}


def test_every_integer_input_has_a_recipe():
    found = set(all_integers())
    assert sorted(found - set(RECIPES)) == [], "integer inputs without a recipe"
    assert sorted(set(RECIPES) - found) == [], "recipes of no integer input"
    int_headers = {k[3] for k in found if k[2] == "header"}
    unclassified = _headers_read() - int_headers - set(OTHER_HEADERS) - {"Authorization"}
    assert sorted(unclassified) == [], "headers the API reads, neither an integer nor listed"


def test_every_integer_documents_its_range():
    open_ended = {k for k, (lo, hi) in EXTRA.items() if lo is None and hi is None}
    missing = [k for k, (lo, hi) in all_integers().items()
               if k not in open_ended and (lo is None or hi is None)]
    assert missing == [], "integer inputs whose schema gives no minimum or maximum"


CASES = [pytest.param(key, RECIPES[key], id=f"{key[0]} {key[1]} {key[2]}:{key[3]}")
         for key in sorted(RECIPES)] + [
    pytest.param(key, recipe, id=name) for name, (key, recipe) in VARIANTS.items()]
TABLE: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _write_table():
    yield
    target = Path(os.environ.get("RECOVERY_VAR_DIR", "var")) / "integer-bounds.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(TABLE) + "\n")


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> World:
    """One tenant for the module (built once, in a transaction rolled back at the end;
    each test runs in a savepoint of it): an admin's bearer client, a checkpoint and an
    effect at revision 0 on one run, a LangGraph thread with one checkpoint."""
    from tests.conftest import bearer_client
    from tests.helpers import graph_put, put_checkpoint, put_effect

    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            acme = services.tenant_create(slug="acme", name="Acme Corp")
            adam = services.account_create(username="bounds-admin", service=True)
            services.role_grant(actor=None, tenant=acme, user=adam, role="admin")
            cp = envelope()
            put_checkpoint(adam, acme, cp)
            fx = effect_body(run_id=cp["run_id"])
            put_effect(adam, acme, fx)
            graph_put(adam, acme, lg_put("bounds-thread", LG_HEAD, values={"a": 1}))
            yield World(acme, bearer_client(adam), cp, fx, "bounds-thread")
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


@pytest.mark.django_db
@pytest.mark.parametrize(("key", "recipe"), CASES)
def test_boundary_row(world, key, recipe):
    bounds = all_integers()[key]
    problems, row = [], []
    for v in values_for(bounds):
        want, field = expected(recipe, bounds, v)
        sid = transaction.savepoint()
        world.watch, world.before = want == "refused", None
        try:
            try:
                out = recipe.send(world, v)
            except Exception as exc:  # noqa: BLE001 - a 500 in the test client
                out = Outcome(500, f"{type(exc).__name__}: {exc}"[:200])
            changed = changes(world.before, snapshot()) if world.before is not None else {}
        finally:
            transaction.savepoint_rollback(sid)
        row.append(f"{v}:{out.status}")
        if want == "ok":
            good = out.status in recipe.ok and not out.extra
        else:
            named = key[0] == "HEAD" or out.detail.startswith(f"{field}:")
            good = out.status == 400 and named and not changed
        if not good:
            problems.append(f"{v}: want {want} {field or ''} got {out.status} {out.detail!r} "
                            f"{out.extra} {changed or ''}".rstrip())
    TABLE.append(f"{' '.join(key)} [{bounds[0]}..{bounds[1]}]: {' '.join(row)}")
    assert not problems, "\n".join(problems)
