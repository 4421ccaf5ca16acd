"""The isolation table (issue 6): every URL pattern of the dashboard and the API, taken
from the URL resolver, x every identity, with the exact status CONTRACT.md's rules give
and proof that nothing changed.

- **Patterns** come from ``get_resolver()``; each needs a request recipe in ``RECIPES``
  (a pattern without one, or a recipe without a pattern, fails
  ``test_every_url_pattern_has_a_recipe``). The Django admin is the one namespace left
  out: it is no tenant's surface, and ``test_admin`` pins down what it may show.
- **Identities**: anonymous; each role in the tenant (acme); each role in the twin tenant
  (globex) only; a reviewer of both (asked through acme's URL for an object only globex
  holds, it is 404 like everyone); a superuser and a staff account without a role; an account that had a
  role and was deactivated; a token that had a role and was revoked. The API is called
  with bearer tokens, the dashboard with a logged-in session.
- **Twin world**: acme and globex hold the same objects under the same UUIDs (runs,
  checkpoints, effects), so a request that reached the wrong tenant's row would show.
  Built by ``tests/twinworld.py`` (as for ``test_twin_world.py``), once for the module,
  in a transaction rolled back at the end.
- **Rules** (CONTRACT.md 3 and 4): API: no or dead credentials 401; no role in the
  tenant (another tenant's roles, superuser, staff) 404; a role lacking the right 403;
  else the action's own success status. Dashboard: the same, with the login redirect
  for 401. Flags give nothing.
- **Nothing changed**: each request runs in a savepoint that is rolled back afterwards;
  before that, row counts, a few aggregates of mutable columns and the audit chain head
  of both tenants, plus accounts, grants and tokens, are compared with the state before.
  A refusal changes nothing; a read changes nothing; an audited payload read adds
  exactly one audit event; a write changes its own tenant (with an audit event) and
  never the twin. (``ApiToken.last_used_at`` is bookkeeping and left out: see
  ``services.token_authenticate``.)

The table is printed (``pytest -s``) and written to ``$RECOVERY_VAR_DIR/isolation-table.txt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from checkpoints import roles, services
from checkpoints.models import (
    ApiToken,
    AuditChainHead,
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    EffectRevision,
    GraphCheckpoint,
    GraphWrite,
    NotificationEndpoint,
    NotificationMessage,
    ReconcileAttempt,
    ReconcilerConfig,
    ReconcileRequest,
    RetryRequest,
    Run,
    Tenant,
)
from tests.helpers import effect_body, envelope, lg_put, lg_writes
from tests.twinworld import (
    DECLARED_KIND,
    HOME,
    LG_IDS,
    TWIN,
    TWIN_ENDPOINT_ID,
    account,
    build_world,
    declared_kind,
    holder_of_both,
    holders,
    login,
    world_ids,
)

REASON = {"reason": "isolation table"}
User = get_user_model()
SKIPPED_NAMESPACES = {"admin"}  # not a tenant surface: tests/security/test_admin.py

# --------------------------------------------------------------------------------------
# The twin world
# --------------------------------------------------------------------------------------

IDS, EXTRA = world_ids("isolation")  # tests/twinworld.py; EXTRA: globex only
# Only the twin holds r_twin (an effect marked unknown, a retry request open).
IDS.update(r_twin=EXTRA["r_more"], c_twin=EXTRA["c_more"], e_twin=EXTRA["e_more"])
LG_THREAD = "isolation-thread"


@dataclass
class World:
    retry_pk: int           # acme's open retry request (requested by someone else)
    attempt_pk: int         # acme's reconcile look-up with evidence
    identities: list[Identity]
    bulk_id: str = ""       # acme's bulk action (issue 9, item 3)
    migration_id: str = ""  # acme's stored migration job (issue 19, item 2)
    hold_id: str = ""       # acme's active legal hold (issue 20)
    erasure_id: str = ""    # acme's erasure request, not decided yet (issue 20)
    endpoint_id: str = ""   # acme's webhook endpoint, the same UUID as globex's (issue 21)
    event_id: str = ""      # its delivered message, the same event id as globex's
    twin_endpoint_id: str = str(TWIN_ENDPOINT_ID)  # an endpoint only globex holds
    audit_event_id: str = ""  # acme's integrated audit event (issue 22): its proof


@dataclass
class Identity:
    name: str
    role: str | None = None          # its role ...
    tenant: str | None = None        # ... in this tenant
    live: bool = True                # False: deactivated account or revoked token
    also: tuple[str, ...] = ()       # more tenants where it holds the same role
    user: object = None
    token: str | None = None
    session: dict = field(default_factory=dict)  # cookies of a logged-in session

    def api(self) -> APIClient:
        client = APIClient()
        if self.token:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client

    def web(self) -> Client:
        client = Client()
        for key, value in self.session.items():
            client.cookies[key] = value
        if self.token and not self.session:  # a token means nothing to the dashboard
            client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {self.token}"
        return client

    def perms(self, tenant: str) -> set[str]:
        """Its rights in ``tenant`` under CONTRACT.md 4 (none without a live role there:
        flags count for nothing)."""
        if not self.live or tenant not in (self.tenant, *self.also) or self.role is None:
            return set()
        return set(roles.ROLE_PERMISSIONS[self.role])


def _identities() -> list[Identity]:
    out = [Identity("anonymous", live=False)]
    tags = {HOME: "", TWIN: "g."}
    out += [Identity(f"{tags[h.slug]}{h.role}" if h.role else h.flag, h.role, h.slug,
                     user=h.user, token=h.token, session=h.cookies) for h in holders()]
    home = Tenant.objects.get(slug=HOME)
    both = holder_of_both("reviewer")  # issue 17, item 14: rights in two tenants
    out.append(Identity("both.reviewer", "reviewer", HOME, also=(TWIN,), user=both,
                        token=services.token_issue(user=both), session=login(both)))
    gone = account("deactivated-reviewer")
    services.role_grant(actor=None, tenant=home, user=gone, role="reviewer")
    ident = Identity("deactivated", "reviewer", HOME, live=False, user=gone,
                     token=services.token_issue(user=gone), session=login(gone))
    services.account_deactivate(user=gone)
    out.append(ident)
    holder = account("revoked-writer")
    services.role_grant(actor=None, tenant=home, user=holder, role="writer")
    ident = Identity("revoked", "writer", HOME, live=False, user=holder,
                     token=services.token_issue(user=holder))
    services.tokens_revoke(user=holder)
    out.append(ident)
    return out


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            home = build_world(IDS, EXTRA, lg_thread=LG_THREAD, lg_run="lg-run")[HOME]
            yield World(home.retry_pk, home.attempt_pk, _identities(), home.bulk_id,
                        home.migration_id, home.hold_id, home.erasure_id, home.endpoint_id,
                        home.event_id, audit_event_id=home.audit_event_id)
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


# --------------------------------------------------------------------------------------
# Rules and recipes
# --------------------------------------------------------------------------------------

LOGIN = "login"  # the expected answer "302 to the login page"


def api_rule(right: str, ok: int, *, any_of: tuple[str, ...] = ()) -> Callable:
    def rule(ident: Identity, tenant: str) -> int:
        if not ident.live:
            return 401
        perms = ident.perms(tenant)
        if not perms:
            return 404
        if right not in perms or (any_of and not perms & set(any_of)):
            return 403
        return ok
    return rule


def page_rule(right: str, ok: int | str) -> Callable:
    def rule(ident: Identity, tenant: str):
        if not ident.live or not ident.session:
            return LOGIN
        perms = ident.perms(tenant)
        if not perms:
            return 404
        return ok if right in perms else 403
    return rule


def home_rule(ident: Identity, tenant: str):
    if not ident.live or not ident.session:
        return LOGIN
    return 302 if ident.role else 200  # to its tenant's inbox; else "no role anywhere"


def login_page_rule(ident: Identity, tenant: str):
    return 302 if ident.live and ident.session else 200  # logged in: on to the inbox


def schema_rule(ident: Identity, tenant: str) -> int:
    """The schema is not a tenant resource but needs an account (docs/security/input.md):
    any live token is answered alike (flags and roles change nothing); none, or a dead
    one, is 401."""
    return 200 if ident.token and ident.live else 401


def docs_rule(ident: Identity, tenant: str):
    """The docs page is for a logged-in browser: without a live session, to the login."""
    return 200 if ident.live and ident.session else LOGIN


@dataclass
class Op:
    method: str
    kwargs: Callable[[World], dict]
    rule: Callable[[Identity], int | str]
    effect: str = "read"            # read | audited (one audit event) | write
    query: str = ""
    body: object = None
    headers: dict = field(default_factory=dict)
    surface: str = "api"            # api (bearer) | web (session)
    tenant: str = HOME              # the tenant in the URL (TWIN: cross-tenant ids)


def _ids(**names) -> Callable[[World], dict]:
    """URL kwargs from ``IDS``/world attributes: ``_ids(run_id="r_stuck")``."""
    def build(w: World) -> dict:
        out = {}
        for key, source in names.items():
            out[key] = getattr(w, source) if hasattr(w, source) else str(IDS[source])
        return out
    return build


def _t(tenant=HOME, **names):
    build = _ids(**names)
    return lambda w: {"tenant": tenant, **build(w)}


def _kind(version: int, tenant=HOME):
    """The URL kwargs of the declared kind's ``version`` (``twinworld.DECLARED_KIND``)."""
    return lambda w: {"tenant": tenant, "kind": DECLARED_KIND, "version": str(version)}


