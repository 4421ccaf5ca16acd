"""The Data page (issue 20; docs/security/retention.md): the tenant's data policy (its
admin edits it here through ``services.data_policy_set``, as ``PUT …/data-policy``),
the tombstones deletions left (newest first, a page at a time), the active legal holds
and the erasure requests. Any role of the tenant reads it (``selectors.lifecycle``: ids,
numbers, reasons and names, never a payload value; what the page shows the API shows).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from .. import roles, selectors, services
from ..models import Tenant
from .common import _base_context, _require_valid, dashboard, require_GET, require_POST, tenant_page
from .forms import DataPolicyForm, TombstonePageForm, subject_line


def _subject_lines(fields: dict[str, str]) -> list[str]:
    """The policy's subject fields as the form shows them and reads them back (one
    ``name = pointer`` a line, a pointer stored before the one-line rule as an escaped
    JSON string: ``forms.subject_line``); the table of the other roles shows the same."""
    return [subject_line(name, pointer) for name, pointer in fields.items()]


@require_GET
@dashboard
@tenant_page()
def data_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/data/[?before=N]``: the policy (a form for the tenant's admin, a
    table for everyone else), the tombstones with an id below ``before`` (newest first,
    ``selectors.TOMBSTONE_PAGE`` a page; an htmx request for the next page gets the
    ``tombstones`` fragment only), the active legal holds and the latest erasure
    requests. A GET: nothing written."""
    before = TombstonePageForm.from_request(request).cleaned_data["before"]
    user = request.user
    stones = selectors.tombstone_page(user=user, tenant=tenant, before=before)
    context = _base_context(request, tenant, "data") | {"stones": stones, "before": before}
    if request.htmx and before is not None:
        return render(request, "checkpoints/data.html#tombstones", context)
    policy = selectors.data_policy_get(user=user, tenant=tenant)
    lines = _subject_lines(policy.subject_fields or {})
    context |= {
        "policy": policy,
        "policy_set": not policy._state.adding,
        "subject_lines": lines, "subject_text": "\n".join(lines),
        "holds": selectors.legal_hold_list(user=user, tenant=tenant, active_only=True,
                                           limit=selectors.HOLDS_SHOWN),
        "erasures": selectors.erasure_request_list(user=user, tenant=tenant,
                                                   limit=selectors.ERASURES_SHOWN),
        "holds_max": selectors.HOLDS_SHOWN, "erasures_max": selectors.ERASURES_SHOWN,
    }
    return render(request, "checkpoints/data.html", context)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def data_policy_post(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/data/policy/`` (the Data page's form, ``DataPolicyForm``), the
    tenant's admin only (other roles 403, no role 404): ``services.data_policy_set``,
    then 303 back to the page saying whether anything changed. Bad input is a 400 naming
    the field, nothing written."""
    form = DataPolicyForm(request.POST)
    _require_valid(form)
    _, changed = services.data_policy_set(actor=request.user, tenant=tenant,
                                          **form.cleaned_data)
    messages.success(request, "Data policy saved (audited)." if changed
                     else "The data policy already had these values: nothing changed.")
    response = redirect("data_page", slug=tenant.slug)
    response.status_code = 303
    return response
