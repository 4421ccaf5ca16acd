"""Who may call what: every API path as another tenant's accounts (404, nothing changes),
unauthenticated (401), session without CSRF (403), and the role matrix of CONTRACT.md 4."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint, NotificationMessage
from checkpoints.vocab import DeliveryState
from tests import contract_tables
from tests.api.apihelpers import new_checkpoint, post, put_cp, snapshot, url, walk
from tests.helpers import effect_body, envelope, sweep_later


@dataclass
class World:
    """acme objects: run ``rid`` (checkpoint ``cid`` in flight, a conflict, retry request
    ``retry`` by rita, then effect ``eid`` submitted), run ``rid2`` (stable, effect ``eid2``
    unresolved after the sweep, nothing open) and run ``rid3`` (in flight, owner gone:
    ambiguous with no effect, so a retry may be requested)."""

    rid: str
    cid: str
    eid: str
    retry: int
    rid2: str
    eid2: str
    rid3: str
    migration: str = ""  # a stored migration job (issue 19, item 2), by an admin
    hold: str = ""       # an active legal hold (issue 20), placed by that admin
    erasure: str = ""    # an erasure request of run ``rid2`` by rita, not decided
    endpoint: str = ""   # a webhook endpoint (issue 21), by that admin
    event: str = ""      # a failed message of it (so it may be resent)
    audit: int = 0       # an audit event in a signed tree head (issue 22): its proof


@pytest.fixture
def world(api_as, wendy, rita, acme, django_user_model) -> World:
    w = api_as(wendy)
    cp = new_checkpoint(w, "acme", payload={"phase": "charging"})
    put_cp(w, "acme", cp, create=True)  # refused: a conflict on the run
    sweep_later()  # its owner is gone: ambiguous, so rita may ask for a retry
    retry = post(api_as(rita), "acme", f"runs/{cp['run_id']}/retry-requests", {"reason": "x"})
    assert retry.status_code == 201, retry.content
    fx = effect_body(run_id=cp["run_id"])
    walk(w, "acme", fx, "submitted")
    cp2 = new_checkpoint(w, "acme")
    fx2 = effect_body(run_id=cp2["run_id"], operation_key="charge:B")
    walk(w, "acme", fx2, "submitted")
    cp3 = new_checkpoint(w, "acme", payload={"phase": "charging"})
    sweep_later()
    owner = django_user_model.objects.create_user("migration-owner")
    services.role_grant(actor=None, tenant=acme, user=owner, role="admin")
    job, _ = services.migration_job_submit(actor=owner, tenant=acme, kind="acme.order",
                                           to_version=2, client_token=uuid.uuid4())
    hold = services.legal_hold_place(actor=owner, tenant=acme, runs=[cp3["run_id"]],
                                     reason="case")
    erasure = services.erasure_request(actor=rita, tenant=acme, runs=[cp2["run_id"]],
                                       reason="art. 17")
    endpoint, _secret = services.endpoint_create(actor=owner, tenant=acme, body=ENDPOINT)
    message = services.notification_test(actor=owner, tenant=acme, endpoint_id=endpoint.uuid)
    NotificationMessage.objects.filter(pk=message.pk).update(state=DeliveryState.FAILED)
    services.audit_integrate(acme)
    audit = AuditEvent.objects.filter(tenant=acme).order_by("seq").first().pk
    return World(cp["run_id"], cp["id"], fx["id"], retry.json()["id"], cp2["run_id"], fx2["id"],
                 cp3["run_id"], str(job.uuid), str(hold.uuid), str(erasure.uuid),
                 str(endpoint.uuid), message.event_id, audit)


# name -> (method, path, body builder or None, headers, success status)
def _new_cp(wd):
    return envelope(run_id=wd.rid2)


def _cp_update(wd):
    return envelope(checkpoint_id=wd.cid, run_id=wd.rid, revision=1)


def _new_fx(wd):
    return effect_body(run_id=wd.rid2, operation_key="charge:C")


def _bulk(wd):
    return {"action": "acknowledge_conflicts", "reason": "because", "runs": [wd.rid]}


REASON = {"reason": "because"}
ENDPOINT = {"name": "ops", "channel": "webhook", "url": "https://hooks.example.com/in",
            "event_types": ["run.needs_review"]}
NE = "notification-endpoints"
OPS = {
    "checkpoint_create": ("put", "checkpoints/{new}", _new_cp, {"HTTP_IF_NONE_MATCH": "*"}, 201),
    "checkpoint_update": ("put", "checkpoints/{cid}", _cp_update, {"HTTP_IF_MATCH": '"0"'}, 200),
    "checkpoint_get": ("get", "checkpoints/{cid}", None, {}, 200),
    "checkpoint_revisions": ("get", "checkpoints/{cid}/revisions", None, {}, 200),
    "effect_create": ("put", "effects/{new}", _new_fx, {"HTTP_IF_NONE_MATCH": "*"}, 201),
    "effect_list": ("get", "effects?service=payments&operation_key=charge:A-1042", None, {}, 200),
    "effect_get": ("get", "effects/{eid}", None, {}, 200),
    "effect_mark_unknown": ("post", "effects/{eid2}/mark-unknown", REASON, {}, 200),
    "run_list": ("get", "runs?recovery_state=awaiting_approval", None, {}, 200),
    "run_get": ("get", "runs/{rid}", None, {}, 200),
    "run_lease": ("post", "runs/{rid2}/lease", {"owner": "w9", "ttl_s": 30}, {}, 200),
    "run_resume": ("get", "runs/{rid2}/resume", None, {}, 200),
    "run_resume_claim": ("post", "runs/{rid2}/resume", {}, {}, 200),
    "retry_request": ("post", "runs/{rid3}/retry-requests", REASON, {}, 201),
    "retry_approve": ("post", "retry-requests/{retry}/approve", REASON, {}, 200),
    "retry_reject": ("post", "retry-requests/{retry}/reject", REASON, {}, 200),
    "run_reconcile": ("post", "runs/{rid2}/reconcile", REASON, {}, 202),
    "conflicts_acknowledge": ("post", "runs/{rid}/conflicts/acknowledge", REASON, {}, 200),
    "run_close": ("post", "runs/{rid2}/close", REASON, {}, 200),
    "retry_withdraw": ("post", "retry-requests/{retry}/withdraw", REASON, {}, 200),
    # The approvers' queue (the dashboard's Approvals page, its right: approver, admin).
    "retry_request_list": ("get", "retry-requests", None, {}, 200),
    "retry_request_get": ("get", "retry-requests/{retry}", None, {}, 200),
    "effect_reveal_receipt": ("post", "effects/{eid}/reveal-receipt", REASON, {}, 200),
    "bulk_action": ("post", "bulk-actions", _bulk, {"HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4())},
                    201),
    "audit_events": ("get", "audit-events?run={rid}", None, {}, 200),
    # CONTRACT.md 8 (issue 22): an event's inclusion proof, viewer and up.
    "audit_event_proof": ("get", "audit-events/{audit}/proof", None, {}, 200),
    "report": ("get", "report", None, {}, 200),
    "kind_list": ("get", "kinds", None, {}, 200),
    # CONTRACT.md 8 (issue 19, item 2): the tenant admin's; a job is read by any role.
    "kind_migration_preview": ("post", "kinds/acme.order/migrations",
                               {"to_version": 2, "dry_run": True}, {}, 200),
    "kind_migration_create": ("post", "kinds/acme.order/migrations", {"to_version": 2},
                              {"HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4())}, 202),
    "kind_migration_get": ("get", "kinds/acme.order/migrations/{migration}", None, {}, 200),
    # CONTRACT.md 8 (issue 20): legal holds are the admin's; erasure requests a reviewer's
    # or admin's, decided by an approver (or admin) who did not file them; all read by any
    # role.
    "legal_hold_list": ("get", "legal-holds", None, {}, 200),
    "legal_hold_get": ("get", "legal-holds/{hold}", None, {}, 200),
    "legal_hold_place": ("post", "legal-holds", {"tenant": True, "reason": "because"}, {},
                         201),
    "legal_hold_release": ("post", "legal-holds/{hold}/release", REASON, {}, 200),
    "erasure_request_list": ("get", "erasure-requests", None, {}, 200),
    "erasure_request_get": ("get", "erasure-requests/{erasure}", None, {}, 200),
    "erasure_request_create": ("post", "erasure-requests",
                               lambda wd: {"runs": [wd.rid2], "reason": "because"}, {}, 201),
    "erasure_approve": ("post", "erasure-requests/{erasure}/approve", {}, {}, 200),
    "erasure_reject": ("post", "erasure-requests/{erasure}/reject", REASON, {}, 200),
    # CONTRACT.md 8 (issue 21): endpoints and their delivery log are read by every role
    # (without URL or secret below the admin: tests/notifications/test_api.py); the rest
    # is the admin's.
    "notification_endpoint_list": ("get", NE, None, {}, 200),
    "notification_endpoint_create": ("post", NE, dict(ENDPOINT, name="second"), {}, 201),
    "notification_endpoint_get": ("get", NE + "/{endpoint}", None, {}, 200),
    "notification_endpoint_update": ("patch", NE + "/{endpoint}", {"name": "renamed"}, {},
                                     200),
    "notification_endpoint_delete": ("delete", NE + "/{endpoint}", None, {}, 204),
    "notification_endpoint_rotate": ("post", NE + "/{endpoint}/rotate-secret", {}, {}, 200),
    "notification_endpoint_test": ("post", NE + "/{endpoint}/test", {}, {}, 202),
    "notification_deliveries": ("get", NE + "/{endpoint}/deliveries", None, {}, 200),
    "notification_resend": ("post", NE + "/{endpoint}/deliveries/{event}/resend", {}, {},
                            202),
}
# CONTRACT.md 4's roles table says what each role "may" in phrases; this is what each
# phrase means in API operations. A phrase missing here (CONTRACT.md changed) fails
# test_every_phrase_of_the_roles_table_means_something.
PHRASE_OPS = {
    "see runs": {"run_list", "run_get"},
    "metadata": {"effect_list", "effect_get", "kind_list"},
    "reports": {"report"},
    "audit": {"audit_events"},
    "reveal payloads": {"checkpoint_get", "checkpoint_revisions"},
    "request retry": {"retry_request"},
    "mark unknown": {"effect_mark_unknown"},
    "reconcile": {"run_reconcile"},
    "acknowledge": {"conflicts_acknowledge"},
    # Reading the queue of requests to decide is the same right (the Approvals page's).
    "approve or reject others' retry requests": {"retry_approve", "retry_reject",
                                                 "retry_request_list", "retry_request_get"},
    "write checkpoints and effects": {"checkpoint_create", "checkpoint_update",
                                      "effect_create"},
    "take leases": {"run_lease"},
    "ask resume decisions": {"run_resume", "run_resume_claim"},
    "grant roles in it": set(),  # no API path: services.role_grant (tests/test_roles.py)
}
# CONTRACT.md 8's lifecycle table (not parsed by contract_tables): what only the admin may
# ("admin" in its who column), and what every role may read.
SECTION_8_ADMIN = {"kind_migration_preview", "kind_migration_create", "legal_hold_place",
                   "legal_hold_release", "notification_endpoint_create",
                   "notification_endpoint_update", "notification_endpoint_delete",
                   "notification_endpoint_rotate", "notification_endpoint_test",
                   "notification_resend"}
SECTION_8_ANY_ROLE = {"kind_migration_get", "legal_hold_list", "legal_hold_get",
                      "erasure_request_list", "erasure_request_get",
                      "notification_endpoint_list", "notification_endpoint_get",
                      "notification_deliveries", "audit_event_proof"}
# "reviewer or admin" and "approver, never the requester" (the world's request is rita's).
SECTION_8_BY_ROLE = {"reviewer": {"erasure_request_create"},
                     "approver": {"erasure_approve", "erasure_reject"},
                     "admin": {"erasure_request_create", "erasure_approve", "erasure_reject"}}
# Where the code gives a role more than CONTRACT.md 4 says, and why (report to the team).
ROLES_BEYOND_CONTRACT = {
    # The writer is a runtime's account: docs/security/access.md and the README give it
    # the viewer's reads (the runtime client's list_runs, and GET …/effects to find the
    # effect an operation_exists names, CONTRACT.md 3) and an audited read of its own
    # checkpoints (payload.read) to resume from, and the kinds list (GET …/kinds, metadata
    # as the effects are); CONTRACT.md 4's writer row lists writes, leases and resume
    # decisions only.
    "writer": {"run_list", "run_get", "effect_list", "effect_get", "report", "audit_events",
               "checkpoint_get", "checkpoint_revisions", "kind_list"},
}


def _holds(role: contract_tables.Role, action: contract_tables.Request) -> bool:
    """Whether ``role`` is the review table's "who": a role it lists ("reviewer, approver,
    admin"), or a role whose rights include all of the first one's ("reviewer": the admin
    too; "viewer and up": every role that says "viewer + ..." and the admin)."""
    if role.name in action.extra["roles"]:
        return True
    other = contract_tables.roles()[action.extra["who"]]
    return other.rights <= role.rights


def _op_of(method: str, path: str) -> set[str]:
    """The OPS entries for a CONTRACT request (path parameters written ``{}``)."""
    return {name for name, (m, p, *_rest) in OPS.items()
            if m == method.lower() and contract_tables.normalise_path(p)[0] == path}


def _allowed_by_contract() -> dict[str, set[str]]:
    allowed: dict[str, set[str]] = {}
    for name, role in contract_tables.roles().items():
        ops = set().union(*(PHRASE_OPS[phrase] for phrase in role.rights))
        for action in contract_tables.review_actions():
            if _holds(role, action):
                ops |= _op_of(action.method, action.path)
        allowed[name] = ops
    return allowed


# "reviewer who requested it" (withdraw): of the personas holding the reviewer's rights only
# rita requested the world's retry, so for the others it is 403 (not the requester).
REQUESTER_ONLY = {name for action in contract_tables.review_actions()
                  if action.extra["requester_only"]
                  for name in _op_of(action.method, action.path)}
ALLOWED = {role: (ops | ROLES_BEYOND_CONTRACT.get(role, set()) | SECTION_8_ANY_ROLE
                 | (SECTION_8_ADMIN if role == "admin" else set())
                 | SECTION_8_BY_ROLE.get(role, set()))
           - (REQUESTER_ONLY if role != "reviewer" else set())
           for role, ops in _allowed_by_contract().items()}
PERSONA = {"viewer": "vic", "reviewer": "rita", "approver": "april", "writer": "wendy",
           "admin": "adam"}


def call(client, tenant: str, name: str, wd: World, *, ids: dict | None = None):
    """Perform operation ``name`` on ``tenant`` against the world's objects."""
    method, path, body, headers, _ = OPS[name]
    built = body(wd) if callable(body) else body
    new = built["id"] if isinstance(built, dict) and "id" in built else str(uuid.uuid4())
    values = {"new": new, **vars(wd), **(ids or {})}
    target = url(tenant, path.format(**values))
    if method == "get":
        return client.get(target)
    return getattr(client, method)(target, data=json.dumps(built), content_type="application/json",
                                   **headers)


