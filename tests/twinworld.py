"""The twin world: the two tenants both isolation suites build (issue 6's isolation table,
``tests/security/test_isolation_table.py``; issue 7's twin world,
``tests/security/test_twin_world.py``), built here once for both.

``acme`` (``HOME``) and ``globex`` (``TWIN``) hold the same runs, checkpoints and effects
under the same UUIDs (and the same operation keys), built through the services; each
tenant's data carries its own marker (``MARK``): workflow names, order ids in payloads,
receipts, reconcile evidence, every reason, and the names of the accounts that built it.
globex holds a few more (``extra``), so every count differs between the twins. Each
tenant has a writer that built it and a reviewer that requested its reviews; the
accounts the suites call with (a holder of each role in each tenant, a superuser and a
staff account without a role) come from ``holders``. The caller builds the world inside
a transaction it rolls back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from checkpoints import audittree, crypto, roles, services, webhooksign
from checkpoints.jobs import reconciliation
from checkpoints.models import (
    AuditEvent,
    NotificationAttempt,
    NotificationEndpoint,
    NotificationMessage,
    ReconcileAttempt,
    Tenant,
)
from checkpoints.reconcile import Answer
from checkpoints.services import notify_dispatch
from checkpoints.vocab import DeliveryState
from tests.helpers import (
    age_world,
    effect_body,
    envelope,
    graph_put,
    graph_writes,
    lg_put,
    lg_writes,
    put_checkpoint,
    walk_effect,
)
from tests.views.reconcilers import Scripted

HOME, TWIN = "acme", "globex"
SLUGS = (HOME, TWIN)
MARK = {HOME: "qqacmeqq", TWIN: "qqglobexqq"}  # in every piece of each tenant's data

#: What both tenants hold, under the same UUIDs (``world_ids``).
ID_NAMES = (
    "r_stuck", "c_stuck", "e_stuck",          # ambiguous, effect unresolved, a conflict
    "r_unknown", "c_unknown", "e_unknown",    # unknown outcome, a retry request open
    "r_retry", "c_retry",                     # ambiguous, nothing in doubt, no request
    "r_stable", "c_stable", "e_done",         # stable, effect confirmed with a receipt
    "r_looked", "c_looked", "e_looked",       # reconciled: a look-up with evidence
    "r_closed", "c_closed",                   # closed by a reviewer
    "new_cp", "new_fx",                       # ids a writer creates
)
#: What only globex holds: an unknown effect with a retry request open (``r_more``) and
#: a second conflict (``r_more2``).
EXTRA_NAMES = ("r_more", "c_more", "e_more", "r_more2", "c_more2")
LG_IDS = ["1f0c0000-0000-6000-8000-000000000001", "1f0c0000-0000-6000-8000-000000000002",
          "1f0c0000-0000-6000-8000-000000000003"]


def world_ids(namespace: str) -> tuple[dict[str, uuid.UUID], dict[str, uuid.UUID]]:
    """The UUIDs of ``ID_NAMES`` (both tenants) and of ``EXTRA_NAMES`` (globex only),
    derived from ``namespace`` (each suite its own)."""
    ids = {name: uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}") for name in ID_NAMES}
    extra = {name: uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{TWIN}/{name}")
             for name in EXTRA_NAMES}
    return ids, extra


@dataclass
class TenantData:
    """One tenant of the world: the accounts that built it and the ids of its objects
    that have no UUID of their own choosing."""

    tenant: Tenant
    builder: object                 # the writer that wrote its runs
    requester: object               # the reviewer that requested its reviews
    retry_pk: int = 0               # its open retry request (on ``r_unknown``)
    attempt_pk: int = 0             # its reconcile look-up with evidence (``r_looked``)
    bulk_id: str = ""               # its bulk action (issue 9, item 3)
    migration_id: str = ""          # its stored migration job (issue 19, item 2)
    hold_id: str = ""               # its active legal hold on ``r_stable`` (issue 20)
    erasure_id: str = ""            # its erasure request of ``r_closed``, not decided yet
    endpoint_id: str = ""           # its webhook endpoint (``ENDPOINT_ID``, both tenants)
    event_id: str = ""              # its delivered message to it (``EVENT_ID``, both)
    audit_event_id: str = ""        # an integrated audit event carrying the marker (issue 22)


@dataclass(frozen=True)
class Holder:
    """An account the suites call with, and its credentials: ``role`` in tenant ``slug``,
    or (both ``None``) ``flag`` ``"superuser"`` or ``"staff"`` and no role anywhere."""

    slug: str | None
    role: str | None
    user: object
    token: str
    cookies: dict                   # of a logged-in dashboard session
    flag: str = ""


def account(name: str, **flags):
    """A new account ``name`` (password ``pw-for-tests``), with ``flags`` (``is_staff``,
    ``is_superuser``...) set on it."""
    user = services.account_create(username=name, password="pw-for-tests")
    if flags:
        user_model = get_user_model()
        user_model.objects.filter(pk=user.pk).update(**flags)
        user = user_model.objects.get(pk=user.pk)
    return user


def login(user) -> dict:
    """The cookies of a dashboard session logged in as ``user``."""
    client = Client()
    client.force_login(user)
    return {k: v.value for k, v in client.cookies.items()}


def _payload(slug: str, phase: str) -> dict:
    m = MARK[slug]
    return {"phase": phase, "order_id": f"order-{m}", "workflow": f"wf-{m}"}


def _in_flight(writer, tenant, slug, run, cp, effect=None, key=""):
    put_checkpoint(writer, tenant, envelope(cp, run, 0, payload=_payload(slug, "ready")))
    put_checkpoint(writer, tenant, envelope(cp, run, 1, payload=_payload(slug, "charging")),
                   expected=0)
    if effect:
        walk_effect(writer, tenant, effect_body(effect, run, operation_key=key), "submitted")


def _conflict(writer, tenant, slug, run, cp):
    """A refused write on ``cp`` (at revision 1): a conflict to see."""
    with pytest.raises(services.StaleRevision):
        put_checkpoint(writer, tenant, envelope(cp, run, 1, payload=_payload(slug, "charged")),
                       expected=0)


#: The kind both tenants declare (``declared_kind``), each its own.
DECLARED_KIND = "twin.declared"


def declared_kind(description: str) -> dict:
    """A small declaration (``PUT …/kinds/{kind}/versions/{v}``): a ``step`` phase field."""
    return {"description": description,
            "schema": {"type": "object", "required": ["step"],
                       "properties": {"step": {"enum": ["ready", "calling", "done"]}}},
            "phase": {"pointer": "/step", "stable": ["ready"], "in_flight": ["calling"],
                      "completed": ["done"]}}


def _build_writes(slug: str, ids: dict, extra: dict, lg_thread: str,
                  lg_run: str) -> TenantData:
    """Phase 1 of a tenant: what its runtime writes (before the owners go quiet)."""
    m, i = MARK[slug], ids
    tenant = services.tenant_create(slug=slug, name=f"{slug} {m}")
    builder = account(f"{slug}-builder-{m}")
    services.role_grant(actor=None, tenant=tenant, user=builder, role="writer")
    requester = account(f"{slug}-requester-{m}")
    services.role_grant(actor=None, tenant=tenant, user=requester, role="reviewer")
    _in_flight(builder, tenant, slug, i["r_stuck"], i["c_stuck"], i["e_stuck"], "charge:stuck")
    _conflict(builder, tenant, slug, i["r_stuck"], i["c_stuck"])
    _in_flight(builder, tenant, slug, i["r_unknown"], i["c_unknown"], i["e_unknown"],
               "charge:unknown")
    _in_flight(builder, tenant, slug, i["r_retry"], i["c_retry"])
    _in_flight(builder, tenant, slug, i["r_looked"], i["c_looked"], i["e_looked"],
               "charge:looked")
    _in_flight(builder, tenant, slug, i["r_closed"], i["c_closed"])
    put_checkpoint(builder, tenant, envelope(i["c_stable"], i["r_stable"], 0,
                                             payload=_payload(slug, "charged")))
    done = effect_body(i["e_done"], i["r_stable"], operation_key="done")
    walk_effect(builder, tenant, done, "submitted")
    services.effect_put(actor=builder, tenant=tenant, body=services.parse_effect(
        dict(done, revision=2, state="confirmed", receipt={"charge_id": f"ch-{m}"}),
        url_id=i["e_done"]), expected_revision=1)
    if slug == TWIN:  # more of everything than its twin, so no count is shared
        e = extra
        _in_flight(builder, tenant, slug, e["r_more"], e["c_more"], e["e_more"], "charge:more")
        _in_flight(builder, tenant, slug, e["r_more2"], e["c_more2"])
        _conflict(builder, tenant, slug, e["r_more2"], e["c_more2"])
    # A declared kind of the same name in both (issue 19), its description marked; globex
    # has one version more.
    for version in ((1, 2) if slug == TWIN else (1,)):
        services.kind_declare(actor=None, tenant=tenant, kind=DECLARED_KIND, version=version,
                              body=declared_kind(f"declared {m}"))
    # A LangGraph thread under the same thread id in both (issue 10), marked in its
    # metadata; globex has one more thread.
    threads = (lg_thread, f"{lg_thread}-more") if slug == TWIN else (lg_thread,)
    for thread in threads:
        graph_put(builder, tenant, lg_put(thread, LG_IDS[0], nodes=["charge"],
                                          metadata={"run_id": lg_run, "note": f"lg-{m}"}))
        graph_put(builder, tenant, lg_put(thread, LG_IDS[1], parent=LG_IDS[0], nodes=["ship"],
                                          metadata={"run_id": lg_run, "note": f"lg-{m}"}))
        graph_writes(builder, tenant, lg_writes(thread, LG_IDS[1], "task", [(0, "out", m)]))
    return TenantData(tenant, builder, requester)


def _build_reviews(d: TenantData, slug: str, ids: dict, extra: dict) -> None:
    """Phase 2, once the owners are gone: review actions with marked reasons."""
    m, t, i = MARK[slug], d.tenant, ids
    services.effect_mark_unknown(actor=d.requester, tenant=t, effect_id=i["e_unknown"],
                                 reason=f"no look-up {m}")
    d.retry_pk = services.retry_request(actor=d.requester, tenant=t, run_id=i["r_unknown"],
                                        reason=f"try again {m}").pk
    services.run_close(actor=d.requester, tenant=t, run_id=i["r_closed"],
                       reason=f"handled by phone {m}")
    services.reconciler_configure(actor=None, tenant=t, service="payments",
                                  plugin="tests.views.reconcilers.Scripted")
    Scripted.answers = [Answer.found({"charge_id": f"ch-{m}"}, f"found {m}",
                                     evidence={"status": "succeeded", "note": f"ev-{m}"})]
    queued = services.run_reconcile(actor=d.requester, tenant=t, run_id=i["r_looked"],
                                    reason=f"ask {m}")
    reconciliation.execute(queued.requests[0].pk)
    Scripted.answers = []
    d.attempt_pk = ReconcileAttempt.objects.get(tenant=t).pk
    # A bulk action (issue 9, item 3) that changes no state: conflicts of a stable run.
    d.bulk_id = str(services.bulk_submit(
        actor=d.requester, tenant=t, action="acknowledge_conflicts", reason=f"bulk {m}",
        run_ids=[i["r_stable"]], client_token=uuid.uuid5(uuid.NAMESPACE_URL, slug))[0].uuid)
    # A stored migration job (issue 19, item 2), queued, with one item: written directly
    # (the world has no admin; the job's rules are tests/services/test_migration_jobs.py).
    from checkpoints.models import MigrationJob, MigrationJobItem
    job = MigrationJob.objects.create(
        tenant=t, uuid=uuid.uuid5(uuid.NAMESPACE_OID, slug), client_token=uuid.uuid4(),
        requested_by=d.requester, requested_by_name=d.requester.get_username(),
        kind="acme.order", to_version=2, selection={}, fingerprint="0" * 64)
    MigrationJobItem.objects.create(tenant=t, job=job, checkpoint_uuid=i["c_stuck"],
                                    run_uuid=i["r_stuck"], outcome="refused",
                                    reason="owner_live", detail=f"owner {m}", attempt=1)
    d.migration_id = str(job.uuid)
    # A legal hold and an erasure request (issue 20), written directly like the job (the
    # world has no admin; their rules are tests/lifecycle/): each tenant its own ids.
    from checkpoints.models import ErasureRequest, HeldRun, LegalHold
    hold = LegalHold.objects.create(
        tenant=t, uuid=uuid.uuid5(uuid.NAMESPACE_OID, f"hold/{slug}"), scope="runs",
        run_uuids=[str(i["r_stable"])], reason=f"hold {m}", placed_by=d.requester,
        placed_by_name=d.requester.get_username())
    HeldRun.objects.create(tenant=t, hold=hold, run_uuid=i["r_stable"])
    d.hold_id = str(hold.uuid)
    d.erasure_id = str(ErasureRequest.objects.create(
        tenant=t, uuid=uuid.uuid5(uuid.NAMESPACE_OID, f"erasure/{slug}"),
        run_uuids=[str(i["r_closed"])], reason=f"erase {m}", requested_by=d.requester,
        requested_by_name=d.requester.get_username()).uuid)
    if slug == TWIN:
        services.effect_mark_unknown(actor=d.requester, tenant=t, effect_id=extra["e_more"],
                                     reason=f"more {m}")
        services.retry_request(actor=d.requester, tenant=t, run_id=extra["r_more"],
                               reason=f"more {m}")


#: Notification endpoints (issue 21): one webhook endpoint under the same UUID in both
#: tenants, with one delivered message under the same event id; globex holds one more
#: endpoint (``TWIN_ENDPOINT_ID``) with a message waiting (``pending``).
ENDPOINT_ID = uuid.uuid5(uuid.NAMESPACE_OID, "twin-world/endpoint")
TWIN_ENDPOINT_ID = uuid.uuid5(uuid.NAMESPACE_OID, "twin-world/globex/endpoint")
EVENT_ID = "msg_" + uuid.uuid5(uuid.NAMESPACE_OID, "twin-world/event").hex


def _build_notifications(d: TenantData, slug: str) -> None:
    """Phase 3: the tenant's notification endpoints and delivery log, written directly
    like the holds (the world has no admin; the rules are tests/services/test_notify_*.py
    and tests/api/test_notifications_api.py). Names, hosts, subjects and answers carry the
    marker; the signing secret is a real one, encrypted under the tenant's data key."""
    m, t = MARK[slug], d.tenant
    own = [(ENDPOINT_ID, EVENT_ID, DeliveryState.DELIVERED)]
    if slug == TWIN:
        own.append((TWIN_ENDPOINT_ID, EVENT_ID[:-4] + "more", DeliveryState.PENDING))
    for n, (eid, event_id, state) in enumerate(own):
        endpoint = NotificationEndpoint.objects.create(
            tenant=t, uuid=eid, name=f"hooks {n} {m}", channel="webhook",
            url=f"https://hooks.{m}.example.com/in/{n}",
            secret=crypto.encrypt_text(webhooksign.new_secret(), tenant=t),
            event_types=["run.needs_review", "run.resolved"], kinds=[f"kind-{m}"],
            created_by=d.requester, created_by_name=d.requester.get_username())
        message = NotificationMessage.objects.create(
            tenant=t, endpoint=endpoint, event_id=event_id, event_type="run.needs_review",
            payload={"type": "run.needs_review", "data": {"tenant": slug, "note": m}},
            subject=f"[recovery] {m} needs review", text=f"review {m}", state=state)
        NotificationAttempt.objects.create(
            tenant=t, message=message, number=1, started_at=message.created_at,
            latency_ms=12, status_code=200, response_head=f"ok {m}")
    d.endpoint_id, d.event_id = str(ENDPOINT_ID), EVENT_ID


