"""The twin world (issue 7, item 1): two tenants holding the same UUIDs, each with its own
markers, and a full persona set in each; nothing of one tenant may ever reach the other.

- **World**: ``acme`` and ``globex`` hold runs, checkpoints and effects under the same
  UUIDs (and the same operation keys), built through the services. Each tenant's data
  carries its own marker (``MARK``): workflow names, order ids in payloads, receipts,
  reconcile evidence, every reason, and the names of the accounts that built it. globex
  has a few more runs, effects, retry requests and open conflicts, so every count
  differs between the twins. Personas in each tenant: viewer, reviewer, approver,
  writer, admin; plus a superuser and a staff account with no role anywhere, and a
  viewer of both tenants (``World.both``: on the selectors and the tenant's own API URLs;
  asked through acme for an object only globex holds, it is 404). Built once
  for the module inside a transaction rolled back at the end; each request or call runs
  in a savepoint that is rolled back too.
- **Sources of truth** (a new one fails a ``test_every_…`` test until it has a recipe):
  the public functions of ``checkpoints/selectors/`` (introspected); the operations of
  the OpenAPI schema (drf-spectacular's generator, which reads the URL resolver); the
  dashboard's URL patterns (``checkpoints/urls.py``); the public services that take a
  ``tenant`` (introspected from services, reconciliation and audit).
- **Cells**: every selector x tenant x persona (13 x 2 x 12 = 312, plus 20 cells of the
  twin's integer ids); every API operation x tenant x persona (23 x 2 x 12 = 552, the two
  HEADs included); every dashboard page x tenant x persona (20 x 2 x 12 = 480); every
  tenant-taking service (23 recipes), called in each tenant by its own persona with the
  twin's ids or objects, and by the twin's persona (88). 1,452 cells in all.
- **What each cell asserts**: the other tenant's marker appears nowhere in the answer
  (body and headers), model objects returned belong to the asked tenant, counts are the
  tenant's own (an oracle counting rows by tenant), a write changes nothing of the twin,
  and a read that succeeds shows its own tenant's marker (so a cell cannot pass by
  showing nothing).
- **Killed mutants** (scratch edits, one at a time): the tenant filter removed from
  ``effect_get``, ``retry_get``, ``audit_list``, ``effect_find``, ``run_list``,
  ``report``, the audit query of ``run_detail``, and the retry decision in services;
  ``run_get`` and ``effect_get`` scoped to all of the caller's tenants
  (``for_tenant(tenants_for_user(user))``), killed by the viewer of both (issue 17).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db import models as djm
from django.db import transaction
from django.db.models import F
from django.test import Client
from django.urls import URLPattern, reverse
from rest_framework.test import APIClient

from checkpoints import audit, audithead, audittree, reports, roles, selectors, services
from checkpoints import urls as dashboard_urls
from checkpoints.exceptions import DomainError, Forbidden, NotFound
from checkpoints.interop import langgraph, runifold
from checkpoints.interop.runifold import jsonl_lines
from checkpoints.jobs import reconciliation
from checkpoints.models import (
    AuditEvent,
    BulkActionItem,
    Checkpoint,
    CheckpointRevision,
    Conflict,
    Effect,
    ErasureRequest,
    LegalHold,
    NotificationEndpoint,
    NotificationMessage,
    ReconcileRequest,
    RetryRequest,
    Run,
    RunTransition,
    Tenant,
    Tombstone,
    TombstonePurge,
)
from checkpoints.vocab import RetryState
from tests.helpers import effect_body, envelope, lg_put, lg_writes
from tests.matrixhelpers import interop_modules, is_internal, service_modules
from tests.twinworld import (
    DECLARED_KIND,
    ENDPOINT_ID,
    EVENT_ID,
    HOME,
    LG_IDS,
    MARK,
    SLUGS,
    TWIN,
    TWIN_ENDPOINT_ID,
    TenantData,
    build_world,
    declared_kind,
    holder_of_both,
    holders,
    login,
    world_ids,
)

IDS, EXTRA = world_ids("twin-world")  # EXTRA: globex only
LG_THREAD = "tw-thread"


def other(slug: str) -> str:
    return TWIN if slug == HOME else HOME


# --------------------------------------------------------------------------------------
# The world (tests/twinworld.py)
# --------------------------------------------------------------------------------------

@dataclass
class Persona:
    name: str
    role: str | None
    slug: str | None
    user: object
    token: str
    cookies: dict

    def api(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client

    def web(self) -> Client:
        client = Client()
        for key, value in self.cookies.items():
            client.cookies[key] = value
        return client

    also: tuple[str, ...] = ()  # more tenants where it holds the same role

    def perms(self, slug: str) -> set[str]:
        return set(roles.ROLE_PERMISSIONS[self.role]) if slug in (self.slug, *self.also) \
            and self.role else set()


@dataclass
class World:
    data: dict[str, TenantData]
    personas: list[Persona] = field(default_factory=list)
    #: Viewer in both tenants (issue 17, item 14): scoping a read to all of the caller's
    #: tenants instead of the URL's shows only to an account that has more than one.
    #: Kept out of ``personas`` (whose unscoped pages show the persona's one tenant).
    both: Persona | None = None

    def tenant(self, slug: str) -> Tenant:
        return self.data[slug].tenant

    def persona(self, slug: str, role: str) -> Persona:
        return next(p for p in self.personas if p.slug == slug and p.role == role)


def _personas() -> list[Persona]:
    return [Persona(f"{h.slug}.{h.role}" if h.role else h.flag, h.role, h.slug, h.user,
                    h.token, h.cookies) for h in holders()]


def _both() -> Persona:
    """A viewer of both tenants (``World.both``)."""
    user = holder_of_both("viewer")
    return Persona("both.viewer", "viewer", HOME, user, services.token_issue(user=user),
                   login(user), also=(TWIN,))


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            data = build_world(IDS, EXTRA, lg_thread=LG_THREAD, lg_run="tw-run")
            yield World(data, _personas(), _both())
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


# --------------------------------------------------------------------------------------
# Oracles and checks
# --------------------------------------------------------------------------------------

def own_counts(tenant: Tenant) -> dict:
    """What a tenant holds, counted by the test itself (rows filtered by tenant)."""
    def by(model, column, **filters):
        return dict(Counter(model.objects.filter(tenant=tenant, **filters)
                            .values_list(column, flat=True)))
    return {
        "runs": by(Run, "recovery_state"),
        "effects": by(Effect, "state"),
        "retry_requests": by(RetryRequest, "state"),
        "open_conflicts": Conflict.objects.filter(tenant=tenant,
                                                  acknowledged_at__isnull=True).count(),
        "audit": AuditEvent.objects.filter(tenant=tenant).count(),
        "payments": Effect.objects.filter(tenant=tenant, service="payments").count(),
        "charged_runs": Effect.objects.filter(tenant=tenant, operation_key__contains="charge:")
        .values("run").distinct().count(),
    }


def _objects(value, depth=0):
    """Model instances inside a selector's answer (lists, dicts, dataclasses, and the
    related objects loaded with them)."""
    if depth > 6:
        return
    if isinstance(value, djm.Model):
        yield value
        for cached in value._state.fields_cache.values():
            if cached is not None:
                yield from _objects(cached, depth + 1)
        for cached in getattr(value, "_prefetched_objects_cache", {}).values():
            yield from _objects(list(cached), depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _objects(getattr(value, f.name), depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _objects(v, depth + 1)
    elif isinstance(value, (list, tuple, set, djm.QuerySet)):
        for v in value:
            yield from _objects(v, depth + 1)


def _text(value) -> str:
    """Everything a selector's answer says, as text: values of every loaded column of
    every object in it, and the plain values around them."""
    parts = []
    for obj in _objects(value):
        parts += [str(getattr(obj, f.attname, "")) for f in obj._meta.concrete_fields]
    parts.append(repr(value))
    return "\n".join(parts)


def foreign_problems(value, slug: str, world: World) -> list[str]:
    """What of the twin of ``slug`` is in ``value``."""
    problems = []
    mark = MARK[other(slug)]
    if mark in _text(value):
        problems.append(f"the marker {mark} of {other(slug)} appears")
    own = world.tenant(slug).pk
    for obj in _objects(value):
        if isinstance(obj, Tenant):
            if obj.pk != own:
                problems.append(f"the tenant {obj.slug} appears")
        elif getattr(obj, "tenant_id", own) != own:
            problems.append(f"{type(obj).__name__} {obj.pk} of {other(slug)}")
    rows = value[0] if isinstance(value, tuple) and value and isinstance(value[0], list) \
        else value if isinstance(value, list) else []
    for row in rows:
        if isinstance(row, dict) and row.get("tenant_id", own) != own:
            problems.append(f"a row of {other(slug)}: {row.get('id')}")
    return problems


# --------------------------------------------------------------------------------------
# Selectors: every public function of checkpoints/selectors/
# --------------------------------------------------------------------------------------

def _viewer(w: World, slug: str):
    return w.persona(slug, "viewer").user


def _run(w: World, slug: str, name="r_looked") -> Run:
    return selectors.run_get(user=_viewer(w, slug), tenant=w.tenant(slug), run_id=IDS[name])


@dataclass
class SelectorCell:
    call: Callable[[World, str, object], object]   # (world, tenant slug, user) -> answer
    count: Callable[[World, str, object], str] | None = None  # "" or the problem
    shows_mark: bool = True  # an answer holds its tenant's marker


def _count_is(expected_of: Callable, got_of: Callable) -> Callable:
    def check(w, slug, answer):
        expected, got = expected_of(own_counts(w.tenant(slug))), got_of(answer)
        return "" if expected == got else f"count {got}, the tenant's own is {expected}"
    return check


SELECTORS: dict[str, SelectorCell] = {
    # Tombstone governance (issue 20, item 5): each tenant's own (none in the world).
    "tombstone_list": SelectorCell(
        lambda w, s, u: selectors.tombstone_list(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if len(a) == Tombstone.objects.filter(tenant=w.tenant(s)).count()
        else "tombstone count", shows_mark=False),
    "tombstone_purge_list": SelectorCell(
        lambda w, s, u: selectors.tombstone_purge_list(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if len(a) == TombstonePurge.objects.filter(
            tenant=w.tenant(s)).count() else "purge count", shows_mark=False),
    "run_list": SelectorCell(
        lambda w, s, u: selectors.run_list(user=u, tenant=w.tenant(s),
                                           filters=selectors.RunFilters(), limit=200),
        _count_is(lambda c: sum(c["runs"].values()), lambda a: len(a[0]))),
    # The search (issue 9) answers with its own tenant's runs only: the twins share
    # operation keys ("charge:…") and checkpoint ids, so a leak changes the numbers.
    "run_state_counts": SelectorCell(
        lambda w, s, u: selectors.run_state_counts(
            user=u, tenant=w.tenant(s), filters=selectors.RunFilters(q="CHARGE:")),
        _count_is(lambda c: c["charged_runs"], lambda a: sum(a.values())), shows_mark=False),
    "run_position": SelectorCell(
        lambda w, s, u: selectors.run_position(
            user=u, tenant=w.tenant(s), filters=selectors.RunFilters(q=str(IDS["c_stuck"])),
            sort="created", pk=2**62),
        lambda w, s, a: "" if a == 1 else f"{a} runs before, the tenant has 1",
        shows_mark=False),
    "run_get": SelectorCell(
        lambda w, s, u: selectors.run_get(user=u, tenant=w.tenant(s), run_id=IDS["r_closed"])),
    "run_detail": SelectorCell(
        lambda w, s, u: selectors.run_detail(user=u, tenant=w.tenant(s),
                                             run_id=IDS["r_unknown"]),
        lambda w, s, a: "" if len(a.audit) == AuditEvent.objects.filter(
            tenant=w.tenant(s), run_uuid=IDS["r_unknown"]).count() else "audit count"),
    "run_summary": SelectorCell(
        lambda w, s, u: selectors.run_summary(user=u, tenant=w.tenant(s),
                                              run_id=IDS["r_unknown"])),
    "checkpoint_history": SelectorCell(
        lambda w, s, u: selectors.checkpoint_history(
            user=u, tenant=w.tenant(s), checkpoint=selectors.checkpoint_get(
                user=u, tenant=w.tenant(s), checkpoint_id=IDS["c_stuck"]))),
    "effect_history": SelectorCell(
        lambda w, s, u: selectors.effect_history(
            user=u, tenant=w.tenant(s), effect=selectors.effect_get(
                user=u, tenant=w.tenant(s), effect_id=IDS["e_done"]))),
    "reconcile_requests": SelectorCell(
        lambda w, s, u: selectors.reconcile_requests(user=u, tenant=w.tenant(s),
                                                     run=_run(w, s)),
        lambda w, s, a: "" if len(a) == ReconcileRequest.objects.filter(
            tenant=w.tenant(s)).count() else "request count"),
    "reconcile_attempt_get": SelectorCell(
        lambda w, s, u: selectors.reconcile_attempt_get(user=u, tenant=w.tenant(s),
                                                        attempt_id=w.data[s].attempt_pk)),
    # The inbox's next steps (issue 21, item 7): one per run of the tenant's own page.
    "page_steps": SelectorCell(
        lambda w, s, u: selectors.page_steps(user=u, tenant=w.tenant(s), rows=selectors.run_list(
            user=u, tenant=w.tenant(s), filters=selectors.RunFilters(), limit=200).rows),
        _count_is(lambda c: sum(c["runs"].values()), len), shows_mark=False),
    # The API run detail's next step (stop 35): its own run's, the list's words.
    "run_step": SelectorCell(
        lambda w, s, u: selectors.run_step(user=u, tenant=w.tenant(s), run=_run(w, s)),
        shows_mark=False),
    # The run page's LangGraph thread id (issue 21, item 10), from its own checkpoints.
    "run_thread_id": SelectorCell(
        lambda w, s, u: selectors.run_thread_id(
            user=u, tenant=w.tenant(s), run=_run(w, s),
            checkpoints=selectors.run_detail(user=u, tenant=w.tenant(s),
                                             run_id=IDS["r_looked"]).checkpoints),
        shows_mark=False),
    "run_owner_status": SelectorCell(
        lambda w, s, u: selectors.run_owner_status(user=u, tenant=w.tenant(s), run=_run(w, s)),
        shows_mark=False),
    "checkpoint_get": SelectorCell(
        lambda w, s, u: selectors.checkpoint_get(user=u, tenant=w.tenant(s),
                                                 checkpoint_id=IDS["c_stuck"])),
    "effect_get": SelectorCell(
        lambda w, s, u: selectors.effect_get(user=u, tenant=w.tenant(s),
                                             effect_id=IDS["e_done"])),
    "effect_find": SelectorCell(
        lambda w, s, u: selectors.effect_find(user=u, tenant=w.tenant(s), service="payments",
                                              operation_key=None),
        _count_is(lambda c: c["payments"], len)),
    "retry_get": SelectorCell(
        lambda w, s, u: selectors.retry_get(user=u, tenant=w.tenant(s),
                                            retry_id=w.data[s].retry_pk)),
    "audit_list": SelectorCell(
        lambda w, s, u: selectors.audit_list(user=u, tenant=w.tenant(s), limit=500),
        _count_is(lambda c: c["audit"], len)),
    "report": SelectorCell(
        lambda w, s, u: selectors.report(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if (a["effects"], a["retry_requests"], a["open_conflicts"],
                               {k: v for k, v in a["runs"].items() if v}) == (
            (c := own_counts(w.tenant(s)))["effects"], c["retry_requests"],
            c["open_conflicts"], c["runs"]) else f"report {a}, own {c}",
        shows_mark=False),
    "run_ids_matching": SelectorCell(
        lambda w, s, u: selectors.run_ids_matching(user=u, tenant=w.tenant(s),
                                                   filters=selectors.RunFilters(), limit=500),
        _count_is(lambda c: sum(c["runs"].values()), len), shows_mark=False),
    "bulk_get": SelectorCell(
        lambda w, s, u: selectors.bulk_get(user=u, tenant=w.tenant(s),
                                           bulk_id=w.data[s].bulk_id)),
    # The tenant's bulk actions (the list): its own one, never the twin's.
    "bulk_list": SelectorCell(
        lambda w, s, u: selectors.bulk_list(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if [str(b.uuid) for b in a] == [w.data[s].bulk_id]
        else f"bulk actions {[str(b.uuid) for b in a]}"),
    "kind_usage": SelectorCell(
        lambda w, s, u: selectors.kind_usage(user=u, tenant=w.tenant(s)),
        lambda w, s, a: _kinds_count(w, s, [(v.checkpoints, v.schema_mismatch_runs)
                                            for k in a for v in k.versions]),
        shows_mark=False),
    "kind_known": SelectorCell(
        lambda w, s, u: selectors.kind_known(user=u, tenant=w.tenant(s), kind=DECLARED_KIND),
        shows_mark=False),
    "declared_kind_get": SelectorCell(
        lambda w, s, u: selectors.declared_kind_get(user=u, tenant=w.tenant(s),
                                                    kind=DECLARED_KIND, version=1)),
    # Legal holds and erasure requests (issue 20): each tenant's own, by its own ids.
    "legal_hold_list": SelectorCell(
        lambda w, s, u: selectors.legal_hold_list(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if len(a) == LegalHold.objects.filter(tenant=w.tenant(s)).count()
        else f"{len(a)} holds"),
    "legal_hold_get": SelectorCell(
        lambda w, s, u: selectors.legal_hold_get(user=u, tenant=w.tenant(s),
                                                 hold_id=w.data[s].hold_id)),
    "erasure_request_list": SelectorCell(
        lambda w, s, u: selectors.erasure_request_list(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if len(a) == ErasureRequest.objects.filter(
            tenant=w.tenant(s)).count() else f"{len(a)} requests"),
    "erasure_request_get": SelectorCell(
        lambda w, s, u: selectors.erasure_request_get(user=u, tenant=w.tenant(s),
                                                      request_id=w.data[s].erasure_id)),
    "state_counts": SelectorCell(
        lambda w, s, u: selectors.state_counts(tenant=w.tenant(s)),
        lambda w, s, a: "" if {k: v for k, v in a.items() if v} == own_counts(
            w.tenant(s))["runs"] else f"counts {a}",
        shows_mark=False),
}


def _kinds_count(w: World, slug: str, versions: list[tuple[int, int]]) -> str:
    """The kinds' (checkpoints, schema_mismatch runs) per version, summed: every checkpoint
    of the tenant and its schema_mismatch runs, nothing of the twin's."""
    t = w.tenant(slug)
    got = tuple(map(sum, zip(*versions, strict=True))) if versions else (0, 0)
    want = (Checkpoint.objects.filter(tenant=t).count(),
            own_counts(t)["runs"].get("schema_mismatch", 0))
    return "" if got == want else f"kinds (checkpoints, mismatched) {got}, own {want}"


