"""The audit log page: the tenant's audit events, newest first, filtered and paged
backwards. (The run page's audit panel is ``run.run_audit``; the audit trail itself is
written by ``checkpoints.audit``.)"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import selectors
from ..models import Tenant
from ..vocab import AuditAction
from .common import _base_context, dashboard, require_GET, tenant_page
from .forms import AuditFilterForm


@require_GET
@dashboard
@tenant_page()
def audit_log(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/audit/``: the tenant's audit events, newest first, filtered by the
    search ``q`` (events of the runs the inbox search finds) and ``actor``/``action``/
    ``run``, paged backwards with ``before``."""
    form = AuditFilterForm.from_request(request)
    data = form.cleaned_data
    page_size = 100
    events = selectors.audit_list(user=request.user, tenant=tenant, run_id=data["run"],
                                  actor=data["actor"] or None, action=data["action"] or None,
                                  before_seq=data["before"], q=data["q"] or None,
                                  limit=page_size + 1)
    older = events[page_size - 1].seq if len(events) > page_size else None
    query = {k: v for k, v in (("q", data["q"]), ("actor", data["actor"]),
                               ("action", data["action"]),
                               ("run", str(data["run"]) if data["run"] else "")) if v}
    context = _base_context(request, tenant, "audit") | {
        "events": events[:page_size], "older": older, "form": form, "filter_query": query,
        "paged": data["before"] is not None, "known_actions": AuditAction.values,
    }
    return render(request, "checkpoints/audit.html", context)