@pytest.mark.parametrize("who", ["omar", "wes"])
def test_it_answers_404_on_every_path_to_another_tenants_account_and_changes_nothing(
        request, api_as, world, who):
    client = api_as(request.getfixturevalue(who))
    missing = {k: str(uuid.uuid4()) for k in ("rid", "cid", "eid", "rid2", "eid2", "rid3")}
    missing["retry"] = 987654
    missing["migration"] = str(uuid.uuid4())
    missing["hold"] = missing["erasure"] = missing["endpoint"] = str(uuid.uuid4())
    missing["event"] = "msg_" + uuid.uuid4().hex
    missing["audit"] = 987654321
    before = snapshot()
    for name in OPS:
        r = call(client, "acme", name, world)
        assert r.status_code == 404, (name, r.content)
        assert r.json() == {"error": "not_found", "detail": "no tenant 'acme'"}, name
        # Existing and absent objects are indistinguishable.
        assert call(client, "acme", name, world, ids=missing).json() == r.json(), name
        # ... and so is a tenant that does not exist at all.
        r = call(client, "no-such-tenant", name, world)
        assert r.status_code == 404
        assert r.json() == {"error": "not_found", "detail": "no tenant 'no-such-tenant'"}
    assert snapshot() == before


def test_it_keeps_the_same_uuid_in_two_tenants_apart(api_as, world, wes, omar):
    body = envelope(checkpoint_id=world.cid, run_id=world.rid, payload={"phase": "ready"})
    assert put_cp(api_as(wes), "globex", body, create=True).status_code == 201
    assert Checkpoint.objects.filter(uuid=world.cid).count() == 2
    r = api_as(omar).get(url("globex", f"checkpoints/{world.cid}"))
    assert r.json()["payload"] == {"phase": "ready"}
    r = api_as(omar).get(url("globex", f"runs/{world.rid}"))
    assert r.status_code == 200 and r.json()["open_review_items"]["retry_request"] is None