def build_world(ids: dict, extra: dict, *, lg_thread: str, lg_run: str) -> dict[str, TenantData]:
    """Both tenants, by slug: ``ids`` (``world_ids``) in each and ``extra`` in globex;
    the LangGraph thread ``lg_thread`` (its checkpoints' metadata naming the run
    ``lg_run``) in each, plus ``<lg_thread>-more`` in globex. Their runtimes write, then
    an hour passes and the sweep marks the quiet runs, then their reviewers act, then the
    notification round drains the outbox and their endpoints are added (globex first each
    time, so its rows come first)."""
    data = {slug: _build_writes(slug, ids, extra, lg_thread, lg_run) for slug in (TWIN, HOME)}
    age_world(3600)
    services.sweep_stale_runs()
    for slug in (TWIN, HOME):
        _build_reviews(data[slug], slug, ids, extra)
    notify_dispatch.dispatch_round()  # the outbox, drained while no endpoint listens
    for slug in (TWIN, HOME):
        _build_notifications(data[slug], slug)
    for slug in (TWIN, HOME):
        _build_audit_tree(data[slug], slug)
    return data


def _build_audit_tree(d: TenantData, slug: str) -> None:
    """Phase 4: the tenant's queued audit events integrated into its Merkle tree (a
    signed head), and the id of its first event whose leaf carries the marker: each
    tenant's ids differ, so one tenant's id on the other's URL finds nothing."""
    services.audit_integrate(d.tenant)
    for event in AuditEvent.objects.filter(tenant=d.tenant).order_by("seq"):
        if MARK[slug] in audittree.leaf_input(event).decode("utf-8"):
            d.audit_event_id = str(event.pk)
            return
    raise AssertionError(f"no audit event of {slug} carries its marker")