def _own_rows(model, got_of: Callable) -> Callable:
    """A count oracle: the answer holds as many rows as the tenant's own ``model`` rows
    (the twin world has none of the lifecycle's rows, so also: none of the twin's)."""
    def check(w, slug, answer):
        want, got = model.objects.filter(tenant=w.tenant(slug)).count(), got_of(answer)
        return "" if want == got else f"{model.__name__} rows {got}, the tenant's own {want}"
    return check


SELECTORS.update({  # Short run ids (the run page's URLs): the shared run id's prefix.
    "run_prefix_matches": SelectorCell(
        lambda w, s, u: selectors.run_prefix_matches(user=u, tenant=w.tenant(s),
                                                     prefix=str(IDS["r_closed"])[:8]),
        lambda w, s, a: "" if a and all(r.tenant_id == w.tenant(s).pk for r in a)
        else "another tenant's run, or none", shows_mark=False),
})


SELECTORS.update({  # The data lifecycle (issue 20): the Data page's reads.
    "data_policy_get": SelectorCell(
        lambda w, s, u: selectors.data_policy_get(user=u, tenant=w.tenant(s)),
        lambda w, s, a: "" if a.tenant_id == w.tenant(s).pk else "another tenant's policy",
        shows_mark=False),
    "tombstone_page": SelectorCell(
        lambda w, s, u: selectors.tombstone_page(user=u, tenant=w.tenant(s)),
        _own_rows(Tombstone, lambda a: a.total), shows_mark=False),
    "run_legal_holds": SelectorCell(
        lambda w, s, u: selectors.run_legal_holds(
            user=u, tenant=w.tenant(s), run=Run.objects.get(tenant=w.tenant(s),
                                                            uuid=IDS["r_closed"])),
        lambda w, s, a: "" if all(h.tenant_id == w.tenant(s).pk for h in a)
        else "another tenant's hold", shows_mark=False),
    "run_tombstone": SelectorCell(
        lambda w, s, u: selectors.run_tombstone(
            user=u, tenant=w.tenant(s), run=Run.objects.get(tenant=w.tenant(s),
                                                            uuid=IDS["r_closed"])),
        lambda w, s, a: "" if a is None else "a tombstone for a run never deleted",
        shows_mark=False),
})


# Integer ids are not shared by the twins: the twin's id, asked in this tenant, is 404.
def _approval_queue(w: World, slug: str, user):
    """The queue is an approver's read: another role of the tenant is ``Forbidden``
    (said as such, so the cell checks only what an approver is answered)."""
    try:
        return selectors.approval_queue(user=user, tenant=w.tenant(slug))
    except Forbidden:
        return "forbidden"


def _queue_count(w: World, slug: str, answer) -> str:
    if answer == "forbidden":
        return ""
    t = w.tenant(slug)
    rows = answer.rows
    if any(r.retry.tenant_id != t.pk or r.retry.run.tenant_id != t.pk for r in rows):
        return "another tenant's request"
    want = RetryRequest.objects.filter(tenant=t, state=RetryState.REQUESTED).count()
    return "" if len(rows) == want else f"{len(rows)} requests, own {want}"