def _purge(tenant=HOME):
    """The URL kwargs of a tombstone purge id that no tenant holds."""
    return lambda w: {"tenant": tenant, "purge_id": str(IDS["new_cp"])}


def _s(tenant=HOME, **names):
    build = _ids(**names)
    return lambda w: {"slug": tenant, **build(w)}



V, RV, RW, AP, WR = roles.VIEW, roles.REVEAL, roles.REVIEW, roles.APPROVE, roles.WRITE
NEW_CP = envelope(IDS["new_cp"], IDS["r_stable"], 0, payload={"phase": "ready"})
NEW_FX = effect_body(IDS["new_fx"], IDS["r_stable"], operation_key="charge:new")
CREATE = {"HTTP_IF_NONE_MATCH": "*"}

RECIPES: dict[str, list[Op]] = {
    # --- API (CONTRACT.md 3), bearer tokens ---------------------------------------------
    "api:checkpoint": [
        Op("get", _t(checkpoint_id="c_stuck"), api_rule(V, 200, any_of=(RV, WR)), "audited"),
        Op("put", _t(checkpoint_id="new_cp"), api_rule(WR, 201), "write", body=NEW_CP,
           headers=CREATE),
    ],
    "api:checkpoint-revisions": [
        Op("get", _t(checkpoint_id="c_stuck"), api_rule(V, 200, any_of=(RV, WR)), "audited")],
    "api:effect-list": [Op("get", _t(), api_rule(V, 200), query="service=payments")],
    "api:effect": [
        Op("get", _t(effect_id="e_done"), api_rule(V, 200)),
        Op("get", _t(effect_id="e_twin"), api_rule(V, 404)),
        Op("put", _t(effect_id="new_fx"), api_rule(WR, 201), "write", body=NEW_FX,
           headers=CREATE),
    ],
    "api:effect-mark-unknown": [
        Op("post", _t(effect_id="e_stuck"), api_rule(RW, 200), "write", body=REASON)],
    "api:effect-reveal-receipt": [
        Op("post", _t(effect_id="e_done"), api_rule(RV, 200), "audited", body=REASON)],
    "api:run-list": [Op("get", _t(), api_rule(V, 200), query="recovery_state=ambiguous")],
    "api:run": [Op("get", _t(run_id="r_stuck"), api_rule(V, 200)),
                # Only the twin holds r_twin: through HOME's URL it does not exist, also
                # for an account with a role in both (issue 17, item 14).
                Op("get", _t(run_id="r_twin"), api_rule(V, 404))],
    "api:run-lease": [Op("post", _t(run_id="r_stable"), api_rule(WR, 200), "write",
                         body={"owner": "table", "ttl_s": 30})],
    # No run of the world holds a live lease: a reviewer's answer is the refusal (409
    # no_live_lease, nothing written); the revoke itself: tests/api/test_lease_revoke.py.
    "api:run-lease-revoke": [Op("post", _t(run_id="r_stuck"), api_rule(RW, 409), body=REASON)],
    # Likewise a writer's release: 409 no_live_lease, nothing written; the release
    # itself: tests/api/test_lease_release.py.
    "api:run-lease-release": [Op("post", _t(run_id="r_stable"), api_rule(WR, 409),
                                 body={"owner": "table", "fencing_token": 1})],
    "api:run-resume": [
        Op("get", _t(run_id="r_stable"), api_rule(WR, 200)),
        Op("post", _t(run_id="r_stable"), api_rule(WR, 200), body={}),
    ],
    "api:run-retry-requests": [
        Op("post", _t(run_id="r_retry"), api_rule(RW, 201), "write", body=REASON)],
    "api:run-reconcile": [
        Op("post", _t(run_id="r_stuck"), api_rule(RW, 202), "write", body=REASON)],
    "api:run-close": [Op("post", _t(run_id="r_stuck"), api_rule(RW, 200), "write", body=REASON)],
    "api:run-conflicts-acknowledge": [
        Op("post", _t(run_id="r_stuck"), api_rule(RW, 200), "write", body=REASON)],
    # The approvers' queue (the dashboard's Approvals page, ``approval_queue`` below):
    # the page's right; HOME's request on the twin's URL finds nothing.
    "api:retry-requests": [Op("get", _t(), api_rule(AP, 200), query="state=all")],
    "api:retry-request": [
        Op("get", _t(retry_id="retry_pk"), api_rule(AP, 200)),
        Op("get", _t(TWIN, retry_id="retry_pk"), api_rule(AP, 404), tenant=TWIN)],
    # Integer ids are not shared by the twins: HOME's id on the twin's URL finds nothing,
    # whoever may act in the twin (404), and changes nothing anywhere.
    "api:retry-approve": [
        Op("post", _t(retry_id="retry_pk"), api_rule(AP, 200), "write", body=REASON),
        Op("post", _t(TWIN, retry_id="retry_pk"), api_rule(AP, 404), body=REASON,
           tenant=TWIN)],
    "api:retry-reject": [
        Op("post", _t(retry_id="retry_pk"), api_rule(AP, 200), "write", body=REASON),
        Op("post", _t(TWIN, retry_id="retry_pk"), api_rule(AP, 404), body=REASON,
           tenant=TWIN)],
    # Withdraw (issue 9, item 4): only the requester may, and the table's requester is the
    # world's helper account: every reviewer here is refused (403), no role 404, the twin's
    # URL finds nothing (tests/api/test_retry_withdraw.py: the requester's own 200).
    "api:retry-withdraw": [
        Op("post", _t(retry_id="retry_pk"), api_rule(RW, 403), body=REASON),
        Op("post", _t(TWIN, retry_id="retry_pk"), api_rule(RW, 404), body=REASON,
           tenant=TWIN)],
    # Bulk actions (issue 9, item 3): the single actions' right; HOME's bulk id on the
    # twin's URL finds nothing. The list: any role, as one bulk action's read.
    "api:bulk-actions": [
        Op("get", _t(), api_rule(V, 200)),
        Op("post", _t(), api_rule(RW, 201), "write",
           body={**REASON, "action": "close", "run_ids": [str(IDS["r_stuck"])],
                 "client_token": str(IDS["new_cp"])})],
    "api:bulk-action": [
        Op("get", _t(bulk_id="bulk_id"), api_rule(V, 200)),
        Op("get", _t(TWIN, bulk_id="bulk_id"), api_rule(V, 404), tenant=TWIN)],
    # Abort (issue 22, item 6): the review right; HOME's bulk ran inline, so a reviewer is
    # refused 422 (nothing to abort: tests/views/test_bulk_jobs.py aborts a job), the
    # twin's URL finds nothing.
    "api:bulk-action-abort": [
        Op("post", _t(bulk_id="bulk_id"), api_rule(RW, 422), body=REASON),
        Op("post", _t(TWIN, bulk_id="bulk_id"), api_rule(RW, 404), body=REASON,
           tenant=TWIN)],
    # LangGraph threads (issue 10): the writer's; the same thread id in the twin is the
    # twin's own thread, never touched.
    "api:langgraph-checkpoints": [
        Op("get", _t(), api_rule(WR, 200), "audited", query=f"thread_id={LG_THREAD}"),
        Op("post", _t(), api_rule(WR, 201), "write",
           body=lg_put(LG_THREAD, LG_IDS[2], parent=LG_IDS[1]))],
    "api:langgraph-writes": [Op("post", _t(), api_rule(WR, 200), "write",
                                body=lg_writes(LG_THREAD, LG_IDS[1], "task-2",
                                               [(0, "out", 2)]))],
    "api:langgraph-thread-delete": [Op("post", _t(), api_rule(WR, 200), "write",
                                       body={"thread_id": LG_THREAD})],
    "api:langgraph-thread-copy": [Op("post", _t(), api_rule(WR, 200), "write",
                                     body={"source_thread_id": LG_THREAD,
                                           "target_thread_id": "isolation-copy"})],
    "api:langgraph-thread-prune": [Op("post", _t(), api_rule(WR, 200), "write",
                                      body={"thread_ids": [LG_THREAD],
                                            "strategy": "keep_latest"})],
    "api:langgraph-runs-delete": [Op("post", _t(), api_rule(WR, 200), "write",
                                     body={"run_ids": ["lg-run"]})],
    "api:audit-events": [Op("get", _t(), api_rule(V, 200))],
    # An audit event's inclusion proof (issue 22; CONTRACT.md 8): viewer and up; acme's
    # event id on globex's URL finds nothing.
    "api:audit-event-proof": [
        Op("get", _t(audit_event_id="audit_event_id"), api_rule(V, 200)),
        Op("get", _t(TWIN, audit_event_id="audit_event_id"), api_rule(V, 404), tenant=TWIN)],
    "api:report": [Op("get", _t(), api_rule(V, 200))],
    # The kinds in use and the registry's (docs/kinds.md): metadata, a viewer's read.
    "api:kind-list": [Op("get", _t(), api_rule(V, 200))],
    # A declared kind (issue 19): the same name in both tenants, each its own; globex's
    # v2 is not HOME's (404). Declaring is the admin's (a new version: 201, written).
    "api:kind-version": [
        Op("get", _kind(1), api_rule(V, 200)),
        Op("get", _kind(2), api_rule(V, 404)),
        Op("get", _kind(2, TWIN), api_rule(V, 200), tenant=TWIN),
        Op("put", _kind(3), api_rule(roles.MANAGE, 201), "write",
           body=declared_kind("isolation"))],
    # Migrations (issue 19, item 2; CONTRACT.md 8): the tenant admin's; a dry run is a
    # read; HOME's job on the twin's URL finds nothing.
    "api:kind-migrations": [
        Op("post", lambda w: {"tenant": HOME, "kind": "acme.order"},
           api_rule(roles.MANAGE, 200), body={"to_version": 2, "dry_run": True}),
        Op("post", lambda w: {"tenant": HOME, "kind": "acme.order"},
           api_rule(roles.MANAGE, 202), "write",
           body={"to_version": 2, "runs": [str(IDS["r_stuck"])],
                 "client_token": str(IDS["new_cp"])})],
    "api:kind-migration": [
        Op("get", lambda w: {"tenant": HOME, "kind": "acme.order", "job_id": w.migration_id},
           api_rule(V, 200)),
        Op("get", lambda w: {"tenant": TWIN, "kind": "acme.order", "job_id": w.migration_id},
           api_rule(V, 404), tenant=TWIN)],
    # Legal holds (issue 20, item 4; CONTRACT.md 8): the tenant admin places and
    # releases, every role reads; HOME's hold on the twin's URL finds nothing.
    "api:legal-holds": [
        Op("get", _t(), api_rule(V, 200)),
        Op("post", _t(), api_rule(roles.MANAGE, 201), "write",
           body={**REASON, "runs": [str(IDS["r_stable"])]})],
    "api:legal-hold": [
        Op("get", _t(hold_id="hold_id"), api_rule(V, 200)),
        Op("get", _t(TWIN, hold_id="hold_id"), api_rule(V, 404), tenant=TWIN)],
    "api:legal-hold-release": [
        Op("post", _t(hold_id="hold_id"), api_rule(roles.MANAGE, 200), "write", body=REASON),
        Op("post", _t(TWIN, hold_id="hold_id"), api_rule(roles.MANAGE, 404), body=REASON,
           tenant=TWIN)],
    # Erasure requests (issue 20, item 2): a reviewer or admin files, an approver who is
    # not the requester (the world's helper reviewer filed HOME's) decides.
    "api:erasure-requests": [
        Op("get", _t(), api_rule(V, 200)),
        Op("post", _t(), api_rule(RW, 201), "write",
           body={**REASON, "runs": [str(IDS["r_closed"])]})],
    "api:erasure-request": [
        Op("get", _t(request_id="erasure_id"), api_rule(V, 200)),
        Op("get", _t(TWIN, request_id="erasure_id"), api_rule(V, 404), tenant=TWIN)],
    "api:erasure-approve": [
        Op("post", _t(request_id="erasure_id"), api_rule(AP, 200), "write", body={}),
        Op("post", _t(TWIN, request_id="erasure_id"), api_rule(AP, 404), body={},
           tenant=TWIN)],
    "api:erasure-reject": [
        Op("post", _t(request_id="erasure_id"), api_rule(AP, 200), "write", body=REASON),
        Op("post", _t(TWIN, request_id="erasure_id"), api_rule(AP, 404), body=REASON,
           tenant=TWIN)],
    # Tombstone governance (issue 20, item 5): the tombstones and purges are a viewer's
    # read; preparing and executing the admin's, deciding the approver's. The twin world
    # keeps tombstones forever (no tombstone retention): a prepare is 409 for the admin;
    # a purge id no tenant holds is 404 for whoever may act on one.
    "api:tombstones": [Op("get", _t(), api_rule(V, 200))],
    "api:tombstone-purges": [Op("get", _t(), api_rule(V, 200)),
                             Op("post", _t(), api_rule(roles.MANAGE, 409), body={})],
    "api:tombstone-purge": [Op("get", _purge(), api_rule(V, 404))],
    "api:tombstone-purge-approve": [Op("post", _purge(), api_rule(AP, 404), body={})],
    "api:tombstone-purge-reject": [Op("post", _purge(), api_rule(AP, 404), body=REASON)],
    "api:tombstone-purge-execute": [Op("post", _purge(), api_rule(roles.MANAGE, 404),
                                       body={})],
    # The data policy (issue 20; CONTRACT.md 8): a viewer reads, the admin writes.
    "api:data-policy": [
        Op("get", _t(), api_rule(V, 200)),
        Op("put", _t(), api_rule(roles.MANAGE, 200), "write",
           body={"payload_retention_days": 30})],
    # Notification endpoints (issue 21; CONTRACT.md 8): every role reads (no secret; the
    # URL for the admin only), the tenant admin writes. Both tenants hold an endpoint and a
    # message under the same ids; an endpoint only globex holds is 404 through acme.
    "api:notification-endpoints": [
        Op("get", _t(), api_rule(V, 200)),
        Op("post", _t(), api_rule(roles.MANAGE, 201), "write",
           body={"name": "isolation", "channel": "webhook", "url": "https://hooks.example.com/i",
                 "event_types": ["run.needs_review"]})],
    "api:notification-endpoint": [
        Op("get", _t(endpoint_id="endpoint_id"), api_rule(V, 200)),
        Op("get", _t(endpoint_id="twin_endpoint_id"), api_rule(V, 404)),
        Op("patch", _t(endpoint_id="endpoint_id"), api_rule(roles.MANAGE, 200), "write",
           body={"name": "renamed by the isolation table"}),
        Op("patch", _t(endpoint_id="twin_endpoint_id"), api_rule(roles.MANAGE, 404),
           body={"name": "renamed by the isolation table"}),
        Op("delete", _t(endpoint_id="endpoint_id"), api_rule(roles.MANAGE, 204), "write")],
    "api:notification-endpoint-rotate": [
        Op("post", _t(endpoint_id="endpoint_id"), api_rule(roles.MANAGE, 200), "write",
           body={}),
        Op("post", _t(endpoint_id="twin_endpoint_id"), api_rule(roles.MANAGE, 404), body={})],
    "api:notification-endpoint-test": [
        Op("post", _t(endpoint_id="endpoint_id"), api_rule(roles.MANAGE, 202), "write",
           body={}),
        Op("post", _t(endpoint_id="twin_endpoint_id"), api_rule(roles.MANAGE, 404), body={})],
    "api:notification-deliveries": [
        Op("get", _t(endpoint_id="endpoint_id"), api_rule(V, 200)),
        Op("get", _t(endpoint_id="twin_endpoint_id"), api_rule(V, 404))],
    "api:notification-resend": [
        Op("post", _t(endpoint_id="endpoint_id", event_id="event_id"),
           api_rule(roles.MANAGE, 202), "write", body={}),
        Op("post", _t(endpoint_id="twin_endpoint_id", event_id="event_id"),
           api_rule(roles.MANAGE, 404), body={})],
    "schema": [Op("get", lambda w: {}, schema_rule)],
    "api-docs": [Op("get", lambda w: {}, docs_rule, surface="web")],
    # Operations (checkpoints/ops/health.py): the probes answer anyone and name no tenant; the
    # metrics are off (404) for everyone while RECOVERY_METRICS_TOKEN is unset, and no
    # account's credentials open them (tests/test_ops.py: the token).
    "healthz": [Op("get", lambda w: {}, lambda ident, tenant: 200)],
    # Any other path under /api/v1/: its JSON 404 (recovery/urls.py), for everyone.
    "api-not-found": [Op("get", lambda w: {}, lambda ident, tenant: 404)],
    "readyz": [Op("get", lambda w: {}, lambda ident, tenant: 200)],
    "metrics": [Op("get", lambda w: {}, lambda ident, tenant: 404),
                Op("get", lambda w: {}, lambda ident, tenant: 404, surface="web")],
    # --- dashboard, sessions ------------------------------------------------------------
    "login": [Op("get", lambda w: {}, login_page_rule, surface="web")],
    "logout": [Op("post", lambda w: {}, lambda ident, tenant: 302, surface="web")],
    "inbox": [Op("get", lambda w: {}, home_rule, surface="web")],
    "run_list": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "run_counts": [Op("get", _s(), page_rule(V, 200), surface="web")],
    # The incident a reviewer works on (issue 21, item 10): the session only, no row.
    "incident_set": [Op("post", _s(), page_rule(V, 303), surface="web",
                        body={"incident_ref": "INC-2041"})],
    "report": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "audit_log": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "kind_list": [Op("get", _s(), page_rule(V, 200), surface="web")],
    # A declared kind's declaration, read only: as ``api:kind-version``'s GET.
    "kind_version": [
        Op("get", lambda w: {"slug": HOME, "kind": DECLARED_KIND, "version": "1"},
           page_rule(V, 200), surface="web"),
        Op("get", lambda w: {"slug": HOME, "kind": DECLARED_KIND, "version": "2"},
           page_rule(V, 404), surface="web")],
    # Migrations from the dashboard (issue 19, item 2): the preview (a dry run: a read)
    # and its confirm are the tenant admin's, as ``api:kind-migrations``; the job's page
    # any role's, HOME's job on the twin's URL finds nothing.
    "migration_preview": [
        Op("get", lambda w: {"slug": HOME, "kind": "acme.order"},
           page_rule(roles.MANAGE, 200), query="to=2", surface="web")],
    "migration_submit": [
        Op("post", lambda w: {"slug": HOME, "kind": "acme.order"},
           page_rule(roles.MANAGE, 303), "write", surface="web",
           body={"to": "2", "client_token": str(IDS["new_cp"])})],
    "migration_detail": [
        Op("get", lambda w: {"slug": HOME, "kind": "acme.order", "job_id": w.migration_id},
           page_rule(V, 200), surface="web"),
        Op("get", lambda w: {"slug": TWIN, "kind": "acme.order", "job_id": w.migration_id},
           page_rule(V, 404), surface="web", tenant=TWIN)],
    # Erasure requests and legal holds (issue 20): as their API (``api:erasure-*``,
    # ``api:legal-hold*``); a plain form post answers a redirect.
    "erasure_requests": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "erasure_request_file": [Op("post", _s(run_id="r_closed"), page_rule(RW, 303), "write",
                                body=REASON, surface="web")],
    "erasure_approve": [
        Op("post", _s(request_id="erasure_id"), page_rule(AP, 303), "write", body={},
           surface="web"),
        Op("post", _s(TWIN, request_id="erasure_id"), page_rule(AP, 404), body={},
           surface="web", tenant=TWIN)],
    "erasure_reject": [
        Op("post", _s(request_id="erasure_id"), page_rule(AP, 303), "write", body=REASON,
           surface="web"),
        Op("post", _s(TWIN, request_id="erasure_id"), page_rule(AP, 404), body=REASON,
           surface="web", tenant=TWIN)],
    "legal_holds": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "legal_hold_place": [Op("post", _s(), page_rule(roles.MANAGE, 303), "write",
                            body={**REASON, "scope": "runs", "runs": str(IDS["r_stable"])},
                            surface="web")],
    "legal_hold_place_run": [Op("post", _s(run_id="r_stable"), page_rule(roles.MANAGE, 303),
                                "write", body=REASON, surface="web")],
    "legal_hold_release": [
        Op("post", _s(hold_id="hold_id"), page_rule(roles.MANAGE, 303), "write", body=REASON,
           surface="web"),
        Op("post", _s(TWIN, hold_id="hold_id"), page_rule(roles.MANAGE, 404), body=REASON,
           surface="web", tenant=TWIN)],
    # The Data page (issue 20): any role reads; the policy form is the admin's.
    "data_page": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "data_policy_post": [
        Op("post", _s(), page_rule(roles.MANAGE, 303), "write", surface="web",
           body={"payload_retention_days": "30", "restart_interval_s": "86400",
                 "secrets_policy": "warn"})],
    # Notifications (issue 21, items 1 and 5): every role reads the endpoints and the
    # delivery log; the forms are the tenant admin's (as ``api:notification-*``). Both
    # tenants hold an endpoint and a message under the same ids; the endpoint only globex
    # holds finds nothing through acme's URLs.
    "notification_list": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "notification_create": [
        Op("post", _s(), page_rule(roles.MANAGE, 303), "write", surface="web",
           body={"name": "table", "channel": "email", "email": "ops@example.com",
                 "event_types": "digest"})],
    "notification_detail": [
        Op("get", _s(endpoint_id="endpoint_id"), page_rule(V, 200), surface="web"),
        Op("get", _s(endpoint_id="twin_endpoint_id"), page_rule(V, 404), surface="web")],
    "notification_update": [
        Op("post", _s(endpoint_id="endpoint_id"), page_rule(roles.MANAGE, 303), "write",
           body={"enabled": "false"}, surface="web"),
        Op("post", _s(endpoint_id="twin_endpoint_id"), page_rule(roles.MANAGE, 404),
           body={"enabled": "false"}, surface="web")],
    "notification_rotate": [
        Op("post", _s(endpoint_id="endpoint_id"), page_rule(roles.MANAGE, 200), "write",
           body={}, surface="web"),
        Op("post", _s(endpoint_id="twin_endpoint_id"), page_rule(roles.MANAGE, 404),
           body={}, surface="web")],
    "notification_delete": [
        Op("post", _s(endpoint_id="endpoint_id"), page_rule(roles.MANAGE, 303), "write",
           body={"confirm": "on"}, surface="web"),
        Op("post", _s(endpoint_id="twin_endpoint_id"), page_rule(roles.MANAGE, 404),
           body={"confirm": "on"}, surface="web")],
    "notification_send_test": [
        Op("post", _s(endpoint_id="endpoint_id"), page_rule(roles.MANAGE, 303), "write",
           body={}, surface="web"),
        Op("post", _s(endpoint_id="twin_endpoint_id"), page_rule(roles.MANAGE, 404),
           body={}, surface="web")],
    "notification_resend": [
        Op("post", _s(endpoint_id="endpoint_id", event_id="event_id"),
           page_rule(roles.MANAGE, 303), "write", body={}, surface="web"),
        Op("post", _s(endpoint_id="twin_endpoint_id", event_id="event_id"),
           page_rule(roles.MANAGE, 404), body={}, surface="web")],
    "run_detail": [Op("get", _s(run_id="r_stuck"), page_rule(V, 200), surface="web"),
                   Op("get", _s(run_id="r_twin"), page_rule(V, 404), surface="web")],
    "run_audit": [Op("get", _s(run_id="r_stuck"), page_rule(V, 200), surface="web")],
    "checkpoint_history": [Op("get", _s(checkpoint_id="c_stuck"), page_rule(V, 200),
                              surface="web")],
    "effect_history": [Op("get", _s(effect_id="e_done"), page_rule(V, 200), surface="web"),
                       Op("get", _s(effect_id="e_twin"), page_rule(V, 404), surface="web")],
    "run_retry_request": [Op("post", _s(run_id="r_retry"), page_rule(RW, 303), "write",
                             body=REASON, surface="web")],
    "run_reconcile": [Op("post", _s(run_id="r_stuck"), page_rule(RW, 303), "write",
                         body=REASON, surface="web")],
    "run_close": [Op("post", _s(run_id="r_stuck"), page_rule(RW, 303), "write",
                     body={**REASON, "confirm": "on"}, surface="web")],
    "run_lease_revoke": [Op("post", _s(run_id="r_stuck"), page_rule(RW, 409),
                            body={**REASON, "confirm": "on", "owner": "table"}, surface="web")],
    "conflicts_acknowledge": [Op("post", _s(run_id="r_stuck"), page_rule(RW, 303), "write",
                                 body=REASON, surface="web")],
    "retry_approve": [
        Op("post", _s(retry_id="retry_pk"), page_rule(AP, 303), "write", body=REASON,
           surface="web"),
        Op("post", _s(TWIN, retry_id="retry_pk"), page_rule(AP, 404), body=REASON,
           surface="web", tenant=TWIN)],
    "retry_reject": [
        Op("post", _s(retry_id="retry_pk"), page_rule(AP, 303), "write", body=REASON,
           surface="web"),
        Op("post", _s(TWIN, retry_id="retry_pk"), page_rule(AP, 404), body=REASON,
           surface="web", tenant=TWIN)],
    "retry_withdraw": [
        Op("post", _s(retry_id="retry_pk"), page_rule(RW, 403), body=REASON, surface="web"),
        Op("post", _s(TWIN, retry_id="retry_pk"), page_rule(RW, 404), body=REASON,
           surface="web", tenant=TWIN)],
    "bulk_submit": [Op("post", _s(), page_rule(RW, 303), "write",
                       body={**REASON, "action": "close", "scope": "selected",
                             "run": str(IDS["r_stuck"]), "confirm": "yes",
                             "client_token": str(IDS["new_cp"])}, surface="web")],
    "bulk_list": [Op("get", _s(), page_rule(V, 200), surface="web")],
    "bulk_detail": [
        Op("get", _s(bulk_id="bulk_id"), page_rule(V, 200), surface="web"),
        Op("get", _s(TWIN, bulk_id="bulk_id"), page_rule(V, 404), surface="web",
           tenant=TWIN)],
    "bulk_abort": [
        Op("post", _s(bulk_id="bulk_id"), page_rule(RW, 422), body=REASON, surface="web"),
        Op("post", _s(TWIN, bulk_id="bulk_id"), page_rule(RW, 404), body=REASON,
           surface="web", tenant=TWIN)],
    # Issue 21: the polls of the inbox and the run page (reads), the approver's queue
    # (its decisions: as ``retry_approve``; a retry of HOME on the twin's URL finds nothing).
    "run_new": [Op("get", _s(), page_rule(V, 200), query="since=1", surface="web")],
    "run_live": [
        Op("get", _s(run_id="r_stuck"), page_rule(V, 200), query="seen=000000000000",
           surface="web"),
        Op("get", _s(run_id="r_twin"), page_rule(V, 404), query="seen=000000000000",
           surface="web")],
    "approval_queue": [Op("get", _s(), page_rule(AP, 200), surface="web")],
    "approval_decide": [
        Op("post", _s(retry_id="retry_pk"), page_rule(AP, 303), "write",
           body={**REASON, "decision": "approve"}, surface="web"),
        Op("post", _s(TWIN, retry_id="retry_pk"), page_rule(AP, 404),
           body={**REASON, "decision": "reject"}, surface="web", tenant=TWIN)],
    # The world's open request is on a run with an unknown effect (a possible duplicate):
    # bulk approve skips it, so an approver's post writes nothing and says so.
    "approval_bulk": [
        Op("post", lambda w: {"slug": HOME}, page_rule(AP, 303),
           body=lambda w: {**REASON, "retry": str(w.retry_pk)}, surface="web")],
    "effect_mark_unknown": [Op("post", _s(effect_id="e_stuck"), page_rule(RW, 303), "write",
                               body={**REASON, "confirm": "on"}, surface="web")],
    "effect_receipt_reveal": [Op("post", _s(effect_id="e_done"), page_rule(RV, 200),
                                 "audited", body=REASON, surface="web")],
    "checkpoint_reveal": [Op("post", _s(checkpoint_id="c_stuck"), page_rule(RV, 200),
                             "audited", body=REASON, surface="web")],
    "checkpoint_diff": [Op("post", _s(checkpoint_id="c_stuck"), page_rule(RV, 200), "write",
                           body={**REASON, "from_rev": 0, "to_rev": 1}, surface="web")],
    "reconcile_evidence_reveal": [
        Op("post", _s(attempt_id="attempt_pk"), page_rule(RV, 200), "audited", body=REASON,
           surface="web"),
        Op("post", _s(TWIN, attempt_id="attempt_pk"), page_rule(RV, 404), body=REASON,
           surface="web", tenant=TWIN)],
}


