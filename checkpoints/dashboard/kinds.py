"""The Kinds page: which kinds and schema versions the tenant's checkpoints use, beside
what the kind registry supports (``selectors.kind_usage``, which ``GET …/kinds`` answers
too: what the page hides the API hides; docs/kinds.md); a declared kind version's
declaration; and migrations from the dashboard (issue 19, item 2; docs/migrations.md):
the tenant admin's preview and confirm, and the stored job's page. Every rule is the
services' and selectors' (``migration_preview``, ``migration_job_submit``,
``migration_job_get``, ``migration_offers``), as for ``POST``/``GET …/kinds/{kind}/
migrations``: nothing here decides what may be migrated."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import intranges, roles, selectors, services
from ..exceptions import InvalidPayload, NotFound
from ..heartbeat import broker_configured
from ..models import Tenant
from ..services.migration_jobs import PREVIEW_LISTED
from ..vocab import MigrationJobState, MigrationOutcome
from .common import (
    _base_context,
    _require_valid,
    dashboard,
    require_POST,
    require_safe,
    see_other,
    tenant_page,
)
from .forms import MigrationForm, MigrationPreviewForm, NoQuery

T = TypeVar("T")


@require_safe
@dashboard
@tenant_page()
def kind_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/kinds/``: every kind the registry knows and every kind the tenant's
    checkpoints use, each schema version with its checkpoints, runs and ``schema_mismatch``
    runs (links into the inbox filtered by the kind), whether a chain of steps leads it up
    to the newest version (``KindVersion.migrates_to_newest``) and, for a kind the tenant
    declared, a link to each version's declaration. The tenant's admin (``roles.MANAGE``)
    also gets "Migrate to vN" for each kind ``selectors.migration_offers`` offers (the
    preview page; no query more). Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    usage = selectors.kind_usage(user=request.user, tenant=tenant)
    context = _base_context(request, tenant, "kinds")
    offers = selectors.migration_offers(usage) if context["can_manage"] else {}
    context |= {
        "kinds": [(k, offers.get(k.kind)) for k in usage],
        "mismatched": sum(v.schema_mismatch_runs for k in usage for v in k.versions),
    }
    return render(request, "checkpoints/kinds.html", context)


def _url_version(value: str) -> int:
    """The ``<version>`` of a declaration's URL: a schema version (ASCII digits, in
    ``intranges.SCHEMA_VERSION``), else ``NotFound`` (a malformed id, as the API's
    ``GET …/kinds/{kind}/versions/{v}`` answers)."""
    try:
        return intranges.SCHEMA_VERSION.parse(value, "version")  # the API's one reading
    except InvalidPayload:
        raise NotFound("no such kind version") from None


@require_safe
@dashboard
@tenant_page()
def kind_version(request: HttpRequest, tenant: Tenant, kind: str, version: str) -> HttpResponse:
    """``/t/<slug>/kinds/<kind>/versions/<v>/``: one version of a kind the tenant
    declared, read only (``selectors.declared_kind_get``, any role, as ``GET …/kinds/
    {kind}/versions/{v}``): its description, digest, who declared it and when, and the
    declaration as given (JSON Schema, phase map, identity, usage, migration). A kind in
    code, an unknown version or another tenant's declaration is 404. Takes no parameter."""
    NoQuery.from_request(request)
    row = selectors.declared_kind_get(user=request.user, tenant=tenant, kind=kind,
                                      version=_url_version(version))
    context = _base_context(request, tenant, "kinds") | {"d": row}
    return render(request, "checkpoints/kind_version.html", context)


def _field_to(call: Callable[[], T]) -> T:
    """``call()``, with a refusal of ``to_version`` (``services.migration_target_check``)
    named as the page's own field, ``to``: the one check, in the page's words."""
    try:
        return call()
    except InvalidPayload as exc:
        if exc.detail.startswith("to_version:"):
            raise InvalidPayload("to:" + exc.detail.removeprefix("to_version:")) from None
        raise


def _require_kind(request: HttpRequest, tenant: Tenant, kind: str) -> None:
    """404 for a kind the tenant cannot name (``selectors.kind_known``), like the API's
    ``POST …/kinds/{kind}/migrations``: a path segment, not a field."""
    if not selectors.kind_known(user=request.user, tenant=tenant, kind=kind):
        raise NotFound("no such kind (neither in code nor declared by this tenant)")