def _approvers_only(read):
    """A selector an approver reads (the queue, ``GET …/retry-requests``): another role
    of the tenant is ``Forbidden``, said as such (the cell checks what an approver is
    answered)."""
    def call(w: World, slug: str, user):
        try:
            return read(w, slug, user)
        except Forbidden:
            return "forbidden"
    return call


def _retry_list_count(w: World, slug: str, answer) -> str:
    """Every state: all the tenant's requests, none of the twin's."""
    if answer == "forbidden":
        return ""
    t = w.tenant(slug)
    if any(r.retry.tenant_id != t.pk or r.retry.run.tenant_id != t.pk for r in answer):
        return "another tenant's request"
    want = RetryRequest.objects.filter(tenant=t).count()
    return "" if len(answer) == want else f"{len(answer)} requests, own {want}"


SELECTORS.update({  # ``GET …/retry-requests``: the queue's rows over the API.
    "retry_request_list": SelectorCell(
        _approvers_only(lambda w, s, u: selectors.retry_request_list(
            user=u, tenant=w.tenant(s), state=selectors.RETRY_STATE_ALL, limit=500)),
        _retry_list_count, shows_mark=False),
    "retry_request_get": SelectorCell(
        _approvers_only(lambda w, s, u: selectors.retry_request_get(
            user=u, tenant=w.tenant(s), retry_id=w.data[s].retry_pk)),
        lambda w, s, a: "" if a == "forbidden" or a.retry.tenant_id == w.tenant(s).pk
        else "another tenant's request", shows_mark=False),
})

SELECTORS.update({  # Issue 21, items 8 and 9: the polls' reads and the approver's queue.
    "run_live": SelectorCell(
        lambda w, s, u: selectors.run_live(user=u, tenant=w.tenant(s),
                                           run_id=IDS["r_unknown"]),
        lambda w, s, a: "" if a.state == Run.objects.get(
            tenant=w.tenant(s), uuid=IDS["r_unknown"]).recovery_state else "another run's state",
        shows_mark=False),
    "new_runs": SelectorCell(
        lambda w, s, u: selectors.new_runs(user=u, tenant=w.tenant(s),
                                           filters=selectors.RunFilters(),
                                           since=selectors.from_micros(1)),
        lambda w, s, a: "" if a == min(selectors.NEW_RUNS_CAP + 1, Run.objects.filter(
            tenant=w.tenant(s), state_changed_at__isnull=False).count()) else f"{a} new runs",
        shows_mark=False),
    "bulk_outcomes": SelectorCell(
        lambda w, s, u: selectors.bulk_outcomes(
            user=u, tenant=w.tenant(s), items=list(BulkActionItem.objects.filter(
                tenant=w.tenant(s)))),
        lambda w, s, a: "" if set(a) == set(BulkActionItem.objects.filter(
            tenant=w.tenant(s)).values_list("pk", flat=True)) else "other rows",
        shows_mark=False),
    "approval_queue": SelectorCell(_approval_queue, _queue_count, shows_mark=False),
    "rejected_retries": SelectorCell(
        lambda w, s, u: selectors.rejected_retries(
            user=u, tenant=w.tenant(s), run_pks=list(Run.objects.values_list("pk", flat=True))),
        lambda w, s, a: "" if all(r.tenant_id == w.tenant(s).pk for r in a.values())
        else "another tenant's request", shows_mark=False),
})

def _own_messages(w: World, slug: str, answer) -> str:
    """The delivery log of the shared endpoint id: this tenant's messages to it only."""
    endpoint, rows = answer
    want = NotificationMessage.objects.filter(tenant=w.tenant(slug),
                                              endpoint__uuid=ENDPOINT_ID).count()
    if endpoint.tenant_id != w.tenant(slug).pk:
        return "another tenant's endpoint"
    return "" if len(rows) == want else f"{len(rows)} messages, own {want}"


SELECTORS.update({  # Notification endpoints (issue 21): the same endpoint UUID in both.
    "notification_endpoint_list": SelectorCell(
        lambda w, s, u: selectors.notification_endpoint_list(user=u, tenant=w.tenant(s)),
        _own_rows(NotificationEndpoint, len)),
    "notification_endpoint_get": SelectorCell(
        lambda w, s, u: selectors.notification_endpoint_get(user=u, tenant=w.tenant(s),
                                                            endpoint_id=ENDPOINT_ID)),
    "notification_deliveries": SelectorCell(
        lambda w, s, u: selectors.notification_deliveries(user=u, tenant=w.tenant(s),
                                                          endpoint_id=ENDPOINT_ID),
        _own_messages),
})

CROSS_IDS: dict[str, Callable[[World, str, object], object]] = {
    "retry_get": lambda w, s, u: selectors.retry_get(
        user=u, tenant=w.tenant(s), retry_id=w.data[other(s)].retry_pk),
    # Asked by the tenant's approver (another role is refused before any look-up).
    "retry_request_get": lambda w, s, u: selectors.retry_request_get(
        user=_as(w, s, "approver"), tenant=w.tenant(s), retry_id=w.data[other(s)].retry_pk),
    "reconcile_attempt_get": lambda w, s, u: selectors.reconcile_attempt_get(
        user=u, tenant=w.tenant(s), attempt_id=w.data[other(s)].attempt_pk),
    "bulk_get": lambda w, s, u: selectors.bulk_get(user=u, tenant=w.tenant(s),
                                                   bulk_id=w.data[other(s)].bulk_id),
    "migration_job_get": lambda w, s, u: selectors.migration_job_get(
        user=u, tenant=w.tenant(s), kind="acme.order", job_id=w.data[other(s)].migration_id),
    "legal_hold_get": lambda w, s, u: selectors.legal_hold_get(
        user=u, tenant=w.tenant(s), hold_id=w.data[other(s)].hold_id),
    "erasure_request_get": lambda w, s, u: selectors.erasure_request_get(
        user=u, tenant=w.tenant(s), request_id=w.data[other(s)].erasure_id),
}
NOT_TENANT_DATA = {
    "encode_cursor": "pure: turns a row into a cursor",
    "decode_cursor": "pure: parses a cursor",
    "search_terms": "pure: checks and strips a search",
    "run_prefix_digits": "pure: the hex digits a short run id holds",
    "filter_limit": "pure: a filter's most characters, from the model's columns",
    "search_substring": "pure: whether a search term reads the substring branches",
    "uuid_prefix_range": "pure: the UUID range a prefix spans",
    "tenants_for_user": "the tenants of one account: test_tenants_for_user_lists_only_granted",
    "tokens_of_account": "one account's tokens, no tenant: the operator's list_tokens",
    "migration_job_get": "one job by its UUID: the twin's job asked here is 404 (CROSS_IDS); "
                         "its items are its own tenant's (the API recipe's marker)",
    "migration_offers": "pure: reads the kind_usage answer it is given and the registry",
    "consistent_read": "a transaction around other reads; reads nothing itself",
    "covering_holds": "one run's holds, by the run's own tenant (run_legal_holds' cell; "
                      "tests/lifecycle/test_run_holds.py)",
    "hold_covers_q": "no user, no query: the coverage rule as a Q on LegalHold, its tenant "
                     "first (for_tenant subqueries); covering_holds' cell and "
                     "tests/lifecycle/test_hold_coverage_agree.py cover it",
    "held_runs_q": "no user: the coverage rule as a Q on Run for retention and the "
                   "deletion's blockers (services), its tenant first (for_tenant subqueries); "
                   "tests/lifecycle/test_hold_coverage_agree.py",
    "held_q": "no user: the coverage rule as a Q on Run or Tombstone (held_runs_q, "
              "held_tombstones_q), its tenant first (for_tenant subqueries); "
              "tests/lifecycle/test_hold_rule_everywhere.py",
    "held_tombstones_q": "no user: the coverage rule as a Q on Tombstone for the tombstone "
                         "purge (services), its tenant first (for_tenant subqueries); "
                         "tests/lifecycle/test_hold_rule_everywhere.py",
    "to_micros": "pure: a time as microseconds", "from_micros": "pure: the inverse",
    "duplicates_in": "pure: counts a preview's possible duplicates",
    "retry_requests_in": "no user: the queryset of approval_queue and retry_request_list "
                         "(tenant first, for_tenant), whose cells cover it",
    "queue_rows": "no user right: lays out requests its caller already read in its "
                  "tenant, with retry_previews (tenant_id first); the cells of "
                  "approval_queue and retry_request_list cover it",
    "retry_previews": "no user: the preview of runs its caller already read in its tenant "
                      "(tenant_id first); approval_queue's cell and services.retry_preview "
                      "(the run page, the approval) cover it",
    "next_step": "pure: words from the StepInput its caller read (page_steps has a cell)",
    "tombstone_purge_get": "one purge by its UUID in the asked tenant (for_tenant); the "
                           "twin world holds none: tests/lifecycle/test_tombstone_api.py",
}

def _figures_count(w: World, slug: str, a: dict) -> str:
    """The report's figures over the last 24 hours (the world was built just now): every
    transition and every accepted revision of the tenant, nothing of the twin's."""
    t = w.tenant(slug)
    got = (sum(sum(v) for v in a["runs_entering"].values()),
           sum(v["n"] for v in a["checkpoint_size_bytes"].values()))
    want = (RunTransition.objects.filter(tenant=t).count(),
            CheckpointRevision.objects.filter(tenant=t).count())
    return "" if got == want else f"figures (transitions, revisions) {got}, own {want}"


#: The public functions of ``checkpoints.reports`` that read tenant data, like selectors.
REPORTS: dict[str, SelectorCell] = {
    "figures": SelectorCell(
        lambda w, s, u: reports.figures(user=u, tenant=w.tenant(s), range_name="24h"),
        _figures_count, shows_mark=False),
}
REPORTS_PURE = {
    "window": "pure: parses a range", "percentile": "pure arithmetic",
    "csv_cell": "pure: formats a value", "csv_rows": "pure: lays out figures' answer",
    "csv_filename": "pure: names figures' answer",
    "to_csv": "pure: writes figures' answer", "bar_chart": "pure geometry",
    "stat_chart": "pure geometry",
}


def test_every_public_report_function_is_classified():
    found = {name for name, fn in inspect.getmembers(reports, inspect.isfunction)
             if fn.__module__.startswith(f"{reports.__name__}.") and not name.startswith("_")}
    assert found == set(REPORTS) | set(REPORTS_PURE), found ^ (set(REPORTS) | set(REPORTS_PURE))


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_report_function_answers_with_its_own_tenant_only(world, name):
    cell = REPORTS[name]
    failures = []
    for slug in SLUGS:
        for p in [*world.personas, world.both]:
            allowed = roles.VIEW in p.perms(slug)
            try:
                answer = cell.call(world, slug, p.user)
            except NotFound:
                if allowed:
                    failures.append(f"{slug}/{p.name}: NotFound for its own tenant")
                continue
            if not allowed:
                failures.append(f"{slug}/{p.name}: answered without a role: {answer!r:.100}")
            if MARK[other(slug)] in _text(answer):
                failures.append(f"{slug}/{p.name}: the twin's marker in the answer")
            if problem := cell.count(world, slug, answer):
                failures.append(f"{slug}/{p.name}: {problem}")
    assert not failures, f"{name}:\n" + "\n".join(failures)