# --------------------------------------------------------------------------------------
# The resolver's patterns
# --------------------------------------------------------------------------------------

def url_patterns() -> list[tuple[str, str]]:
    """``[(qualified name, route)]`` of every URL pattern the resolver knows, but those
    of ``SKIPPED_NAMESPACES``."""
    found: list[tuple[str, str]] = []

    def walk(resolver: URLResolver, prefix: str, namespace: str) -> None:
        for entry in resolver.url_patterns:
            if isinstance(entry, URLResolver):
                ns = entry.namespace or namespace
                if ns in SKIPPED_NAMESPACES:
                    continue
                walk(entry, prefix + str(entry.pattern), ns)
            elif isinstance(entry, URLPattern):
                name = f"{namespace}:{entry.name}" if namespace and entry.name else entry.name
                found.append((name or f"(unnamed) {prefix}{entry.pattern}",
                              prefix + str(entry.pattern)))

    walk(get_resolver(), "/", "")
    return found


PATTERNS = url_patterns()


def test_every_url_pattern_has_a_recipe():
    names = [name for name, _ in PATTERNS]
    missing = sorted(set(names) - set(RECIPES))
    assert not missing, f"URL patterns without a request recipe in RECIPES: {missing}"
    stale = sorted(set(RECIPES) - set(names))
    assert not stale, f"recipes for URL patterns that no longer exist: {stale}"
    assert len(names) == len(set(names)), "two URL patterns share a name"