def holders() -> list[Holder]:
    """New accounts, each with a token and a session: a holder of each role in acme, then
    each in globex (accounts ``<role>-<slug>``), then a superuser and a staff account
    without a role (``superuser-no-role``, ``staff-no-role``)."""
    out = []
    for slug in SLUGS:
        tenant = Tenant.objects.get(slug=slug)
        for role in roles.ROLES:
            user = account(f"{role}-{slug}")
            services.role_grant(actor=None, tenant=tenant, user=user, role=role)
            out.append(Holder(slug, role, user, services.token_issue(user=user), login(user)))
    for flag, flags in (("superuser", {"is_superuser": True, "is_staff": True}),
                        ("staff", {"is_staff": True})):
        user = account(f"{flag}-no-role", **flags)
        out.append(Holder(None, None, user, services.token_issue(user=user), login(user),
                          flag=flag))
    return out


def holder_of_both(role: str):
    """A new account ``<role>-of-both`` holding ``role`` in both tenants (issue 17, item
    14: scoping a read to all of the caller's tenants instead of the URL's shows only to
    an account with more than one)."""
    user = account(f"{role}-of-both")
    for slug in SLUGS:
        services.role_grant(actor=None, tenant=Tenant.objects.get(slug=slug), user=user,
                            role=role)
    return user