def test_every_public_selector_is_classified():
    found = {name for name, fn in inspect.getmembers(selectors, inspect.isfunction)
             if fn.__module__.startswith(f"{selectors.__name__}.") and not name.startswith("_")}
    missing = sorted(found - set(SELECTORS) - set(NOT_TENANT_DATA))
    assert not missing, f"selectors with no twin-world cell nor a reason: {missing}"
    stale = sorted((set(SELECTORS) | set(NOT_TENANT_DATA) | set(CROSS_IDS)) - found)
    assert not stale, f"cells for selectors that no longer exist: {stale}"


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_a_selector_answers_with_its_own_tenant_only(world, name):
    cell = SELECTORS[name]
    failures = []
    for slug in SLUGS:
        for p in [*world.personas, world.both]:
            allowed = roles.VIEW in p.perms(slug)
            try:
                answer = cell.call(world, slug, p.user)
            except NotFound:
                if allowed:
                    failures.append(f"{slug}/{p.name}: NotFound for its own tenant")
                continue
            if not allowed and name != "state_counts":  # state_counts takes no user
                failures.append(f"{slug}/{p.name}: answered without a role: {answer!r:.100}")
            failures += [f"{slug}/{p.name}: {x}" for x in foreign_problems(answer, slug, world)]
            if cell.count and (problem := cell.count(world, slug, answer)):
                failures.append(f"{slug}/{p.name}: {problem}")
            if cell.shows_mark and MARK[slug] not in _text(answer):
                failures.append(f"{slug}/{p.name}: its own marker is missing (vacuous cell)")
        if name in CROSS_IDS:
            for p in world.personas:
                if p.slug != slug:
                    continue
                try:
                    answer = CROSS_IDS[name](world, slug, p.user)
                except NotFound:
                    continue
                failures.append(f"{slug}/{p.name}: the twin's id answered {answer!r:.100}")
    assert not failures, f"{name}:\n" + "\n".join(failures)


#: Selectors that find one object by its UUID, asked for an object only the twin holds
#: (globex's ``EXTRA``): through the other tenant it does not exist, even for an account
#: with a role in both (``World.both``), whose rights span the tenant that holds it.
TWIN_ONLY: dict[str, Callable[[World, str, object], object]] = {
    "run_get": lambda w, s, u: selectors.run_get(user=u, tenant=w.tenant(s),
                                                 run_id=EXTRA["r_more"]),
    "run_detail": lambda w, s, u: selectors.run_detail(user=u, tenant=w.tenant(s),
                                                       run_id=EXTRA["r_more"]),
    "run_summary": lambda w, s, u: selectors.run_summary(user=u, tenant=w.tenant(s),
                                                         run_id=EXTRA["r_more"]),
    "checkpoint_get": lambda w, s, u: selectors.checkpoint_get(
        user=u, tenant=w.tenant(s), checkpoint_id=EXTRA["c_more"]),
    "effect_get": lambda w, s, u: selectors.effect_get(user=u, tenant=w.tenant(s),
                                                       effect_id=EXTRA["e_more"]),
    "notification_endpoint_get": lambda w, s, u: selectors.notification_endpoint_get(
        user=u, tenant=w.tenant(s), endpoint_id=TWIN_ENDPOINT_ID),
    "notification_deliveries": lambda w, s, u: selectors.notification_deliveries(
        user=u, tenant=w.tenant(s), endpoint_id=TWIN_ENDPOINT_ID),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(TWIN_ONLY))
def test_an_object_of_the_twin_only_is_not_found_through_this_tenant(world, name):
    call = TWIN_ONLY[name]
    viewer = world.persona(TWIN, "viewer").user
    assert MARK[TWIN] in _text(call(world, TWIN, viewer))  # it exists, in the twin
    failures = []
    for p in [*world.personas, world.both]:
        try:
            answer = call(world, HOME, p.user)
        except NotFound:
            continue
        failures.append(f"{HOME}/{p.name}: the twin's object answered {answer!r:.100}")
    assert not failures, f"{name}:\n" + "\n".join(failures)


@pytest.mark.django_db
def test_tenants_for_user_lists_only_granted(world):
    for p in [*world.personas, world.both]:
        got = [t.slug for t in selectors.tenants_for_user(p.user)]
        want = sorted(s for s in (p.slug, *p.also) if s)
        assert got == want, (p.name, got)


def test_the_twins_differ_in_every_count(world):
    """The oracle has power: the tenants' counts differ, so a leak changes a number."""
    with transaction.atomic():
        home, twin = own_counts(world.tenant(HOME)), own_counts(world.tenant(TWIN))
    for key in home:
        assert home[key] != twin[key], key


# --------------------------------------------------------------------------------------
# Requests: every API operation (from the OpenAPI schema) and every dashboard page
# --------------------------------------------------------------------------------------

R = {"reason": "twin world"}


@dataclass
class Req:
    # URL kwarg -> IDS name, "retry_pk"/"attempt_pk"/"bulk_id", or "=<literal>"
    ids: dict = field(default_factory=dict)
    body: object = None
    headers: dict = field(default_factory=dict)
    query: str = ""
    write: bool = False      # may change its own tenant
    shows_mark: bool = False  # a 200 carries its tenant's marker
    count: Callable | None = None  # (world, slug, response) -> problem or ""

    def kwargs(self, w: World, slug: str) -> dict:
        out = {}
        for key, source in self.ids.items():
            if source.startswith("="):  # a literal, the same in both tenants
                out[key] = source[1:]
                continue
            out[key] = str(getattr(w.data[slug], source)) if source in (
                "retry_pk", "attempt_pk", "bulk_id", "migration_id", "hold_id",
                "erasure_id", "endpoint_id", "event_id", "audit_event_id") \
                else str(IDS[source])
        return out


def _api_count(key: str, total: Callable[[dict], int]) -> Callable:
    def check(w, slug, response):
        got, want = len(response.json()[key]), total(own_counts(w.tenant(slug)))
        return "" if got == want else f"{got} {key}, the tenant's own is {want}"
    return check


def _report_count(w, slug, response):
    data, own = response.json(), own_counts(w.tenant(slug))
    got = (data["effects"], data["retry_requests"], data["open_conflicts"],
           {k: v for k, v in data["runs"].items() if v})
    want = (own["effects"], own["retry_requests"], own["open_conflicts"], own["runs"])
    if got != want:
        return f"report {got}, own {want}"
    return _figures_count(w, slug, data)


