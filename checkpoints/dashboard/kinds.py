"""The Kinds page: which kinds and schema versions the tenant's checkpoints use, beside
what the kind registry supports (``selectors.kind_usage``, which ``GET …/kinds`` answers
too: what the page hides the API hides; docs/kinds.md)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import selectors
from ..models import Tenant
from .common import _base_context, dashboard, require_GET, tenant_page
from .forms import NoQuery


@require_GET
@dashboard
@tenant_page()
def kind_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/kinds/``: every kind the registry knows and every kind the tenant's
    checkpoints use, each schema version with its checkpoints, runs and ``schema_mismatch``
    runs (links into the inbox filtered by the kind). Takes no parameter (``NoQuery``)."""
    NoQuery.from_request(request)
    usage = selectors.kind_usage(user=request.user, tenant=tenant)
    context = _base_context(request, tenant, "kinds") | {
        "kinds": usage,
        "mismatched": sum(v.schema_mismatch_runs for k in usage for v in k.versions),
    }
    return render(request, "checkpoints/kinds.html", context)