@require_safe
@dashboard
@tenant_page(roles.MANAGE)
def migration_preview_page(request: HttpRequest, tenant: Tenant, kind: str) -> HttpResponse:
    """``/t/<slug>/kinds/<kind>/migrate/?to=N[&reverse=1]``, the tenant's admin only (a
    viewer, reviewer or approver: 403; no role: 404): what migrating the tenant's
    checkpoints of ``kind`` to ``to`` would do, computed now and written nowhere
    (``services.migration_preview``, the API's ``dry_run``): the counts per outcome, the
    refusals per reason, one diff per distinct change (key paths only), and the
    checkpoints that would be refused or conflict, with their runs and why. Then a
    confirm form (``migration_submit``) with a fresh ``client_token``.

    The query string is ``MigrationPreviewForm`` (``to`` required, ASCII digits;
    ``reverse`` ``1``/``0``); a ``kind`` or ``to`` the service refuses is a 400 naming
    ``to``, never a 500; a ``kind`` neither in code nor declared by the tenant is a 404,
    as the API's path. A GET: no lock, no row, no audit event."""
    _require_kind(request, tenant, kind)
    data = MigrationPreviewForm.from_request(request).cleaned_data
    preview = _field_to(lambda: services.migration_preview(
        actor=request.user, tenant=tenant, kind=kind, to_version=data["to"],
        reverse=data["reverse"]))
    counts = preview.counts
    left = sum(counts[o] for o in (MigrationOutcome.MIGRATED, MigrationOutcome.REFUSED,
                                   MigrationOutcome.CONFLICT))
    context = _base_context(request, tenant, "kinds") | {
        "kind": kind, "p": preview, "counts": counts, "left": left,
        "listed_max": PREVIEW_LISTED,
        "not_listed": counts[MigrationOutcome.REFUSED] + counts[MigrationOutcome.CONFLICT]
        - len(preview.refused),
        # One per rendered preview: submitting this form twice makes one job.
        "token": uuid.uuid4(),
    }
    return render(request, "checkpoints/migration_preview.html", context)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def migration_submit(request: HttpRequest, tenant: Tenant, kind: str) -> HttpResponse:
    """``POST /t/<slug>/kinds/<kind>/migrations/`` (the preview's confirm form,
    ``MigrationForm``), the tenant's admin only: ``services.migration_job_submit`` stores
    the job (queued, audited) and this answers 303 to its page (post/redirect/get). The
    same form submitted again (same ``client_token``) makes no second job: it answers
    the first one's page, saying so. Bad input is a 400 naming the field (``to``,
    ``reverse``, ``client_token``), with nothing written; an unknown kind is a 404."""
    _require_kind(request, tenant, kind)
    form = MigrationForm(request.POST)
    _require_valid(form)
    data = form.cleaned_data
    job, created = _field_to(lambda: services.migration_job_submit(
        actor=request.user, tenant=tenant, kind=kind, to_version=data["to"],
        reverse=data["reverse"], client_token=data["client_token"]))
    if not created:
        messages.info(request, "This migration was already submitted: this is its job "
                               "(nothing was submitted again).")
    return see_other("migration_detail", slug=tenant.slug, kind=kind, job_id=str(job.uuid))


@require_safe
@dashboard
@tenant_page()
def migration_detail(request: HttpRequest, tenant: Tenant, kind: str, job_id: str
                     ) -> HttpResponse:
    """``/t/<slug>/kinds/<kind>/migrations/<id>/``: a stored migration job, for any role
    of the tenant (``selectors.migration_job_get``, as ``GET …/kinds/{kind}/migrations/
    {id}``: runs, checkpoints, versions and refusal words, never a payload value): its
    state (the last error when it failed or is being retried), counts per outcome and each
    checkpoint's result with a link to its run. While the job is queued or running the
    ``job`` fragment asks for itself every 2 s (htmx): an htmx request gets only that
    fragment (``Vary: HX-Request``, from ``dashboard``). A malformed or unknown id,
    another kind's or another tenant's job is 404. Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    result = selectors.migration_job_get(user=request.user, tenant=tenant, kind=kind,
                                         job_id=job_id)
    context = _base_context(request, tenant, "kinds") | {
        "kind": kind, "job": result.job, "result": result,
        "open": result.job.state in MigrationJobState.OPEN,
        "queued": result.job.state == MigrationJobState.QUEUED,
        "broker": broker_configured(), "sweep_s": settings.RECOVERY_SWEEP_INTERVAL_S,
    }
    template = "checkpoints/migration.html"
    if request.htmx:
        template += "#job"
    return render(request, template, context)