NEW_CP = lambda: envelope(IDS["new_cp"], IDS["r_stable"], 0, payload={"phase": "ready"})  # noqa: E731
NEW_FX = lambda: effect_body(IDS["new_fx"], IDS["r_stable"], operation_key="charge:new")  # noqa: E731
T = "/api/v1/tenants/{tenant}/"
API: dict[str, Req] = {
    f"get {T}checkpoints/{{checkpoint_id}}": Req({"checkpoint_id": "c_stuck"}, shows_mark=True),
    f"put {T}checkpoints/{{checkpoint_id}}": Req({"checkpoint_id": "new_cp"}, NEW_CP,
                                                 {"HTTP_IF_NONE_MATCH": "*"}, write=True),
    f"get {T}checkpoints/{{checkpoint_id}}/revisions": Req({"checkpoint_id": "c_stuck"},
                                                          shows_mark=True),
    f"head {T}checkpoints/{{checkpoint_id}}": Req({"checkpoint_id": "c_stuck"}),
    f"head {T}checkpoints/{{checkpoint_id}}/revisions": Req({"checkpoint_id": "c_stuck"}),
    f"get {T}effects": Req(query="service=payments&limit=500",
                           count=_api_count("results", lambda c: c["payments"])),
    f"get {T}effects/{{effect_id}}": Req({"effect_id": "e_done"}),
    f"put {T}effects/{{effect_id}}": Req({"effect_id": "new_fx"}, NEW_FX,
                                         {"HTTP_IF_NONE_MATCH": "*"}, write=True),
    f"post {T}effects/{{effect_id}}/mark-unknown": Req({"effect_id": "e_stuck"}, R, write=True),
    f"post {T}effects/{{effect_id}}/reveal-receipt": Req({"effect_id": "e_done"}, R,
                                                         write=True, shows_mark=True),
    f"get {T}runs": Req(query="limit=200", shows_mark=True,
                        count=_api_count("results", lambda c: sum(c["runs"].values()))),
    f"get {T}runs/{{run_id}}": Req({"run_id": "r_unknown"}, shows_mark=True),
    f"post {T}runs/{{run_id}}/lease": Req({"run_id": "r_stable"}, {"owner": "tw", "ttl_s": 30},
                                          write=True),
    # No run of the world holds a live lease: a reviewer's answer is 409 no_live_lease
    # (its own run, read under its own tenant); the revoke itself: ``lease_revoke`` below.
    f"post {T}runs/{{run_id}}/lease/revoke": Req({"run_id": "r_stuck"}, R, write=True),
    # A writer's release, likewise 409 no_live_lease; the release itself:
    # ``lease_release`` below.
    f"post {T}runs/{{run_id}}/lease/release": Req({"run_id": "r_stable"},
                                                  {"owner": "tw", "fencing_token": 1},
                                                  write=True),
    f"get {T}runs/{{run_id}}/resume": Req({"run_id": "r_stable"}),
    f"post {T}runs/{{run_id}}/resume": Req({"run_id": "r_stable"}, {}, write=True),
    f"post {T}runs/{{run_id}}/retry-requests": Req({"run_id": "r_retry"}, R, write=True),
    f"post {T}runs/{{run_id}}/reconcile": Req({"run_id": "r_stuck"}, R, write=True),
    f"post {T}runs/{{run_id}}/close": Req({"run_id": "r_stuck"}, R, write=True),
    f"post {T}runs/{{run_id}}/conflicts/acknowledge": Req({"run_id": "r_stuck"}, R, write=True),
    # The approvers' queue (the Approvals page): every state, the tenant's own only.
    f"get {T}retry-requests": Req(query="state=all&limit=200", shows_mark=True,
                                  count=_api_count("results", lambda c: sum(
                                      c["retry_requests"].values()))),
    f"get {T}retry-requests/{{retry_id}}": Req({"retry_id": "retry_pk"}, shows_mark=True),
    f"post {T}retry-requests/{{retry_id}}/approve": Req({"retry_id": "retry_pk"}, R,
                                                        write=True, shows_mark=True),
    f"post {T}retry-requests/{{retry_id}}/reject": Req({"retry_id": "retry_pk"}, R,
                                                       write=True, shows_mark=True),
    f"post {T}retry-requests/{{retry_id}}/withdraw": Req({"retry_id": "retry_pk"}, R,
                                                         write=True),
    f"get {T}audit-events": Req(query="limit=200", shows_mark=True,
                                count=_api_count("results", lambda c: c["audit"])),
    # An audit event's inclusion proof (issue 22): each tenant's own event id.
    f"get {T}audit-events/{{audit_event_id}}/proof": Req({"audit_event_id": "audit_event_id"},
                                                         shows_mark=True),
    f"get {T}report": Req(query="range=24h", count=_report_count),
    f"get {T}kinds": Req(count=lambda w, slug, r: _kinds_count(
        w, slug, [(v["checkpoints"], v["schema_mismatch_runs"])
                  for k in r.json()["kinds"] for v in k["versions"]])),
    # The kind both tenants declared under one name (issue 19): each its own declaration.
    f"get {T}kinds/{{kind}}/versions/{{version}}": Req(
        {"kind": f"={DECLARED_KIND}", "version": "=1"}, shows_mark=True),
    f"put {T}kinds/{{kind}}/versions/{{version}}": Req(
        {"kind": f"={DECLARED_KIND}", "version": "=3"}, declared_kind("tw"), write=True),
    f"post {T}bulk-actions": Req(body={**R, "action": "close", "run_ids": [str(IDS["r_stuck"])],
                                       "client_token": str(IDS["new_cp"])}, write=True),
    f"get {T}bulk-actions": Req(shows_mark=True),
    f"get {T}bulk-actions/{{bulk_id}}": Req({"bulk_id": "bulk_id"}, shows_mark=True),
    f"post {T}bulk-actions/{{bulk_id}}/abort": Req({"bulk_id": "bulk_id"}, R, write=True),
    # Migrations (issue 19, item 2): the shared run ids, this tenant's checkpoints only.
    f"post {T}kinds/{{kind}}/migrations": Req(
        {"kind": "=acme.order"}, {"to_version": 2, "runs": [str(IDS["r_stuck"])],
                                  "client_token": str(IDS["new_cp"])}, write=True),
    f"get {T}kinds/{{kind}}/migrations/{{job_id}}": Req(
        {"kind": "=acme.order", "job_id": "migration_id"}, shows_mark=True),
    # Legal holds and erasure requests (issue 20): the shared run ids are this tenant's
    # runs; each tenant's hold and request under its own id.
    f"post {T}legal-holds": Req(body={**R, "runs": [str(IDS["r_stable"])]}, write=True,
                                shows_mark=False),
    f"get {T}legal-holds": Req(shows_mark=True, count=lambda w, slug, r: "" if len(
        r.json()["results"]) == LegalHold.objects.filter(tenant=w.tenant(slug)).count()
        else "holds count"),
    f"get {T}legal-holds/{{hold_id}}": Req({"hold_id": "hold_id"}, shows_mark=True),
    f"post {T}legal-holds/{{hold_id}}/release": Req({"hold_id": "hold_id"}, R, write=True,
                                                    shows_mark=True),
    f"post {T}erasure-requests": Req(body={**R, "runs": [str(IDS["r_closed"])]}, write=True),
    f"get {T}erasure-requests": Req(shows_mark=True, count=lambda w, slug, r: "" if len(
        r.json()["results"]) == ErasureRequest.objects.filter(tenant=w.tenant(slug)).count()
        else "requests count"),
    f"get {T}erasure-requests/{{request_id}}": Req({"request_id": "erasure_id"},
                                                   shows_mark=True),
    f"post {T}erasure-requests/{{request_id}}/approve": Req({"request_id": "erasure_id"}, {},
                                                            write=True, shows_mark=True),
    f"post {T}erasure-requests/{{request_id}}/reject": Req({"request_id": "erasure_id"}, R,
                                                           write=True, shows_mark=True),
    # LangGraph threads (issue 10): the same thread id in both tenants.
    # The data policy (issue 20): each tenant's own row.
    f"get {T}data-policy": Req(),
    f"put {T}data-policy": Req(body={"payload_retention_days": 30}, write=True),
    f"get {T}langgraph/checkpoints": Req(query=f"thread_id={LG_THREAD}", shows_mark=True),
    f"head {T}langgraph/checkpoints": Req(query=f"thread_id={LG_THREAD}"),
    f"post {T}langgraph/checkpoints": Req(body=lambda: lg_put(LG_THREAD, LG_IDS[2],
                                                              parent=LG_IDS[1]), write=True),
    f"post {T}langgraph/writes": Req(body=lambda: lg_writes(LG_THREAD, LG_IDS[1], "task-2",
                                                            [(0, "out", 2)]), write=True),
    f"post {T}langgraph/threads/delete": Req(body={"thread_id": LG_THREAD}, write=True),
    f"post {T}langgraph/threads/copy": Req(body={"source_thread_id": LG_THREAD,
                                                 "target_thread_id": "tw-copy"}, write=True),
    f"post {T}langgraph/threads/prune": Req(body={"thread_ids": [LG_THREAD],
                                                  "strategy": "keep_latest"}, write=True),
    f"post {T}langgraph/runs/delete": Req(body={"run_ids": ["tw-run"]}, write=True),
    # Tombstone governance (issue 20, item 5): each tenant's own tombstones and purges
    # (none in the twin world: its policy keeps tombstones forever, so a prepare is 409);
    # a purge id is looked up in the asked tenant only.
    f"get {T}tombstones": Req(count=lambda w, slug, r: "" if len(r.json()["results"]) ==
                              Tombstone.objects.filter(tenant=w.tenant(slug)).count()
                              else "tombstone count"),
    f"get {T}tombstone-purges": Req(),
    f"post {T}tombstone-purges": Req(body={}, write=True),
    f"get {T}tombstone-purges/{{purge_id}}": Req({"purge_id": "new_cp"}),
    f"post {T}tombstone-purges/{{purge_id}}/approve": Req({"purge_id": "new_cp"}, {},
                                                          write=True),
    f"post {T}tombstone-purges/{{purge_id}}/reject": Req({"purge_id": "new_cp"}, R,
                                                         write=True),
    f"post {T}tombstone-purges/{{purge_id}}/execute": Req({"purge_id": "new_cp"}, {},
                                                          write=True),
}

# Notification endpoints (issue 21): the endpoint and message ids are the same in both
# tenants; the answers carry this tenant's marker (the endpoint's name and host, the
# messages' subjects); a write changes this tenant's endpoint only.
NE = f"{T}notification-endpoints"
EP = {"endpoint_id": "=" + str(ENDPOINT_ID)}
API.update({
    f"get {NE}": Req(shows_mark=True, count=lambda w, slug, r: "" if len(
        r.json()["results"]) == NotificationEndpoint.objects.filter(
        tenant=w.tenant(slug)).count() else "endpoints count"),
    f"post {NE}": Req(body={"name": "tw", "channel": "webhook",
                            "url": "https://hooks.example.com/tw",
                            "event_types": ["run.needs_review"]}, write=True),
    f"get {NE}/{{endpoint_id}}": Req(EP, shows_mark=True),
    f"patch {NE}/{{endpoint_id}}": Req(EP, {"name": "renamed tw"}, write=True,
                                       shows_mark=True),
    f"delete {NE}/{{endpoint_id}}": Req(EP, write=True),
    f"post {NE}/{{endpoint_id}}/rotate-secret": Req(EP, {}, write=True, shows_mark=True),
    f"post {NE}/{{endpoint_id}}/test": Req(EP, {}, write=True),
    f"get {NE}/{{endpoint_id}}/deliveries": Req(
        EP, shows_mark=True, count=lambda w, slug, r: "" if len(r.json()["results"]) ==
        NotificationMessage.objects.filter(tenant=w.tenant(slug),
                                           endpoint__uuid=ENDPOINT_ID).count()
        else "messages count"),
    f"post {NE}/{{endpoint_id}}/deliveries/{{event_id}}/resend": Req(
        {**EP, "event_id": "=" + EVENT_ID}, {}, write=True, shows_mark=True),
})

PAGES: dict[str, Req] = {
    "login": Req(),
    "logout": Req(body={}, write=True),
    "inbox": Req(),
    "run_list": Req(shows_mark=True),
    "run_counts": Req(),
    # The incident a reviewer works on (issue 21, item 10): their session, no row.
    "incident_set": Req(body={"incident_ref": "INC-2041"}, write=True),
    "report": Req(),
    "audit_log": Req(shows_mark=True),
    "kind_list": Req(),
    # The kind both tenants declared under one name (issue 19): each its own declaration.
    "kind_version": Req({"kind": f"={DECLARED_KIND}", "version": "=1"}, shows_mark=True),
    # Migrations (issue 19, item 2): this tenant's checkpoints and job only.
    "migration_preview": Req({"kind": "=acme.order"}, query="to=2"),
    "migration_submit": Req({"kind": "=acme.order"},
                            {"to": "2", "client_token": str(IDS["new_cp"])}, write=True),
    "migration_detail": Req({"kind": "=acme.order", "job_id": "migration_id"},
                            shows_mark=True),
    # Erasure requests and legal holds (issue 20): each tenant's own.
    "erasure_requests": Req(shows_mark=True),
    "erasure_request_file": Req({"run_id": "r_closed"}, R, write=True),
    "erasure_approve": Req({"request_id": "erasure_id"}, {}, write=True),
    "erasure_reject": Req({"request_id": "erasure_id"}, R, write=True),
    "legal_holds": Req(shows_mark=True),
    "legal_hold_place": Req(body={**R, "scope": "runs", "runs": str(IDS["r_stable"])},
                            write=True),
    "legal_hold_place_run": Req({"run_id": "r_stable"}, R, write=True),
    "legal_hold_release": Req({"hold_id": "hold_id"}, R, write=True),
    # The Data page (issue 20): this tenant's policy, tombstones, holds, requests.
    "data_page": Req(),
    "data_policy_post": Req(body={"payload_retention_days": "30", "restart_interval_s": "86400",
                                  "secrets_policy": "warn"}, write=True),
    # Notifications (issue 21, items 1 and 5): each tenant's own endpoint and delivery
    # log; the same event id in both tenants is each one's own message.
    "notification_list": Req(shows_mark=True),
    "notification_create": Req(body={"name": "tw", "channel": "email",
                                     "email": "ops@example.com", "event_types": "digest"},
                               write=True),
    "notification_detail": Req({"endpoint_id": "endpoint_id"}, shows_mark=True),
    "notification_update": Req({"endpoint_id": "endpoint_id"}, {"enabled": "true"},
                               write=True),
    "notification_rotate": Req({"endpoint_id": "endpoint_id"}, {}, write=True,
                               shows_mark=True),
    "notification_delete": Req({"endpoint_id": "endpoint_id"}, {"confirm": "on"},
                               write=True),
    "notification_send_test": Req({"endpoint_id": "endpoint_id"}, {}, write=True),
    "notification_resend": Req({"endpoint_id": "endpoint_id", "event_id": "event_id"}, {},
                               write=True),
    "run_detail": Req({"run_id": "r_unknown"}, shows_mark=True),
    "run_audit": Req({"run_id": "r_unknown"}, shows_mark=True),
    "checkpoint_history": Req({"checkpoint_id": "c_stuck"}, shows_mark=True),
    "effect_history": Req({"effect_id": "e_done"}, shows_mark=True),
    "run_retry_request": Req({"run_id": "r_retry"}, R, write=True),
    "run_reconcile": Req({"run_id": "r_stuck"}, R, write=True),
    "run_close": Req({"run_id": "r_stuck"}, {**R, "confirm": "on"}, write=True),
    "run_lease_revoke": Req({"run_id": "r_stuck"}, {**R, "confirm": "on", "owner": "tw"},
                            write=True),
    "conflicts_acknowledge": Req({"run_id": "r_stuck"}, R, write=True),
    "retry_approve": Req({"retry_id": "retry_pk"}, R, write=True),
    "retry_reject": Req({"retry_id": "retry_pk"}, R, write=True),
    "retry_withdraw": Req({"retry_id": "retry_pk"}, R, write=True),
    "effect_mark_unknown": Req({"effect_id": "e_stuck"}, {**R, "confirm": "on"}, write=True),
    "effect_receipt_reveal": Req({"effect_id": "e_done"}, R, write=True, shows_mark=True),
    "checkpoint_reveal": Req({"checkpoint_id": "c_stuck"}, R, write=True, shows_mark=True),
    "checkpoint_diff": Req({"checkpoint_id": "c_stuck"}, {**R, "from_rev": 0, "to_rev": 1},
                           write=True, shows_mark=True),
    "reconcile_evidence_reveal": Req({"attempt_id": "attempt_pk"}, R, write=True,
                                     shows_mark=True),
    "bulk_submit": Req(body={**R, "action": "close", "scope": "selected", "confirm": "yes",
                             "run": str(IDS["r_stuck"]), "client_token": str(IDS["new_cp"])},
                       write=True),
    "bulk_list": Req(shows_mark=True),
    "bulk_detail": Req({"bulk_id": "bulk_id"}, shows_mark=True),
    "bulk_abort": Req({"bulk_id": "bulk_id"}, R, write=True),
    # Issue 21: the polls (reads of this tenant's runs) and the approver's queue (its own
    # requests; the twin's request number in a bulk approve is "not found", never decided).
    "run_new": Req(query="since=1"),
    "run_live": Req({"run_id": "r_unknown"}, query="seen=000000000000", shows_mark=True),
    "approval_queue": Req(),
    "approval_decide": Req({"retry_id": "retry_pk"}, {**R, "decision": "reject"}, write=True),
    "approval_bulk": Req(body=lambda w, s: {**R, "retry": [str(w.data[s].retry_pk),
                                                           str(w.data[other(s)].retry_pk)]},
                         write=True),
}