# --------------------------------------------------------------------------------------
# "Nothing changed"
# --------------------------------------------------------------------------------------

_PER_TENANT = [
    (Run, ("COUNT(*)", "SUM(fencing_token)", "COUNT(closed_at)", "MAX(updated_at)",
           "SUM(CASE WHEN lease_owner = '' THEN 0 ELSE 1 END)")),
    (Checkpoint, ("COUNT(*)", "SUM(revision)")),
    (CheckpointRevision, ("COUNT(*)",)),
    (Effect, ("COUNT(*)", "SUM(revision)", "MAX(updated_at)")),
    (EffectRevision, ("COUNT(*)",)),
    (Conflict, ("COUNT(*)", "COUNT(acknowledged_at)")),
    (RetryRequest, ("COUNT(*)", "MAX(updated_at)")),
    (ReconcileRequest, ("COUNT(*)", "MAX(updated_at)")),
    (ReconcileAttempt, ("COUNT(*)",)),
    (ReconcilerConfig, ("COUNT(*)",)),
    (GraphCheckpoint, ("COUNT(*)",)),
    (GraphWrite, ("COUNT(*)", "SUM(LENGTH(value_ciphertext))")),
    (NotificationEndpoint, ("COUNT(*)", "MAX(updated_at)", "SUM(LENGTH(name))",
                            "SUM(LENGTH(secret))")),
    (NotificationMessage, ("COUNT(*)", "SUM(attempts)",
                           "SUM(CASE WHEN state = 'pending' THEN 1 ELSE 0 END)")),
    (AuditEvent, ("COUNT(*)",)),
    (AuditChainHead, ("MAX(seq)", "MAX(last_hash)")),
]
_GLOBAL = [
    (ApiToken, ("COUNT(*)", "COUNT(revoked_at)")),  # last_used_at: bookkeeping, left out
    (User, ("COUNT(*)", "SUM(CASE WHEN is_active THEN 1 ELSE 0 END)")),
    (User.groups.through, ("COUNT(*)",)),
]
_TENANT = f"(SELECT id FROM {Tenant._meta.db_table} WHERE slug = %s)"
_STATE_SQL = "SELECT " + ", ".join(
    [f"(SELECT {expr} FROM {model._meta.db_table} WHERE tenant_id = {_TENANT})"
     for _slug in (HOME, TWIN) for model, exprs in _PER_TENANT for expr in exprs]
    + [f"(SELECT {expr} FROM {model._meta.db_table})" for model, exprs in _GLOBAL
       for expr in exprs])
