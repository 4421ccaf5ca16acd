"""The incident a reviewer works on (issue 21, item 10): a short reference they type
(``INC-2041``), kept in their session while they work, stored on each audit event they
cause (``audit.working_on``, set around every dashboard request by ``with_incident``),
and the last reason they gave for it offered again in the action forms."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from ..exceptions import InvalidPayload
from ..models import Tenant
from .common import (
    INCIDENT_KEY,
    REASON_KEY,
    _base_context,
    _referer,
    dashboard,
    incident_of,
    require_POST,
    see_other,
    session_get,
    session_put,
    tenant_page,
)
from .forms import IncidentForm, first_error


@require_POST
@dashboard
@tenant_page()
def incident_set(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/incident/`` ``incident_ref``: the incident the reviewer now works
    on (empty: none; at most 64 printable characters, else 400 naming the field). Kept in
    their session only (no database row; the audit events they cause carry it). htmx:
    the incident box (``_incident.html``); otherwise back to the page it was sent from
    (same site only) or the tenant's inbox."""
    form = IncidentForm(request.POST)
    if not form.is_valid():
        raise InvalidPayload(first_error(form))
    ref = form.cleaned_data["incident_ref"]
    if ref != session_get(request, INCIDENT_KEY, tenant.slug):
        session_put(request, REASON_KEY, tenant.slug, "")  # a reason belongs to its incident
    session_put(request, INCIDENT_KEY, tenant.slug, ref)
    if request.htmx:
        context = (_base_context(request, tenant, "inbox")
                   | {"incident": incident_of(request, tenant.slug)})
        return render(request, "checkpoints/_incident.html", context)
    return see_other(_referer(request) or reverse("run_list", args=[tenant.slug]))