def schema_operations() -> list[str]:
    """``"method path"`` of every operation of the OpenAPI schema, tenant-scoped or not."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return sorted(f"{method} {path}" for path, ops in schema["paths"].items()
                  for method in ops if method in ("get", "head", "put", "post", "patch",
                                                  "delete"))


def page_names() -> list[str]:
    return [p.name for p in dashboard_urls.urlpatterns if isinstance(p, URLPattern)]


def test_every_api_operation_and_page_has_a_recipe():
    ops = schema_operations()
    assert sorted(set(ops) - set(API)) == [], "API operations without a twin-world recipe"
    assert sorted(set(API) - set(ops)) == [], "recipes for operations no longer in the schema"
    pages = page_names()
    assert sorted(set(pages) - set(PAGES)) == [], "dashboard pages without a recipe"
    assert sorted(set(PAGES) - set(pages)) == [], "recipes for pages that no longer exist"


def tenant_rows(tenant: Tenant) -> dict:
    """Every row of the tenant's data (every model with a ``tenant`` column)."""
    from django.apps import apps

    out = {}
    for model in apps.get_app_config("checkpoints").get_models():
        if any(f.name == "tenant" for f in model._meta.concrete_fields):
            out[model.__name__] = sorted(
                tuple(str(v) for v in row)
                for row in model.objects.filter(tenant=tenant).values_list())
    return out


def _request(kind: str, key: str, req: Req, w: World, slug: str, p: Persona):
    if kind == "api":
        method, template = key.split(" ", 1)
        path = template.format(tenant=slug, **req.kwargs(w, slug))
        client = p.api()
        target = path + (f"?{req.query}" if req.query else "")
        if method in ("get", "head"):
            return path, getattr(client, method)(target)
        body = req.body() if callable(req.body) else req.body
        return path, getattr(client, method)(target, data=json.dumps(body),
                                             content_type="application/json", **req.headers)
    pattern = next(x for x in dashboard_urls.urlpatterns if x.name == key)
    kwargs = req.kwargs(w, slug)
    if "slug" in pattern.pattern.converters:
        kwargs["slug"] = slug
    path = reverse(key, kwargs=kwargs)
    client = p.web()
    if req.body is not None:  # a callable: a form naming the world's rows, (w, slug) -> body
        body = req.body(w, slug) if callable(req.body) else req.body
        return path, client.post(path, body)
    return path, client.get(path + (f"?{req.query}" if req.query else ""))


def _scoped(kind: str, key: str) -> bool:
    if kind == "api":
        return "{tenant}" in key
    pattern = next(x for x in dashboard_urls.urlpatterns if x.name == key)
    return "slug" in pattern.pattern.converters


REQUEST_CASES = [("api", k) for k in API] + [("page", k) for k in PAGES]


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "key"), REQUEST_CASES,
                         ids=[f"{k}:{x}" for k, x in REQUEST_CASES])
def test_a_request_shows_nothing_of_the_twin(world, kind, key):
    check_request(world, kind, key, (API if kind == "api" else PAGES)[key])


def check_request(world: World, kind: str, key: str, req: Req) -> list[int]:
    """Send ``req`` (``key`` names its method and URL) in each tenant as every persona and
    assert nothing of the twin shows or changes (tests/security/test_twin_world_sql.py
    sends requests of its own through it). Returns the answers' status codes."""
    scoped = _scoped(kind, key)
    failures, statuses = [], []
    # The viewer of both tenants on the tenant's own API URLs (a page's tenant switcher
    # names both of its tenants, and the names carry the markers).
    personas = [*world.personas, world.both] if scoped and kind == "api" else world.personas
    for slug in SLUGS:
        twin_tenant = world.tenant(other(slug))
        # Read once per tenant: every request below is rolled back, so the twin's rows are
        # the same before each one (and a change that outlived its rollback, say through
        # another connection, is caught by the next request's comparison too).
        twin_before = tenant_rows(twin_tenant) if req.write else None
        for p in personas:
            # Whose data may appear: the URL's tenant; on an unscoped page, the persona's.
            allowed = slug if scoped else p.slug
            forbidden = [MARK[s] for s in SLUGS if s != allowed]
            with transaction.atomic():
                path, response = _request(kind, key, req, world, slug, p)
                statuses.append(response.status_code)
                text = response.content.decode("utf-8", "replace") + "\n" + "\n".join(
                    f"{k}: {v}" for k, v in response.items())
                for mark in forbidden:
                    if mark in text:
                        failures.append(f"{slug}/{p.name} {path}: {mark} appears "
                                        f"({response.status_code})")
                if req.write and scoped and tenant_rows(twin_tenant) != twin_before:
                    failures.append(f"{slug}/{p.name} {path}: the twin's data changed")
                ok = response.status_code == 200
                if ok and scoped and req.shows_mark and MARK[slug] not in text:
                    failures.append(f"{slug}/{p.name} {path}: 200 without its own marker")
                if ok and scoped and req.count and (problem := req.count(world, slug,
                                                                         response)):
                    failures.append(f"{slug}/{p.name} {path}: {problem}")
                if scoped and p.slug is not None and slug not in (p.slug, *p.also) and ok:
                    failures.append(f"{slug}/{p.name} {path}: 200 for a persona of the twin")
                transaction.set_rollback(True)
    assert not failures, f"{kind} {key}:\n" + "\n".join(failures[:40])
    return statuses


# --------------------------------------------------------------------------------------
# Services that take a tenant: called in one tenant with the twin's ids and objects
# --------------------------------------------------------------------------------------

def _as(w: World, slug: str, role: str):
    return w.persona(slug, role).user


def _cp(w: World, slug: str):
    return selectors.checkpoint_get(user=_as(w, slug, "viewer"), tenant=w.tenant(slug),
                                    checkpoint_id=IDS["c_stuck"])


@dataclass
class ServiceCell:
    """``call(world, slug, actor_slug)`` acts in tenant ``slug`` as a persona of
    ``actor_slug``. ``foreign``: the call names an object of the twin (its integer id, or
    its model object) and must be ``NotFound``; otherwise it uses the shared UUIDs and
    must act on its own tenant only. A persona of the twin acting in ``slug`` (an
    approver of B deciding in A) is always ``NotFound`` and changes nothing anywhere;
    ``actor=False`` for the operator-only functions that take no actor."""

    call: Callable[[World, str, str], object]
    foreign: bool = False
    actor: bool = True


def _purge_aged(w: World, slug: str, _actor) -> dict:
    """Set ``slug``'s retention to one day, age its own runs two days, purge it."""
    tenant = w.tenant(slug)
    services.data_policy_set(actor=None, tenant=tenant, payload_retention_days=1)
    two_days = timedelta(days=2)
    Run.objects.filter(tenant=tenant).update(state_changed_at=F("state_changed_at") - two_days,
                                             closed_at=F("closed_at") - two_days)
    stats = services.retention_purge(tenant=tenant)
    assert stats["purged"] > 0, "a vacuous cell: nothing was purged"
    return stats


def _lease_revoked(w: World, slug: str, acting: str):
    """A reviewer of ``acting`` ends the lease of ``r_stable`` in ``slug``; in its own
    tenant a writer of ``slug`` took the lease first (not vacuous: the revoke writes). A
    persona of the twin finds no run (``NotFound``), and nothing was leased for it."""
    if acting == slug:
        services.lease_acquire(actor=_as(w, slug, "writer"), tenant=w.tenant(slug),
                               run_id=IDS["r_stable"], owner="tw", ttl_s=600)
    return services.lease_revoke(actor=_as(w, acting, "reviewer"), tenant=w.tenant(slug),
                                 run_id=IDS["r_stable"], reason="x", expected_owner="tw")


def _lease_released(w: World, slug: str, acting: str):
    """A writer of ``acting`` gives back the lease of ``r_stable`` in ``slug``, which a
    writer of ``slug`` took first in its own tenant (not vacuous: the release writes). A
    persona of the twin finds no run (``NotFound``)."""
    token = 1
    if acting == slug:
        token = services.lease_acquire(actor=_as(w, slug, "writer"), tenant=w.tenant(slug),
                                       run_id=IDS["r_stable"], owner="tw",
                                       ttl_s=600).fencing_token
    return services.lease_release(actor=_as(w, acting, "writer"), tenant=w.tenant(slug),
                                  run_id=IDS["r_stable"], owner="tw", held_token=token)