_N = sum(len(exprs) for _, exprs in _PER_TENANT)  # values per tenant
_AUDIT = _N - 3  # AuditEvent COUNT(*); the chain head's seq and hash follow it


def state() -> tuple[tuple, tuple, tuple]:
    """``(home, twin, global)``: row counts, aggregates of mutable columns and the audit
    chain head of each tenant, and accounts, grants and tokens; one query."""
    params = [HOME] * _N + [TWIN] * _N
    with connection.cursor() as cur:
        cur.execute(_STATE_SQL, params)
        row = tuple(str(v) for v in cur.fetchone())
    return row[:_N], row[_N:2 * _N], row[2 * _N:]


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------

TABLE: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def print_table(request):
    yield
    if not TABLE:
        return
    names = list(next(iter(TABLE.values())))
    width = max(len(k) for k in TABLE) + 2
    lines = [f"isolation table: {len(TABLE)} requests x {len(names)} identities = "
             f"{len(TABLE) * len(names)} cells; tenant {HOME}, its twin {TWIN} (g. = a role "
             f"in {TWIN} only); 302L = redirect to the login page",
             " " * width + " ".join(f"{n[:11]:>11}" for n in names)]
    for row, cells in TABLE.items():
        lines.append(f"{row:<{width}}" + " ".join(f"{cells[n]:>11}" for n in names))
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    var = Path(getattr(settings, "VAR_DIR", "var"))
    var.mkdir(parents=True, exist_ok=True)
    (var / "isolation-table.txt").write_text(text)


