"""The audit log page: the tenant's audit events, newest first, filtered and paged
backwards, and how far the audit sequencer has sealed them (issue 22, item 1). (The run
page's audit panel is ``run.run_audit``; the audit trail itself is written by
``checkpoints.audit`` and sealed by ``checkpoints.audittree``.)"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import audittree, selectors
from ..models import Tenant
from ..templatetags.dashboard import duration
from ..vocab import AuditAction
from .common import _base_context, dashboard, require_safe, tenant_page
from .forms import AuditFilterForm


@require_safe
@dashboard
@tenant_page()
def audit_log(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/audit/``: the tenant's audit events, newest first, filtered by the
    search ``q`` (events of the runs the inbox search finds, or of an incident reference
    starting with it: ``selectors.audit_list``) and ``actor``/``action``/
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
        "sealing": sealing(tenant),
    }
    return render(request, "checkpoints/audit.html", context)



def sealing(tenant: Tenant) -> dict:
    """How far the tenant's audit events are sealed (integrated under a signed tree
    head), for the on-call engineer: ``audittree.tenant_lag``'s ``pending``, ``lag_s``,
    ``tree_size`` and ``head_at``, plus ``words`` ("All events sealed in the signed log"
    / "12 events waiting to be sealed, oldest 1.4 s") and ``late`` (the oldest has waited
    past ``RECOVERY_AUDIT_LAG_MAX_S``, when ``/readyz`` fails too). Two queries, database
    clock; the caller has checked the viewer's right."""
    lag = audittree.tenant_lag(tenant)
    pending, age = lag["pending"], lag["lag_s"]
    if not pending:
        words = "All events sealed in the signed log"
    else:
        oldest = f"{age:.1f} s" if age < 10 else duration(age)
        words = (f"{pending} event{'' if pending == 1 else 's'} waiting to be sealed, "
                 f"oldest {oldest}")
    return lag | {"words": words,
                  "late": bool(pending) and age > settings.RECOVERY_AUDIT_LAG_MAX_S}