def _runifold_lines() -> bytes:
    """A runifold agent checkpoint in the shared run ``r_stable`` (new id ``new_cp``) and
    an effect record naming that run (RUNIFOLD.md 1, 4)."""
    cp = {"id": str(IDS["new_cp"]), "revision": 0, "run_id": str(IDS["r_stable"]),
          "kind": "runifold.agent", "schema_version": 1, "updated_at_ms": 1,
          "payload": {"execution_id": str(IDS["new_cp"]), "agent": "a",
                      "model": {"provider": "p", "name": "m"}, "transcript": [], "turns": 0,
                      "tool_calls": 0, "delegations": 0, "usage": {},
                      "phase": {"state": "ready_for_turn"}}}
    fx = {"revision": 0, "run_id": str(IDS["r_stable"]), "status": {"state": "prepared"},
          "request": {"effect_id": str(IDS["new_fx"]), "invocation_id": str(IDS["new_fx"]),
                      "kind": "Tool", "capability_id": str(IDS["new_fx"]), "input": {},
                      "effect_class": "ReadOnly", "idempotency_key": "done"}}
    return (json.dumps(cp) + "\n" + json.dumps(fx) + "\n").encode()


def _runifold_export(w: World, slug: str, acting: str) -> list[str]:
    """The lines ``runifold_export`` writes for ``slug``: its answer, checked for the
    twin's marker (the two tenants holding the same runifold file:
    tests/test_runifold_io.py::test_the_same_file_into_two_tenants_is_two_sets_of_objects)."""
    lines: list[str] = []
    runifold.runifold_export(actor=_as(w, acting, "reviewer"), tenant=w.tenant(slug),
                             write=lines.append)
    return lines


def _migrate(w: World, slug: str, acting: str):
    """Migrating the shared run ids (issue 19, item 2) moves this tenant's checkpoints of
    them (their owners are gone: the world is an hour old), never the twin's; a run only
    the twin holds is not looked at."""
    report = services.checkpoints_migrate(
        actor=_as(w, acting, "admin"), tenant=w.tenant(slug), kind="acme.order", to_version=2,
        run_ids=[IDS["r_stable"], IDS["r_stuck"], EXTRA["r_more"]])
    # Not a cell that passes by doing nothing: each of this tenant's is migrated.
    assert report.counts["migrated"] == len(report.items) > 0, report
    return report


_BODY = lambda: services.parse_envelope(  # noqa: E731
    envelope(IDS["new_cp"], IDS["r_stable"], 0, payload={"phase": "ready"}),
    url_id=IDS["new_cp"])
SERVICES: dict[str, list[ServiceCell]] = {
    "retry_approve": [ServiceCell(lambda w, s, a: services.retry_approve(
        actor=_as(w, a, "approver"), tenant=w.tenant(s), retry_id=w.data[other(s)].retry_pk,
        reason="x"), foreign=True)],
    "retry_reject": [ServiceCell(lambda w, s, a: services.retry_reject(
        actor=_as(w, a, "approver"), tenant=w.tenant(s), retry_id=w.data[other(s)].retry_pk,
        reason="x"), foreign=True)],
    "retry_withdraw": [ServiceCell(lambda w, s, a: services.retry_withdraw(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), retry_id=w.data[other(s)].retry_pk,
        reason="x"), foreign=True)],
    "evidence_reveal": [ServiceCell(lambda w, s, a: services.evidence_reveal(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s),
        attempt_id=w.data[other(s)].attempt_pk, reason="x"), foreign=True)],
    "request_get": [ServiceCell(lambda w, s, a: reconciliation.request_get(
        w.tenant(s), ReconcileRequest.objects.get(tenant=w.tenant(other(s))).pk),
        foreign=True, actor=False)],
    "requests_get": [ServiceCell(lambda w, s, a: reconciliation.requests_get(
        w.tenant(s), [ReconcileRequest.objects.get(tenant=w.tenant(other(s))).pk]),
        foreign=True, actor=False)],
    "payload_reveal": [ServiceCell(lambda w, s, a: services.payload_reveal(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), checkpoint=_cp(w, other(s)),
        reason="x"), foreign=True)],
    "revisions_export": [ServiceCell(lambda w, s, a: services.revisions_export(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), checkpoint=_cp(w, other(s))),
        foreign=True)],
    "receipt_reveal": [ServiceCell(lambda w, s, a: services.receipt_reveal(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), effect_id=IDS["e_done"],
        reason="x"))],
    "effect_mark_unknown": [ServiceCell(lambda w, s, a: services.effect_mark_unknown(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), effect_id=IDS["e_stuck"],
        reason="x"))],
    "run_close": [ServiceCell(lambda w, s, a: services.run_close(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), run_id=IDS["r_stuck"], reason="x"))],
    "conflicts_acknowledge": [ServiceCell(lambda w, s, a: services.conflicts_acknowledge(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), run_id=IDS["r_stuck"], reason="x"))],
    "retry_request": [ServiceCell(lambda w, s, a: services.retry_request(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), run_id=IDS["r_retry"], reason="x"))],
    "run_reconcile": [ServiceCell(lambda w, s, a: services.run_reconcile(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), run_id=IDS["r_stuck"], reason="x"))],
    "lease_revoke": [ServiceCell(_lease_revoked)],
    "lease_release": [ServiceCell(_lease_released)],
    "lease_acquire": [ServiceCell(lambda w, s, a: services.lease_acquire(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), run_id=IDS["r_stable"], owner="x",
        ttl_s=30))],
    "resume_preview": [ServiceCell(lambda w, s, a: services.resume_preview(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), run_id=IDS["r_stable"], asked={}))],
    "resume_claim": [ServiceCell(lambda w, s, a: services.resume_claim(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), run_id=IDS["r_stable"], asked={}))],
    "checkpoint_put": [ServiceCell(lambda w, s, a: services.checkpoint_put(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), envelope=_BODY(),
        expected_revision=None))],
    "effect_put": [ServiceCell(lambda w, s, a: services.effect_put(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), body=services.parse_effect(
            effect_body(IDS["new_fx"], IDS["r_stable"], operation_key="done"),
            url_id=IDS["new_fx"]), expected_revision=None))],
    "role_grant": [ServiceCell(lambda w, s, a: services.role_grant(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), user=_as(w, a, "viewer"),
        role="reviewer"))],
    "role_revoke": [ServiceCell(lambda w, s, a: services.role_revoke(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), user=_as(w, a, "viewer"),
        role="viewer"))],
    "tenant_set_ambiguity_threshold": [ServiceCell(
        lambda w, s, a: services.tenant_set_ambiguity_threshold(
            actor=_as(w, a, "admin"), tenant=w.tenant(s), seconds=60))],
    "reconciler_configure": [ServiceCell(lambda w, s, a: services.reconciler_configure(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), service="payments", plugin="default"))],
    "audit_head_export": [ServiceCell(lambda w, s, a: services.audit_head_export(
        tenant=w.tenant(s)), actor=False)],
    # The audit Merkle tree (issue 22): the sequencer and the lag read one tenant; a proof
    # of the twin's event id through this tenant is not found.
    "audit_integrate": [ServiceCell(lambda w, s, a: audittree.audit_integrate(w.tenant(s)),
                                    actor=False)],
    "tenant_lag": [ServiceCell(lambda w, s, a: audittree.tenant_lag(w.tenant(s)),
                               actor=False)],
    "audit_proof": [
        ServiceCell(lambda w, s, a: audittree.audit_proof(
            user=_as(w, a, "viewer"), tenant=w.tenant(s), event_id=w.data[s].audit_event_id)),
        ServiceCell(lambda w, s, a: audittree.audit_proof(
            user=_as(w, a, "viewer"), tenant=w.tenant(s),
            event_id=w.data[other(s)].audit_event_id), foreign=True)],
    # The shared run ids act on this tenant's runs; a run only the twin holds is "not
    # found" here (its result), never acted on.
    "bulk_submit": [ServiceCell(lambda w, s, a: services.bulk_submit(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s), action="close", reason="x",
        run_ids=[IDS["r_stuck"], EXTRA["r_more"]], client_token=IDS["new_cp"]))],
    # The twin's bulk id is not found here (issue 22, item 6); this tenant's own ran inline
    # (refused: nothing to abort).
    "bulk_abort": [
        ServiceCell(lambda w, s, a: services.bulk_abort(
            actor=_as(w, a, "reviewer"), tenant=w.tenant(s), bulk_id=w.data[s].bulk_id,
            reason="x")),
        ServiceCell(lambda w, s, a: services.bulk_abort(
            actor=_as(w, a, "reviewer"), tenant=w.tenant(s),
            bulk_id=w.data[other(s)].bulk_id, reason="x"), foreign=True)],
    # A runifold file naming the shared ids: the checkpoint and effect land in this
    # tenant's run (or are refused there), never in the twin's.
    "runifold_import": [ServiceCell(lambda w, s, a: runifold.runifold_import(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), lines=jsonl_lines(io.BytesIO(
            _runifold_lines()))))],
    "runifold_export": [ServiceCell(lambda w, s, a: _runifold_export(w, s, a))],
    "checkpoints_migrate": [ServiceCell(_migrate)],
    # The same kind name in both tenants: a new version lands in this tenant only.
    "kind_declare": [ServiceCell(lambda w, s, a: services.kind_declare(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), kind=DECLARED_KIND, version=3,
        body=declared_kind("tw")))],
    # A stored job and its preview (issue 19, item 2): the shared run ids, this tenant's.
    "migration_job_submit": [ServiceCell(lambda w, s, a: services.migration_job_submit(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), kind="acme.order", to_version=2,
        run_ids=[IDS["r_stable"], EXTRA["r_more"]], client_token=IDS["new_cp"]))],
    # Tombstone governance (issue 20, item 5): an export of this tenant's chain; a
    # prepare in a tenant that keeps tombstones forever (409: its own answer); a purge id
    # no tenant holds, decided or executed: NotFound.
    "audit_export": [ServiceCell(lambda w, s, a: services.audit_export(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), out_dir=tempfile.mkdtemp()))],
    "tombstone_purge_prepare": [ServiceCell(lambda w, s, a: services.tombstone_purge_prepare(
        actor=_as(w, a, "admin"), tenant=w.tenant(s)))],
    "tombstone_purge_approve": [ServiceCell(lambda w, s, a: services.tombstone_purge_approve(
        actor=_as(w, a, "approver"), tenant=w.tenant(s), purge_id=IDS["new_cp"]),
        foreign=True)],
    "tombstone_purge_reject": [ServiceCell(lambda w, s, a: services.tombstone_purge_reject(
        actor=_as(w, a, "approver"), tenant=w.tenant(s), purge_id=IDS["new_cp"],
        reason="x"), foreign=True)],
    "tombstone_purge_execute": [ServiceCell(lambda w, s, a: services.tombstone_purge_execute(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), purge_id=IDS["new_cp"]),
        foreign=True)],
    "migration_preview": [ServiceCell(lambda w, s, a: services.migration_preview(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), kind="acme.order", to_version=2,
        run_ids=[IDS["r_stable"], IDS["r_stuck"], EXTRA["r_more"]]))],
    # Legal holds and erasure (issue 20): the shared run ids name this tenant's runs (a
    # run only the twin holds is an unknown run here: 400); the twin's hold or request,
    # named here, is NotFound.
    "legal_hold_place": [ServiceCell(lambda w, s, a: services.legal_hold_place(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), runs=[IDS["r_stable"]], reason="x"))],
    "legal_hold_release": [ServiceCell(lambda w, s, a: services.legal_hold_release(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), hold_id=w.data[other(s)].hold_id,
        reason="x"), foreign=True)],
    "erasure_request": [ServiceCell(lambda w, s, a: services.erasure_request(
        actor=_as(w, a, "reviewer"), tenant=w.tenant(s),
        runs=[IDS["r_closed"], IDS["r_stable"]], reason="x"))],
    "erasure_approve": [
        ServiceCell(lambda w, s, a: services.erasure_approve(
            actor=_as(w, a, "approver"), tenant=w.tenant(s),
            request_id=w.data[other(s)].erasure_id), foreign=True),
        ServiceCell(lambda w, s, a: services.erasure_approve(
            actor=_as(w, a, "approver"), tenant=w.tenant(s),
            request_id=w.data[s].erasure_id))],
    "erasure_reject": [ServiceCell(lambda w, s, a: services.erasure_reject(
        actor=_as(w, a, "approver"), tenant=w.tenant(s), request_id=w.data[other(s)].erasure_id,
        reason="x"), foreign=True)],
    # The data lifecycle (issue 20): a policy lands in this tenant; the purge, with this
    # tenant's completed runs aged past it, deletes (with tombstones) this tenant's runs
    # only, though the twin holds runs of the same UUIDs in the same states.
    "data_policy_set": [ServiceCell(lambda w, s, a: services.data_policy_set(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), payload_retention_days=1))],
    "retention_purge": [ServiceCell(_purge_aged, actor=False)],
}
_LG_PUT = lambda: langgraph.parse_put(lg_put(LG_THREAD, LG_IDS[2], parent=LG_IDS[1]))  # noqa: E731
_LG_WRITES = lambda: langgraph.parse_writes(  # noqa: E731
    lg_writes(LG_THREAD, LG_IDS[1], "task-2", [(0, "out", 2)]))