def _request(op: Op, ident: Identity, path: str, world=None):
    import json

    if op.surface == "api":
        client = ident.api()
        target = path + (f"?{op.query}" if op.query else "")
        if op.method == "get":
            return client.get(target)
        return getattr(client, op.method)(target, data=json.dumps(op.body),
                                          content_type="application/json", **op.headers)
    client = ident.web()
    if op.method == "get":
        return client.get(path + (f"?{op.query}" if op.query else ""))
    body = op.body(world) if callable(op.body) else op.body  # a form naming a world row
    return client.post(path, body or {})


def _check_cell(op: Op, path: str, response, expected, before, after) -> list[str]:
    problems = []
    status = response.status_code
    if expected == LOGIN:
        location = response.get("Location", "")
        if status != 302 or not location.startswith(reverse("login")):
            problems.append(f"expected a redirect to the login page, got {status} {location}")
    elif status != expected:
        problems.append(f"expected {expected}, got {status}: {response.content[:200]!r}")
    if (path.startswith("/api/v1/") and status >= 400
            and "json" not in response.get("Content-Type", "")):
        problems.append("an API error that is not JSON")
    home_before, twin_before, glob_before = before
    home_after, twin_after, glob_after = after
    if twin_after != twin_before:
        problems.append("the twin tenant changed")
    succeeded = status < 400 and expected not in (LOGIN, 401, 403, 404)
    if not succeeded or op.effect == "read":
        if home_after != home_before or glob_after != glob_before:
            problems.append(f"something changed on a {'read' if succeeded else 'refusal'}")
    elif op.effect == "audited":
        if int(home_after[_AUDIT]) != int(home_before[_AUDIT]) + 1:
            problems.append("an audited read did not write exactly one audit event")
        if home_after[:_AUDIT] != home_before[:_AUDIT] or glob_after != glob_before:
            problems.append("an audited read changed more than the audit log")
    elif home_after[_AUDIT:] == home_before[_AUDIT:]:
        problems.append("a write wrote no audit event")
    return problems


