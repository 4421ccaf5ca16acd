"""The OpenAPI schema at /api/schema/ generates cleanly and documents every request of
CONTRACT.md section 3 (read from docs/CONTRACT.md) with its methods, status codes and
query parameters, and nothing else but the named extras."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator

from tests import contract_tables

PREFIX = "/api/v1/tenants/{tenant}/"

# Operations the schema documents beyond CONTRACT.md 3, and why.
BEYOND_CONTRACT = {
    # Receipts are treated like payloads (CONTRACT.md 4), so roles that may reveal read
    # one through this audited reveal (issue 6; docs/security/access.md).
    ("POST", "effects/{}/reveal-receipt"): "audited receipt reveal",
    # An effect by id, as a checkpoint by id (the runtime client reads one back).
    ("GET", "effects/{}"): "read one effect",
    # The dashboard's report as JSON ("see ... reports", CONTRACT.md 4).
    ("GET", "report"): "the report",
    # CONTRACT.md 8 (lifecycle): the kinds in use and the registry's, for a viewer
    # (docs/kinds.md); a declared version read back, the declaration, the migration jobs.
    ("GET", "kinds"): "the tenant's kinds and schema versions",
    ("GET", "kinds/{}/versions/{}"): "a declared kind version",
    ("PUT", "kinds/{}/versions/{}"): "CONTRACT.md 8: declare a kind version",
    ("POST", "kinds/{}/migrations"): "CONTRACT.md 8: a migration job (202) or its preview",
    ("GET", "kinds/{}/migrations/{}"): "a migration job and its per-checkpoint results",
    # CONTRACT.md 8 (lifecycle, issue 20 items 2 and 4): legal holds and erasure
    # requests, filed, decided and read back.
    ("POST", "legal-holds"): "CONTRACT.md 8: place a legal hold",
    # Notifications (issue 21; CONTRACT.md 8 names the CRUD and the deliveries).
    ("GET", "notification-endpoints"): "CONTRACT.md 8: the tenant's endpoints",
    ("POST", "notification-endpoints"): "CONTRACT.md 8: add an endpoint",
    ("GET", "notification-endpoints/{}"): "CONTRACT.md 8: one endpoint",
    ("PATCH", "notification-endpoints/{}"): "CONTRACT.md 8: change an endpoint",
    ("DELETE", "notification-endpoints/{}"): "CONTRACT.md 8: delete an endpoint",
    ("GET", "notification-endpoints/{}/deliveries"): "CONTRACT.md 8: the delivery log",
    ("POST", "notification-endpoints/{}/rotate-secret"): "issue 21: rotate the secret",
    ("POST", "notification-endpoints/{}/test"): "issue 21: send a test event",
    ("POST", "notification-endpoints/{}/deliveries/{}/resend"): "issue 21: resend",
    ("GET", "legal-holds"): "the tenant's legal holds",
    ("GET", "legal-holds/{}"): "one legal hold",
    ("POST", "legal-holds/{}/release"): "CONTRACT.md 8: release a legal hold",
    ("POST", "erasure-requests"): "CONTRACT.md 8: file an erasure request",
    ("GET", "erasure-requests"): "the tenant's erasure requests",
    ("GET", "erasure-requests/{}"): "one erasure request",
    ("POST", "erasure-requests/{}/approve"): "CONTRACT.md 8: approve (and execute) one",
    ("POST", "erasure-requests/{}/reject"): "CONTRACT.md 8: reject one",
    # The GETs that reveal payloads (audited), without their bodies: the current revision
    # (ETag) without a reveal, so without an audit event (issue 8).
    ("HEAD", "checkpoints/{}"): "the current revision, unaudited",
    ("HEAD", "checkpoints/{}/revisions"): "the GET's status, unaudited",
    # A reviewer withdraws their own open retry request (issue 9); the reviewer's rights of
    # CONTRACT.md 4 ("request retry") cover taking one's own request back.
    ("POST", "retry-requests/{}/withdraw"): "withdraw your own retry request",
    # The approvers' queue, the dashboard's Approvals page over the API (issue 21, item
    # 9): CONTRACT.md 4's approver reads what the page shows (their decisions: above).
    ("GET", "retry-requests"): "the approvers' queue of retry requests",
    ("GET", "retry-requests/{}"): "one retry request, as the queue shows it",
    # A reviewer ends a dead owner's live lease (CONTRACT.md 3's fencing makes it safe;
    # the review right of CONTRACT.md 4, a reason as for every action).
    ("POST", "runs/{}/lease/revoke"): "end a dead owner's lease",
    # The runtime holding a lease gives it back (stop 39): CONTRACT.md 4's writer takes
    # leases, and gives them back; fenced as a revoke.
    ("POST", "runs/{}/lease/release"): "a runtime gives back its lease",
    # One review action on many runs, and its per-run results (issue 9, item 3).
    ("POST", "bulk-actions"): "bulk review action",
    ("GET", "bulk-actions/{}"): "a bulk action's results",
    # Their list, to find one again (stop 39; a newcomer's finding).
    ("GET", "bulk-actions"): "the tenant's bulk actions",
    # A bulk action beyond 500 runs runs as a stored job a reviewer may stop (issue 22,
    # item 6): the review right of CONTRACT.md 4, a reason as for every action (3).
    ("POST", "bulk-actions/{}/abort"): "abort a bulk job",
    # CONTRACT.md 8 (lifecycle): the tenant's data policy (issue 20; docs/security/retention.md).
    ("GET", "data-policy"): "CONTRACT.md 8: the data policy, for a viewer",
    ("PUT", "data-policy"): "CONTRACT.md 8: set the data policy (admin)",
    # CONTRACT.md 8: an audit event's inclusion proof under a signed tree head (issue 22).
    ("GET", "audit-events/{}/proof"): "CONTRACT.md 8: an audit event's inclusion proof",
    # LangGraph threads (issue 10, docs/langgraph.md): the saver's operations.
    ("POST", "langgraph/checkpoints"): "LangGraph put",
    ("GET", "langgraph/checkpoints"): "LangGraph get_tuple and list (audited read)",
    ("HEAD", "langgraph/checkpoints"): "LangGraph list without its body (not audited)",
    ("POST", "langgraph/writes"): "LangGraph put_writes",
    ("POST", "langgraph/threads/delete"): "LangGraph delete_thread",
    ("POST", "langgraph/threads/copy"): "LangGraph copy_thread",
    ("POST", "langgraph/threads/prune"): "LangGraph prune",
    ("POST", "langgraph/runs/delete"): "LangGraph delete_for_runs",
    # Tombstone governance (issue 20, item 5; RUNIFOLD.md 5): the tombstones by cursor and
    # the four-eyes purge of tombstones (prepare, approve or reject, execute).
    ("GET", "tombstones"): "the tenant's tombstones by cursor",
    ("GET", "tombstone-purges"): "the tenant's tombstone purges",
    ("POST", "tombstone-purges"): "prepare a tombstone purge",
    ("GET", "tombstone-purges/{}"): "a tombstone purge and its evidence",
    ("POST", "tombstone-purges/{}/approve"): "approve a tombstone purge (four eyes)",
    ("POST", "tombstone-purges/{}/reject"): "reject a tombstone purge",
    ("POST", "tombstone-purges/{}/execute"): "execute an approved tombstone purge",
}
# Status codes CONTRACT.md 3 gives in prose, for groups of requests.
EVERY_REQUEST = {403, 404}  # "a role that lacks the right ... 403"; no role: 404
PUT_PROSE = {400, 409, 413}  # bad precondition or body 400; fenced 409; over the limit 413
REVIEW_PROSE = {400}  # "A reason is required (400 without one)"


def _contract() -> dict[tuple[str, str], dict]:
    """(METHOD, path with ``{}`` parameters) -> {"statuses", "query"} from CONTRACT.md 3."""
    ops: dict[tuple[str, str], dict] = {}
    for r in contract_tables.api_requests():
        op = ops.setdefault((r.method, r.path), {"statuses": set(EVERY_REQUEST), "query": set()})
        op["statuses"] |= r.statuses
        op["query"] |= set(r.query)
    for request, _meaning, _answers in contract_tables.checkpoint_cas():
        if request.path is None:  # "PUT without either header": every PUT
            for (method, _path), op in ops.items():
                if method == request.method:
                    op["statuses"] |= request.statuses
    # "PUT …/effects/{id} with the same conditional headers and answers as checkpoints."
    ops[("PUT", "effects/{}")]["statuses"] |= ops[("PUT", "checkpoints/{}")]["statuses"]
    for (method, _path), op in ops.items():
        if method == "PUT":
            op["statuses"] |= PUT_PROSE
    for action in contract_tables.review_actions():
        if action.method == "POST":
            ops[(action.method, action.path)]["statuses"] |= REVIEW_PROSE
    return ops


def _schema() -> dict[tuple[str, str], dict]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    out = {}
    for path, operations in schema["paths"].items():
        if not path.startswith(PREFIX):
            continue
        for method, operation in operations.items():
            if method == "parameters":
                continue
            out[(method.upper(), contract_tables.normalise_path(path)[0])] = operation
    return out


def test_it_serves_the_schema(client, vic):
    client.force_login(vic)  # the schema needs an account (tests/api/test_hardening.py)
    r = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    assert "/api/v1/tenants/{tenant}/checkpoints/{checkpoint_id}" in r.json()["paths"]


def test_it_documents_every_contract_request_and_no_other():
    assert set(_schema()) == set(_contract()) | set(BEYOND_CONTRACT)


def test_it_documents_every_status_and_query_parameter_the_contract_gives():
    schema = _schema()
    for key, op in _contract().items():
        documented = {int(code) for code in schema[key]["responses"]}
        assert op["statuses"] <= documented, (key, sorted(op["statuses"] - documented))
        params = {p["name"] for p in schema[key].get("parameters", []) if p["in"] == "query"}
        assert op["query"] <= params, (key, sorted(op["query"] - params))


def test_it_generates_without_warnings_and_validates(tmp_path):
    """``--fail-on-warn`` raises on any generator warning; ``--validate`` checks OpenAPI 3."""
    try:
        call_command("spectacular", "--fail-on-warn", "--validate",
                     "--file", str(tmp_path / "schema.yaml"))
    except Exception as exc:  # noqa: BLE001 - report the generator's complaint
        pytest.fail(f"schema generation warned or failed: {exc}")


def test_a_subject_value_is_documented_as_a_string_or_an_integer():
    """A hold's or an erasure request's ``subject.value`` takes a non-empty string or an
    integer (``services.subject_value``); the schema said a string only, so a client
    generated from it could not send ``42``."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    value = schema["components"]["schemas"]["SubjectInput"]["properties"]["value"]
    assert sorted(option["type"] for option in value["oneOf"]) == ["integer", "string"]
    assert {"type": "string", "minLength": 1} in value["oneOf"]
    assert "type" not in value  # not also "a string" beside its oneOf
    assert schema["components"]["schemas"]["SubjectInput"]["required"] == ["field", "value"]