def test_it_answers_401_on_every_path_without_credentials(world):
    anonymous = APIClient()
    for name in OPS:
        r = call(anonymous, "acme", name, world)
        assert r.status_code == 401, name
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer rcv_not-a-token")
    assert call(bad, "acme", "run_list", world).status_code == 401


def test_it_enforces_csrf_on_session_writes(world, adam):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(adam)
    for name, (method, *_rest) in OPS.items():
        before = snapshot()
        r = call(client, "acme", name, world)
        if method == "get":
            assert r.status_code == 200, name  # reads need no token (and may audit a reveal)
        else:
            assert r.status_code == 403, name
            assert "CSRF" in json.dumps(r.json())
            assert snapshot() == before
    token = get_random_string(32)
    client.cookies["csrftoken"] = token
    client.credentials(HTTP_X_CSRFTOKEN=token)
    assert call(client, "acme", "retry_request", world).status_code == 201


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("role", list(PERSONA))
def test_it_gives_each_role_exactly_its_rights(request, api_as, world, role, name):
    client = api_as(request.getfixturevalue(PERSONA[role]))
    before = snapshot()
    r = call(client, "acme", name, world)
    if name in ALLOWED[role]:
        assert r.status_code == OPS[name][4], (role, name, r.content)
    else:
        assert r.status_code == 403, (role, name, r.content)
        assert r.json()["error"] == "forbidden"
        assert snapshot() == before


def test_every_request_of_the_contract_has_an_operation_here():
    for request in contract_tables.api_requests():
        assert _op_of(request.method, request.path), request.text


def test_every_phrase_of_the_roles_table_means_something():
    phrases = set().union(*(r.rights for r in contract_tables.roles().values()))
    assert phrases == set(PHRASE_OPS)
    # "not payloads": a role that says so reads no payload.
    for role in contract_tables.roles().values():
        if "payloads" in role.denied:
            assert not ALLOWED[role.name] & PHRASE_OPS["reveal payloads"], role.name


def test_every_exception_is_outside_the_contract():
    by_contract = _allowed_by_contract()
    for role, ops in ROLES_BEYOND_CONTRACT.items():
        assert ops and not ops & by_contract[role], role


# `once`, not `matrix` (stop 40): database-independent, so make test runs it in the SQLite pass,
# which had time to spare; the PostgreSQL pass was the longer.
pytestmark = pytest.mark.once