CASES = [(name, i, op) for name, _ in PATTERNS for i, op in enumerate(RECIPES.get(name, []))]


@pytest.mark.django_db  # (also tells pytest-django to set the test database up)
@pytest.mark.parametrize(("name", "index", "op"), CASES,
                         ids=[f"{n}-{op.method}" for n, _, op in CASES])
def test_isolation_row(world, name, index, op):
    kwargs = op.kwargs(world)
    path = reverse(name, kwargs=kwargs)
    row = f"{op.method.upper():<5}{path}"
    for key, value in IDS.items():
        row = row.replace(str(value), "{" + key + "}")
    cells, failures = {}, []
    for ident in world.identities:
        expected = op.rule(ident, op.tenant)
        with transaction.atomic():
            before = state()
            response = _request(op, ident, path, world)
            after = state()
            transaction.set_rollback(True)
        status = response.status_code
        cells[ident.name] = "302L" if expected == LOGIN and status == 302 else str(status)
        for problem in _check_cell(op, path, response, expected, before, after):
            failures.append(f"{ident.name}: {problem}")
    TABLE[row] = cells
    assert not failures, f"{row}\n" + "\n".join(failures)


# A rule matrix whose cases reach PostgreSQL-only SQL (the write path's statements), so
# `make test` runs it once, on PostgreSQL (test-sqlite deselects the `matrix` marker).
pytestmark = pytest.mark.matrix