SERVICES.update({  # LangGraph threads (issue 10): the shared thread id acts on its own
    "graph_put": [ServiceCell(lambda w, s, a: langgraph.graph_put(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), put=_LG_PUT()))],
    "graph_put_writes": [ServiceCell(lambda w, s, a: langgraph.graph_put_writes(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), body=_LG_WRITES()))],
    "graph_list": [ServiceCell(lambda w, s, a: langgraph.graph_list(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), thread_id=LG_THREAD))],
    "graph_thread_delete": [ServiceCell(lambda w, s, a: langgraph.graph_thread_delete(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), thread_id=LG_THREAD))],
    "graph_threads_prune": [ServiceCell(lambda w, s, a: langgraph.graph_threads_prune(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), thread_ids=[LG_THREAD],
        strategy="keep_latest"))],
    "graph_runs_delete": [ServiceCell(lambda w, s, a: langgraph.graph_runs_delete(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), run_ids=["tw-run"]))],
    "graph_thread_copy": [ServiceCell(lambda w, s, a: langgraph.graph_thread_copy(
        actor=_as(w, a, "writer"), tenant=w.tenant(s), source_thread_id=LG_THREAD,
        target_thread_id="tw-copy"))],
})
def _foreign_endpoint(call: Callable) -> ServiceCell:
    """``call`` in acme on the endpoint only globex holds (NotFound), and in globex on an
    id acme never had (NotFound)."""
    return ServiceCell(lambda w, s, a: call(w, s, a, TWIN_ENDPOINT_ID if s == HOME
                                            else IDS["new_cp"]), foreign=True)


def _admin_call(fn: Callable, **kw) -> Callable:
    return lambda w, s, a, eid: fn(actor=_as(w, a, "admin"), tenant=w.tenant(s),
                                   endpoint_id=eid, **kw)


SERVICES.update({  # The erasure preview: another tenant's request is NotFound.
    "erasure_preview": [ServiceCell(lambda w, s, a: services.erasure_preview(
        user=_as(w, a, "reviewer"), tenant=w.tenant(s),
        request=ErasureRequest.objects.get(tenant=w.tenant(other(s)))), foreign=True)],
})


SERVICES.update({  # Notification endpoints (issue 21): the same endpoint id in both.
    "endpoint_create": [ServiceCell(lambda w, s, a: services.endpoint_create(
        actor=_as(w, a, "admin"), tenant=w.tenant(s), body={
            "name": "tw", "channel": "webhook", "url": "https://hooks.example.com/tw",
            "event_types": ["run.needs_review"]}))],
    "endpoint_update": [
        ServiceCell(lambda w, s, a: _admin_call(services.endpoint_update,
                                                body={"name": "tw"})(w, s, a, ENDPOINT_ID)),
        _foreign_endpoint(_admin_call(services.endpoint_update, body={"name": "tw"}))],
    "endpoint_delete": [
        ServiceCell(lambda w, s, a: _admin_call(services.endpoint_delete)(w, s, a,
                                                                          ENDPOINT_ID)),
        _foreign_endpoint(_admin_call(services.endpoint_delete))],
    "endpoint_rotate_secret": [
        ServiceCell(lambda w, s, a: _admin_call(services.endpoint_rotate_secret)(
            w, s, a, ENDPOINT_ID)),
        _foreign_endpoint(_admin_call(services.endpoint_rotate_secret))],
    "notification_test": [
        ServiceCell(lambda w, s, a: _admin_call(services.notification_test)(w, s, a,
                                                                            ENDPOINT_ID)),
        _foreign_endpoint(_admin_call(services.notification_test))],
    "notification_resend": [
        ServiceCell(lambda w, s, a: _admin_call(services.notification_resend,
                                                event_id=EVENT_ID)(w, s, a, ENDPOINT_ID)),
        _foreign_endpoint(_admin_call(services.notification_resend, event_id=EVENT_ID))],
})
NOT_SERVICE_CELLS = {
    "export_watermark": "reads one tenant's exports by tenant pk (for_tenant); writes "
                        "nothing: tests/lifecycle/test_audit_export.py",
    "migration_target_check": "reads the kind registry only (the same in every tenant "
                              "until declarative kinds); writes nothing",
    "audit_verify": "reads one tenant's chain by tenant pk: tests/services/test_audit_chain.py",
    "tree_problem": "audit_verify's check of the tenant's tree (its leaves, nodes and heads "
                    "read for that tenant only): tests/services/test_audit_tree.py",
    "inclusion": "the proof of an event audit_proof found in that tenant (audit_proof's "
                 "cells cover it)",
    "consistency_problem": "audit_head_check's proof that one tenant's tree extends an "
                           "exported head: tests/services/test_audit_tree.py",
    "audit_record": "appends to the given tenant's chain; every service above goes through it",
    "audit_record_many": "appends to the given tenant's chain, as audit_record; "
                         "runifold_import's cell goes through it",
    "new_event": "builds (unsaved) the next event of the tenant whose chain head its "
                 "caller holds; reads and writes nothing",
    "tenant_register": "registers the tenant tenant_create has just made, in its "
                       "transaction (the tenant registry belongs to no tenant and is shown "
                       "to none); tenant_create is an operator command",
    "tenant_shred": "the operator's crypto-shredding (actor None or a superuser, no API): "
                    "destroys the data keys of the tenant it is given; "
                    "tests/lifecycle/test_shred.py shows the other tenant untouched",
    "notify_emit": "writes one notification outbox row for the tenant and run its caller "
                   "(reconciliation's give-up) holds, in its transaction; reads nothing "
                   "(the dispatcher routes each row to its own tenant's endpoints: "
                   "tests/services/test_notify_dispatch.py)",
    "parse_line": "checks one runifold line and encrypts it under the data key of the "
                  "tenant runifold_import passes (runifold_import's cell covers it)",
    "conflict_parts": "builds (never saves) a refused write's conflict row and audit event "
                      "for the tenant and run its caller holds; the writes' cells cover it",
    "tombstone_dates": "reads the given tenant's tombstones by tenant pk (for_tenant) for "
                       "the runs a write would create; writes nothing: "
                       "tests/lifecycle/test_tombstoned_ids.py (another tenant's tombstone "
                       "refuses nothing)",
    "refuse_tombstoned": "tombstone_dates of one run id, raising RunDeleted; the writes' "
                         "cells cover it (tests/lifecycle/test_tombstoned_ids.py)",
}


def _tenant_taking_services() -> set[str]:
    out = set()
    for module in (*service_modules(), *interop_modules(), reconciliation, audit, audithead,
                   audittree):
        if is_internal(module):
            continue
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or fn.__module__ != module.__name__:
                continue
            if "tenant" in inspect.signature(fn).parameters:
                out.add(name)
    return out


def test_every_tenant_taking_service_is_classified():
    found = _tenant_taking_services()
    missing = sorted(found - set(SERVICES) - set(NOT_SERVICE_CELLS))
    assert not missing, f"services taking a tenant with no twin-world cell: {missing}"
    stale = sorted((set(SERVICES) | set(NOT_SERVICE_CELLS)) - found)
    assert not stale, f"cells for services that no longer take a tenant: {stale}"


SERVICE_CASES = [(name, i) for name, cells in SERVICES.items() for i in range(len(cells))]


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "index"), SERVICE_CASES,
                         ids=[f"{n}-{i}" for n, i in SERVICE_CASES])
def test_a_service_in_one_tenant_never_touches_the_twin(world, name, index):
    cell = SERVICES[name][index]
    failures = []
    for slug in SLUGS:
        for acting in (slug, other(slug)) if cell.actor else (slug,):
            where = f"in {slug} as a persona of {acting}"
            twin = world.tenant(other(slug))
            with transaction.atomic():
                before = tenant_rows(twin)
                home_before = tenant_rows(world.tenant(slug))
                try:
                    answer = cell.call(world, slug, acting)
                except NotFound:
                    answer = NotFound
                except DomainError as exc:  # an answer of the service about its own tenant
                    answer = exc
                if tenant_rows(twin) != before:
                    failures.append(f"{where}: the twin's data changed")
                if (cell.foreign or acting != slug) and answer is not NotFound:
                    failures.append(f"{where}: not NotFound: {answer!r:.200}")
                if acting != slug and tenant_rows(world.tenant(slug)) != home_before:
                    failures.append(f"{where}: a persona without a role here changed data")
                if answer is not NotFound and MARK[other(slug)] in _text(answer):
                    failures.append(f"{where}: the answer holds the twin's marker")
                transaction.set_rollback(True)
    assert not failures, f"{name}:\n" + "\n".join(failures)


# Database-independent (tenant scoping is in the queries Django builds for either
# backend): make test runs it once, in the SQLite pass, which had time to spare.
pytestmark = pytest.mark.once