# --------------------------------------------------------------------------------------
# HEAD answers as GET does (the newcomer's finding: the dashboard's pages refused HEAD
# with a 405 while the API answered it)
# --------------------------------------------------------------------------------------

ROUTES = dict(PATTERNS)
#: Every recipe's GET of a pattern outside the API: the dashboard's pages and fragments,
#: the login page, ``/healthz`` and ``/readyz``, the API docs page (the API itself
#: answers HEAD through ``TenantApi``).
PAGE_GETS = [(name, i, op) for name, i, op in CASES
             if op.method == "get" and "api/v1/" not in ROUTES[name]]
#: Headers a HEAD must answer as its GET does.
SAME_HEADERS = ("Content-Type", "Location", "Vary", "Cache-Control", "Allow")


def test_every_page_get_has_a_head_case():
    """The HEAD cases are the isolation table's GETs outside the API (every pattern has
    a recipe: ``test_every_url_pattern_has_a_recipe``), the pages named in the finding
    among them."""
    gets = {name for name, _, op in PAGE_GETS}
    assert {"run_list", "run_detail", "audit_log", "login", "healthz", "readyz"} <= gets


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "index", "op"), PAGE_GETS,
                         ids=[f"{n}-{i}" for n, i, _ in PAGE_GETS])
def test_head_answers_as_get(world, name, index, op):
    """For every identity: HEAD's status and headers are GET's, its body is empty, and
    it changes nothing (a GET writes nothing, nor does HEAD)."""
    path = reverse(name, kwargs=op.kwargs(world)) + (f"?{op.query}" if op.query else "")
    failures = []
    for ident in world.identities:
        client = ident.web() if op.surface == "web" else ident.api()
        with transaction.atomic():
            before = state()
            head = client.head(path)
            after = state()
            got = client.get(path)
            transaction.set_rollback(True)
        if head.status_code != got.status_code:
            failures.append(f"{ident.name}: HEAD {head.status_code}, GET {got.status_code}")
        for header in SAME_HEADERS:
            if head.get(header) != got.get(header):
                failures.append(f"{ident.name}: {header} {head.get(header)!r} on HEAD, "
                                f"{got.get(header)!r} on GET")
        if head.content:
            failures.append(f"{ident.name}: HEAD answered a body")
        if after != before:
            failures.append(f"{ident.name}: HEAD changed something")
    assert not failures, f"HEAD {path}\n" + "\n".join(failures)
